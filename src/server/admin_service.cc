#include "src/server/admin_service.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "src/common/ids.h"
#include "src/common/status_macros.h"
#include "src/server/call.h"
#include "src/server/convert.h"
#include "src/server/watch_service.h"

namespace sbx::server {
namespace {

// The WriteLocks key of an admin object: "<kind>/<name>".
std::string ObjectKey(absl::string_view kind, absl::string_view name) {
  return absl::StrCat(kind, "/", name);
}
std::string TemplateKey(const std::string& name) { return ObjectKey("template", name); }
std::string PoolKey(const std::string& name) { return ObjectKey("pool", name); }

// The check of expected_generation / create_only against what is stored (`existing`).
template <typename Record>
absl::Status CheckWrite(absl::string_view kind, const std::string& name,
                        const absl::StatusOr<Record>& existing, int64_t expected_generation,
                        bool create_only) {
  if (expected_generation < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected_generation ", expected_generation, " is negative"));
  }
  if (create_only && existing.ok()) {
    return absl::AlreadyExistsError(absl::StrCat(kind, " \"", name, "\" exists (generation ",
                                                 existing->generation, ") and create_only is set"));
  }
  if (expected_generation != 0) {
    if (!existing.ok()) return existing.status();
    if (static_cast<int64_t>(existing->generation) != expected_generation) {
      return absl::AbortedError(absl::StrCat(kind, " \"", name, "\" is at generation ",
                                             existing->generation, ", not the expected ",
                                             expected_generation, "; read it again and retry"));
    }
  }
  return absl::OkStatus();
}

bool SamePool(const store::PoolRecord& a, const store::PoolRecord& b) {
  return a.template_name == b.template_name && a.min_warm == b.min_warm &&
         a.max_warm == b.max_warm && a.empty_pool_policy == b.empty_pool_policy &&
         a.default_wait == b.default_wait && a.default_ttl == b.default_ttl &&
         a.max_ttl == b.max_ttl && a.selection_policy == b.selection_policy && a.sizing == b.sizing;
}

// One page of `items` (sorted by name) after the token's name.
template <typename Item, typename Out>
absl::Status Page(absl::string_view kind, uint64_t fingerprint, int32_t page_size_in,
                  const std::string& token, const std::vector<Item>& items, Out&& out,
                  std::string* next_token) {
  ASSIGN_OR_RETURN(const int page_size, PageSize(page_size_in));
  ASSIGN_OR_RETURN(const std::string after, DecodePageToken(kind, fingerprint, token));
  int taken = 0;
  std::string last;
  for (const Item& item : items) {
    if (!after.empty() && item.name <= after) continue;
    if (taken == page_size) {
      *next_token = EncodePageToken(kind, fingerprint, last);
      break;
    }
    RETURN_IF_ERROR(out(item));
    last = item.name;
    ++taken;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AdminService::WriteLocks::Begin(const std::string& key) {
  absl::MutexLock lock(&mu_);
  if (!busy_.insert(key).second) {
    return absl::AbortedError(
        absl::StrCat("another write to ", key, " is in progress; read it again and retry"));
  }
  return absl::OkStatus();
}

void AdminService::WriteLocks::End(const std::string& key) {
  absl::MutexLock lock(&mu_);
  busy_.erase(key);
}

absl::StatusOr<std::string> AdminService::Canonical(absl::string_view field,
                                                    absl::string_view name) const {
  return CanonicalQualifiedName(field, name, allocator_->default_namespace());
}

template <typename Record, typename Response>
grpc::ServerUnaryReactor* AdminService::DeleteObject(
    grpc::CallbackServerContext* ctx, const char* kind, const std::string& name, bool allow_missing,
    int64_t expected_generation, Response* resp, const std::function<absl::StatusOr<Record>()>& get,
    std::function<void(allocator::StatusCallback)> erase) {
  const std::string key = ObjectKey(kind, name);
  if (absl::Status s = writes_->Begin(key); !s.ok()) return FinishNow(ctx, s);
  const absl::StatusOr<Record> existing = get();
  if (!existing.ok() && absl::IsNotFound(existing.status()) && allow_missing) {
    writes_->End(key);
    resp->set_deleted(false);
    return FinishNow(ctx, absl::OkStatus());
  }
  absl::Status check = existing.status();
  if (check.ok()) check = CheckWrite(kind, name, existing, expected_generation, false);
  if (!check.ok()) {
    writes_->End(key);
    return FinishNow(ctx, check);
  }
  auto call = AsyncUnary<Response>::Create(ctx, resp);
  erase([writes = writes_, call, key](absl::Status s) {
    writes->End(key);
    call->Complete(s, [](Response* out) {
      out->set_deleted(true);
      return absl::OkStatus();
    });
  });
  return call->reactor();
}

grpc::ServerUnaryReactor* AdminService::PutTemplate(grpc::CallbackServerContext* ctx,
                                                    const v1::PutTemplateRequest* req,
                                                    v1::PutTemplateResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, true, "PutTemplate");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (!req->has_template_()) {
    return FinishNow(ctx, absl::InvalidArgumentError("template is required"));
  }
  absl::StatusOr<store::TemplateRecord> record =
      TemplateFromProto(req->template_(), allocator_->default_namespace());
  if (!record.ok()) return FinishNow(ctx, record.status());
  // What only the runtimes know: whether this server has the runtime, whether a local
  // mount would show the server's own files.
  if (check_template_) {
    if (absl::Status s = check_template_(req->template_()); !s.ok()) return FinishNow(ctx, s);
  }
  const std::string key = TemplateKey(record->name);
  if (absl::Status s = writes_->Begin(key); !s.ok()) return FinishNow(ctx, s);
  // From here on no other write of this service touches the template.
  const absl::StatusOr<store::TemplateRecord> existing = allocator_->GetTemplate(record->name);
  if (absl::Status s = CheckWrite("template", record->name, existing, req->expected_generation(),
                                  req->create_only());
      !s.ok()) {
    writes_->End(key);
    return FinishNow(ctx, s);
  }
  if (existing.ok() && existing->runtime == record->runtime && existing->spec == record->spec) {
    writes_->End(key);  // identical: nothing changes, not even the generation
    ToProto(*existing, resp->mutable_template_());
    resp->set_created(false);
    return FinishNow(ctx, absl::OkStatus());
  }
  auto call = AsyncUnary<v1::PutTemplateResponse>::Create(ctx, resp);
  const bool created = !existing.ok();
  allocator_->PutTemplate(*record, [a = allocator_, writes = writes_, call, key,
                                    name = record->name, created](absl::Status s) {
    writes->End(key);
    absl::StatusOr<store::TemplateRecord> stored =
        s.ok() ? a->GetTemplate(name) : absl::StatusOr<store::TemplateRecord>(s);
    call->Complete(stored.status(), [&](v1::PutTemplateResponse* out) {
      ToProto(*stored, out->mutable_template_());
      out->set_created(created);
      return absl::OkStatus();
    });
  });
  return call->reactor();
}

grpc::ServerUnaryReactor* AdminService::GetTemplate(grpc::CallbackServerContext* ctx,
                                                    const v1::GetTemplateRequest* req,
                                                    v1::GetTemplateResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, true, "GetTemplate");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  absl::StatusOr<std::string> name = Canonical("name", req->name());
  if (!name.ok()) return FinishNow(ctx, name.status());
  absl::StatusOr<store::TemplateRecord> t = allocator_->GetTemplate(*name);
  if (!t.ok()) return FinishNow(ctx, t.status());
  ToProto(*t, resp->mutable_template_());
  return FinishNow(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::ListTemplates(grpc::CallbackServerContext* ctx,
                                                      const v1::ListTemplatesRequest* req,
                                                      v1::ListTemplatesResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, true, "ListTemplates");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  std::string next;
  absl::Status s = Page(
      "templates", Fingerprint({}), req->page_size(), req->page_token(),
      allocator_->ListTemplates(),
      [&](const store::TemplateRecord& t) {
        ToProto(t, resp->add_templates());
        return absl::OkStatus();
      },
      &next);
  if (!s.ok()) {
    resp->Clear();
    return FinishNow(ctx, s);
  }
  resp->set_next_page_token(next);
  return FinishNow(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::DeleteTemplate(grpc::CallbackServerContext* ctx,
                                                       const v1::DeleteTemplateRequest* req,
                                                       v1::DeleteTemplateResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, true, "DeleteTemplate");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  absl::StatusOr<std::string> canonical = Canonical("name", req->name());
  if (!canonical.ok()) return FinishNow(ctx, canonical.status());
  const std::string& name = *canonical;
  return DeleteObject<store::TemplateRecord>(
      ctx, "template", name, req->allow_missing(), req->expected_generation(), resp,
      [&] { return allocator_->GetTemplate(name); },
      [a = allocator_, name](allocator::StatusCallback done) {
        a->DeleteTemplate(name, std::move(done));
      });
}

grpc::ServerUnaryReactor* AdminService::PutPool(grpc::CallbackServerContext* ctx,
                                                const v1::PutPoolRequest* req,
                                                v1::PutPoolResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, true, "PutPool");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  if (!req->has_pool()) return FinishNow(ctx, absl::InvalidArgumentError("pool is required"));
  absl::StatusOr<store::PoolRecord> record =
      PoolFromProto(req->pool(), allocator_->default_namespace());
  if (!record.ok()) return FinishNow(ctx, record.status());
  const std::string key = PoolKey(record->name);
  if (absl::Status s = writes_->Begin(key); !s.ok()) return FinishNow(ctx, s);
  const absl::StatusOr<store::PoolRecord> existing = allocator_->GetPool(record->name);
  if (absl::Status s = CheckWrite("pool", record->name, existing, req->expected_generation(),
                                  req->create_only());
      !s.ok()) {
    writes_->End(key);
    return FinishNow(ctx, s);
  }
  if (existing.ok() && SamePool(*existing, *record)) {
    writes_->End(key);  // identical: nothing changes, not even the generation
    absl::Status s = FillPool(*allocator_, record->name, resp->mutable_pool(), images_);
    resp->set_created(false);
    return FinishNow(ctx, s);
  }
  auto call = AsyncUnary<v1::PutPoolResponse>::Create(ctx, resp);
  const bool created = !existing.ok();
  allocator_->PutPool(*record, [a = allocator_, writes = writes_, call, key, name = record->name,
                                created, images = images_](absl::Status s) {
    writes->End(key);
    call->Complete(s, [&](v1::PutPoolResponse* out) {
      out->set_created(created);
      return FillPool(*a, name, out->mutable_pool(), images);
    });
  });
  return call->reactor();
}

grpc::ServerUnaryReactor* AdminService::GetPool(grpc::CallbackServerContext* ctx,
                                                const v1::GetPoolRequest* req,
                                                v1::GetPoolResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, true, "GetPool");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  absl::StatusOr<std::string> name = Canonical("name", req->name());
  if (!name.ok()) return FinishNow(ctx, name.status());
  absl::Status s = FillPool(*allocator_, *name, resp->mutable_pool(), images_);
  if (!s.ok()) resp->Clear();
  return FinishNow(ctx, s);
}

grpc::ServerUnaryReactor* AdminService::ListPools(grpc::CallbackServerContext* ctx,
                                                  const v1::ListPoolsRequest* req,
                                                  v1::ListPoolsResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, true, "ListPools");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  std::string template_name;
  if (!req->template_().empty()) {
    absl::StatusOr<std::string> canonical = Canonical("template", req->template_());
    if (!canonical.ok()) return FinishNow(ctx, canonical.status());
    template_name = *std::move(canonical);
  }
  std::vector<store::PoolRecord> pools = allocator_->ListPools();
  if (!template_name.empty()) {
    pools.erase(std::remove_if(
                    pools.begin(), pools.end(),
                    [&](const store::PoolRecord& p) { return p.template_name != template_name; }),
                pools.end());
  }
  std::string next;
  absl::Status s = Page(
      "pools", Fingerprint({template_name}), req->page_size(), req->page_token(), pools,
      [&](const store::PoolRecord& p) {
        v1::Pool* out = resp->add_pools();
        // A pool deleted since the listing is still shown, without status.
        if (!FillPool(*allocator_, p.name, out, images_).ok()) ToProto(p, out);
        return absl::OkStatus();
      },
      &next);
  if (!s.ok()) {
    resp->Clear();
    return FinishNow(ctx, s);
  }
  resp->set_next_page_token(next);
  return FinishNow(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::DeletePool(grpc::CallbackServerContext* ctx,
                                                   const v1::DeletePoolRequest* req,
                                                   v1::DeletePoolResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, true, "DeletePool");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  absl::StatusOr<std::string> canonical = Canonical("name", req->name());
  if (!canonical.ok()) return FinishNow(ctx, canonical.status());
  const std::string& name = *canonical;
  return DeleteObject<store::PoolRecord>(
      ctx, "pool", name, req->allow_missing(), req->expected_generation(), resp,
      [&] { return allocator_->GetPool(name); },
      [a = allocator_, name](allocator::StatusCallback done) {
        a->DeletePool(name, std::move(done));
      });
}

grpc::ServerUnaryReactor* AdminService::ScalePool(grpc::CallbackServerContext* ctx,
                                                  const v1::ScalePoolRequest* req,
                                                  v1::ScalePoolResponse* resp) {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, true, "ScalePool");
  if (!caller.ok()) return FinishNow(ctx, caller.status());
  absl::StatusOr<std::string> canonical = Canonical("name", req->name());
  if (!canonical.ok()) return FinishNow(ctx, canonical.status());
  const std::string& name = *canonical;
  if (!req->has_min_warm() && !req->has_max_warm()) {
    return FinishNow(ctx, absl::InvalidArgumentError(
                              absl::StrCat("pool \"", name, "\": set min_warm, max_warm or both")));
  }
  if (req->has_min_warm() && req->min_warm().value() < 0) {
    return FinishNow(ctx, absl::InvalidArgumentError(
                              absl::StrCat("min_warm ", req->min_warm().value(), " is negative")));
  }
  if (req->has_max_warm() && req->max_warm().value() < 0) {
    return FinishNow(ctx, absl::InvalidArgumentError(
                              absl::StrCat("max_warm ", req->max_warm().value(), " is negative")));
  }
  const std::string key = PoolKey(name);
  if (absl::Status s = writes_->Begin(key); !s.ok()) return FinishNow(ctx, s);
  absl::StatusOr<store::PoolRecord> pool = allocator_->GetPool(name);
  if (!pool.ok()) {
    writes_->End(key);
    return FinishNow(ctx, pool.status());
  }
  if (req->has_min_warm()) pool->min_warm = req->min_warm().value();
  if (req->has_max_warm()) pool->max_warm = req->max_warm().value();
  absl::Status check = absl::OkStatus();
  if (pool->max_warm < pool->min_warm) {
    check =
        absl::InvalidArgumentError(absl::StrCat("pool \"", name, "\": max_warm ", pool->max_warm,
                                                " would be below min_warm ", pool->min_warm));
  } else if (pool->max_warm > allocator_->max_pool_warm()) {
    // The allocator owns the limit (AllocatorOptions::max_pool_warm); checked here too so
    // that the scale answers before its write.
    check = absl::InvalidArgumentError(
        absl::StrCat("pool \"", name, "\": max_warm ", pool->max_warm, " is above ",
                     allocator_->max_pool_warm(), ", the allocator's max_pool_warm"));
  }
  if (!check.ok()) {
    writes_->End(key);
    return FinishNow(ctx, check);
  }
  auto call = AsyncUnary<v1::ScalePoolResponse>::Create(ctx, resp);
  allocator_->PutPool(
      *pool, [a = allocator_, writes = writes_, call, key, name, images = images_](absl::Status s) {
        writes->End(key);
        call->Complete(s, [&](v1::ScalePoolResponse* out) {
          return FillPool(*a, name, out->mutable_pool(), images);
        });
      });
  return call->reactor();
}

grpc::ServerWriteReactor<v1::PoolEvent>* AdminService::WatchPools(
    grpc::CallbackServerContext* ctx, const v1::WatchPoolsRequest* req) {
  return server::WatchPools(ctx, req, allocator_, auth_, images_);
}

}  // namespace sbx::server

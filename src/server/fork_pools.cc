#include "src/server/fork_pools.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "src/common/ids.h"
#include "src/server/convert.h"

namespace sbx::server {
namespace {

constexpr absl::string_view kForkPrefix = "fork-";
constexpr absl::string_view kSnapshotPrefix = "sn-";
// Snapshot ids are "sn-" and 16 lowercase hex digits (allocator::Snapshots).
constexpr size_t kIdDigits = 16;

}  // namespace

absl::Status CheckTemplateSnapshot(const allocator::Snapshots* snapshots, const v1::Template& t) {
  if (!t.has_local() || t.local().snapshot().empty()) return absl::OkStatus();
  const std::string& id = t.local().snapshot();
  const std::string what = absl::StrCat("template \"", t.name(), "\": local.snapshot ", id);
  if (snapshots == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": this server has no snapshots (the local runtime keeps them)"));
  }
  absl::StatusOr<store::SnapshotRecord> r = snapshots->Find(id);
  if (!r.ok()) return absl::NotFoundError(absl::StrCat(what, " does not exist"));
  const std::string& image = t.local().image();
  v1::LocalSpec source;
  if (r->template_runtime == "local" && source.ParseFromString(r->template_spec)) {
    if (source.image() != image) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, " was taken on ",
          source.image().empty() ? std::string("the host's root")
                                 : absl::StrCat("image \"", source.image(), "\""),
          " and the template runs ",
          image.empty() ? std::string("the host's root") : absl::StrCat("image \"", image, "\""),
          ": a template starts only from a snapshot of its own image"));
    }
  } else if (r->parent_image_digest.empty() != image.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        r->parent_image_digest.empty() ? " holds only a workspace (the host's root)"
                                       : " was taken on an image",
        " and the template ", image.empty() ? "runs the host's root" : "names an image",
        ": a template starts only from a snapshot of its own image"));
  }
  return absl::OkStatus();
}

std::shared_ptr<ForkPools> ForkPools::Create(allocator::Allocator* allocator, TemplateCheck check) {
  return std::shared_ptr<ForkPools>(new ForkPools(allocator, std::move(check)));
}

std::string ForkPools::PoolName(absl::string_view snapshot_id) {
  absl::ConsumePrefix(&snapshot_id, kSnapshotPrefix);
  return absl::StrCat(kForkPrefix, snapshot_id);
}

bool ForkPools::IsForkName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kForkPrefix) || name.size() != kIdDigits) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f'); });
}

std::string ForkPools::SnapshotOf(absl::string_view name) {
  if (const size_t slash = name.rfind('/'); slash != absl::string_view::npos) {
    name.remove_prefix(slash + 1);
  }
  if (!IsForkName(name)) return "";
  name.remove_prefix(kForkPrefix.size());
  return absl::StrCat(kSnapshotPrefix, name);
}

void ForkPools::Resolve(const Caller& caller, const store::SnapshotRecord& snapshot,
                        Callback done) {
  // (An empty spec is a local spec of defaults: the host's root.)
  if (snapshot.template_runtime.empty()) {
    return std::move(done)(absl::FailedPreconditionError(absl::StrCat(
        "snapshot ", snapshot.id,
        " does not record the template its sandbox was started from (it was taken before "
        "forks existed, or after its pool or template had been deleted): it cannot be forked; "
        "Reset still rewinds a sandbox of its image to it")));
  }
  if (snapshot.template_runtime != "local") {
    return std::move(done)(absl::FailedPreconditionError(absl::StrCat(
        "snapshot ", snapshot.id, " was taken of a sandbox of template \"", snapshot.template_name,
        "\", runtime \"", snapshot.template_runtime, "\": only local sandboxes are forked")));
  }
  const std::string& default_ns = allocator_->default_namespace();
  const std::string ns =
      MayClaimFrom(caller, default_ns) ? default_ns : caller.limits.namespaces.front();
  const std::string name = QualifiedName(ns, PoolName(snapshot.id), default_ns);
  auto answer = [self = shared_from_this(), name, id = snapshot.id,
                 done = std::move(done)](absl::Status s) mutable {
    if (s.ok()) s = self->CheckOwn(name, id);
    if (!s.ok()) return std::move(done)(s);
    std::move(done)(name);
  };
  if (allocator_->GetPool(name).ok()) return answer(absl::OkStatus());
  {
    absl::MutexLock lock(&mu_);
    auto [it, first] = flights_.try_emplace(name);
    it->second.push_back(std::move(answer));
    if (!first) return;  // another Fork is making it: its writes answer this one too
  }
  Make(name, snapshot);
}

absl::Status ForkPools::CheckOwn(const std::string& name, const std::string& snapshot_id) const {
  absl::StatusOr<store::PoolRecord> pool = allocator_->GetPool(name);
  absl::StatusOr<store::TemplateRecord> t =
      allocator_->GetTemplate(pool.ok() ? pool->template_name : name);
  if (!t.ok()) return absl::OkStatus();  // a missing one is made
  v1::LocalSpec spec;
  if (t->runtime == "local" && spec.ParseFromString(t->spec) && spec.snapshot() == snapshot_id) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat(pool.ok() ? "pool \"" : "template \"", name, "\", the name of snapshot ",
                   snapshot_id, "'s fork pool, exists and does not start from it (template \"",
                   t->name, "\" is an admin's): delete or rename it"));
}

void ForkPools::Make(const std::string& name, const store::SnapshotRecord& snapshot) {
  if (absl::Status s = CheckOwn(name, snapshot.id); !s.ok()) return Finish(name, s);
  if (allocator_->GetTemplate(name).ok()) return MakePool(name);
  v1::Template api;
  api.set_name(name);
  api.set_runtime("local");
  if (!api.mutable_local()->ParseFromString(snapshot.template_spec)) {
    return Finish(name, absl::FailedPreconditionError(absl::StrCat(
                            "snapshot ", snapshot.id, ": the recorded local spec of template \"",
                            snapshot.template_name, "\" does not parse")));
  }
  api.mutable_local()->set_snapshot(snapshot.id);
  // Checked as PutTemplate checks a template (the runtime's view may have changed since the
  // source template was stored).
  absl::StatusOr<store::TemplateRecord> t = TemplateFromProto(api, allocator_->default_namespace());
  if (t.ok() && check_) {
    if (absl::Status s = check_(api); !s.ok()) t = s;
  }
  if (!t.ok()) return Finish(name, t.status());
  allocator_->PutTemplate(*std::move(t), [self = shared_from_this(), name](absl::Status s) {
    if (!s.ok()) return self->Finish(name, s);
    self->MakePool(name);
  });
}

void ForkPools::MakePool(const std::string& name) {
  if (allocator_->GetPool(name).ok()) return Finish(name, absl::OkStatus());
  store::PoolRecord p;
  p.name = name;
  p.template_name = name;
  p.min_warm = 0;
  p.max_warm = kMaxForkWarm;
  p.empty_pool_policy = store::EmptyPoolPolicy::kCold;
  p.default_wait = kForkWait;
  allocator_->PutPool(std::move(p),
                      [self = shared_from_this(), name](absl::Status s) { self->Finish(name, s); });
}

void ForkPools::Finish(const std::string& name, const absl::Status& result) {
  std::vector<StatusCallback> waiting;
  {
    absl::MutexLock lock(&mu_);
    auto it = flights_.find(name);
    if (it == flights_.end()) return;
    waiting = std::move(it->second);
    flights_.erase(it);
  }
  absl::Status s = result;
  if (!s.ok()) {
    s = absl::Status(s.code(), absl::StrCat("making fork pool \"", name, "\": ", s.message()));
  }
  for (auto& done : waiting) std::move(done)(s);
}

void ForkPools::Retire(const std::string& snapshot_id, StatusCallback done) {
  const std::string local = PoolName(snapshot_id);
  std::vector<std::string> names;
  for (const store::PoolRecord& p : allocator_->ListPools()) {
    if (SplitQualifiedName(p.name, allocator_->default_namespace()).name == local) {
      names.push_back(p.name);
    }
  }
  // Pools first (a template in use by a pool cannot go), then the templates of that name.
  auto templates = [self = shared_from_this(), local,
                    done = std::move(done)](absl::Status s) mutable {
    if (!s.ok()) return std::move(done)(s);
    std::vector<std::string> left;
    for (const store::TemplateRecord& t : self->allocator_->ListTemplates()) {
      if (SplitQualifiedName(t.name, self->allocator_->default_namespace()).name == local) {
        left.push_back(t.name);
      }
    }
    self->DeleteAll(std::move(left), /*pools=*/false, std::move(done));
  };
  DeleteAll(std::move(names), /*pools=*/true, std::move(templates));
}

void ForkPools::DeleteAll(std::vector<std::string> names, bool pools, StatusCallback done) {
  if (names.empty()) return std::move(done)(absl::OkStatus());
  const std::string name = std::move(names.back());
  names.pop_back();
  auto next = [self = shared_from_this(), names = std::move(names), pools,
               done = std::move(done)](absl::Status s) mutable {
    if (!s.ok()) return std::move(done)(s);
    self->DeleteAll(std::move(names), pools, std::move(done));
  };
  if (pools) {
    allocator_->DeletePool(name, std::move(next));
  } else {
    allocator_->DeleteTemplate(name, std::move(next));
  }
}

}  // namespace sbx::server

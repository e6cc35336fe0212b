#include "src/server/image_pools.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "src/common/hash.h"
#include "src/common/ids.h"
#include "src/common/status_macros.h"
#include "src/server/convert.h"

namespace sbx::server {
namespace {

constexpr absl::string_view kOnDemandPrefix = "image-";
constexpr int kOnDemandHexDigits = 12;
constexpr size_t kMaxReferenceBytes = 4096;

std::string Quoted(absl::string_view ref) { return absl::StrCat("\"", absl::CEscape(ref), "\""); }

// The reference check of a server without an image cache (Kubernetes images are
// "name[:tag][@digest]"; the cluster judges the rest).
absl::Status CheckPlainReference(const std::string& ref) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("image ", Quoted(ref), " ", why));
  };
  if (ref.empty()) return bad("is empty");
  if (ref.size() > kMaxReferenceBytes) return bad("is longer than 4096 bytes");
  for (char c : ref) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      return bad("has a blank or control character");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ImageClaimOptions::Validate() const {
  if (max_warm < 1 || max_warm > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("image claims: max_warm ", max_warm, " is outside 1..10000"));
  }
  if (default_wait <= absl::ZeroDuration() || default_wait > allocator::kMaxWait) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image claims: default_wait ", absl::FormatDuration(default_wait), " is outside (0, 1h]"));
  }
  return absl::OkStatus();
}

v1::LocalSpec DefaultImageClaimSpec() {
  v1::LocalSpec spec;
  spec.set_network(false);
  spec.set_memory_limit_bytes(int64_t{512} << 20);
  spec.set_pids_limit(512);
  return spec;
}

std::shared_ptr<ImagePools> ImagePools::Create(allocator::Allocator* allocator,
                                               images::Images* images, TenantLimiter* limiter,
                                               ImageClaimOptions options) {
  return std::shared_ptr<ImagePools>(
      new ImagePools(allocator, images, limiter, std::move(options)));
}

ImagePools::ImagePools(allocator::Allocator* allocator, images::Images* images,
                       TenantLimiter* limiter, ImageClaimOptions options)
    : allocator_(allocator),
      images_(images),
      limiter_(limiter),
      options_(std::move(options)),
      writes_(PoolWrites::Create(allocator, "on-demand pool")) {}

std::string ImagePools::OnDemandName(absl::string_view ref) {
  const std::string hex = absl::StrFormat("%016x", Fnv1a64(ref));
  return absl::StrCat(kOnDemandPrefix, hex.substr(0, kOnDemandHexDigits));
}

bool ImagePools::IsOnDemandName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kOnDemandPrefix) || name.size() != kOnDemandHexDigits) {
    return false;
  }
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f'); });
}

bool ImagePools::RunsImage(const store::TemplateRecord& t, const std::string& ref) const {
  if (t.runtime == "local") {
    v1::LocalSpec spec;
    return spec.ParseFromString(t.spec) && spec.image() == ref;
  }
  if (t.runtime == "kubernetes" && options_.kubernetes_images) {
    const std::vector<std::string> images = options_.kubernetes_images(t);
    return std::find(images.begin(), images.end(), ref) != images.end();
  }
  return false;
}

std::string ImagePools::FindDeclared(const Caller& caller, const std::string& ref) const {
  const std::string& default_ns = allocator_->default_namespace();
  std::string best;
  // Best first: more warm, fewer waiting, then the name (pools come sorted by name).
  std::tuple<int64_t, int64_t> best_key{-1, 0};
  for (const store::PoolRecord& p : allocator_->ListPools()) {
    const NamespacedName where = SplitQualifiedName(p.name, default_ns);
    if (options_.on_demand && IsOnDemandName(where.name)) continue;
    if (!MayClaimFrom(caller, where.ns)) continue;
    absl::StatusOr<store::TemplateRecord> t = allocator_->GetTemplate(p.template_name);
    if (!t.ok() || !RunsImage(*t, ref)) continue;
    absl::StatusOr<allocator::PoolStatus> st = allocator_->GetPoolStatus(p.name);
    const std::tuple<int64_t, int64_t> key{st.ok() ? st->warm : 0, st.ok() ? -st->waiting : 0};
    if (best.empty() || key > best_key) {
      best = p.name;
      best_key = key;
    }
  }
  return best;
}

void ImagePools::Resolve(const Caller& caller, const std::string& ref, int claims, Callback done) {
  if (absl::Status s = options_.on_demand && images_ != nullptr ? images_->CheckReference(ref)
                                                                : CheckPlainReference(ref);
      !s.ok()) {
    return std::move(done)(s);
  }
  if (std::string declared = FindDeclared(caller, ref); !declared.empty()) {
    return std::move(done)(ImagePool{std::move(declared), ImageRoute::kDeclaredPool});
  }
  if (!options_.on_demand) {
    return std::move(done)(absl::NotFoundError(absl::StrCat(
        "no pool runs image ", Quoted(ref), " (among the pools tenant \"", caller.tenant,
        "\" may claim from; a pool runs an image when its template's local.image, or a "
        "container of its pod template, is exactly that reference), and this server makes "
        "no pools of images (only the local runtime does): declare one")));
  }
  if (images_ == nullptr) {
    return std::move(done)(absl::FailedPreconditionError(absl::StrCat(
        "no pool runs image ", Quoted(ref),
        " and this server has no image cache to make one: start sbx-server with "
        "--image_cache_bytes (and --image_import_dir or --image_registry), or declare a pool "
        "of the image")));
  }
  if (absl::Status s = CheckLimits(caller, ref, claims); !s.ok()) return std::move(done)(s);

  const std::string& default_ns = allocator_->default_namespace();
  const std::string ns =
      MayClaimFrom(caller, default_ns) ? default_ns : caller.limits.namespaces.front();
  const std::string name = QualifiedName(ns, OnDemandName(ref), default_ns);
  // Checked again once the pool is there: a claim of another image whose name hashes
  // alike may have joined the flight.
  auto answer = [self = shared_from_this(), name, ref,
                 done = std::move(done)](absl::Status s) mutable {
    if (s.ok()) s = self->CheckOwn(name, ref);
    if (!s.ok()) return std::move(done)(s);
    std::move(done)(ImagePool{name, ImageRoute::kOnDemandPool});
  };
  if (allocator_->GetPool(name).ok()) return answer(absl::OkStatus());
  // Another claim making it: its writes answer this one too.
  if (!writes_->Join(name, std::move(answer))) return;
  Make(name, ref);
}

absl::Status ImagePools::CheckLimits(const Caller& caller, const std::string& ref, int claims) {
  const std::vector<images::Image> cached = images_->List();
  const bool in_cache = std::any_of(cached.begin(), cached.end(),
                                    [&](const images::Image& i) { return i.ref == ref; });
  const int64_t limit = caller.limits.image_cache_bytes;
  if (!caller.admin && limit > 0 && !in_cache) {
    int64_t used = 0;
    {
      absl::MutexLock lock(&mu_);
      for (const images::Image& i : cached) {
        auto a = attributed_.find(i.ref);
        if (a != attributed_.end() && a->second.tenant == caller.tenant) used += i.bytes;
      }
    }
    if (used >= limit) {
      limiter_->CountRefusal(caller.tenant, "image_cache_bytes");
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant \"", caller.tenant, "\" is at its image_cache_bytes ", limit, ": images its ",
          "claims pulled take ", used, " bytes of the image cache, and image ", Quoted(ref),
          " is not in the cache (a claim of it would pull it). Claim an image that is cached "
          "or has a pool, or have an admin remove images (sbx images rm)"));
    }
  }
  if (!caller.admin) RETURN_IF_ERROR(limiter_->TakeImageClaims(caller, claims));
  absl::MutexLock lock(&mu_);
  for (const images::Image& i : cached) {
    if (auto a = attributed_.find(i.ref); a != attributed_.end()) a->second.seen = true;
  }
  if (!in_cache) {
    // The first claim to find it missing pulls it; after it has been cached (and left),
    // the next one to find it missing.
    auto [a, added] = attributed_.try_emplace(ref);
    if (added || a->second.seen) a->second = Attribution{caller.tenant, false};
  }
  return absl::OkStatus();
}

absl::Status ImagePools::CheckOwn(const std::string& name, const std::string& ref) const {
  absl::StatusOr<store::PoolRecord> pool = allocator_->GetPool(name);
  absl::StatusOr<store::TemplateRecord> t =
      allocator_->GetTemplate(pool.ok() ? pool->template_name : name);
  if (!t.ok() || RunsImage(*t, ref)) return absl::OkStatus();  // a missing one is made
  return absl::FailedPreconditionError(absl::StrCat(
      pool.ok() ? "pool \"" : "template \"", name, "\", the name of the on-demand pool of image ",
      Quoted(ref), ", exists and runs another image (template \"", t->name,
      "\": an admin's, or the pool of a reference whose name hashes alike); declare a pool of "
      "the image instead"));
}

void ImagePools::Make(const std::string& name, const std::string& ref) {
  if (absl::Status s = CheckOwn(name, ref); !s.ok()) return writes_->Finish(name, s);
  store::PoolRecord p;
  p.name = name;
  p.template_name = name;
  p.min_warm = 0;
  p.max_warm = options_.max_warm;
  p.empty_pool_policy = store::EmptyPoolPolicy::kCold;
  p.default_wait = options_.default_wait;
  if (allocator_->GetTemplate(name).ok()) return writes_->Write(std::nullopt, std::move(p));
  v1::LocalSpec spec = DefaultImageClaimSpec();
  if (!options_.base_template.empty()) {
    absl::StatusOr<store::TemplateRecord> base = allocator_->GetTemplate(options_.base_template);
    const std::string what = absl::StrCat("the base template of on-demand image pools, \"",
                                          options_.base_template, "\" (--image_claim_template),");
    if (!base.ok()) {
      return writes_->Finish(
          name, absl::FailedPreconditionError(absl::StrCat(
                    what, " does not exist; cannot make a pool of image ", Quoted(ref))));
    }
    if (base->runtime != "local" || !spec.ParseFromString(base->spec)) {
      return writes_->Finish(
          name, absl::FailedPreconditionError(absl::StrCat(
                    what, " has runtime \"", base->runtime,
                    "\", not a local spec; cannot make a pool of image ", Quoted(ref))));
    }
  }
  spec.set_image(ref);
  // Checked as PutTemplate checks a template (a base template may have changed since it was
  // stored, or have been stored before a check existed).
  v1::Template api;
  api.set_name(name);
  api.set_runtime("local");
  *api.mutable_local() = std::move(spec);
  absl::StatusOr<store::TemplateRecord> t = TemplateFromProto(api, allocator_->default_namespace());
  if (t.ok() && options_.check_template) {
    if (absl::Status s = options_.check_template(api); !s.ok()) t = s;
  }
  if (!t.ok()) return writes_->Finish(name, t.status());
  writes_->Write(*std::move(t), std::move(p));
}

}  // namespace sbx::server

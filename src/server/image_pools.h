#pragma once
// ImagePools: which pool serves a claim that names an image instead of a pool
// (ClaimRequest.image, ClaimBatchRequest.image), and the on-demand pools of images that
// no declared pool runs, so that a trainer with 2,000 task images declares no 2,000
// pools.
//
// A claim by image goes, in this order:
// 1. To a declared pool that runs the image, in a namespace the caller may claim from
//    (MayClaimFrom, auth.h): its template is local with `local.image` equal to the
//    reference, or kubernetes with a container of that image in its pod template
//    (ImageClaimOptions::kubernetes_images). References match exactly, as written. Among
//    several, the one with the most warm sandboxes, then the fewest waiting claims, then
//    the first name. No tenant limit of this file applies (the pool is the admin's).
// 2. Else, on a server that makes pools of images (ImageClaimOptions::on_demand: the
//    local runtime) and has an image cache, to the image's on-demand pool: a template and
//    a pool both named OnDemandName(ref), "image-<12 hex digits>" (FNV-1a 64 of the
//    reference, src/common/hash.h), in the default namespace, or in the caller's first
//    namespace when its token confines it elsewhere. The template is the base template's
//    local spec (ImageClaimOptions::base_template, else DefaultImageClaimSpec) with
//    `image` set; the pool keeps none warm (min_warm 0, max_warm
//    ImageClaimOptions::max_warm), defaults to policy COLD and waits
//    ImageClaimOptions::default_wait. The first claim that finds the pool missing writes
//    the template and the pool (through the allocator, as AdminService does); claims
//    racing it wait for those writes and share their result (single flight), so one
//    image gets one pool. An existing template or pool is used as it is (an admin may
//    change either); one of that name that runs another image (a hash collision, or an
//    admin's pool) is FAILED_PRECONDITION. The image is pulled by the pool's first
//    create (the runtime's, through the cache, which pulls once for concurrent creates).
//    Pools named image-<12 hex digits> are never taken for declared ones on such a
//    server.
// 3. Else NOT_FOUND naming the image (no on-demand pools: Kubernetes, where a pool's pod
//    template decides, and the instant and none runtimes), or FAILED_PRECONDITION naming
//    --image_cache_bytes (a local server without an image cache).
// The reference is checked first: by the image cache on a server that makes on-demand
// pools and has one (CheckReference: INVALID_ARGUMENT, or NOT_FOUND for a local file that
// is not there), else only that it is a non-empty string of at most 4096 bytes without
// blanks or control characters (Kubernetes images are no references of the cache). An
// on-demand template is checked as PutTemplate checks one (TemplateFromProto, then
// ImageClaimOptions::check_template) before it is written.
//
// Tenant limits (tokens file, auth.h) on claims served by on-demand pools, for tenants
// that are not admins, checked in this order, before anything is written:
// - image_cache_bytes=N: a claim of an image that is not in the cache (no image of the
//   cache was first pulled by this reference, images::Image::ref) is refused when the
//   images attributed to the tenant take N bytes or more of the cache now. An image is
//   attributed to the tenant whose claim first found it missing from the cache (the claim
//   whose pool then pulls it); racing claims of one missing image: the first one here.
//   When the image leaves the cache (evicted, removed) and a claim of another tenant
//   finds it missing again, it becomes that tenant's. Bytes are counted as the cache
//   counts them (unpacked, images::Image::bytes) and only while the image is cached, so a
//   tenant may end above N by its last image's size, and removing images (sbx images rm)
//   gives room back. Attributions live in memory: after a restart the cached images are
//   nobody's until they are pulled again.
// - image_claim_rate / image_claim_burst: TenantLimiter::TakeImageClaims (a batch counts
//   its count).
// Refusals are RESOURCE_EXHAUSTED naming the tenant and the limit, counted in the
// TenantLimiter (sbx_tenant_limited_total).
//
// Thread-safety: every method may be called from any thread. Resolve's callback runs on
// the calling thread when the pool is known, else on the thread of the allocator's
// callback (the store's committer), never under a lock of this class.
// Lifetime: held by a shared_ptr; the allocator's callbacks keep it alive while its writes
// are in flight. The Allocator, Images and TenantLimiter given to Create must outlive it,
// and the kubernetes_images function too.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sbx/v1/admin.pb.h"
#include "src/allocator/allocator.h"
#include "src/images/images.h"
#include "src/server/auth.h"
#include "src/server/pool_writes.h"
#include "src/server/tenant_limits.h"

namespace sbx::server {

// The images a kubernetes template of the allocator runs (its pod template's containers'
// `image`s); empty when it is unknown here.
using TemplateImages = std::function<std::vector<std::string>(const store::TemplateRecord&)>;

struct ImageClaimOptions {
  // Whether claims of an image that no declared pool runs get an on-demand pool (the
  // local runtime). False: NOT_FOUND naming the image.
  bool on_demand = false;
  // The template whose local spec on-demand templates copy (sbx-server's
  // --image_claim_template), a canonical name (src/common/ids.h). Empty:
  // DefaultImageClaimSpec(). Read when an on-demand template is made: missing, or not
  // local, then is FAILED_PRECONDITION naming it.
  std::string base_template;
  // Warm ceiling of on-demand pools: how many sandboxes their refill makes at a time for
  // claims that wait (batches, policy WAIT). 1 to 10000.
  int32_t max_warm = 4;
  // How long claims of on-demand pools wait by default (a first pull may take minutes).
  absl::Duration default_wait = absl::Minutes(5);
  // Images of kubernetes templates (the pod template's or the SandboxTemplate's
  // containers). Unset: kubernetes templates match no image.
  TemplateImages kubernetes_images;
  // What the runtimes say of a template before it is stored (ServerOptions::
  // check_template, as PutTemplate asks it), asked of each on-demand template before it
  // is written; its error fails the claims. Unset: none.
  std::function<absl::Status(const v1::Template&)> check_template;

  // INVALID_ARGUMENT naming the field and value.
  [[nodiscard]] absl::Status Validate() const;
};

// The base spec of on-demand templates without --image_claim_template: no network, 512 MiB
// of memory, 512 processes, the default workspace.
v1::LocalSpec DefaultImageClaimSpec();

// How a claim by image is served.
enum class ImageRoute : uint8_t { kDeclaredPool, kOnDemandPool };

struct ImagePool {
  std::string pool;  // canonical name
  ImageRoute route = ImageRoute::kDeclaredPool;
};

class ImagePools : public std::enable_shared_from_this<ImagePools> {
 public:
  using Callback = absl::AnyInvocable<void(absl::StatusOr<ImagePool>) &&>;

  // `images` null: the server has no image cache; `limiter` may not be null.
  static std::shared_ptr<ImagePools> Create(allocator::Allocator* allocator, images::Images* images,
                                            TenantLimiter* limiter, ImageClaimOptions options);

  // The pool that serves `claims` claims (a batch: its count) of image `ref` for `caller`
  // (see above), made first when it is an on-demand pool that does not exist. Errors:
  // INVALID_ARGUMENT (the reference), NOT_FOUND, FAILED_PRECONDITION, RESOURCE_EXHAUSTED
  // (a tenant limit), the allocator's errors of the template's and the pool's writes.
  void Resolve(const Caller& caller, const std::string& ref, int claims, Callback done)
      ABSL_LOCKS_EXCLUDED(mu_);

  // "image-" and the first 12 hex digits of FNV-1a 64 of `ref`.
  static std::string OnDemandName(absl::string_view ref);
  // Whether `name` (without namespace) has the shape of an on-demand pool's name.
  static bool IsOnDemandName(absl::string_view name);

 private:
  ImagePools(allocator::Allocator* allocator, images::Images* images, TenantLimiter* limiter,
             ImageClaimOptions options);

  // Whether template `t` runs image `ref`.
  bool RunsImage(const store::TemplateRecord& t, const std::string& ref) const;
  // The declared pool of `ref` that `caller` may claim from and that is best to take from;
  // "" when there is none.
  std::string FindDeclared(const Caller& caller, const std::string& ref) const;
  // The tenant limits of an on-demand claim, and the attribution of a pull.
  [[nodiscard]] absl::Status CheckLimits(const Caller& caller, const std::string& ref, int claims)
      ABSL_LOCKS_EXCLUDED(mu_);
  // OK when existing pool or template `name` is the on-demand one of `ref`.
  [[nodiscard]] absl::Status CheckOwn(const std::string& name, const std::string& ref) const;
  // Makes the template and pool `name` of `ref` (those missing), finishing the flight.
  void Make(const std::string& name, const std::string& ref);

  allocator::Allocator* const allocator_;
  images::Images* const images_;
  TenantLimiter* const limiter_;
  const ImageClaimOptions options_;

  // The writes of on-demand pools, one flight per name.
  const std::shared_ptr<PoolWrites> writes_;

  absl::Mutex mu_;
  // Who pulled the images of references claimed from on-demand pools (see above): the
  // tenant, and whether an image of the reference has been seen in the cache since.
  struct Attribution {
    std::string tenant;
    bool seen = false;
  };
  absl::flat_hash_map<std::string, Attribution> attributed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::server

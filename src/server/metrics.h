#pragma once
// sbx::server metrics wiring: the Prometheus view of sbx-server, served on /metrics.
//
// Nothing on a request path touches Prometheus. Components keep plain counters (relaxed
// atomics and AtomicHistograms: the allocator per pool, the store per group commit, the
// services here in RequestCounters); ServerCollector reads them at scrape time and builds
// the metric families then. Per-pool series exist from the moment a pool exists (they
// come from Allocator::ListPools/GetPoolStatus at each scrape), and nothing is looked up
// by name on a claim. docs/metrics.md is the catalogue of every family.
//
// Thread-safety: RequestCounters may be updated from any thread; Collect may run
// concurrently with everything.
// Lifetime: the sources given to ServerCollector / MetricsEndpoint (allocator, refill
// reconciler, store reader, request counters) must outlive them. Destroy the endpoint
// before the sources.

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/common/histogram.h"
#include "src/images/images.h"
#include "src/server/tenant_limits.h"

namespace prometheus {
class Collectable;
class Exposer;
class Registry;
struct MetricFamily;
}  // namespace prometheus

namespace sbx::allocator {
class Allocator;
class RefillReconciler;
class Snapshots;
}  // namespace sbx::allocator

namespace sbx::server {

struct MetricsOptions {
  // host:port of the HTTP server that serves /metrics; port 0 picks a free port. "" or
  // "off" serves no metrics.
  std::string listen = "0.0.0.0:9090";
  // When set, the bound port is written there (decimal, then a newline) once serving.
  std::string port_file;

  bool enabled() const { return !listen.empty() && listen != "off"; }
  // INVALID_ARGUMENT naming the bad address.
  [[nodiscard]] absl::Status Validate() const;
};

// The gRPC methods whose calls are counted by final status code.
enum class CountedMethod : uint8_t { kClaim = 0, kClaimBatch = 1, kRelease = 2 };
// "Claim", "ClaimBatch", "Release".
const char* MethodName(CountedMethod m);

// How a claim by image (ClaimRequest.image, ClaimBatchRequest.image) was served: from a
// declared pool of the image, from its on-demand pool, or refused before it reached a pool
// (no pool, a bad reference, no image cache, a tenant's image limit).
enum class ImageClaimRoute : uint8_t { kDeclaredPool = 0, kOnDemandPool = 1, kRefused = 2 };
inline constexpr int kImageClaimRoutes = 3;
// "declared_pool", "on_demand_pool", "refused" (the label sbx_image_claims_total{served}).
const char* ImageClaimRouteName(ImageClaimRoute r);

// Writes `port` and a newline to `path` through a temporary file renamed over it, so a
// reader never sees half a number. INTERNAL naming the file when it cannot.
[[nodiscard]] absl::Status WritePortFile(const std::string& path, int port);
inline constexpr int kCountedMethods = 3;

// Counters the services keep on their request paths: fixed arrays of relaxed atomics,
// indexed by method and status code, so counting is one atomic add.
class RequestCounters {
 public:
  RequestCounters() : exec_seconds_(ExecDurationBuckets()) {}

  void CountCall(CountedMethod method, absl::StatusCode code) {
    calls_[static_cast<int>(method)][Index(code)].fetch_add(1, std::memory_order_relaxed);
  }
  // One Claim or ClaimBatch call by image went `route` (a retry answered from its claim
  // is not counted again).
  void CountImageClaim(ImageClaimRoute route) {
    image_claims_[static_cast<int>(route)].fetch_add(1, std::memory_order_relaxed);
  }
  // One Exec call ended with `code` after `took` (from its first message to its status).
  void CountExec(absl::StatusCode code, absl::Duration took) {
    execs_[Index(code)].fetch_add(1, std::memory_order_relaxed);
    exec_seconds_.Observe(absl::ToDoubleSeconds(took));
  }

  uint64_t calls(CountedMethod method, int code) const {
    return calls_[static_cast<int>(method)][code].load(std::memory_order_relaxed);
  }
  uint64_t execs(int code) const { return execs_[code].load(std::memory_order_relaxed); }
  uint64_t image_claims(ImageClaimRoute route) const {
    return image_claims_[static_cast<int>(route)].load(std::memory_order_relaxed);
  }
  HistogramSnapshot exec_seconds() const { return exec_seconds_.Snapshot(); }

 private:
  static constexpr int kCodes = 17;
  static int Index(absl::StatusCode code) {
    const int c = static_cast<int>(code);
    return c >= 0 && c < kCodes ? c : static_cast<int>(absl::StatusCode::kUnknown);
  }

  // Relaxed: counters order no other memory.
  std::array<std::array<std::atomic<uint64_t>, kCodes>, kCountedMethods> calls_{};
  std::array<std::atomic<uint64_t>, kCodes> execs_{};
  std::array<std::atomic<uint64_t>, kImageClaimRoutes> image_claims_{};
  AtomicHistogram exec_seconds_;
};

// The store's numbers as src/cmd reads them (the server does not know the store).
struct StoreCounts {
  uint64_t commits = 0;
  uint64_t write_batches = 0;
  uint64_t syncs = 0;
  double committer_busy_seconds = 0;
  double syncer_busy_seconds = 0;
  HistogramSnapshot write_seconds;
  HistogramSnapshot group_commits;
  // Whether the store accepts writes, the free bytes of its file system at its last check
  // (nullopt: unknown, the family is left out) and its reserve.
  bool writable = true;
  std::optional<uint64_t> free_bytes;
  uint64_t min_free_bytes = 0;
};

// Where the numbers come from. Every field is optional (null: those families are left out).
struct MetricsSources {
  // The allocator, read at each scrape (null: none yet, as on a standby until it leads).
  std::function<const allocator::Allocator*()> allocator;
  // Creates in flight per pool (sbx_pool_starting_sandboxes) and refill totals.
  const allocator::RefillReconciler* refill = nullptr;
  std::function<StoreCounts()> store;
  const RequestCounters* requests = nullptr;
  // Claims refused by the tenants' limits (sbx_tenant_limited_total).
  const TenantLimiter* tenants = nullptr;
  // Bytes of local sandboxes' output their bounded logs did not keep
  // (sbx_sandbox_output_dropped_bytes_total); unset without the local runtime.
  std::function<uint64_t()> sandbox_output_dropped;
  // The local runtime's image cache (sbx_image_cache_*); null: none.
  const images::Images* images = nullptr;
  // Snapshots (sbx_snapshot*), read at each scrape; unset or null: none.
  std::function<const allocator::Snapshots*()> snapshots;
  // Further families collected at scrape time (store replication's).
  std::vector<std::shared_ptr<prometheus::Collectable>> extra;
};

// Builds every sbx_* family of sbx-server from `sources` at each Collect (the Kubernetes
// families live in the shared registry instead).
std::shared_ptr<prometheus::Collectable> NewServerCollector(MetricsSources sources);

// Adds sbx_build_info{version,commit} = 1 to `registry`, and the same as upstream's
// agent_sandbox_build_info{git_version,git_commit,compiler,platform}.
void RegisterBuildInfo(prometheus::Registry& registry);

// Why the reconciliation with the runtime at start marked a claim LOST.
inline constexpr char kLostSandboxMissing[] = "sandbox_missing";  // the runtime lacks it
// Adds sbx_claims_lost_at_restart_total{reason} to `registry`: the acknowledged claims
// that the reconciliation with the runtime after this start marked LOST, by reason (every
// reason of `lost` and kLostSandboxMissing, 0 when absent). Called once, at start.
void RegisterClaimsLostAtRestart(prometheus::Registry& registry,
                                 const std::map<std::string, uint64_t>& lost);
// sbx_start_sandboxes_kept{reason}: sandboxes the start's reconciliation found running
// but unknown to the store and did not delete: "claimed" (held by a claim the runtime
// records, adopted) and "over_delete_limit" (more unknown ones than the start may delete
// without --start_confirm_deletes).
void RegisterStartSandboxesKept(prometheus::Registry& registry, uint64_t claimed,
                                uint64_t over_limit);

// The HTTP endpoint: serves `registry` (the Kubernetes client's and controllers' metrics,
// build info) and the server collector together on GET /metrics.
class MetricsEndpoint {
 public:
  // Binds and serves. Errors: INVALID_ARGUMENT for bad options, UNAVAILABLE when the
  // address cannot be bound, INTERNAL when the port file cannot be written.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const MetricsOptions& options, std::shared_ptr<prometheus::Registry> registry,
      MetricsSources sources);
  ~MetricsEndpoint();

  int port() const { return port_; }

 private:
  MetricsEndpoint() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> collector_;
  std::vector<std::shared_ptr<prometheus::Collectable>> extra_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace sbx::server

#pragma once
// FleetRuntime: one Runtime in front of several clusters' runtimes (docs/kubernetes.md,
// "Fleet"). The allocator, the refill reconciler and the server see one runtime; each
// Create is placed on a cluster by the fleet's placement policy (fleet_placement.h), and
// every other call goes to the cluster that the sandbox id names.
//
// Ids: a sandbox of the home cluster (clusters[0]) keeps the id its own runtime gives it,
// so that a one-cluster store stays valid; a sandbox of cluster "east" is "east:<its id>"
// (':' never occurs in a Kubernetes name or namespace). Its node becomes "east:<node>", so
// that node-keyed selection policies count nodes of different clusters apart. Every
// sandbox carries the node label kClusterLabel=<cluster name>, which a claim's
// node_preference can ask for.
//
// Members: per cluster and pool, the fleet counts the sandboxes that exist or are being
// made (warm and claimed); a create takes a place at once and gives it back when it fails,
// a Delete (OK or NOT_FOUND) and a gone report (Gone) give it back; List recounts. Per
// cluster, the creates answered ready over the last `rate_window` give its measured create
// rate, which the weighted policy reads: 1 / their mean time from Create to ready (the
// creates per second one create slot achieves there). Not completions per second, which
// grow with the creates the placement sends and would feed back on it.
//
// Thread-safety: every method may be called from any thread. Callbacks run on the
// clusters' runtimes' threads, never under the fleet's lock.
// Lifetime: the clusters' runtimes must outlive the fleet runtime, and their pending
// callbacks must have run before it goes (shut them down first).

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/common/clock.h"
#include "src/k8s/fleet_placement.h"
#include "src/runtime/runtime.h"

namespace sbx::k8s {

// The node label every sandbox of a fleet carries: the name of its cluster.
inline constexpr char kClusterLabel[] = "sbx.dev/cluster";

struct FleetCluster {
  // A DNS-1123 label (ValidateName), unique in the fleet.
  std::string name;
  // Not owned; must outlive the fleet runtime.
  runtime::Runtime* runtime = nullptr;
  // Per pool: members kept here at least / at most (0: no maximum); the weight (> 0).
  int64_t min = 0;
  int64_t max = 0;
  double weight = 1;
  // Whether the cluster may take creates now (a lost cluster does not: FleetHealth); null:
  // always. Called under the fleet's lock: it must not block or call into the fleet.
  std::function<bool()> healthy = nullptr;
};

struct FleetRuntimeOptions {
  // The home cluster first (its ids are not prefixed), then the others.
  std::vector<FleetCluster> clusters;
  FleetPlacement placement = FleetPlacement::kSpread;
  // The window of the measured create rate.
  absl::Duration rate_window = absl::Minutes(1);
  // A cluster whose create failed for a reason of its own (UNAVAILABLE, RESOURCE_EXHAUSTED,
  // DEADLINE_EXCEEDED, INTERNAL, UNKNOWN, ABORTED) takes no creates for this long, doubled
  // at each failure in a row up to max_failure_backoff, until one succeeds: without it, a
  // cluster that refuses at once would be placed again at once (it has the fewest members).
  absl::Duration failure_backoff = absl::Milliseconds(500);
  absl::Duration max_failure_backoff = absl::Seconds(30);
  // The real clock when null; must outlive the runtime.
  const Clock* clock = nullptr;

  // INVALID_ARGUMENT naming the cluster and what is wrong (no cluster, a bad or repeated
  // name, no runtime, weight <= 0, min or max < 0, min > max).
  [[nodiscard]] absl::Status Validate() const;
};

// What the fleet knows of one cluster (for logs, metrics and tests).
struct FleetClusterState {
  std::string name;
  // Members (existing or being made) by pool.
  std::map<std::string, int64_t> members;
  // 1 / the mean time from Create to ready of the creates answered over the last
  // rate_window (0: none).
  double create_rate = 0;
  // Failed creates in a row, and until when the cluster takes none (InfinitePast: now).
  int failures = 0;
  absl::Time backoff_until = absl::InfinitePast();
};

class FleetRuntime final : public runtime::Runtime {
 public:
  // Options must be valid (Validate).
  explicit FleetRuntime(FleetRuntimeOptions options);

  void Create(runtime::CreateRequest request, runtime::CreateCallback done) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Delete(std::string id, runtime::DeleteCallback done) override ABSL_LOCKS_EXCLUDED(mu_);
  void Suspend(std::string id, runtime::DoneCallback done) override;
  void Resume(std::string id, runtime::ResumeCallback done) override;
  // The union of the clusters' lists, in fleet ids; UNAVAILABLE naming the cluster when
  // one of them cannot answer (absence cannot be told then).
  [[nodiscard]] absl::StatusOr<std::vector<runtime::SandboxInfo>> List() override
      ABSL_LOCKS_EXCLUDED(mu_);

  // A sandbox of cluster `cluster` (its index) whose runtime reported it gone, by that
  // runtime's id: forgets it and answers its fleet id (for the allocator's SandboxGone).
  std::string Gone(size_t cluster, const std::string& local_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The fleet id of `local_id` of cluster `cluster`.
  std::string FleetId(size_t cluster, const std::string& local_id) const;
  // The cluster (index) and that cluster's id of fleet id `id`; NOT_FOUND naming the id
  // when its prefix names no cluster of the fleet.
  [[nodiscard]] absl::StatusOr<std::pair<size_t, std::string>> Route(const std::string& id) const;

  std::vector<FleetClusterState> State() const ABSL_LOCKS_EXCLUDED(mu_);
  // The fleet ids of the members of cluster `cluster` (index) reported ready or listed and
  // not gone since, warm or claimed.
  std::vector<std::string> MembersOf(size_t cluster) const ABSL_LOCKS_EXCLUDED(mu_);
  const FleetRuntimeOptions& options() const { return options_; }

 private:
  // A create answered ready: when, and how long after it was asked.
  struct Answered {
    absl::Time at;
    absl::Duration took;
  };
  struct Member {
    size_t cluster = 0;
    std::string pool;
  };
  // The sandbox `info` of cluster `cluster` in fleet terms.
  runtime::SandboxInfo ToFleet(size_t cluster, runtime::SandboxInfo info) const;
  void ReleaseLocked(size_t cluster, const std::string& pool) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForgetLocked(const std::string& fleet_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double RateLocked(size_t cluster, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double RateOfLocked(const std::deque<Answered>& answered, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FleetRuntimeOptions options_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  // Per cluster, per pool: members existing or being made.
  std::vector<absl::flat_hash_map<std::string, int64_t>> counts_ ABSL_GUARDED_BY(mu_);
  // Members reported ready (or listed), by fleet id.
  absl::flat_hash_map<std::string, Member> members_ ABSL_GUARDED_BY(mu_);
  // Per cluster: when its creates were answered ready, and how long each took, within
  // rate_window.
  std::vector<std::deque<Answered>> ready_times_ ABSL_GUARDED_BY(mu_);
  // Per cluster: failed creates in a row, and until when it takes none.
  std::vector<int> failures_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> backoff_until_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::k8s

#pragma once
// FleetHealth: whether one cluster of a fleet answers (docs/kubernetes.md, "Fleet", a lost
// cluster). A thread probes the cluster every `interval` (the probe is given: an API request
// with a short timeout and no retries); the cluster is healthy while its last successful
// probe is at most `bound` old, so a probe that hangs counts against it as it hangs. Each
// change (healthy to excluded, and back) is reported once to `on_change`, from the probe
// thread.
//
// Thread-safety: Healthy() from any thread. Start/Stop from one thread.
// Lifetime: Stop (or the destructor) joins the thread; the probe and on_change must stay
// valid until then.

#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/common/clock.h"

namespace sbx::k8s {

struct FleetHealthOptions {
  // One request to the cluster; OK when it answered.
  std::function<absl::Status()> probe;
  // Excluded once no probe has succeeded for this long.
  absl::Duration bound = absl::Seconds(15);
  absl::Duration interval = absl::Seconds(1);
  // Called with false when the cluster is excluded, true when it answers again.
  std::function<void(bool healthy, const absl::Status& last_error)> on_change;
  // The real clock when null; must outlive the FleetHealth.
  const Clock* clock = nullptr;

  // INVALID_ARGUMENT naming what is wrong (no probe, bound or interval not > 0, interval
  // above bound).
  [[nodiscard]] absl::Status Validate() const;
};

class FleetHealth {
 public:
  // Options must be valid. Healthy from construction (the cluster answered at start).
  explicit FleetHealth(FleetHealthOptions options);
  ~FleetHealth();
  FleetHealth(const FleetHealth&) = delete;
  FleetHealth& operator=(const FleetHealth&) = delete;

  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the last successful probe is at most `bound` old.
  bool Healthy() const ABSL_LOCKS_EXCLUDED(mu_);
  // Probes once and reports a change (the thread's step, for tests with a fake clock).
  void ProbeOnce() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const FleetHealthOptions options_;
  const Clock* const clock_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_ok_ ABSL_GUARDED_BY(mu_);
  // What on_change was last told.
  bool reported_healthy_ ABSL_GUARDED_BY(mu_) = true;
  absl::Status last_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::k8s

#pragma once
// ReconcileMetrics: one controller's reconciles and work queue under controller-runtime's
// metric names, which upstream's controller exports and its dashboards and load-test
// recipes read: controller_runtime_reconcile_total{controller,result} (result: success,
// error, requeue, requeue_after; all four exported from the start, at 0, as
// controller-runtime does) and workqueue_depth{name}. The controller names are
// upstream's: "sandbox", "sandboxclaim", "sandboxtemplate", "sandboxwarmpool" (the
// lower-case kind each reconciles, controller-runtime's default name).
//
// Thread-safety: all methods may be called from any thread (prometheus-cpp metrics are).
// Lifetime: the registry must outlive this object.

#include <cstddef>
#include <memory>
#include <string>

namespace prometheus {
class Counter;
class Gauge;
class Registry;
}  // namespace prometheus

namespace sbx::k8s {

inline constexpr char kSandboxControllerName[] = "sandbox";
inline constexpr char kClaimControllerName[] = "sandboxclaim";
inline constexpr char kTemplateControllerName[] = "sandboxtemplate";
inline constexpr char kWarmPoolControllerName[] = "sandboxwarmpool";

class ReconcileMetrics {
 public:
  enum class Result { kSuccess, kError, kRequeue, kRequeueAfter };

  // Registers (or joins) the two families in `registry` for `controller`.
  ReconcileMetrics(prometheus::Registry& registry, const std::string& controller);

  // One reconcile ended with `result`.
  void Reconciled(Result result);
  // Keys waiting in the controller's queue now.
  void SetDepth(size_t depth);

 private:
  prometheus::Counter* results_[4];
  prometheus::Gauge* depth_;
};

}  // namespace sbx::k8s

#include "src/k8s/controller_metrics.h"

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace sbx::k8s {

ReconcileMetrics::ReconcileMetrics(prometheus::Registry& registry, const std::string& controller) {
  auto& reconciles = prometheus::BuildCounter()
                         .Name("controller_runtime_reconcile_total")
                         .Help("Total number of reconciliations per controller")
                         .Register(registry);
  const char* kResults[] = {"success", "error", "requeue", "requeue_after"};
  for (int i = 0; i < 4; ++i) {
    results_[i] = &reconciles.Add({{"controller", controller}, {"result", kResults[i]}});
  }
  depth_ = &prometheus::BuildGauge()
                .Name("workqueue_depth")
                .Help("Current depth of workqueue")
                .Register(registry)
                .Add({{"name", controller}});
}

void ReconcileMetrics::Reconciled(Result result) {
  results_[static_cast<int>(result)]->Increment();
}

void ReconcileMetrics::SetDepth(size_t depth) { depth_->Set(static_cast<double>(depth)); }

}  // namespace sbx::k8s

// controller-runtime's metric names for sbx's controllers (src/k8s/controller_metrics.h),
// read back from a real prometheus::Registry as /metrics would show them.

#include "src/k8s/controller_metrics.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace sbx::k8s {
namespace {

// family name -> "label=value,..." -> value, for every sample of `registry`.
std::map<std::string, std::map<std::string, double>> Samples(prometheus::Registry& registry) {
  std::map<std::string, std::map<std::string, double>> out;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    for (const prometheus::ClientMetric& m : family.metric) {
      std::string labels;
      for (const auto& l : m.label) labels += (labels.empty() ? "" : ",") + l.name + "=" + l.value;
      out[family.name][labels] =
          family.type == prometheus::MetricType::Gauge ? m.gauge.value : m.counter.value;
    }
  }
  return out;
}

TEST(ReconcileMetricsTest, UpstreamsNamesAndLabelsEveryResultFromZero) {
  prometheus::Registry registry;
  ReconcileMetrics sandbox(registry, kSandboxControllerName);
  ReconcileMetrics claims(registry, kClaimControllerName);
  sandbox.Reconciled(ReconcileMetrics::Result::kSuccess);
  sandbox.Reconciled(ReconcileMetrics::Result::kSuccess);
  sandbox.Reconciled(ReconcileMetrics::Result::kError);
  claims.Reconciled(ReconcileMetrics::Result::kRequeueAfter);
  sandbox.SetDepth(3);
  auto samples = Samples(registry);
  const auto& total = samples["controller_runtime_reconcile_total"];
  EXPECT_EQ(total.at("controller=sandbox,result=success"), 2);
  EXPECT_EQ(total.at("controller=sandbox,result=error"), 1);
  EXPECT_EQ(total.at("controller=sandbox,result=requeue"), 0);
  EXPECT_EQ(total.at("controller=sandbox,result=requeue_after"), 0);
  EXPECT_EQ(total.at("controller=sandboxclaim,result=requeue_after"), 1);
  EXPECT_EQ(total.at("controller=sandboxclaim,result=success"), 0);
  EXPECT_EQ(total.size(), 8u);
  EXPECT_EQ(samples["workqueue_depth"].at("name=sandbox"), 3);
  EXPECT_EQ(samples["workqueue_depth"].at("name=sandboxclaim"), 0);
}

// Upstream's controllers are named after the kind each reconciles (controller-runtime's
// default: no Named() in its SetupWithManager).
TEST(ReconcileMetricsTest, ControllerNamesAreUpstreams) {
  EXPECT_STREQ(kSandboxControllerName, "sandbox");
  EXPECT_STREQ(kClaimControllerName, "sandboxclaim");
  EXPECT_STREQ(kTemplateControllerName, "sandboxtemplate");
  EXPECT_STREQ(kWarmPoolControllerName, "sandboxwarmpool");
}

}  // namespace
}  // namespace sbx::k8s

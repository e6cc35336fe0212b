// KubeRuntime::List against the API emulator: what a restart of sbx-server takes for the
// sandboxes that exist. The reconciliation after a restart marks every claim whose
// sandbox List leaves out LOST, so List must report existence (Ready or not) and must
// not answer from a cache that has not completed a list.

#include "src/k8s/kube_runtime.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/k8s/informer.h"
#include "src/k8s/write_scheduler.h"
#include "tests/k8s/test_emulator.h"

namespace sbx::k8s {
namespace {

// A member of pool "py" as KubeRuntime makes them (the labels that matter here).
Json Member(const std::string& name, const std::string& pool = "py") {
  Json labels = Json::object();
  if (!pool.empty()) labels[kSbxPoolLabel] = pool;
  return {{"metadata", {{"name", name}, {"labels", labels}}},
          {"spec",
           {{"podTemplate",
             {{"spec", {{"containers", {{{"name", "main"}, {"image", "python:3.12-slim"}}}}}}}}}}};
}

Json Condition(const std::string& type, const std::string& status, const std::string& reason) {
  return {{"type", type},
          {"status", status},
          {"reason", reason},
          {"message", reason},
          {"lastTransitionTime", "2026-01-01T00:00:00Z"}};
}

class KubeRuntimeListTest : public ::testing::Test {
 protected:
  void SetUp() override {
    emulator_ = std::make_unique<testing::TestEmulator>();
    ASSERT_TRUE(emulator_->ok());
    ClientOptions client_options;
    // Faults are not retried for long: an informer under a 100% 500 rate keeps failing.
    client_options.retry_max_backoff = absl::Milliseconds(50);
    client_ = *Client::Create(emulator_->Cluster(), client_options);
    ASSERT_NO_FATAL_FAILURE(testing::InstallCrds(*client_));
  }
  void TearDown() override {
    runtime_.reset();
    for (auto& informer : informers_) informer->Stop();
    writes_.reset();
  }

  void Create(const Json& sandbox, const Json& status = nullptr) {
    ASSERT_TRUE(client_->Create(kSandboxes, "default", sandbox).ok());
    if (status.is_null()) return;
    absl::StatusOr<Json> patched =
        client_->Patch(kSandboxes, "default", sandbox["metadata"]["name"], PatchType::kMerge,
                       Json{{"status", status}}, "status");
    ASSERT_TRUE(patched.ok()) << patched.status();
  }

  // Starts the informers and the runtime, as sbx-server does after a restart (without
  // waiting for the caches: List must).
  void StartRuntime(absl::Duration list_sync_timeout) {
    for (const Resource* r : {&kSandboxes, &kSandboxWarmPools, &kSandboxTemplates}) {
      informers_.push_back(
          std::make_unique<Informer>(client_.get(), NamespaceInformer(*r, "default")));
      informers_.back()->Start();
    }
    writes_ = std::make_unique<WriteScheduler>(WriteSchedulerOptions{});
    KubeRuntimeOptions options;
    options.list_sync_timeout = list_sync_timeout;
    runtime_ = std::make_unique<KubeRuntime>(client_.get(), writes_.get(), informers_[0].get(),
                                             informers_[1].get(), informers_[2].get(), options);
  }

  std::vector<std::string> ListedIds() {
    absl::StatusOr<std::vector<runtime::SandboxInfo>> listed = runtime_->List();
    EXPECT_TRUE(listed.ok()) << listed.status();
    std::vector<std::string> ids;
    if (!listed.ok()) return ids;
    for (const runtime::SandboxInfo& info : *listed) ids.push_back(info.id);
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  std::unique_ptr<testing::TestEmulator> emulator_;
  std::unique_ptr<Client> client_;
  std::vector<std::unique_ptr<Informer>> informers_;
  std::unique_ptr<WriteScheduler> writes_;
  std::unique_ptr<KubeRuntime> runtime_;
};

// Failed at 0045959: List skipped every Sandbox that was not Ready with a pod IP, so a
// claimed member whose status was momentarily not Ready (a reconcile error written under
// API faults, a pod being replaced) counted as gone and its claim became LOST.
TEST_F(KubeRuntimeListTest, ListsSandboxesThatExistWhetherReadyOrNot) {
  const Json ready = {{"conditions", {Condition("Ready", "True", "DependenciesReady")}},
                      {"podIPs", {"10.0.0.7"}}};
  const Json not_ready = {{"conditions", {Condition("Ready", "False", "ReconcilerError")}},
                          {"podIPs", {"10.0.0.8"}}};
  const Json finished = {
      {"conditions",
       {Condition("Ready", "False", "PodFailed"), Condition("Finished", "True", "PodFailed")}},
      {"podIPs", {"10.0.0.9"}}};
  ASSERT_NO_FATAL_FAILURE(Create(Member("py-ready"), ready));
  ASSERT_NO_FATAL_FAILURE(Create(Member("py-not-ready"), not_ready));
  ASSERT_NO_FATAL_FAILURE(Create(Member("py-no-status")));  // pod not made or not seen yet
  ASSERT_NO_FATAL_FAILURE(Create(Member("py-finished"), finished));
  ASSERT_NO_FATAL_FAILURE(Create(Member("not-sbx", /*pool=*/""), ready));
  StartRuntime(absl::Seconds(20));

  EXPECT_EQ(ListedIds(), (std::vector<std::string>{"py-no-status", "py-not-ready", "py-ready"}));
  absl::StatusOr<std::vector<runtime::SandboxInfo>> listed = runtime_->List();
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const runtime::SandboxInfo& info : *listed) {
    EXPECT_EQ(info.pool, "py") << info.id;
    EXPECT_EQ(info.ready, info.id == "py-ready") << info.id;
    if (info.id == "py-no-status") EXPECT_EQ(info.endpoint, "");
    if (info.id == "py-not-ready") EXPECT_EQ(info.endpoint, "10.0.0.8");
  }
}

// Failed at 0045959: List answered from whatever the cache held, so before the first
// complete list (the API server failing every LIST) it answered an empty list, and every
// stored sandbox counted as gone.
TEST_F(KubeRuntimeListTest, FailsUntilTheCacheHasCompletedAList) {
  ASSERT_NO_FATAL_FAILURE(
      Create(Member("py-a"), {{"conditions", {Condition("Ready", "True", "DependenciesReady")}},
                              {"podIPs", {"10.0.0.7"}}}));
  emulator_->SetFaults({{"errors", {{"500", 1.0}}}});
  StartRuntime(absl::Milliseconds(300));

  absl::StatusOr<std::vector<runtime::SandboxInfo>> listed = runtime_->List();
  EXPECT_TRUE(absl::IsUnavailable(listed.status())) << listed.status();

  emulator_->ClearFaults();
  ASSERT_TRUE(informers_[0]->WaitForSync(absl::Seconds(30)));
  EXPECT_EQ(ListedIds(), (std::vector<std::string>{"py-a"}));
}

}  // namespace
}  // namespace sbx::k8s

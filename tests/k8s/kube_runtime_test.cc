// KubeRuntime against the API emulator. List: what a restart of sbx-server takes for the
// sandboxes that exist (the reconciliation after a restart marks every claim whose
// sandbox List leaves out LOST, so List must report existence, Ready or not, and must not
// answer from a cache that has not completed a list). Create: how a new member's
// readiness reaches the Create callback (which hands it to the allocator) when the
// Sandbox watch keeps breaking, and the lag metric of that hand-over.

#include "src/k8s/kube_runtime.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
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

using ::sbx::k8s::testing::InstallCrds;
using ::sbx::k8s::testing::MarkSandboxReady;
using ::sbx::k8s::testing::TestEmulator;

// The sample count of sbx_k8s_member_ready_to_warm_seconds in `registry` (-1: absent).
int64_t ReadyToWarmCount(prometheus::Registry& registry) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != "sbx_k8s_member_ready_to_warm_seconds") continue;
    int64_t count = 0;
    for (const prometheus::ClientMetric& m : family.metric) count += m.histogram.sample_count;
    return count;
  }
  return -1;
}

// Issue 23. A member turns Ready after 20 other changes of Sandboxes, while every watch
// event cuts its stream (the emulator's watch_drop_rate 1). Its create must complete soon
// after. Before the informer fix (0045959) the informer slept after each cut stream,
// longer each time up to 10 s, so the Ready event came more than a minute later and the
// wait below (30 s) failed; now it comes in well under a second.
TEST(KubeRuntimeTest, MemberReadyWhileTheWatchBreaksIsHandedOverSoon) {
  TestEmulator emulator({"--bookmark_interval_ms", "100000"});
  ASSERT_TRUE(emulator.ok());
  auto client = *Client::Create(emulator.Cluster());
  InstallCrds(*client);
  ASSERT_TRUE(
      client
          ->Create(
              kSandboxTemplates, "default",
              {{"metadata", {{"name", "python"}}},
               {"spec",
                {{"podTemplate",
                  {{"spec",
                    {{"containers", {{{"name", "main"}, {"image", "python:3.12-slim"}}}}}}}}}}})
          .ok());
  ASSERT_TRUE(
      client
          ->Create(kSandboxWarmPools, "default",
                   {{"metadata", {{"name", "py"}}},
                    {"spec", {{"replicas", 1}, {"sandboxTemplateRef", {{"name", "python"}}}}}})
          .ok());

  // Production informer options (backoff 100 ms doubling to 10 s).
  Informer sandboxes(client.get(), NamespaceInformer(kSandboxes, "default"));
  Informer pools(client.get(), NamespaceInformer(kSandboxWarmPools, "default"));
  Informer templates(client.get(), NamespaceInformer(kSandboxTemplates, "default"));
  WriteScheduler writes(WriteSchedulerOptions{});
  // What the create answered (declared before the runtime, which may answer as it goes).
  absl::Mutex mu;
  absl::StatusOr<runtime::SandboxInfo> result = absl::UnknownError("not called");
  absl::Notification done;
  auto registry = std::make_shared<prometheus::Registry>();
  KubeRuntimeOptions options;
  options.registry = registry;
  KubeRuntime runtime(client.get(), &writes, &sandboxes, &pools, &templates, options);
  InformerHandler feed;
  feed.on_add = [&runtime](const ObjectPtr& o) { runtime.OnSandbox(o); };
  feed.on_update = [&runtime](const ObjectPtr&, const ObjectPtr& o) { runtime.OnSandbox(o); };
  feed.on_delete = [&runtime](const ObjectPtr& o) { runtime.OnSandboxDeleted(o); };
  sandboxes.AddHandler(std::move(feed));
  // However the test ends: no handler runs once the runtime goes, nor any write.
  struct StopAll {
    std::function<void()> stop;
    ~StopAll() { stop(); }
  } stop_all{[&] {
    for (Informer* informer : {&sandboxes, &pools, &templates}) informer->Stop();
    runtime.Shutdown();
    writes.Stop();
  }};
  for (Informer* informer : {&sandboxes, &pools, &templates}) {
    informer->Start();
    ASSERT_TRUE(informer->WaitForSync(absl::Seconds(10)));
  }
  EXPECT_EQ(ReadyToWarmCount(*registry), 0);  // registered before any member

  runtime::CreateRequest request;
  request.pool = "py";
  runtime.Create(request, [&](absl::StatusOr<runtime::SandboxInfo> info) {
    absl::MutexLock lock(&mu);
    result = std::move(info);
    if (!done.HasBeenNotified()) done.Notify();
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (runtime.pending() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(runtime.pending(), 1u);
  absl::StatusOr<ListResult> members = client->List(kSandboxes, "default");
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->items.size(), 1u);
  const std::string name = members->items[0]["metadata"]["name"];
  ASSERT_TRUE(runtime.IsPending(name));

  emulator.SetFaults({{"watch_drop_rate", 1.0}});
  for (int i = 1; i <= 20; ++i) {
    ASSERT_TRUE(client
                    ->Patch(kSandboxes, "default", name, PatchType::kMerge,
                            {{"metadata", {{"annotations", {{"n", absl::StrCat(i)}}}}}})
                    .ok());
  }
  ASSERT_TRUE(MarkSandboxReady(*client, "default", name, "10.0.0.7").ok());
  const absl::Time ready = absl::Now();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "the member's create did not complete within 30 s of its Ready";
  const absl::Duration lag = absl::Now() - ready;
  EXPECT_LT(lag, absl::Seconds(5)) << "handed over " << lag << " after Ready";
  {
    absl::MutexLock lock(&mu);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->id, name);
    EXPECT_EQ(result->pool, "py");
    EXPECT_EQ(result->endpoint, "10.0.0.7");
  }
  EXPECT_EQ(ReadyToWarmCount(*registry), 1);
  EXPECT_GE(sandboxes.stats().watches, 21);  // every change cut its stream
}

}  // namespace
}  // namespace sbx::k8s

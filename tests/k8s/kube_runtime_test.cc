// KubeRuntime against the API emulator: how a new member's readiness reaches the Create
// callback (which hands it to the allocator) when the Sandbox watch keeps breaking, and
// the lag metric of that hand-over.

#include "src/k8s/kube_runtime.h"

#include <functional>
#include <memory>
#include <string>

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

using ::sbx::k8s::testing::InstallCrds;
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
  // Ready, as the Sandbox controller writes it.
  const std::string now = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  ASSERT_TRUE(client
                  ->Patch(kSandboxes, "default", name, PatchType::kMerge,
                          {{"status",
                            {{"conditions",
                              {{{"type", "Ready"},
                                {"status", "True"},
                                {"reason", "DependenciesReady"},
                                {"message", "the pod is ready"},
                                {"lastTransitionTime", now}}}},
                             {"podIPs", {"10.0.0.7"}}}}},
                          "status")
                  .ok());
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

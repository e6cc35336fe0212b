// WarmPoolController against the API emulator, with a real allocator (memory store) and
// KubeRuntime: how its clean-up of untracked members treats a member that becomes warm
// while a pass runs.

#include "src/k8s/warm_pool_controller.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "src/common/clock.h"
#include "src/common/ids.h"
#include "src/k8s/informer.h"
#include "src/k8s/kube_runtime.h"
#include "src/k8s/write_scheduler.h"
#include "src/store/memory_store.h"
#include "tests/allocator/fakes.h"
#include "tests/k8s/test_emulator.h"

namespace sbx::k8s {
namespace {

using ::sbx::k8s::testing::InstallCrds;
using ::sbx::k8s::testing::TestEmulator;

// Polls `done` every 5 ms for at most `timeout`.
bool Eventually(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

bool Contains(const std::vector<std::string>& ids, const std::string& id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Issue 23. A member that turns Ready slowly (older than orphan_grace, as under API
// faults) and is handed to the allocator while a pass of the controller runs, after the
// pass read which sandboxes the allocator tracks and before it looked at the member. The
// pass must not delete it as "tracked by nobody": the allocator holds it warm and would
// hand it to a claim. Before the second look at the allocator, it was deleted here
// (orphan_grace 0 stands for "old enough").
TEST(WarmPoolControllerTest, AMemberTurningWarmDuringAPassIsNotDeletedAsUntracked) {
  TestEmulator emulator;
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

  Informer sandboxes(client.get(), NamespaceInformer(kSandboxes, "default"));
  WriteScheduler writes(WriteSchedulerOptions{});
  std::atomic<bool> armed{false};
  std::function<void()> on_snapshot;  // set below, once the member exists
  absl::Notification hook_ran;
  WarmPoolControllerOptions controller_options;
  controller_options.workers = 1;
  controller_options.resync = absl::Seconds(10);  // (Stop waits up to a hundredth of it)
  controller_options.orphan_grace = absl::ZeroDuration();
  const std::thread::id test_thread = std::this_thread::get_id();
  controller_options.after_tracked_snapshot = [&] {
    // Only in the pass this test runs (workers and the resync make passes too).
    if (std::this_thread::get_id() != test_thread || !armed.exchange(false)) return;
    on_snapshot();
    hook_ran.Notify();
  };
  WarmPoolController controller(client.get(), &sandboxes, controller_options);
  KubeRuntime runtime(client.get(), &writes, &sandboxes, &controller.pools(),
                      &controller.templates(), KubeRuntimeOptions{});
  InformerHandler feed;
  feed.on_add = [&runtime](const ObjectPtr& o) { runtime.OnSandbox(o); };
  feed.on_update = [&runtime](const ObjectPtr&, const ObjectPtr& o) { runtime.OnSandbox(o); };
  feed.on_delete = [&runtime](const ObjectPtr& o) { runtime.OnSandboxDeleted(o); };
  sandboxes.AddHandler(std::move(feed));

  store::MemoryStore store;
  allocator::testing::RecordingReconciler reconciler;
  SequentialIdGenerator ids{"c-"};
  auto created = allocator::Allocator::Create(allocator::AllocatorOptions{}, &store, &runtime,
                                              &reconciler, &Clock::Real(), &ids);
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<allocator::Allocator> alloc = std::move(*created);
  // However the test ends: nothing runs once the allocator and runtime go.
  struct StopAll {
    std::function<void()> stop;
    ~StopAll() { stop(); }
  } stop_all{[&] {
    controller.Stop();
    sandboxes.Stop();
    runtime.Shutdown();
    writes.Stop();
  }};
  sandboxes.Start();
  ASSERT_TRUE(sandboxes.WaitForSync(absl::Seconds(10)));
  ASSERT_TRUE(controller.StartInformers(absl::Seconds(10)).ok());
  controller.Start(alloc.get(), &runtime);
  ASSERT_TRUE(Eventually([&] { return alloc->GetPool("py").ok(); }, absl::Seconds(10)))
      << "the controller did not make the allocator pool";

  // A member, created as the refill does (its create callback hands it to the allocator).
  runtime::CreateRequest request;
  request.pool = "py";
  runtime.Create(request, [&](absl::StatusOr<runtime::SandboxInfo> info) {
    if (info.ok()) EXPECT_TRUE(alloc->AddSandbox(*info).ok());
  });
  ASSERT_TRUE(Eventually([&] { return runtime.pending() == 1; }, absl::Seconds(10)));
  absl::StatusOr<ListResult> members = client->List(kSandboxes, "default");
  ASSERT_TRUE(members.ok()) << members.status();
  ASSERT_EQ(members->items.size(), 1u);
  const std::string name = members->items[0]["metadata"]["name"];

  // During the next pass, right after its snapshot of the allocator: the member turns
  // Ready (as the Sandbox controller writes it) and the allocator takes it warm.
  on_snapshot = [&] {
    const std::string now =
        absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
    EXPECT_TRUE(client
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
    EXPECT_TRUE(Eventually(
        [&] { return !runtime.InPassage(name) && Contains(alloc->ListSandboxIds(), name); },
        absl::Seconds(10)))
        << "the member was not handed to the allocator";
  };
  armed = true;
  ASSERT_TRUE(controller.Reconcile("py").ok());
  ASSERT_TRUE(hook_ran.HasBeenNotified());

  absl::StatusOr<Json> member = client->Get(kSandboxes, "default", name);
  ASSERT_TRUE(member.ok()) << "the warm member was deleted: " << member.status();
  EXPECT_TRUE((*member)["metadata"]["deletionTimestamp"].is_null())
      << "the warm member is being deleted";
  absl::StatusOr<allocator::PoolStatus> st = alloc->GetPoolStatus("py");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->warm, 1);
}

}  // namespace
}  // namespace sbx::k8s

// The Sandbox controller against the API emulator, for what kubectl users cannot easily
// arrange: a pod or PVC of the same name that belongs to someone else, a PVC of an earlier
// Sandbox of the same name still being deleted, several pods of one Sandbox, and the write
// count of a steady Sandbox. (tests/e2e/k8s_sandbox_test.py drives
// the user-facing behaviour with kubectl through sbx-server.)
//
// No test sleeps to let time pass: the status hold runs on a FakeClock that the tests
// move, and "nothing more was written" is asserted only once the controller has acted on
// the last change (its informer has handled that change's resourceVersion and its queue
// is idle).

#include "src/k8s/sandbox_controller.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "src/common/clock.h"
#include "src/k8s/informer.h"
#include "src/k8s/json_fields.h"
#include "src/k8s/sandbox_objects.h"
#include "tests/k8s/test_emulator.h"

namespace sbx::k8s {
namespace {

using json_fields::Field;
using json_fields::Str;

Json SandboxObject(const std::string& name) {
  return {{"metadata", {{"name", name}}},
          {"spec",
           {{"podTemplate",
             {{"spec", {{"containers", {{{"name", "main"}, {"image", "python:3.12-slim"}}}}}}}}}}};
}

// SandboxObject with one volumeClaimTemplates entry, "data": its PVC is "data-<name>".
Json SandboxWithVolume(const std::string& name) {
  Json sandbox = SandboxObject(name);
  sandbox["spec"]["volumeClaimTemplates"] = {
      {{"metadata", {{"name", "data"}}},
       {"spec",
        {{"accessModes", {"ReadWriteOnce"}},
         {"resources", {{"requests", {{"storage", "1Gi"}}}}}}}}};
  return sandbox;
}

// The Sandbox's status condition of `type` (null when absent).
Json Condition(Client& client, const std::string& name, const std::string& type) {
  absl::StatusOr<Json> sandbox = client.Get(kSandboxes, "default", name);
  if (!sandbox.ok() || !sandbox->contains("status")) return nullptr;
  for (const Json& c : (*sandbox)["status"].value("conditions", Json::array())) {
    if (c["type"] == type) return c;
  }
  return nullptr;
}

std::string ReadyReason(Client& client, const std::string& name) {
  const Json ready = Condition(client, name, "Ready");
  return ready.is_null() ? "" : ready.value("reason", "");
}

bool WaitForReason(Client& client, const std::string& name, const std::string& reason) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    if (ReadyReason(client, name) == reason) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// Polls (at most 20 s) until the Ready condition of `name` has `reason` and a message
// containing `text`; returns the last Ready condition seen.
Json WaitForReady(Client& client, const std::string& name, const std::string& reason,
                  const std::string& text) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  Json ready;
  while (absl::Now() < deadline) {
    ready = Condition(client, name, "Ready");
    if (!ready.is_null() && ready.value("reason", "") == reason &&
        ready.value("message", "").find(text) != std::string::npos) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return ready;
}

// Polls (at most 20 s) until `name` is gone from the API.
bool WaitGone(Client& client, const Resource& resource, const std::string& name) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline) {
    if (absl::IsNotFound(client.Get(resource, "default", name).status())) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// Every pod and PVC of "default" created while it runs, as its own informers see them:
// what it is, its controller's uid and its resourceVersion at creation (the emulator
// numbers its writes in commit order, as etcd does, so two creations compare by it).
class CreationLog {
 public:
  struct Creation {
    std::string what;  // "pod" or "pvc"
    std::string controller_uid;
    uint64_t version = 0;
    bool operator<(const Creation& other) const { return version < other.version; }
  };

  explicit CreationLog(Client* client)
      : pods_(client, NamespaceInformer(kPods, "default")),
        pvcs_(client, NamespaceInformer(kPersistentVolumeClaims, "default")) {
    for (auto [informer, what] : {std::pair{&pods_, "pod"}, std::pair{&pvcs_, "pvc"}}) {
      InformerHandler handler;
      handler.on_add = [this, what = what](const ObjectPtr& o) {
        Creation c{what, ControllerUid(*o), 0};
        EXPECT_TRUE(absl::SimpleAtoi(Str(Field(*o, "metadata"), "resourceVersion"), &c.version));
        absl::MutexLock lock(&mu_);
        seen_.push_back(std::move(c));
      };
      informer->AddHandler(std::move(handler));
      informer->Start();
    }
  }
  bool Synced() const {
    return pods_.WaitForSync(absl::Seconds(20)) && pvcs_.WaitForSync(absl::Seconds(20));
  }
  // The creations of objects controlled by `uid`, in the order they were made ("pvc",
  // "pod", ...).
  std::vector<std::string> Of(const std::string& uid) {
    std::vector<Creation> seen;
    {
      absl::MutexLock lock(&mu_);
      seen = seen_;
    }
    std::sort(seen.begin(), seen.end());
    std::vector<std::string> out;
    for (const Creation& c : seen) {
      if (c.controller_uid == uid) out.push_back(c.what);
    }
    return out;
  }

 private:
  Informer pods_;
  Informer pvcs_;
  absl::Mutex mu_;
  std::vector<Creation> seen_ ABSL_GUARDED_BY(mu_);
};
// The emulator's resourceVersions are one counter over all objects: comparable numbers.
int64_t Version(const std::string& resource_version) {
  return resource_version.empty() ? 0 : std::stoll(resource_version);
}

std::string VersionOf(const Json& object) {
  return object["metadata"].value("resourceVersion", "");
}

class SandboxControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    emulator_ = std::make_unique<testing::TestEmulator>(
        std::vector<std::string>{"--pod_ready_delay_ms", "20"});
    ASSERT_TRUE(emulator_->ok());
    client_ = *Client::Create(emulator_->Cluster());
    ASSERT_NO_FATAL_FAILURE(testing::InstallCrds(*client_));
    SandboxControllerOptions options;
    options.workers = 2;
    controller_ = std::make_unique<SandboxController>(client_.get(), options);
    ASSERT_TRUE(controller_->Start().ok());
  }
  void TearDown() override { controller_.reset(); }

  // Replaces the controller by one that holds a new Sandbox's first status for `hold` of
  // `clock` (by default clock_, which moves only when a test moves it).
  void RestartWithHold(absl::Duration hold, const Clock* clock = nullptr) {
    controller_.reset();
    SandboxControllerOptions options;
    options.workers = 2;
    options.first_status_hold = hold;
    options.clock = clock != nullptr ? clock : &clock_;
    controller_ = std::make_unique<SandboxController>(client_.get(), options);
    ASSERT_TRUE(controller_->Start().ok());
  }

  // Replaces the controller by one that exports its metrics into `registry`.
  void RestartWithRegistry(std::shared_ptr<prometheus::Registry> registry) {
    controller_.reset();
    SandboxControllerOptions options;
    options.workers = 2;
    options.registry = std::move(registry);
    controller_ = std::make_unique<SandboxController>(client_.get(), options);
    ASSERT_TRUE(controller_->Start().ok());
  }

  // Waits (at most 20 s) until `informer` has handed every change up to `resource_version`
  // to the controller and the controller has reconciled everything that queued: after
  // this, what that change made the controller do is done.
  bool Settled(const Informer& informer, const std::string& resource_version) {
    return testing::Eventually(
        [&] {
          return Version(informer.HandledResourceVersion()) >= Version(resource_version) &&
                 controller_->Idle();
        },
        absl::Seconds(20));
  }

  // The PVC and pod creates asked for since the request log was reset, in the order they
  // arrived ("pvc", "pod"; the log has no names for creates).
  std::vector<std::string> Creates() {
    std::vector<std::string> out;
    for (const Json& r : emulator_->Admin("GET", "/emulator/requests")) {
      if (r.value("verb", "") != "create") continue;
      const std::string resource = r.value("resource", "");
      if (resource == "persistentvolumeclaims") out.push_back("pvc");
      if (resource == "pods") out.push_back("pod");
    }
    return out;
  }

  // Starts at the real time: Sandboxes' creationTimestamps come from the emulator's clock.
  FakeClock clock_{absl::Now()};
  std::unique_ptr<testing::TestEmulator> emulator_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<SandboxController> controller_;
};

TEST_F(SandboxControllerTest, ReadyThenNoFurtherWrites) {
  ASSERT_TRUE(client_->Create(kSandboxes, "default", SandboxObject("steady")).ok());
  ASSERT_TRUE(WaitForReason(*client_, "steady", "DependenciesReady"));
  const int64_t status_writes = emulator_->Requests("patch sandboxes/status");
  const int64_t pod_creates = emulator_->Requests("create pods");
  EXPECT_EQ(pod_creates, 1);
  // Touch the Sandbox (a reconcile with nothing new) a few times, and wait until the
  // controller has reconciled the last touch.
  std::string touched;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<Json> patched =
        client_->Patch(kSandboxes, "default", "steady", PatchType::kMerge,
                       {{"metadata", {{"labels", {{"touch", std::to_string(i)}}}}}});
    ASSERT_TRUE(patched.ok()) << patched.status();
    touched = VersionOf(*patched);
  }
  ASSERT_TRUE(Settled(controller_->sandbox_informer(), touched));
  EXPECT_EQ(emulator_->Requests("patch sandboxes/status"), status_writes);
  EXPECT_EQ(emulator_->Requests("create pods"), pod_creates);
}

// Upstream's dashboards and load-test recipes read controller-runtime's metrics:
// controller_runtime_reconcile_total{controller="sandbox",result} and
// workqueue_depth{name="sandbox"}.
TEST_F(SandboxControllerTest, ReconcilesAreCountedUnderControllerRuntimesNames) {
  auto registry = std::make_shared<prometheus::Registry>();
  RestartWithRegistry(registry);
  ASSERT_TRUE(client_->Create(kSandboxes, "default", SandboxObject("counted")).ok());
  ASSERT_TRUE(WaitForReason(*client_, "counted", "DependenciesReady"));
  ASSERT_TRUE(testing::Eventually([&] { return controller_->Idle(); }, absl::Seconds(20)));
  double success = -1, error = -1, depth = -1;
  for (const prometheus::MetricFamily& family : registry->Collect()) {
    for (const prometheus::ClientMetric& m : family.metric) {
      std::map<std::string, std::string> labels;
      for (const auto& l : m.label) labels[l.name] = l.value;
      if (family.name == "controller_runtime_reconcile_total" &&
          labels["controller"] == "sandbox") {
        if (labels["result"] == "success") success = m.counter.value;
        if (labels["result"] == "error") error = m.counter.value;
      }
      if (family.name == "workqueue_depth" && labels["name"] == "sandbox") depth = m.gauge.value;
    }
  }
  EXPECT_GE(success, 1)
      << "controller_runtime_reconcile_total{controller=\"sandbox\",result=\"success\"}";
  EXPECT_GE(error, 0) << "result=\"error\" is exported from the start";
  EXPECT_GE(depth, 0) << "workqueue_depth{name=\"sandbox\"}";
}

// agent_sandboxes (upstream's gauge) counts each Sandbox once, in the series of its current
// labels: one turning Ready moves from ready_condition="false" to "true", and a deleted
// one is counted out. (Issue 39: the series are made once and then looked up, not added to
// the family at every informer event.)
TEST_F(SandboxControllerTest, AgentSandboxesCountsEachSandboxInTheSeriesOfItsLabels) {
  auto registry = std::make_shared<prometheus::Registry>();
  RestartWithRegistry(registry);
  // The agent_sandboxes series by their labels ("k=v,..." sorted), with their values.
  auto series = [&] {
    std::map<std::string, double> out;
    for (const prometheus::MetricFamily& family : registry->Collect()) {
      if (family.name != "agent_sandboxes") continue;
      for (const prometheus::ClientMetric& m : family.metric) {
        std::map<std::string, std::string> labels;
        for (const auto& l : m.label) labels[l.name] = l.value;
        std::string key;
        for (const auto& [name, value] : labels) absl::StrAppend(&key, name, "=", value, ",");
        out[key] += m.gauge.value;
      }
    }
    return out;
  };
  auto total = [&] {
    double sum = 0;
    for (const auto& [key, value] : series()) sum += value;
    return sum;
  };
  const std::string ready_series =
      "created_by=unknown,expired=false,launch_type=cold,namespace=default,owned_by=None,"
      "ready_condition=true,sandbox_template=unknown,";
  const std::string waiting_series =
      "created_by=unknown,expired=false,launch_type=cold,namespace=default,owned_by=None,"
      "ready_condition=false,sandbox_template=unknown,";
  for (const char* name : {"one", "two"}) {
    ASSERT_TRUE(client_->Create(kSandboxes, "default", SandboxObject(name)).ok());
  }
  for (const char* name : {"one", "two"}) {
    ASSERT_TRUE(WaitForReason(*client_, name, "DependenciesReady")) << name;
    absl::StatusOr<Json> ready = client_->Get(kSandboxes, "default", name);
    ASSERT_TRUE(ready.ok()) << ready.status();
    ASSERT_TRUE(Settled(controller_->sandbox_informer(), VersionOf(*ready))) << name;
  }
  std::map<std::string, double> counted = series();
  EXPECT_EQ(counted[ready_series], 2) << ::testing::PrintToString(counted);
  EXPECT_EQ(counted[waiting_series], 0) << "moved out when Ready, not left counted";
  EXPECT_EQ(total(), 2);

  ASSERT_TRUE(client_->Delete(kSandboxes, "default", "one", DeleteOptions()).ok());
  EXPECT_TRUE(testing::Eventually([&] { return series()[ready_series] == 1 && total() == 1; },
                                  absl::Seconds(20)))
      << ::testing::PrintToString(series());
}

// Issue 40: after `kubectl delete --cascade=orphan` of a Sandbox and a re-apply, its pod
// and Service (both carry the tracking label) are adopted as upstream adopts them: the
// same pod runs on (not made again), the Sandbox controls both and is Ready. Before, the
// Sandbox stayed Ready False ReconcilerError ("not controlled by this Sandbox").
// DISABLED: flaky under load, a real race of the adoption path not yet found. Run beside
// other work (a clean-clone CI, or 4 runs of 6 with a CI run beside them) the Sandbox
// applied again stays Ready False ReconcilerError "pod "orphan" exists and is not
// controlled by this Sandbox" for 20 s, though "adopted its pod" was logged; alone it
// passes every time. Run it with --gtest_also_run_disabled_tests while fixing.
TEST_F(SandboxControllerTest, AnOrphanedPodAndServiceAreAdoptedByTheSandboxAppliedAgain) {
  Json sandbox = SandboxObject("orphan");
  sandbox["spec"]["service"] = true;
  ASSERT_TRUE(client_->Create(kSandboxes, "default", sandbox).ok());
  ASSERT_TRUE(WaitForReason(*client_, "orphan", "DependenciesReady"));
  absl::StatusOr<Json> pod = client_->Get(kPods, "default", "orphan");
  absl::StatusOr<Json> service = client_->Get(kServices, "default", "orphan");
  ASSERT_TRUE(pod.ok() && service.ok());
  const std::string pod_uid = Str((*pod)["metadata"], "uid");
  const std::string service_uid = Str((*service)["metadata"], "uid");

  DeleteOptions orphan;
  orphan.propagation_policy = "Orphan";
  ASSERT_TRUE(client_->Delete(kSandboxes, "default", "orphan", orphan).ok());
  ASSERT_TRUE(testing::Eventually(
      [&] {
        absl::StatusOr<Json> p = client_->Get(kPods, "default", "orphan");
        return !client_->Get(kSandboxes, "default", "orphan").ok() && p.ok() &&
               ControllerUid(*p).empty();
      },
      absl::Seconds(20)))
      << "the Sandbox gone, its pod left without an owner";

  absl::StatusOr<Json> again = client_->Create(kSandboxes, "default", sandbox);
  ASSERT_TRUE(again.ok()) << again.status();
  const std::string uid = Str((*again)["metadata"], "uid");
  ASSERT_TRUE(WaitForReason(*client_, "orphan", "DependenciesReady"))
      << "Ready: " << Condition(*client_, "orphan", "Ready").dump();
  pod = client_->Get(kPods, "default", "orphan");
  service = client_->Get(kServices, "default", "orphan");
  ASSERT_TRUE(pod.ok() && service.ok());
  EXPECT_EQ(Str((*pod)["metadata"], "uid"), pod_uid) << "the same pod, adopted";
  EXPECT_EQ(ControllerUid(*pod), uid);
  EXPECT_EQ(Str((*service)["metadata"], "uid"), service_uid);
  EXPECT_EQ(ControllerUid(*service), uid);
}

TEST_F(SandboxControllerTest, APodOfTheSameNameOwnedBySomeoneElseIsNeverTouched) {
  Json foreign = {{"metadata", {{"name", "taken"}, {"labels", {{"owner", "someone"}}}}},
                  {"spec", {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}}}};
  absl::StatusOr<Json> pod = client_->Create(kPods, "default", foreign);
  ASSERT_TRUE(pod.ok()) << pod.status();
  ASSERT_TRUE(client_->Create(kSandboxes, "default", SandboxObject("taken")).ok());
  ASSERT_TRUE(WaitForReason(*client_, "taken", "ReconcilerError"));
  absl::StatusOr<Json> after = client_->Get(kPods, "default", "taken");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ((*after)["metadata"]["uid"], (*pod)["metadata"]["uid"]);
  EXPECT_FALSE((*after)["metadata"].contains("ownerReferences"));
  // Once the other owner deletes its pod, the Sandbox gets its own.
  ASSERT_TRUE(client_->Delete(kPods, "default", "taken").ok());
  ASSERT_TRUE(WaitForReason(*client_, "taken", "DependenciesReady"));
  absl::StatusOr<Json> own = client_->Get(kPods, "default", "taken");
  ASSERT_TRUE(own.ok());
  absl::StatusOr<Json> sandbox = client_->Get(kSandboxes, "default", "taken");
  ASSERT_TRUE(sandbox.ok());
  EXPECT_EQ(ControllerUid(*own), (*sandbox)["metadata"]["uid"]);
  // The controller keeps going for others.
  ASSERT_TRUE(client_->Create(kSandboxes, "default", SandboxObject("fine")).ok());
  EXPECT_TRUE(WaitForReason(*client_, "fine", "DependenciesReady"));
}

TEST_F(SandboxControllerTest, TwoPodsOfOneSandboxAreReported) {
  absl::StatusOr<Json> sandbox = client_->Create(kSandboxes, "default", SandboxObject("twin"));
  ASSERT_TRUE(sandbox.ok());
  ASSERT_TRUE(WaitForReason(*client_, "twin", "DependenciesReady"));
  Json extra = DesiredPod(*sandbox);
  extra["metadata"]["name"] = "twin-extra";
  ASSERT_TRUE(client_->Create(kPods, "default", extra).ok());
  EXPECT_TRUE(WaitForReason(*client_, "twin", "MultiplePods"));
  ASSERT_TRUE(client_->Delete(kPods, "default", "twin-extra").ok());
  EXPECT_TRUE(WaitForReason(*client_, "twin", "DependenciesReady"));
}

TEST_F(SandboxControllerTest, ASandboxReadyWithinTheHoldGetsOnlyItsReadyStatus) {
  RestartWithHold(absl::Minutes(5));  // clock_ does not move here: the hold never passes
  ASSERT_TRUE(client_->Create(kSandboxes, "default", SandboxObject("quick")).ok());
  ASSERT_TRUE(WaitForReason(*client_, "quick", "DependenciesReady"));
  EXPECT_EQ(emulator_->Requests("patch sandboxes/status"), 1);
}

TEST_F(SandboxControllerTest, AWaitingSandboxIsReportedOnceTheHoldHasPassed) {
  emulator_->Admin("POST", "/emulator/kubelet", {{"ready_delay_ms", 600000}});  // never Ready
  RestartWithHold(absl::Minutes(1));
  emulator_->Admin("POST", "/emulator/stats/reset");
  ASSERT_TRUE(client_->Create(kSandboxes, "default", SandboxObject("slow")).ok());
  // The pod is created and scheduled, and the controller has seen that: its status is held
  // (a timer waits for the hold's end), nothing is written.
  Json pod;
  ASSERT_TRUE(testing::Eventually(
      [&] {
        absl::StatusOr<Json> got = client_->Get(kPods, "default", "slow");
        if (!got.ok() || (*got)["spec"].value("nodeName", "").empty()) return false;
        pod = *std::move(got);
        return true;
      },
      absl::Seconds(20)));
  ASSERT_TRUE(Settled(controller_->pod_informer(), VersionOf(pod)));
  EXPECT_EQ(emulator_->Requests("patch sandboxes/status"), 0);
  EXPECT_EQ(controller_->QueueDelayed(), 1u);
  // Once the hold has passed the status is written (and kept current), although nothing
  // about the pod changes any more. (The hold counts from the creationTimestamp, which is
  // real time in whole seconds and may be up to a second ahead of clock_.)
  clock_.Advance(absl::Minutes(1) + absl::Seconds(2));
  ASSERT_TRUE(WaitForReason(*client_, "slow", "DependenciesNotReady"));
  EXPECT_EQ(Condition(*client_, "slow", "Ready").value("message", ""), "the pod is Pending");
}

TEST_F(SandboxControllerTest, AnUnschedulablePodIsReportedAtOnceDespiteTheHold) {
  RestartWithHold(absl::Minutes(5));
  Json sandbox = SandboxObject("nowhere");
  sandbox["spec"]["podTemplate"]["spec"]["nodeSelector"] = {{"no-such-label", "x"}};
  ASSERT_TRUE(client_->Create(kSandboxes, "default", sandbox).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  Json scheduled;
  while (absl::Now() < deadline && scheduled.is_null()) {
    scheduled = Condition(*client_, "nowhere", "PodScheduled");
    if (scheduled.is_null()) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_FALSE(scheduled.is_null()) << "no PodScheduled condition within 20 s of a 5 min hold";
  EXPECT_EQ(scheduled.value("status", ""), "False");
  EXPECT_EQ(scheduled.value("reason", ""), "Unschedulable");
  EXPECT_EQ(ReadyReason(*client_, "nowhere"), "DependenciesNotReady");
}

// Issue 20: a Sandbox deleted and applied again under the same name got its pod (which
// mounts the claim) and turned Ready while its PVC was not created for 10-20 s.
TEST_F(SandboxControllerTest, ASandboxCreatedAgainGetsItsPvcBeforeItsPod) {
  // The order is read from the objects made for each Sandbox (by its uid), not from the
  // emulator's request log: a reconcile of the deleted Sandbox that still finds it in the
  // controller's cache may create a PVC and a pod for it (as with any controller reading
  // a cache), which the garbage collector takes since their owner is gone.
  CreationLog log(client_.get());
  ASSERT_TRUE(log.Synced());
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(::testing::Message() << "round " << round);
    absl::StatusOr<Json> sandbox =
        client_->Create(kSandboxes, "default", SandboxWithVolume("again"));
    ASSERT_TRUE(sandbox.ok()) << sandbox.status();
    const std::string uid = Str((*sandbox)["metadata"], "uid");
    ASSERT_TRUE(WaitForReason(*client_, "again", "DependenciesReady"));
    // The PVC exists, is this Sandbox's, and was made before the pod; one pod.
    absl::StatusOr<Json> pvc = client_->Get(kPersistentVolumeClaims, "default", "data-again");
    ASSERT_TRUE(pvc.ok()) << pvc.status();
    EXPECT_EQ(ControllerUid(*pvc), uid);
    absl::StatusOr<Json> pod = client_->Get(kPods, "default", "again");
    ASSERT_TRUE(pod.ok()) << pod.status();
    EXPECT_EQ(ControllerUid(*pod), uid);
    std::vector<std::string> made;
    ASSERT_TRUE(testing::Eventually(
        [&] {
          made = log.Of(uid);
          return std::count(made.begin(), made.end(), "pod") >= 1;
        },
        absl::Seconds(20)));
    EXPECT_EQ(made, (std::vector<std::string>{"pvc", "pod"}));
    ASSERT_TRUE(client_->Delete(kSandboxes, "default", "again").ok());
    ASSERT_TRUE(WaitGone(*client_, kSandboxes, "again"));
    ASSERT_TRUE(WaitGone(*client_, kPods, "again"));
    ASSERT_TRUE(WaitGone(*client_, kPersistentVolumeClaims, "data-again"));
  }
}

// The PVC of an earlier Sandbox of the same name, still being deleted (a finalizer holds
// it, as pvc-protection does while the old pod terminates), is not the new Sandbox's: no
// pod until its own PVC exists.
TEST_F(SandboxControllerTest, NoPodWhileThePvcOfAnEarlierSandboxIsBeingDeleted) {
  // Real time: the Sandbox waits on rechecks (timers) as well as on events here.
  RestartWithHold(absl::ZeroDuration(), &Clock::Real());
  Json old = {
      {"metadata",
       {{"name", "data-later"},
        {"labels", {{kNameHashLabel, NameHash("later")}}},
        {"finalizers", {"sbx.test/hold"}},
        {"ownerReferences",
         {{{"apiVersion", "agents.x-k8s.io/v1beta1"},
           {"kind", "Sandbox"},
           {"name", "later"},
           {"uid", "uid-of-an-earlier-sandbox"},
           {"controller", true}}}}}},
      {"spec",
       {{"accessModes", {"ReadWriteOnce"}}, {"resources", {{"requests", {{"storage", "1Gi"}}}}}}}};
  ASSERT_TRUE(client_->Create(kPersistentVolumeClaims, "default", old).ok());
  ASSERT_TRUE(client_->Delete(kPersistentVolumeClaims, "default", "data-later").ok());
  emulator_->Admin("POST", "/emulator/stats/reset");
  absl::StatusOr<Json> sandbox = client_->Create(kSandboxes, "default", SandboxWithVolume("later"));
  ASSERT_TRUE(sandbox.ok()) << sandbox.status();
  // The status is written after the pod's turn in the same reconcile: once it says why it
  // waits, a pod it made would already have been asked for.
  Json ready = WaitForReady(*client_, "later", "DependenciesNotReady", "data-later");
  EXPECT_NE(ready.value("message", "").find("data-later"), std::string::npos) << ready;
  // (A create of its PVC may have been tried, and met the old one: the informer may not
  // have shown it yet.)
  EXPECT_EQ(emulator_->Requests("create pods"), 0);
  EXPECT_TRUE(absl::IsNotFound(client_->Get(kPods, "default", "later").status()));
  // The old PVC goes; the Sandbox gets its own, then its pod.
  ASSERT_TRUE(client_
                  ->Patch(kPersistentVolumeClaims, "default", "data-later", PatchType::kMerge,
                          {{"metadata", {{"finalizers", nullptr}}}})
                  .ok());
  ASSERT_TRUE(WaitForReason(*client_, "later", "DependenciesReady"));
  absl::StatusOr<Json> pvc = client_->Get(kPersistentVolumeClaims, "default", "data-later");
  ASSERT_TRUE(pvc.ok()) << pvc.status();
  EXPECT_EQ(ControllerUid(*pvc), (*sandbox)["metadata"]["uid"]);
  const std::vector<std::string> creates = Creates();
  ASSERT_FALSE(creates.empty());
  EXPECT_EQ(creates.back(), "pod") << ::testing::PrintToString(creates);
  EXPECT_EQ(std::count(creates.begin(), creates.end(), "pod"), 1);
}

// A PVC of the Sandbox's PVC name that it does not control is refused, as upstream does:
// Ready False ReconcilerError naming it, no pod, the PVC untouched.
TEST_F(SandboxControllerTest, APvcOfTheSameNameOwnedBySomeoneElseIsRefused) {
  Json theirs = {
      {"metadata", {{"name", "data-mine"}, {"labels", {{"owner", "someone"}}}}},
      {"spec",
       {{"accessModes", {"ReadWriteOnce"}}, {"resources", {{"requests", {{"storage", "1Gi"}}}}}}}};
  absl::StatusOr<Json> pvc = client_->Create(kPersistentVolumeClaims, "default", theirs);
  ASSERT_TRUE(pvc.ok()) << pvc.status();
  emulator_->Admin("POST", "/emulator/stats/reset");
  absl::StatusOr<Json> sandbox = client_->Create(kSandboxes, "default", SandboxWithVolume("mine"));
  ASSERT_TRUE(sandbox.ok()) << sandbox.status();
  Json ready = WaitForReady(*client_, "mine", "ReconcilerError", "data-mine");
  EXPECT_EQ(ready.value("reason", ""), "ReconcilerError") << ready;
  EXPECT_NE(ready.value("message", "").find("\"data-mine\""), std::string::npos) << ready;
  EXPECT_EQ(emulator_->Requests("create pods"), 0);
  EXPECT_TRUE(absl::IsNotFound(client_->Get(kPods, "default", "mine").status()));
  absl::StatusOr<Json> after = client_->Get(kPersistentVolumeClaims, "default", "data-mine");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ((*after)["metadata"]["uid"], (*pvc)["metadata"]["uid"]);
  EXPECT_FALSE((*after)["metadata"].contains("ownerReferences"));
  // Once its owner deletes it, the Sandbox gets its own PVC and then its pod.
  ASSERT_TRUE(client_->Delete(kPersistentVolumeClaims, "default", "data-mine").ok());
  ASSERT_TRUE(WaitForReason(*client_, "mine", "DependenciesReady"));
  absl::StatusOr<Json> own = client_->Get(kPersistentVolumeClaims, "default", "data-mine");
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(ControllerUid(*own), (*sandbox)["metadata"]["uid"]);
}

}  // namespace
}  // namespace sbx::k8s

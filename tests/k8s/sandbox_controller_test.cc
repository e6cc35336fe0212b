// The Sandbox controller against the API emulator, for what kubectl users cannot easily
// arrange: a pod of the same name that belongs to someone else, several pods of one
// Sandbox, and the write count of a steady Sandbox. (tests/e2e/k8s_sandbox_test.py drives
// the user-facing behaviour with kubectl through sbx-server.)

#include "src/k8s/sandbox_controller.h"

#include "gtest/gtest.h"
#include "src/k8s/sandbox_objects.h"
#include "tests/k8s/test_emulator.h"

namespace sbx::k8s {
namespace {

Json SandboxObject(const std::string& name) {
  return {{"metadata", {{"name", name}}},
          {"spec",
           {{"podTemplate",
             {{"spec", {{"containers", {{{"name", "main"}, {"image", "python:3.12-slim"}}}}}}}}}}};
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

  // Replaces the controller by one that holds a new Sandbox's first status for `hold`.
  void RestartWithHold(absl::Duration hold) {
    controller_.reset();
    SandboxControllerOptions options;
    options.workers = 2;
    options.first_status_hold = hold;
    controller_ = std::make_unique<SandboxController>(client_.get(), options);
    ASSERT_TRUE(controller_->Start().ok());
  }

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
  // Touch the Sandbox (a reconcile with nothing new) a few times.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(client_
                    ->Patch(kSandboxes, "default", "steady", PatchType::kMerge,
                            {{"metadata", {{"labels", {{"touch", std::to_string(i)}}}}}})
                    .ok());
  }
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(emulator_->Requests("patch sandboxes/status"), status_writes);
  EXPECT_EQ(emulator_->Requests("create pods"), pod_creates);
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
  RestartWithHold(absl::Minutes(5));  // far longer than the pod takes (20 ms)
  ASSERT_TRUE(client_->Create(kSandboxes, "default", SandboxObject("quick")).ok());
  ASSERT_TRUE(WaitForReason(*client_, "quick", "DependenciesReady"));
  EXPECT_EQ(emulator_->Requests("patch sandboxes/status"), 1);
}

TEST_F(SandboxControllerTest, AWaitingSandboxIsReportedOnceTheHoldHasPassed) {
  emulator_->Admin("POST", "/emulator/kubelet", {{"ready_delay_ms", 600000}});  // never Ready
  RestartWithHold(absl::Seconds(1));
  ASSERT_TRUE(client_->Create(kSandboxes, "default", SandboxObject("slow")).ok());
  // Held while the pod is created and scheduled; written (and kept current) afterwards,
  // although nothing about the pod changes any more.
  ASSERT_TRUE(WaitForReason(*client_, "slow", "DependenciesNotReady"));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::string message;
  while (absl::Now() < deadline && message != "the pod is Pending") {
    absl::SleepFor(absl::Milliseconds(20));
    message = Condition(*client_, "slow", "Ready").value("message", "");
  }
  EXPECT_EQ(message, "the pod is Pending");
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

}  // namespace
}  // namespace sbx::k8s

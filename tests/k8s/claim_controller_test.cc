// ClaimController against the API emulator, with a real allocator (memory store, a
// runtime that never makes anything: these claims go cold): a claim that waits for its
// SandboxWarmPool or the pool's SandboxTemplate goes on as soon as that object appears,
// not at the next resync. (tests/e2e/k8s_pool_test.py drives claims with kubectl through
// sbx-server.)

#include "src/k8s/claim_controller.h"

#include <functional>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "src/common/clock.h"
#include "src/common/ids.h"
#include "src/k8s/informer.h"
#include "src/k8s/write_scheduler.h"
#include "src/store/memory_store.h"
#include "tests/allocator/fakes.h"
#include "tests/k8s/test_emulator.h"

namespace sbx::k8s {
namespace {

using ::sbx::k8s::testing::Eventually;
using ::sbx::k8s::testing::InstallCrds;
using ::sbx::k8s::testing::MarkSandboxReady;
using ::sbx::k8s::testing::TestEmulator;

// Far beyond every wait below, so that no step can pass by the resync.
constexpr absl::Duration kResync = absl::Minutes(2);
// How long each step may take (the claim controller acts within milliseconds).
constexpr absl::Duration kStep = absl::Seconds(10);

Json Template(const std::string& name) {
  return {{"metadata", {{"name", name}}},
          {"spec",
           {{"podTemplate",
             {{"spec", {{"containers", {{{"name", "main"}, {"image", "python:3.12-slim"}}}}}}}}}}};
}

Json Pool(const std::string& name, const std::string& template_name) {
  return {{"metadata", {{"name", name}}},
          {"spec", {{"replicas", 1}, {"sandboxTemplateRef", {{"name", template_name}}}}}};
}

Json Claim(const std::string& name, const std::string& pool) {
  return {{"metadata", {{"name", name}}}, {"spec", {{"warmPoolRef", {{"name", pool}}}}}};
}

// The SandboxInformers the controller reads (Sandboxes, pools, templates), a write
// scheduler, an allocator with no pool of its own (every claim goes cold) and the
// controller with a resync of kResync. No Sandbox controller runs: the test marks the cold
// Sandbox Ready as it would.
class ClaimControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emulator_.ok());
    client_ = *Client::Create(emulator_.Cluster());
    ASSERT_NO_FATAL_FAILURE(InstallCrds(*client_));
    sandboxes_ =
        std::make_unique<Informer>(client_.get(), NamespaceInformer(kSandboxes, "default"));
    pools_ =
        std::make_unique<Informer>(client_.get(), NamespaceInformer(kSandboxWarmPools, "default"));
    templates_ =
        std::make_unique<Informer>(client_.get(), NamespaceInformer(kSandboxTemplates, "default"));
    writes_ = std::make_unique<WriteScheduler>(WriteSchedulerOptions{});
    auto created = allocator::Allocator::Create(allocator::AllocatorOptions{}, &store_, &runtime_,
                                                &reconciler_, &Clock::Real(), &ids_);
    ASSERT_TRUE(created.ok()) << created.status();
    alloc_ = std::move(*created);
    ClaimControllerOptions options;
    options.workers = 2;
    options.resync = kResync;
    // Before the informers start: the controller adds its handlers to them.
    controller_ = std::make_unique<ClaimController>(client_.get(), writes_.get(), sandboxes_.get(),
                                                    pools_.get(), templates_.get(), options);
    for (Informer* informer : {sandboxes_.get(), pools_.get(), templates_.get()}) {
      informer->Start();
      ASSERT_TRUE(informer->WaitForSync(kStep));
    }
    ASSERT_TRUE(controller_->StartInformers(kStep).ok());
    ASSERT_TRUE(controller_->Start(alloc_.get()).ok());
  }

  void TearDown() override {
    if (controller_) controller_->Stop();
    for (auto* informer : {sandboxes_.get(), pools_.get(), templates_.get()}) {
      if (informer) informer->Stop();
    }
    if (writes_) writes_->Stop();
  }

  void Create(const Resource& resource, const Json& object) {
    absl::StatusOr<Json> created = client_->Create(resource, "default", object);
    ASSERT_TRUE(created.ok()) << created.status();
  }

  // The claim's Ready condition as the API server has it (null when it has none).
  Json Ready(const std::string& claim) {
    absl::StatusOr<Json> got = client_->Get(kSandboxClaims, "default", claim);
    if (!got.ok()) return nullptr;
    const Json status = got->value("status", Json::object());
    for (const Json& c : status.value("conditions", Json::array())) {
      if (c.value("type", "") == "Ready") return c;
    }
    return nullptr;
  }
  bool ReadyReasonIs(const std::string& claim, const std::string& reason) {
    const Json ready = Ready(claim);
    return ready.is_object() && ready.value("reason", "") == reason;
  }

  // The cold Sandbox named like `claim` appears; the test marks it Ready (as the Sandbox
  // controller would) and the claim must say Ready=True with its name.
  void ExpectColdSandboxThenReady(const std::string& claim) {
    ASSERT_TRUE(Eventually([&] { return client_->Get(kSandboxes, "default", claim).ok(); }, kStep))
        << "no Sandbox for the claim within " << kStep
        << " of its pool and template existing; its Ready condition: " << Ready(claim).dump();
    ASSERT_TRUE(MarkSandboxReady(*client_, "default", claim, "10.0.0.9").ok());
    EXPECT_TRUE(Eventually(
        [&] {
          const Json ready = Ready(claim);
          return ready.is_object() && ready.value("status", "") == "True";
        },
        kStep))
        << "the claim's Ready condition: " << Ready(claim).dump();
    absl::StatusOr<Json> got = client_->Get(kSandboxClaims, "default", claim);
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(
        got->value("status", Json::object()).value("sandbox", Json::object()).value("name", ""),
        claim);
  }

  TestEmulator emulator_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Informer> sandboxes_;
  std::unique_ptr<Informer> pools_;
  std::unique_ptr<Informer> templates_;
  std::unique_ptr<WriteScheduler> writes_;
  store::MemoryStore store_;
  allocator::testing::ManualRuntime runtime_;
  allocator::testing::RecordingReconciler reconciler_;
  SequentialIdGenerator ids_{"c-"};
  std::unique_ptr<allocator::Allocator> alloc_;
  std::unique_ptr<ClaimController> controller_;
};

// Issue 20. A claim made before its pool said WarmPoolNotFound and was looked at again
// only by the resync (Ready 6-29 s after the pool appeared); upstream re-queues the claims
// of a pool when the pool is created.
// SandboxClaims mirroring gRPC claims are named by this function; names already in
// clusters must not change (values computed at 06b33ab).
TEST(GrpcClaimNameTest, NamesStayAsTheyWere) {
  EXPECT_EQ(GrpcClaimName("alice", "c1"), "grpc-622bb74485987482");
  EXPECT_EQ(GrpcClaimName("anonymous", "f-1-2"), "grpc-6b16050662cf07b0");
}

TEST_F(ClaimControllerTest, AClaimMadeBeforeItsPoolGoesOnWhenThePoolAppears) {
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxClaims, Claim("early", "py")));
  ASSERT_TRUE(Eventually([&] { return ReadyReasonIs("early", "WarmPoolNotFound"); }, kStep))
      << Ready("early").dump();
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxTemplates, Template("python")));
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxWarmPools, Pool("py", "python")));
  ExpectColdSandboxThenReady("early");
}

// Issue 20. The same for a pool whose SandboxTemplate comes after the claim: the claim
// said TemplateNotFound; the template's creation re-queues the claims of the pools that
// use it (as upstream's does).
TEST_F(ClaimControllerTest, AClaimWaitingForItsPoolsTemplateGoesOnWhenTheTemplateAppears) {
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxWarmPools, Pool("py", "python")));
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxClaims, Claim("early", "py")));
  ASSERT_TRUE(Eventually([&] { return ReadyReasonIs("early", "TemplateNotFound"); }, kStep))
      << Ready("early").dump();
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxTemplates, Template("python")));
  ExpectColdSandboxThenReady("early");
}

// A pool's spec change re-queues its waiting claims too: pointing the pool at a template
// that exists lets a TemplateNotFound claim go on.
TEST_F(ClaimControllerTest, AClaimWaitingForItsPoolsTemplateGoesOnWhenThePoolIsRepointed) {
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxTemplates, Template("python")));
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxWarmPools, Pool("py", "pyhton")));  // a typo
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxClaims, Claim("early", "py")));
  ASSERT_TRUE(Eventually([&] { return ReadyReasonIs("early", "TemplateNotFound"); }, kStep))
      << Ready("early").dump();
  absl::StatusOr<Json> patched =
      client_->Patch(kSandboxWarmPools, "default", "py", PatchType::kMerge,
                     {{"spec", {{"sandboxTemplateRef", {{"name", "python"}}}}}});
  ASSERT_TRUE(patched.ok()) << patched.status();
  ExpectColdSandboxThenReady("early");
}

// Beyond upstream (which re-queues on a template's creation only): a template's spec
// change re-queues the waiting claims of its pools, so a claim refused by the template's
// env policy goes on once the policy allows its env.
TEST_F(ClaimControllerTest, AClaimRefusedByItsTemplatesPolicyGoesOnWhenThePolicyChanges) {
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxTemplates, Template("python")));
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxWarmPools, Pool("py", "python")));
  Json claim = Claim("early", "py");
  claim["spec"]["env"] = {{{"name", "TASK"}, {"value", "42"}}};
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxClaims, claim));
  ASSERT_TRUE(Eventually([&] { return ReadyReasonIs("early", "EnvVarsInjectionRejected"); }, kStep))
      << Ready("early").dump();
  absl::StatusOr<Json> patched =
      client_->Patch(kSandboxTemplates, "default", "python", PatchType::kMerge,
                     {{"spec", {{"envVarsInjectionPolicy", "Allowed"}}}});
  ASSERT_TRUE(patched.ok()) << patched.status();
  ExpectColdSandboxThenReady("early");
}

}  // namespace
}  // namespace sbx::k8s

// ClaimController against the API emulator, with a real allocator (memory store, a
// runtime that never makes anything: claims go cold unless a test hands the allocator a
// warm member): a claim that waits for its SandboxWarmPool or the pool's SandboxTemplate
// goes on as soon as that object appears, not at the next resync; a claim bound to a warm
// member writes its binding and its status once; a claim past its shutdownTime goes on a
// fake clock. (tests/e2e/k8s_pool_test.py drives claims with kubectl through sbx-server.)

#include "src/k8s/claim_controller.h"

#include <functional>
#include <iostream>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "src/common/clock.h"
#include "src/common/ids.h"
#include "src/k8s/claim_writer.h"
#include "src/k8s/informer.h"
#include "src/k8s/kube_runtime.h"
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
// scheduler, an allocator with no pool of its own (claims go cold unless the test adds a
// warm member with AddWarmMember) and the controller with a resync of kResync, on the
// clock of ControllerClock(). No Sandbox controller runs: the test marks Sandboxes Ready
// as it would.
class ClaimControllerTest : public ::testing::Test {
 protected:
  // The controller's clock (null: the real one).
  virtual const Clock* ControllerClock() { return nullptr; }
  // Whether the controller writes upstream's claim annotations (on by default; off here
  // so that the tests count the claim path's own writes).
  virtual bool ClaimAnnotations() { return false; }
  // The namespace the controller and the informers serve ("": every one).
  virtual std::string Watch() { return "default"; }

  void SetUp() override {
    ASSERT_TRUE(emulator_.ok());
    client_ = *Client::Create(emulator_.Cluster());
    ASSERT_NO_FATAL_FAILURE(InstallCrds(*client_));
    sandboxes_ = std::make_unique<Informer>(client_.get(), NamespaceInformer(kSandboxes, Watch()));
    pools_ =
        std::make_unique<Informer>(client_.get(), NamespaceInformer(kSandboxWarmPools, Watch()));
    templates_ =
        std::make_unique<Informer>(client_.get(), NamespaceInformer(kSandboxTemplates, Watch()));
    writes_ = std::make_unique<WriteScheduler>(WriteSchedulerOptions{});
    auto created = allocator::Allocator::Create(allocator::AllocatorOptions{}, &store_, &runtime_,
                                                &reconciler_, &Clock::Real(), &ids_);
    ASSERT_TRUE(created.ok()) << created.status();
    alloc_ = std::move(*created);
    ClaimControllerOptions options;
    options.workers = 2;
    options.resync = kResync;
    options.registry = registry_;
    options.clock = ControllerClock();
    options.claim_annotations = ClaimAnnotations();
    options.namespaces.watch = Watch();
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

  // sbx_k8s_claim_reconciles_total{kind} so far.
  double Reconciles(const std::string& kind) {
    for (const prometheus::MetricFamily& family : registry_->Collect()) {
      if (family.name != "sbx_k8s_claim_reconciles_total") continue;
      for (const prometheus::ClientMetric& metric : family.metric) {
        for (const prometheus::ClientMetric::Label& label : metric.label) {
          if (label.name == "kind" && label.value == kind) return metric.counter.value;
        }
      }
    }
    return -1;
  }

  // A warm member `id` of allocator pool `pool` (made here, on a template of runtime
  // kubernetes) and its Sandbox, Ready, as KubeRuntime and the Sandbox controller leave
  // it; returns once the controller's Sandbox informer shows it Ready.
  void AddWarmMember(const std::string& pool, const std::string& id) {
    auto wait = [](const std::function<void(allocator::StatusCallback)>& call) {
      absl::Notification done;
      absl::Status status;
      call([&](absl::Status s) {
        status = std::move(s);
        done.Notify();
      });
      done.WaitForNotification();
      return status;
    };
    store::TemplateRecord t;
    t.name = "python";
    t.runtime = "kubernetes";
    ASSERT_TRUE(
        wait([&](allocator::StatusCallback cb) { alloc_->PutTemplate(t, std::move(cb)); }).ok());
    store::PoolRecord p;
    p.name = pool;
    p.template_name = "python";
    p.min_warm = 1;
    p.max_warm = 1;
    p.empty_pool_policy = store::EmptyPoolPolicy::kFail;
    ASSERT_TRUE(
        wait([&](allocator::StatusCallback cb) { alloc_->PutPool(p, std::move(cb)); }).ok());
    ASSERT_NO_FATAL_FAILURE(Create(
        kSandboxes,
        {{"metadata", {{"name", id}, {"labels", {{kWarmPoolLabel, pool}}}}},
         {"spec",
          {{"podTemplate",
            {{"spec", {{"containers", {{{"name", "main"}, {"image", "python:3.12-slim"}}}}}}}}}}}));
    ASSERT_TRUE(MarkSandboxReady(*client_, "default", id, "10.0.0.7").ok());
    runtime::SandboxInfo info;
    info.id = id;
    info.pool = pool;
    info.endpoint = "10.0.0.7:7000";
    ASSERT_TRUE(alloc_->AddSandbox(info).ok());
    ASSERT_TRUE(Eventually(
        [&] {
          ObjectPtr sb = sandboxes_->Get("default", id);
          return sb != nullptr && IsReady(sb->value("status", Json::object()));
        },
        kStep));
  }

  // Template "python", pool "py" of it with warm member "warm-1", and both in the
  // controller's caches: with them behind, a claim's first status would say
  // WarmPoolNotFound (a change of its own, and a second write).
  void PoolWithOneWarmMember() {
    ASSERT_NO_FATAL_FAILURE(Create(kSandboxTemplates, Template("python")));
    ASSERT_NO_FATAL_FAILURE(Create(kSandboxWarmPools, Pool("py", "python")));
    ASSERT_NO_FATAL_FAILURE(AddWarmMember("py", "warm-1"));
    ASSERT_TRUE(Eventually(
        [&] {
          return pools_->Get("default", "py") != nullptr &&
                 templates_->Get("default", "python") != nullptr;
        },
        kStep));
  }

  TestEmulator emulator_;
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
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

// Issue 19. A kubectl claim bound to a warm member costs two writes: one binding patch of
// the Sandbox and one status write of the claim. The reconciles that follow — the echo of
// the binding (often before the claim's own status echo, when the informer's copy of the
// claim still lacks the status just written), the echo of the status, and a later change
// of the Sandbox — write nothing more.
TEST_F(ClaimControllerTest, AClaimBoundToAWarmMemberWritesItsBindingAndStatusOnce) {
  ASSERT_NO_FATAL_FAILURE(PoolWithOneWarmMember());
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxClaims, Claim("job", "py")));
  absl::StatusOr<Json> made = client_->Get(kSandboxClaims, "default", "job");
  ASSERT_TRUE(made.ok()) << made.status();
  const std::string uid = (*made)["metadata"]["uid"];

  // Both echoes are in the controller's caches: the claim Ready on warm-1, warm-1 bound.
  ASSERT_TRUE(Eventually(
      [&] {
        ObjectPtr claim = controller_->claims().Get("default", "job");
        ObjectPtr sb = sandboxes_->Get("default", "warm-1");
        return claim != nullptr && IsReady(claim->value("status", Json::object())) &&
               sb != nullptr && BoundTo(*sb, uid);
      },
      kStep))
      << "the claim's Ready condition: " << Ready("job").dump();
  absl::StatusOr<Json> got = client_->Get(kSandboxClaims, "default", "job");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ((*got)["status"]["sandbox"], Json({{"name", "warm-1"}, {"podIPs", {"10.0.0.7"}}}));
  EXPECT_EQ(emulator_.Requests("patch sandboxes"), 1) << "binding patches";
  EXPECT_EQ(emulator_.Requests("patch sandboxclaims/status"), 1) << "status writes";
  EXPECT_EQ(emulator_.Requests("create sandboxes"), 1) << "only the test's warm member";

  // A change of the Sandbox's metadata (as the binding's echo is): the claim is not even
  // looked at. Positive marker: the controller's Sandbox informer handled that version
  // and nothing is queued or being reconciled.
  const double before = Reconciles("kubectl");
  absl::StatusOr<Json> poked =
      client_->Patch(kSandboxes, "default", "warm-1", PatchType::kMerge,
                     {{"metadata", {{"annotations", {{"test/poke", "1"}}}}}});
  ASSERT_TRUE(poked.ok()) << poked.status();
  const std::string poked_version = (*poked)["metadata"]["resourceVersion"];
  ASSERT_TRUE(Eventually(
      [&] {
        return std::stoll(sandboxes_->HandledResourceVersion()) >= std::stoll(poked_version) &&
               controller_->Idle();
      },
      kStep));
  EXPECT_EQ(Reconciles("kubectl"), before) << "reconciled for a change it does not show";

  // A change of the Sandbox's status that the claim's status does not show (a condition of
  // another type): reconciled, not written.
  absl::StatusOr<Json> status_poked =
      client_->Patch(kSandboxes, "default", "warm-1", PatchType::kMerge,
                     {{"status", {{"serviceFQDN", "warm-1.default.svc.cluster.local"}}}}, "status");
  ASSERT_TRUE(status_poked.ok()) << status_poked.status();
  ASSERT_TRUE(Eventually([&] { return Reconciles("kubectl") > before; }, kStep))
      << "no reconcile after the Sandbox's status changed";
  EXPECT_EQ(emulator_.Requests("patch sandboxes"), 2) << "the binding and the test's change";
  EXPECT_EQ(emulator_.Requests("patch sandboxclaims/status"), 1) << "status writes";
  EXPECT_EQ(Reconciles("grpc"), 0);
  std::cout << "reconciles of the kubectl claim: " << Reconciles("kubectl") << std::endl;
  RecordProperty("kubectl_reconciles", static_cast<int>(Reconciles("kubectl")));
}

// Issue 19. A reconcile that runs after a status write and before the informer shows its
// echo reads the claim as it was before the write; the ClaimWriter must not write the same
// status again. Made deterministic by handing the writer that pre-write copy itself (the
// claim lives in a namespace the controller does not serve, so only this writer writes it).
TEST_F(ClaimControllerTest, AStatusIsWrittenOnceWhileTheInformersCopyLagsBehindTheWrite) {
  ClaimWriter writer(client_.get(), writes_.get(), sandboxes_.get());
  ASSERT_NO_FATAL_FAILURE(Create(kNamespaces, {{"metadata", {{"name", "side"}}}}));
  absl::StatusOr<Json> made = client_->Create(kSandboxClaims, "side", Claim("solo", "py"));
  ASSERT_TRUE(made.ok()) << made.status();
  absl::StatusOr<types::SandboxClaim> decoded = types::DecodeSandboxClaim(*made);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const types::SandboxClaim& before_echo = *decoded;
  const Json ready = {{"conditions",
                       {{{"type", "Ready"},
                         {"status", "True"},
                         {"reason", "DependenciesReady"},
                         {"message", "m"},
                         {"lastTransitionTime", "2026-01-01T00:00:00Z"}}}},
                      {"sandbox", {{"name", "sb-1"}}}};
  ASSERT_TRUE(writer.WriteStatus(before_echo, ready).ok());
  ASSERT_TRUE(writer.WriteStatus(before_echo, ready).ok());
  EXPECT_EQ(emulator_.Requests("patch sandboxclaims/status"), 1)
      << "written again from the copy the informer had before the write";
  EXPECT_EQ(writer.LastStatus(before_echo), ready);

  // The echo: a copy of another version, which shows the write itself.
  absl::StatusOr<Json> echo_json = client_->Get(kSandboxClaims, "side", "solo");
  ASSERT_TRUE(echo_json.ok()) << echo_json.status();
  absl::StatusOr<types::SandboxClaim> echo = types::DecodeSandboxClaim(*echo_json);
  ASSERT_TRUE(echo.ok()) << echo.status();
  ASSERT_NE(echo->metadata.resource_version, before_echo.metadata.resource_version);
  ASSERT_TRUE(writer.WriteStatus(*echo, ready).ok());
  EXPECT_EQ(emulator_.Requests("patch sandboxclaims/status"), 1);
  // A change is written.
  Json not_ready = ready;
  not_ready["conditions"][0]["status"] = "False";
  ASSERT_TRUE(writer.WriteStatus(*echo, not_ready).ok());
  EXPECT_EQ(emulator_.Requests("patch sandboxclaims/status"), 2);
}

// Every namespace served, as sbx-server does by default.
class ClaimControllerEveryNamespaceTest : public ClaimControllerTest {
 protected:
  std::string Watch() override { return ""; }
};

// The attack: a user who may make SandboxClaims in namespace team-b makes one carrying
// the annotations of another tenant's gRPC claim (owner and claim id; even the mirror's
// own name), then deletes it. Deleting a gRPC claim's SandboxClaim releases the claim, so
// had the annotations alone been trusted, team-b would end a stranger's claim.
TEST_F(ClaimControllerEveryNamespaceTest, ADeletedLookalikeOfAGrpcClaimsObjectDoesNotReleaseIt) {
  ASSERT_NO_FATAL_FAILURE(PoolWithOneWarmMember());
  // The mirror shows the claims of pools whose allocator template (named like the pool,
  // as the warm pool controller makes it) is of runtime kubernetes.
  store::TemplateRecord t;
  t.name = "py";
  t.runtime = "kubernetes";
  absl::Notification put;
  alloc_->PutTemplate(t, [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    put.Notify();
  });
  ASSERT_TRUE(put.WaitForNotificationWithTimeout(kStep));
  allocator::ClaimRequest request;
  request.owner = "alice";
  request.claim_id = "c1";
  request.pool = "py";
  request.policy = store::EmptyPoolPolicy::kFail;
  absl::Notification claimed;
  absl::Status claim_status;
  alloc_->Claim(request, [&](absl::StatusOr<allocator::ClaimResult> r) {
    claim_status = r.status();
    claimed.Notify();
  });
  ASSERT_TRUE(claimed.WaitForNotificationWithTimeout(kStep));
  ASSERT_TRUE(claim_status.ok()) << claim_status;
  const std::string mirror = GrpcClaimName("alice", "c1");
  ASSERT_TRUE(
      Eventually([&] { return controller_->claims().Get("default", mirror) != nullptr; }, kStep))
      << "the gRPC claim's SandboxClaim was not made";

  ASSERT_NO_FATAL_FAILURE(Create(kNamespaces, {{"metadata", {{"name", "team-b"}}}}));
  Json lookalike = Claim(mirror, "py");
  lookalike["metadata"]["annotations"] = {{kSbxOwnerAnnotation, "alice"},
                                          {kSbxClaimIdAnnotation, "c1"}};
  ASSERT_TRUE(client_->Create(kSandboxClaims, "team-b", lookalike).ok());
  ASSERT_TRUE(client_->Delete(kSandboxClaims, "team-b", mirror, {}).ok());
  // A later object of the same watch: once the controller's informer has it, the
  // lookalike's deletion has been handled.
  ASSERT_TRUE(client_->Create(kSandboxClaims, "team-b", Claim("marker", "none")).ok());
  ASSERT_TRUE(
      Eventually([&] { return controller_->claims().Get("team-b", "marker") != nullptr; }, kStep));
  absl::StatusOr<store::ClaimRecord> c = alloc_->GetClaim("alice", "c1");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state, store::ClaimState::kActive) << "a lookalike's deletion released the claim";

  // The mirror's own object still speaks for it.
  ASSERT_TRUE(client_->Delete(kSandboxClaims, "default", mirror, {}).ok());
  EXPECT_TRUE(Eventually(
      [&] {
        absl::StatusOr<store::ClaimRecord> now = alloc_->GetClaim("alice", "c1");
        return now.ok() && now->state != store::ClaimState::kActive;
      },
      kStep))
      << "deleting the gRPC claim's own SandboxClaim did not release it";
}

// A claim is served from the pools of its own namespace: one that names a pool only
// another namespace has waits for it (WarmPoolNotFound) and is never given that
// namespace's members.
TEST_F(ClaimControllerEveryNamespaceTest, AClaimIsServedOnlyFromItsOwnNamespacesPools) {
  ASSERT_NO_FATAL_FAILURE(PoolWithOneWarmMember());
  ASSERT_NO_FATAL_FAILURE(Create(kNamespaces, {{"metadata", {{"name", "team-b"}}}}));
  ASSERT_TRUE(client_->Create(kSandboxClaims, "team-b", Claim("job", "py")).ok());
  ASSERT_TRUE(Eventually(
      [&] {
        absl::StatusOr<Json> got = client_->Get(kSandboxClaims, "team-b", "job");
        if (!got.ok()) return false;
        for (const Json& c :
             got->value("status", Json::object()).value("conditions", Json::array())) {
          if (c.value("type", "") == "Ready") return c.value("reason", "") == "WarmPoolNotFound";
        }
        return false;
      },
      kStep));
  absl::StatusOr<allocator::PoolStatus> st = alloc_->GetPoolStatus("py");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->warm, 1) << "the default namespace's member was taken";
  EXPECT_FALSE(client_->Get(kSandboxes, "team-b", "job").ok()) << "a cold Sandbox was made";
}

// Upstream writes its claim annotations unless told not to
// (--disable-claim-observability-annotations); so does sbx (--kube_claim_annotations=false).
TEST(ClaimControllerOptionsTest, UpstreamsClaimAnnotationsAreOnByDefault) {
  EXPECT_TRUE(ClaimControllerOptions{}.claim_annotations);
}

// With the claim annotations (the default), as upstream's controller. The other tests
// turn them off to count the writes of the claim path alone.
class ClaimControllerTestWithAnnotations : public ClaimControllerTest {
 protected:
  bool ClaimAnnotations() override { return true; }
};

// Issue 20 item 6: a claim bound to a warm member gets controller-first-observed-at and
// sandbox-name in one metadata patch (and no more, though its echo is reconciled); a
// claim refused for a missing pool gets controller-first-observed-at alone; an
// observed-at written before (an earlier run) is kept.
TEST_F(ClaimControllerTestWithAnnotations, ClaimsGetUpstreamsAnnotationsOnce) {
  ASSERT_NO_FATAL_FAILURE(PoolWithOneWarmMember());
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxClaims, Claim("job", "py")));
  auto annotations = [&](const std::string& name) {
    absl::StatusOr<Json> got = client_->Get(kSandboxClaims, "default", name);
    return got.ok() ? (*got)["metadata"].value("annotations", Json::object()) : Json();
  };
  ASSERT_TRUE(Eventually(
      [&] { return annotations("job").value(kSandboxNameAnnotation, "") == "warm-1"; }, kStep))
      << annotations("job").dump();
  const std::string observed = annotations("job").value(kControllerFirstObservedAnnotation, "");
  absl::Time at;
  std::string err;
  EXPECT_TRUE(absl::ParseTime(absl::RFC3339_full, observed, &at, &err)) << observed << err;
  EXPECT_TRUE(Eventually([&] { return IsReady(Json{{"conditions", {Ready("job")}}}); }, kStep));
  ASSERT_TRUE(Eventually([&] { return controller_->Idle(); }, kStep));
  EXPECT_EQ(emulator_.Requests("patch sandboxclaims"), 1) << "metadata patches";

  // Refused (no such pool): observed-at alone.
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxClaims, Claim("lost", "nopool")));
  ASSERT_TRUE(Eventually([&] { return ReadyReasonIs("lost", "WarmPoolNotFound"); }, kStep));
  ASSERT_TRUE(Eventually(
      [&] { return annotations("lost").contains(kControllerFirstObservedAnnotation); }, kStep));
  EXPECT_FALSE(annotations("lost").contains(kSandboxNameAnnotation));

  // Written before: kept.
  Json early = Claim("early", "nopool");
  early["metadata"]["annotations"] = {{kControllerFirstObservedAnnotation, "2026-01-01T00:00:00Z"}};
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxClaims, early));
  ASSERT_TRUE(Eventually([&] { return ReadyReasonIs("early", "WarmPoolNotFound"); }, kStep));
  ASSERT_TRUE(Eventually([&] { return controller_->Idle(); }, kStep));
  EXPECT_EQ(annotations("early").value(kControllerFirstObservedAnnotation, ""),
            "2026-01-01T00:00:00Z");
}

// The controller on a FakeClock: shutdownTime is judged by it and the look at the claim
// then is a delayed add of the work queue on the same clock.
class ClaimControllerTestOnAFakeClock : public ClaimControllerTest {
 protected:
  const Clock* ControllerClock() override { return &clock_; }
  FakeClock clock_{absl::Now()};
};

// Issue 19. A claim whose shutdownTime (policy Delete) passes is deleted as soon as the
// controller's clock passes it, with no real time spent waiting for it.
TEST_F(ClaimControllerTestOnAFakeClock, AClaimPastItsShutdownTimeIsDeleted) {
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxTemplates, Template("python")));
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxWarmPools, Pool("py", "python")));
  Json claim = Claim("short", "py");
  claim["spec"]["lifecycle"] = {
      {"shutdownTime",
       absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", clock_.Now() + absl::Hours(1), absl::UTCTimeZone())},
      {"shutdownPolicy", "Delete"}};
  ASSERT_NO_FATAL_FAILURE(Create(kSandboxClaims, claim));
  // Reconciled before its shutdownTime: it got its (cold) Sandbox and stays.
  ASSERT_TRUE(Eventually([&] { return client_->Get(kSandboxes, "default", "short").ok(); }, kStep))
      << "the claim's Ready condition: " << Ready("short").dump();
  EXPECT_TRUE(client_->Get(kSandboxClaims, "default", "short").ok());
  EXPECT_EQ(emulator_.Requests("delete sandboxclaims"), 0);

  clock_.Advance(absl::Hours(1) + absl::Seconds(1));
  EXPECT_TRUE(Eventually(
      [&] { return absl::IsNotFound(client_->Get(kSandboxClaims, "default", "short").status()); },
      kStep))
      << "the claim is still there an hour past its shutdownTime on the controller's clock";
  EXPECT_EQ(emulator_.Requests("delete sandboxclaims"), 1);
}

}  // namespace
}  // namespace sbx::k8s

// The SandboxTemplate controller against the API emulator: the NetworkPolicy of a template
// created, kept, replaced by custom rules, deleted when Unmanaged and with its template;
// drift and deletion repaired; a foreign policy of the same name left alone; nothing
// written by a replica that is not the leader. Every test fails on 660dada, which made no
// NetworkPolicy. (tests/e2e/k8s_template_test.py does the same with kubectl and
// sbx-server.)
//
// The resync runs on a FakeClock: a test moves it and waits for the pass, and asserts that
// nothing was written only once the controller has acted on the last change (its informer
// has handled that change's resourceVersion and its queue is idle), never after a sleep.

#include "src/k8s/template_controller.h"

#include <atomic>

#include "gtest/gtest.h"
#include "src/common/clock.h"
#include "src/k8s/sandbox_objects.h"
#include "tests/k8s/test_emulator.h"

namespace sbx::k8s {
namespace {

constexpr char kNs[] = "default";

Json TemplateObject(const std::string& name) {
  return {{"metadata", {{"name", name}}},
          {"spec",
           {{"podTemplate",
             {{"spec",
               {{"containers",
                 {{{"name", "main"},
                   {"image", "python:3.12-slim"},
                   {"ports", {{{"name", "sbx-sandboxd"}, {"containerPort", 7070}}}}}}}}}}}}}};
}

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return done();
}

// The emulator's resourceVersions are one counter over all objects: comparable numbers.
int64_t Version(const std::string& resource_version) {
  return resource_version.empty() ? 0 : std::stoll(resource_version);
}

class TemplateControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    emulator_ = std::make_unique<testing::TestEmulator>();
    ASSERT_TRUE(emulator_->ok());
    client_ = *Client::Create(emulator_->Cluster());
    ASSERT_NO_FATAL_FAILURE(testing::InstallCrds(*client_));
    options_.workers = 2;
    options_.resync = absl::Seconds(30);  // of clock_: only when a test moves it
    options_.clock = &clock_;
    // Only the resync and the expectations run on clock_: a write retried after a
    // conflict backs off in real time (milliseconds), as no test moves the clock for it.
    options_.queue.clock = &Clock::Real();
    options_.network_policy.server_pod_labels = {{"app.kubernetes.io/name", "sbx"}};
    options_.network_policy.server_namespace = "sbx-system";
    options_.is_leader = [this] { return leader_.load(); };
  }
  void TearDown() override { controller_.reset(); }

  void StartController() {
    controller_ = std::make_unique<TemplateController>(client_.get(), options_);
    ASSERT_TRUE(controller_->Start().ok());
  }

  // The template's NetworkPolicy, or null.
  Json Policy(const std::string& template_name) {
    absl::StatusOr<Json> p = client_->Get(kNetworkPolicies, kNs, NetworkPolicyName(template_name));
    return p.ok() ? *p : Json();
  }
  Json Template(const std::string& name) {
    absl::StatusOr<Json> t = client_->Get(kSandboxTemplates, kNs, name);
    return t.ok() ? *t : Json();
  }
  // The same, typed (a default one and a test failure when it does not decode).
  types::SandboxTemplate TypedTemplate(const std::string& name) {
    absl::StatusOr<types::SandboxTemplate> t = types::DecodeSandboxTemplate(Template(name));
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : types::SandboxTemplate();
  }
  // Patches template `name`; returns the resourceVersion of the write ("" and a test
  // failure when it fails).
  std::string PatchTemplate(const std::string& name, const Json& patch) {
    absl::StatusOr<Json> patched =
        client_->Patch(kSandboxTemplates, kNs, name, PatchType::kMerge, patch);
    EXPECT_TRUE(patched.ok()) << patched.status();
    return patched.ok() ? (*patched)["metadata"].value("resourceVersion", "") : "";
  }
  // Waits (at most 20 s) until the template informer has handed every template change up
  // to `resource_version` to the controller and the controller has reconciled what that
  // queued.
  bool Settled(const std::string& resource_version) {
    return WaitFor([&] {
      return Version(controller_->template_informer().HandledResourceVersion()) >=
                 Version(resource_version) &&
             controller_->Idle();
    });
  }
  // Moves clock_ to the next resync and waits (at most 20 s each) until the pass has run
  // and the controller has reconciled every template it queued.
  bool Resync() {
    const int64_t passes = controller_->resyncs();
    if (!WaitFor([&] { return controller_->NextResync() != absl::InfinitePast(); })) return false;
    clock_.Advance(options_.resync);
    return WaitFor([&] { return controller_->resyncs() > passes && controller_->Idle(); });
  }
  bool PolicySpecIs(const std::string& name, const Json& spec) {
    Json p = Policy(name);
    return p.is_object() && p["spec"] == spec;
  }
  int64_t Writes() {
    return emulator_->Requests("create networkpolicies") +
           emulator_->Requests("update networkpolicies") +
           emulator_->Requests("patch networkpolicies") +
           emulator_->Requests("delete networkpolicies");
  }

  FakeClock clock_{absl::Now()};
  std::unique_ptr<testing::TestEmulator> emulator_;
  std::unique_ptr<Client> client_;
  TemplateControllerOptions options_;
  std::atomic<bool> leader_{true};
  std::unique_ptr<TemplateController> controller_;
};

TEST_F(TemplateControllerTest, PolicyFollowsTheTemplateThroughItsLife) {
  ASSERT_NO_FATAL_FAILURE(StartController());
  ASSERT_TRUE(client_->Create(kSandboxTemplates, kNs, TemplateObject("python")).ok());
  // Managed (the CRD's default) with no rules: the secure default, owned by the template.
  const Json defaults =
      *DesiredNetworkPolicy(TypedTemplate("python"), options_.network_policy).spec;
  ASSERT_TRUE(WaitFor([&] { return PolicySpecIs("python", defaults); }))
      << Policy("python").dump(2);
  Json policy = Policy("python");
  EXPECT_EQ(ControllerUid(policy), Template("python")["metadata"]["uid"]);
  EXPECT_EQ(policy["spec"]["podSelector"]["matchLabels"][kTemplateRefHashLabel],
            NameHash("python"));
  ASSERT_EQ(policy["spec"]["ingress"].size(), 2u);  // the router, and sbx-server to sandboxd
  EXPECT_EQ(emulator_->Requests("create networkpolicies"), 1);

  // Steady: touching the template writes nothing.
  const int64_t writes = Writes();
  std::string touched;
  for (int i = 0; i < 3; ++i) {
    touched = PatchTemplate("python", {{"metadata", {{"labels", {{"touch", std::to_string(i)}}}}}});
  }
  ASSERT_TRUE(Settled(touched));
  ASSERT_TRUE(Resync());
  ASSERT_TRUE(Resync());
  EXPECT_EQ(Writes(), writes);

  // Custom rules: exactly those, by one update of the same object.
  const Json custom = Json::parse(R"({
    "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "gateway"}}}],
                 "ports": [{"port": 8080, "protocol": "TCP"}]}],
    "egress": [{"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}]})");
  PatchTemplate("python", {{"spec", {{"networkPolicy", custom}}}});
  Json expected = {
      {"podSelector", {{"matchLabels", {{kTemplateRefHashLabel, NameHash("python")}}}}},
      {"policyTypes", {"Ingress", "Egress"}},
      {"ingress", custom["ingress"]},
      {"egress", custom["egress"]}};
  ASSERT_TRUE(WaitFor([&] { return PolicySpecIs("python", expected); }))
      << Policy("python").dump(2);
  EXPECT_EQ(Policy("python")["metadata"]["uid"], policy["metadata"]["uid"]);
  EXPECT_EQ(emulator_->Requests("update networkpolicies"), 1);

  // Unmanaged: ours is deleted and none is made.
  const std::string unmanaged =
      PatchTemplate("python", {{"spec", {{"networkPolicyManagement", "Unmanaged"}}}});
  ASSERT_TRUE(WaitFor([&] { return Policy("python").is_null(); }));
  ASSERT_TRUE(Settled(unmanaged));
  ASSERT_TRUE(Resync());  // the template looked at again: still none
  EXPECT_TRUE(Policy("python").is_null());

  // Managed again (rules removed): the default comes back.
  PatchTemplate("python",
                {{"spec", {{"networkPolicyManagement", "Managed"}, {"networkPolicy", nullptr}}}});
  ASSERT_TRUE(WaitFor([&] { return PolicySpecIs("python", defaults); }));

  // The template deleted: garbage collection takes the policy (it is the owner).
  DeleteOptions background;
  background.propagation_policy = "Background";
  ASSERT_TRUE(client_->Delete(kSandboxTemplates, kNs, "python", background).ok());
  EXPECT_TRUE(WaitFor([&] { return Policy("python").is_null(); }));
}

TEST_F(TemplateControllerTest, DriftAndDeletionAreRepaired) {
  ASSERT_NO_FATAL_FAILURE(StartController());
  ASSERT_TRUE(client_->Create(kSandboxTemplates, kNs, TemplateObject("python")).ok());
  ASSERT_TRUE(WaitFor([&] { return Policy("python").is_object(); }));
  const Json want = Policy("python")["spec"];
  // Someone opens the policy up: it is put back.
  ASSERT_TRUE(client_
                  ->Patch(kNetworkPolicies, kNs, "python-network-policy", PatchType::kMerge,
                          {{"spec", {{"ingress", Json::array({Json::object()})}}}})
                  .ok());
  ASSERT_TRUE(WaitFor([&] { return PolicySpecIs("python", want); })) << Policy("python").dump(2);
  // Someone deletes it: it is made again.
  ASSERT_TRUE(client_->Delete(kNetworkPolicies, kNs, "python-network-policy").ok());
  ASSERT_TRUE(WaitFor([&] {
    Json p = Policy("python");
    return p.is_object() && p["spec"] == want &&
           p["metadata"].value("deletionTimestamp", "").empty();
  }));
}

TEST_F(TemplateControllerTest, AForeignPolicyOfTheSameNameIsNeverTouched) {
  Json foreign = {{"metadata", {{"name", "python-network-policy"}}},
                  {"spec", {{"podSelector", Json::object()}, {"policyTypes", {"Ingress"}}}}};
  absl::StatusOr<Json> made = client_->Create(kNetworkPolicies, kNs, foreign);
  ASSERT_TRUE(made.ok()) << made.status();
  const int64_t writes = Writes();  // the one above
  ASSERT_NO_FATAL_FAILURE(StartController());
  absl::StatusOr<Json> created = client_->Create(kSandboxTemplates, kNs, TemplateObject("python"));
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_TRUE(Settled((*created)["metadata"]["resourceVersion"].get<std::string>()));
  ASSERT_TRUE(Resync());
  EXPECT_EQ(Policy("python")["metadata"]["resourceVersion"],
            (*made)["metadata"]["resourceVersion"]);
  // Unmanaged does not delete someone else's policy either.
  ASSERT_TRUE(
      Settled(PatchTemplate("python", {{"spec", {{"networkPolicyManagement", "Unmanaged"}}}})));
  ASSERT_TRUE(Resync());
  EXPECT_EQ(Policy("python")["metadata"]["resourceVersion"],
            (*made)["metadata"]["resourceVersion"]);
  EXPECT_EQ(Writes(), writes);
  // Once its owner removes it, a Managed template gets its own.
  PatchTemplate("python", {{"spec", {{"networkPolicyManagement", "Managed"}}}});
  ASSERT_TRUE(client_->Delete(kNetworkPolicies, kNs, "python-network-policy").ok());
  ASSERT_TRUE(WaitFor([&] {
    Json p = Policy("python");
    return p.is_object() && ControllerUid(p) == Template("python")["metadata"]["uid"];
  }));
}

TEST_F(TemplateControllerTest, OnlyTheLeaderWrites) {
  leader_ = false;
  ASSERT_NO_FATAL_FAILURE(StartController());
  absl::StatusOr<Json> created = client_->Create(kSandboxTemplates, kNs, TemplateObject("python"));
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_TRUE(Settled((*created)["metadata"]["resourceVersion"].get<std::string>()));
  ASSERT_TRUE(Resync());
  EXPECT_TRUE(Policy("python").is_null());
  EXPECT_EQ(Writes(), 0);
  // Becoming the leader: the resync hands it the template (and only the resync: no event
  // comes for it).
  leader_ = true;
  ASSERT_TRUE(Resync());
  EXPECT_TRUE(Policy("python").is_object());
}

}  // namespace
}  // namespace sbx::k8s

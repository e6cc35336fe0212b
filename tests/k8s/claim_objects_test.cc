// The SandboxClaim as data (src/k8s/claim_objects.h): plain inputs and outputs, no API
// server. Each test states what a user or the controller would see.

#include "src/k8s/claim_objects.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/k8s/json_fields.h"
#include "src/k8s/kube_runtime.h"
#include "src/k8s/sandbox_objects.h"

namespace sbx::k8s {
namespace {

using ::testing::HasSubstr;

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);  // 2027-01-15T08:00:00Z
constexpr char kNowText[] = "2027-01-15T08:00:00Z";

Json Claim() {
  return Json::parse(R"({
    "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
    "metadata": {"name": "job-42", "namespace": "team", "uid": "claim-uid-1",
                 "resourceVersion": "7", "creationTimestamp": "2027-01-15T07:59:00Z"},
    "spec": {"warmPoolRef": {"name": "py"}}
  })");
}

Json Template() {
  return Json::parse(R"({
    "metadata": {"name": "python", "namespace": "team"},
    "spec": {
      "service": true,
      "podTemplate": {
        "metadata": {"labels": {"app": "py"}},
        "spec": {"containers": [
          {"name": "main", "image": "python:3.12-slim",
           "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
          {"name": "sidecar", "image": "busybox"}]}},
      "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {}}]}
  })");
}

Json WithEnv(Json claim, Json env) {
  claim["spec"]["env"] = std::move(env);
  return claim;
}

Json WithPolicy(Json sandbox_template, const std::string& field, const std::string& policy) {
  sandbox_template["spec"][field] = policy;
  return sandbox_template;
}

// A Sandbox as the Sandbox controller reports it.
Json Sandbox(const std::string& ready, const std::string& reason = "DependenciesReady") {
  return {{"metadata", {{"name", "sb-1"}, {"resourceVersion", "12"}}},
          {"status",
           {{"conditions",
             {{{"type", "Ready"},
               {"status", ready},
               {"reason", reason},
               {"message", "m"},
               {"lastTransitionTime", "2027-01-15T07:00:00Z"}}}},
            {"podIPs", {"10.0.0.9"}}}}};
}

// The claim as the controller gets it: decoded at the edge.
types::SandboxClaim Typed(const Json& claim) {
  absl::StatusOr<types::SandboxClaim> typed = types::DecodeSandboxClaim(claim);
  EXPECT_TRUE(typed.ok()) << typed.status();
  return typed.ok() ? *std::move(typed) : types::SandboxClaim();
}

const Json* Condition(const Json& status, const std::string& type) {
  return json_fields::FindCondition(status, type);
}

// --- The cold Sandbox ---

TEST(ClaimObjectsTest, AColdSandboxIsNamedLikeItsClaimAndControlledByIt) {
  const Json sandbox = ColdSandbox(Typed(Claim()), Template(), "team");
  EXPECT_EQ(sandbox["kind"], "Sandbox");
  EXPECT_EQ(sandbox["metadata"]["name"], "job-42");
  EXPECT_EQ(sandbox["metadata"]["namespace"], "team");
  const Json& labels = sandbox["metadata"]["labels"];
  EXPECT_EQ(labels[kClaimUidLabel], "claim-uid-1");
  EXPECT_EQ(labels[kLaunchTypeLabel], "cold");
  EXPECT_EQ(labels[kTemplateRefHashLabel], NameHash("python"));
  EXPECT_EQ(labels["sbx.dev/template"], "python");
  EXPECT_EQ(sandbox["metadata"]["annotations"][kTemplateRefAnnotation], "python");  // upstream's
  EXPECT_EQ(ControllerUid(sandbox), "claim-uid-1");
  EXPECT_EQ(sandbox["metadata"]["ownerReferences"][0], ClaimRef(Typed(Claim())));
  EXPECT_EQ(ClaimRef(Typed(Claim()))["kind"], "SandboxClaim");
  EXPECT_EQ(ClaimRef(Typed(Claim()))["blockOwnerDeletion"], true);
}

TEST(ClaimObjectsTest, AColdSandboxRunsTheTemplatesPodWithItsSecureDefaultsAndService) {
  const Json sandbox = ColdSandbox(Typed(Claim()), Template(), "team");
  const Json& spec = sandbox["spec"];
  EXPECT_EQ(spec["service"], true);
  EXPECT_EQ(spec["podTemplate"]["metadata"]["labels"]["app"], "py");
  EXPECT_EQ(spec["podTemplate"]["spec"]["containers"][0]["image"], "python:3.12-slim");
  EXPECT_EQ(spec["podTemplate"]["spec"]["automountServiceAccountToken"], false);
  // The template's volumeClaimTemplates, as the claim has none of its own.
  EXPECT_EQ(spec["volumeClaimTemplates"][0]["metadata"]["name"], "data");
}

TEST(ClaimObjectsTest, AClaimsOwnVolumeClaimTemplatesReplaceTheTemplates) {
  Json claim = Claim();
  claim["spec"]["volumeClaimTemplates"] = {{{"metadata", {{"name", "scratch"}}}, {"spec", {}}}};
  const Json sandbox = ColdSandbox(Typed(claim), Template(), "team");
  ASSERT_EQ(sandbox["spec"]["volumeClaimTemplates"].size(), 1u);
  EXPECT_EQ(sandbox["spec"]["volumeClaimTemplates"][0]["metadata"]["name"], "scratch");
}

TEST(ClaimObjectsTest, AClaimsEnvReplacesATemplateVariableOfTheSameNameAndTargetsContainers) {
  const Json claim =
      WithEnv(Claim(), {{{"name", "B"}, {"value", "3"}},
                        {{"name", "C"}, {"value", "4"}, {"containerName", "sidecar"}}});
  const Json sandbox = ColdSandbox(Typed(claim), Template(), "team");
  const Json& containers = sandbox["spec"]["podTemplate"]["spec"]["containers"];
  EXPECT_EQ(containers[0]["env"], Json::parse(R"([{"name": "A", "value": "1"},
                                                  {"name": "B", "value": "3"}])"));
  EXPECT_EQ(containers[1]["env"], Json::parse(R"([{"name": "B", "value": "3"},
                                                  {"name": "C", "value": "4"}])"));
}

TEST(ClaimObjectsTest, AdditionalPodMetadataIsMergedIntoTheColdSandboxsPod) {
  Json claim = Claim();
  claim["spec"]["additionalPodMetadata"] = {{"labels", {{"team", "ml"}}},
                                            {"annotations", {{"note", "x"}}}};
  const Json pod = ColdSandbox(Typed(claim), Template(), "team")["spec"]["podTemplate"];
  EXPECT_EQ(pod["metadata"]["labels"], Json({{"app", "py"}, {"team", "ml"}}));
  EXPECT_EQ(pod["metadata"]["annotations"], Json({{"note", "x"}}));
}

// --- What the template allows ---

TEST(ClaimObjectsTest, AClaimWithoutEnvOrVolumesIsAllowedAndCanTakeAWarmMember) {
  EXPECT_EQ(CheckClaimAgainstTemplate(Typed(Claim()), Template()), std::nullopt);
  EXPECT_FALSE(NeedsOwnSandbox(Typed(Claim())));
  EXPECT_FALSE(NeedsOwnSandbox(Typed(WithEnv(Claim(), Json::array()))));
}

TEST(ClaimObjectsTest, EnvIsRefusedWhenTheTemplateSaysNothingNamingTheTemplate) {
  const Json claim = WithEnv(Claim(), {{{"name", "TASK"}, {"value", "42"}}});
  EXPECT_TRUE(NeedsOwnSandbox(Typed(claim)));
  std::optional<ClaimRefusal> refused = CheckClaimAgainstTemplate(Typed(claim), Template());
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->reason, "EnvVarsInjectionRejected");
  EXPECT_THAT(refused->message, HasSubstr("SandboxTemplate \"python\""));
  EXPECT_THAT(refused->message, HasSubstr("envVarsInjectionPolicy: Disallowed"));
  EXPECT_EQ(CheckClaimAgainstTemplate(
                Typed(claim), WithPolicy(Template(), "envVarsInjectionPolicy", "Disallowed")),
            refused);
}

TEST(ClaimObjectsTest, AllowedEnvTakesNewNamesButRefusesOverridingNamingTheVariable) {
  const Json sandbox_template = WithPolicy(Template(), "envVarsInjectionPolicy", "Allowed");
  EXPECT_EQ(CheckClaimAgainstTemplate(Typed(WithEnv(Claim(), {{{"name", "NEW"}, {"value", "1"}}})),
                                      sandbox_template),
            std::nullopt);
  std::optional<ClaimRefusal> refused = CheckClaimAgainstTemplate(
      Typed(WithEnv(Claim(), {{{"name", "NEW"}, {"value", "1"}}, {{"name", "B"}, {"value", "9"}}})),
      sandbox_template);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->reason, "EnvVarsInjectionRejected");
  EXPECT_THAT(refused->message, HasSubstr("env \"B\" is set by the template"));
}

TEST(ClaimObjectsTest, OverridesEnvMayReplaceTemplateVariables) {
  EXPECT_EQ(
      CheckClaimAgainstTemplate(Typed(WithEnv(Claim(), {{{"name", "B"}, {"value", "9"}}})),
                                WithPolicy(Template(), "envVarsInjectionPolicy", "Overrides")),
      std::nullopt);
}

TEST(ClaimObjectsTest, VolumeClaimTemplatesAreRefusedUnlessTheTemplateAllowsThem) {
  Json claim = Claim();
  claim["spec"]["volumeClaimTemplates"] = {{{"metadata", {{"name", "scratch"}}}}};
  EXPECT_TRUE(NeedsOwnSandbox(Typed(claim)));
  for (const std::string policy : {"", "Disallowed"}) {
    std::optional<ClaimRefusal> refused = CheckClaimAgainstTemplate(
        Typed(claim),
        policy.empty() ? Template() : WithPolicy(Template(), "volumeClaimTemplatesPolicy", policy));
    ASSERT_TRUE(refused.has_value()) << "policy \"" << policy << "\"";
    EXPECT_EQ(refused->reason, "VolumeClaimTemplatesError");  // upstream's reason
    EXPECT_EQ(refused->message,
              "SandboxTemplate \"python\" does not allow volumeClaimTemplates in claims");
  }
  EXPECT_EQ(CheckClaimAgainstTemplate(
                Typed(claim), WithPolicy(Template(), "volumeClaimTemplatesPolicy", "Allowed")),
            std::nullopt);
}

// --- Binding a warm member ---

TEST(ClaimObjectsTest, TheBindingPatchMakesTheClaimTheSandboxsControllerAndDropsThePoolLabel) {
  Json sandbox = {
      {"metadata",
       {{"name", "sb-1"},
        {"labels", {{kWarmPoolLabel, "py"}, {kTemplateRefHashLabel, NameHash("python")}}},
        {"ownerReferences",
         {{{"kind", "SandboxWarmPool"}, {"uid", "pool-uid"}, {"controller", true}}}}}}};
  EXPECT_FALSE(BoundTo(sandbox, "claim-uid-1"));
  sandbox.merge_patch(BindingPatch(Typed(Claim()), "sb-1", "warm"));
  EXPECT_TRUE(BoundTo(sandbox, "claim-uid-1"));
  EXPECT_FALSE(BoundTo(sandbox, "another-claim"));
  const Json& labels = sandbox["metadata"]["labels"];
  EXPECT_FALSE(labels.contains(kWarmPoolLabel));
  EXPECT_EQ(labels[kLaunchTypeLabel], "warm");
  EXPECT_EQ(labels[kTemplateRefHashLabel], NameHash("python"));  // its NetworkPolicy
  EXPECT_EQ(sandbox["metadata"]["ownerReferences"].size(), 1u);
  // As upstream records an adoption: the pod the claim got (named like the member).
  EXPECT_EQ(sandbox["metadata"]["annotations"][kPodNameAnnotation], "sb-1");
}

// As upstream at adoption: the Sandbox's created-by becomes the claim's (a client
// library's), or goes when the claim has none (the member's "controller" is not kept).
TEST(ClaimObjectsTest, TheBindingPatchCopiesTheClaimsCreatedByOrRemovesIt) {
  const Json member = {
      {"metadata",
       {{"name", "sb-1"}, {"labels", {{kWarmPoolLabel, "py"}, {kCreatedByLabel, "controller"}}}}}};
  Json claim = Claim();
  claim["metadata"]["labels"] = {{kCreatedByLabel, "python-sdk"}};
  Json bound = member;
  bound.merge_patch(BindingPatch(Typed(claim), "sb-1", "warm"));
  EXPECT_EQ(bound["metadata"]["labels"][kCreatedByLabel], "python-sdk");

  Json unlabelled = member;
  unlabelled.merge_patch(BindingPatch(Typed(Claim()), "sb-1", "warm"));
  EXPECT_FALSE(unlabelled["metadata"]["labels"].contains(kCreatedByLabel)) << unlabelled.dump();
}

TEST(ClaimObjectsTest, AColdSandboxCarriesTheClaimsCreatedByOnlyWhenTheClaimHasIt) {
  Json claim = Claim();
  claim["metadata"]["labels"] = {{kCreatedByLabel, "python-sdk"}};
  EXPECT_EQ(ColdSandbox(Typed(claim), Template(), "team")["metadata"]["labels"][kCreatedByLabel],
            "python-sdk");
  EXPECT_FALSE(ColdSandbox(Typed(Claim()), Template(), "team")["metadata"]["labels"].contains(
      kCreatedByLabel));
}

TEST(ClaimObjectsTest, ASandboxLabelledForTheClaimButControlledByAnotherIsNotBound) {
  Json sandbox = {{"metadata", {{"labels", {{kClaimUidLabel, "claim-uid-1"}}}}}};
  EXPECT_FALSE(BoundTo(sandbox, "claim-uid-1"));
}

// --- Which updates are reconciled (issue 19: a claim's own writes come back as events) ---

TEST(ClaimObjectsTest, TheEchoOfAClaimsStatusWriteIsNotReconciled) {
  const Json before = Claim();
  Json after = before;
  after["metadata"]["resourceVersion"] = "8";
  after["metadata"]["managedFields"] = Json::array({{{"manager", "sbx"}}});
  after["status"] = Sandbox("True")["status"];
  EXPECT_FALSE(ClaimChangeNeedsReconcile(before, after));
}

TEST(ClaimObjectsTest, AClaimsSpecLabelsAnnotationsOrDeletionAreReconciled) {
  const Json before = Claim();
  Json spec = before;
  spec["spec"]["lifecycle"] = {{"shutdownTime", kNowText}};
  EXPECT_TRUE(ClaimChangeNeedsReconcile(before, spec));
  Json annotated = before;
  annotated["metadata"]["annotations"] = {{"agents.x-k8s.io/client-first-requested-at", kNowText}};
  EXPECT_TRUE(ClaimChangeNeedsReconcile(before, annotated));
  Json labelled = before;
  labelled["metadata"]["labels"] = {{"team", "rl"}};
  EXPECT_TRUE(ClaimChangeNeedsReconcile(before, labelled));
  Json deleting = before;
  deleting["metadata"]["deletionTimestamp"] = kNowText;
  EXPECT_TRUE(ClaimChangeNeedsReconcile(before, deleting));
}

TEST(ClaimObjectsTest, TheEchoOfABindingConcernsNotItsClaimButTheSandboxsStatusDoes) {
  const Json warm = Sandbox("True");
  Json bound = warm;
  bound["metadata"]["resourceVersion"] = "13";
  bound.merge_patch(BindingPatch(Typed(Claim()), "sb-1", "warm"));
  EXPECT_FALSE(SandboxChangeConcernsClaim(warm, bound));

  Json not_ready = bound;
  not_ready["status"]["conditions"][0]["status"] = "False";
  EXPECT_TRUE(SandboxChangeConcernsClaim(bound, not_ready));
  Json moved = bound;
  moved["status"]["podIPs"] = {"10.0.0.10"};
  EXPECT_TRUE(SandboxChangeConcernsClaim(bound, moved));
  Json deleting = bound;
  deleting["metadata"]["deletionTimestamp"] = kNowText;
  EXPECT_TRUE(SandboxChangeConcernsClaim(bound, deleting));
  Json another = bound;
  another["metadata"]["uid"] = "sandbox-uid-2";
  EXPECT_TRUE(SandboxChangeConcernsClaim(bound, another));
}

TEST(ClaimObjectsTest, PodMetadataPatchCarriesOnlyLabelsAndAnnotations) {
  EXPECT_TRUE(PodMetadataPatch(nullptr).is_null());
  EXPECT_TRUE(PodMetadataPatch(Json::object()).is_null());
  EXPECT_EQ(PodMetadataPatch({{"labels", {{"a", "1"}}}, {"other", 1}}),
            Json({{"metadata", {{"labels", {{"a", "1"}}}}}}));
}

// --- The claim's status ---

TEST(ClaimObjectsTest, ABoundClaimIsReadyWithItsSandboxsNameAndPodIPs) {
  const Json sandbox = Sandbox("True");
  const Json status = BoundClaimStatus(Json(), "sb-1", false, &sandbox, kNow);
  EXPECT_TRUE(IsReady(status));
  EXPECT_EQ(status["sandbox"], Json({{"name", "sb-1"}, {"podIPs", {"10.0.0.9"}}}));
  const Json* ready = Condition(status, "Ready");
  ASSERT_NE(ready, nullptr);
  EXPECT_EQ((*ready)["reason"], "DependenciesReady");
  EXPECT_EQ((*ready)["lastTransitionTime"], kNowText);
}

TEST(ClaimObjectsTest, ASandboxWithoutReadyConditionLeavesTheClaimSandboxNotReady) {
  const Json sandbox = {{"metadata", {{"name", "sb-1"}}}, {"status", Json::object()}};
  const Json status = BoundClaimStatus(Json(), "sb-1", true, &sandbox, kNow);
  EXPECT_FALSE(IsReady(status));
  EXPECT_EQ((*Condition(status, "Ready"))["reason"], "SandboxNotReady");
  EXPECT_EQ(status["sandbox"], Json({{"name", "sb-1"}}));
}

TEST(ClaimObjectsTest, AColdSandboxNotInTheCacheYetSaysCreatePending) {
  const Json status = BoundClaimStatus(Json(), "job-42", true, nullptr, kNow);
  EXPECT_EQ((*Condition(status, "Ready"))["reason"], "SandboxCreatePending");
  EXPECT_EQ(status["sandbox"], Json({{"name", "job-42"}}));
}

TEST(ClaimObjectsTest, AWarmSandboxNotInTheCacheKeepsTheClaimsConditions) {
  const Json old = {{"conditions", {{{"type", "Ready"}, {"status", "True"}}}}};
  const Json status = BoundClaimStatus(old, "sb-1", false, nullptr, kNow);
  EXPECT_EQ(status["conditions"], old["conditions"]);
  EXPECT_EQ(status["sandbox"], Json({{"name", "sb-1"}}));
}

TEST(ClaimObjectsTest, ASandboxsFinishedConditionIsShownOnTheClaim) {
  Json sandbox = Sandbox("False", "PodFinished");
  const Json finished = {{"type", "Finished"}, {"status", "True"}, {"reason", "Succeeded"}};
  sandbox["status"]["conditions"].push_back(finished);
  const Json status = BoundClaimStatus(Json(), "sb-1", false, &sandbox, kNow);
  ASSERT_NE(Condition(status, "Finished"), nullptr);
  EXPECT_EQ(*Condition(status, "Finished"), finished);
}

TEST(ClaimObjectsTest, AConditionKeepsItsTransitionTimeUntilItsStatusChanges) {
  const Json old = {
      {"conditions",
       {{{"type", "Ready"}, {"status", "False"}, {"lastTransitionTime", "2027-01-01T00:00:00Z"}}}}};
  EXPECT_EQ(ClaimCondition("Ready", false, "R", "m", old, kNow)["lastTransitionTime"],
            "2027-01-01T00:00:00Z");
  EXPECT_EQ(ClaimCondition("Ready", true, "R", "m", old, kNow)["lastTransitionTime"], kNowText);
  // So an unchanged world computes an equal status, which is not written again.
  const Json sandbox = Sandbox("True");
  const Json first = BoundClaimStatus(Json(), "sb-1", false, &sandbox, kNow);
  const Json again = BoundClaimStatus(first, "sb-1", false, &sandbox, kNow + absl::Minutes(5));
  EXPECT_EQ(again, first);
  EXPECT_TRUE(StatusShows(first, again));
}

TEST(ClaimObjectsTest, AStatusIsShownWhenEveryFieldWrittenIsThereAlready) {
  const Json old = {{"sandbox", {{"name", "sb-1"}}}, {"other", 1}};
  EXPECT_TRUE(StatusShows(old, {{"sandbox", {{"name", "sb-1"}}}}));
  EXPECT_FALSE(StatusShows(old, {{"sandbox", {{"name", "sb-2"}}}}));
  EXPECT_FALSE(StatusShows(old, {{"conditions", Json::array()}}));
  EXPECT_FALSE(StatusShows(nullptr, Json::object()));  // a claim with no status yet
}

TEST(ClaimObjectsTest, ARefusalReplacesTheConditionsAndKeepsTheRest) {
  const Json old = {{"sandbox", {{"name", "sb-1"}}},
                    {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}};
  const Json status = RefusedStatus(old, {"SandboxMissing", "sandbox \"sb-1\" is gone"}, kNow);
  EXPECT_EQ(status["sandbox"], old["sandbox"]);
  ASSERT_EQ(status["conditions"].size(), 1u);
  EXPECT_EQ(status["conditions"][0]["status"], "False");
  EXPECT_EQ(status["conditions"][0]["reason"], "SandboxMissing");
  EXPECT_EQ(status["conditions"][0]["message"], "sandbox \"sb-1\" is gone");
}

// --- Lifecycle ---

Json WithLifecycle(Json lifecycle) {
  Json claim = Claim();
  claim["spec"]["lifecycle"] = std::move(lifecycle);
  return claim;
}

TEST(ClaimObjectsTest, AClaimWithoutShutdownTimeNeverEnds) {
  const LifecycleVerdict v = ShutdownVerdict(Typed(Claim()), kNow);
  EXPECT_EQ(v.end, ClaimEnd::kNone);
  EXPECT_EQ(v.look_again, absl::InfiniteFuture());
}

TEST(ClaimObjectsTest, BeforeItsShutdownTimeAClaimIsLookedAtAgainThen) {
  const LifecycleVerdict v = ShutdownVerdict(
      Typed(
          WithLifecycle({{"shutdownTime", "2027-01-15T09:00:00Z"}, {"shutdownPolicy", "Delete"}})),
      kNow);
  EXPECT_EQ(v.end, ClaimEnd::kNone);
  EXPECT_EQ(v.look_again, kNow + absl::Hours(1));
}

TEST(ClaimObjectsTest, AtItsShutdownTimeAClaimEndsByItsPolicy) {
  auto end = [](const std::string& policy) {
    Json lifecycle = {{"shutdownTime", kNowText}};
    if (!policy.empty()) lifecycle["shutdownPolicy"] = policy;
    return ShutdownVerdict(Typed(WithLifecycle(lifecycle)), kNow).end;
  };
  EXPECT_EQ(end("Delete"), ClaimEnd::kDeleteBackground);
  EXPECT_EQ(end("DeleteForeground"), ClaimEnd::kDeleteForeground);
  EXPECT_EQ(end("Retain"), ClaimEnd::kRetain);
  EXPECT_EQ(end(""), ClaimEnd::kRetain);
}

TEST(ClaimObjectsTest, AShutdownTimeThatIsNotRfc3339NeverComes) {
  const LifecycleVerdict v = ShutdownVerdict(
      Typed(WithLifecycle({{"shutdownTime", "tomorrow"}, {"shutdownPolicy", "Delete"}})), kNow);
  EXPECT_EQ(v.end, ClaimEnd::kNone);
  EXPECT_EQ(v.look_again, absl::InfiniteFuture());
}

TEST(ClaimObjectsTest, TtlAfterFinishedDeletesTheClaimThatLongAfterItsSandboxFinished) {
  const Json claim = WithLifecycle({{"ttlSecondsAfterFinished", 60}});
  const Json finished = {{"conditions",
                          {{{"type", "Finished"},
                            {"status", "True"},
                            {"lastTransitionTime", "2027-01-15T07:59:30Z"}}}}};
  const LifecycleVerdict waiting = TtlVerdict(Typed(claim), finished, kNow);
  EXPECT_EQ(waiting.end, ClaimEnd::kNone);
  EXPECT_EQ(waiting.look_again, kNow + absl::Seconds(30));
  EXPECT_EQ(TtlVerdict(Typed(claim), finished, kNow + absl::Seconds(30)).end, ClaimEnd::kDelete);
  // Not finished, finished False, or no ttl: nothing to wait for.
  EXPECT_EQ(TtlVerdict(Typed(claim), Json::object(), kNow).look_again, absl::InfiniteFuture());
  Json running = finished;
  running["conditions"][0]["status"] = "False";
  EXPECT_EQ(TtlVerdict(Typed(claim), running, kNow).look_again, absl::InfiniteFuture());
  EXPECT_EQ(TtlVerdict(Typed(Claim()), finished, kNow).look_again, absl::InfiniteFuture());
}

TEST(ClaimObjectsTest, AClaimWasMadeAtItsCreationAndRequestedWhenItsClientSays) {
  Json claim = Claim();
  EXPECT_EQ(ClaimCreatedAt(Typed(claim), kNow), kNow - absl::Minutes(1));
  EXPECT_EQ(ClaimCreatedAt(Typed(Json::object()), kNow), kNow);
  EXPECT_EQ(ClientRequestedAt(Typed(claim)), std::nullopt);
  claim["metadata"]["annotations"][kClientRequestedAtAnnotation] = "2027-01-15T07:58:00.5Z";
  EXPECT_EQ(ClientRequestedAt(Typed(claim)), kNow - absl::Minutes(2) + absl::Milliseconds(500));
  claim["metadata"]["annotations"][kClientRequestedAtAnnotation] = "yesterday";
  EXPECT_EQ(ClientRequestedAt(Typed(claim)), std::nullopt);
}

TEST(ClaimObjectsTest, CreatedByIsOneOfUpstreamsValuesOrUnknown) {  // sandbox_objects.h
  Json claim = Claim();
  EXPECT_EQ(CreatedBy(claim), "unknown");
  for (const char* by : {"go-client", "python-client", "controller"}) {
    claim["metadata"]["labels"][kCreatedByLabel] = by;
    EXPECT_EQ(CreatedBy(claim), by);
  }
  claim["metadata"]["labels"][kCreatedByLabel] = "bench";
  EXPECT_EQ(CreatedBy(claim), "unknown");
}

// --- gRPC claims ---

store::ClaimRecord GrpcClaim() {
  store::ClaimRecord c;
  c.owner = "alice";
  c.id = "c1";
  c.pool = "team/py";
  c.sandbox_id = "team/sb-1";
  return c;
}

TEST(ClaimObjectsTest, AGrpcClaimsSandboxClaimNamesItsOwnerIdSandboxAndPool) {
  const Json claim =
      types::Encode(GrpcSandboxClaim(GrpcClaim(), "grpc-622bb74485987482", {"team", "py"}, "sb-1"));
  EXPECT_EQ(claim["metadata"]["name"], "grpc-622bb74485987482");
  EXPECT_EQ(claim["metadata"]["namespace"], "team");
  EXPECT_EQ(claim["metadata"]["labels"]["sbx.dev/source"], "grpc");
  const Json& annotations = claim["metadata"]["annotations"];
  EXPECT_EQ(annotations[kSbxOwnerAnnotation], "alice");
  EXPECT_EQ(annotations[kSbxClaimIdAnnotation], "c1");
  EXPECT_EQ(annotations[kSandboxNameAnnotation], "sb-1");
  EXPECT_EQ(claim["spec"]["warmPoolRef"]["name"], "py");
}

TEST(ClaimObjectsTest, AGrpcClaimsStatusIsReadyWithItsSandboxsPodIPs) {
  const Json sandbox = Sandbox("True");
  const Json status = GrpcClaimStatus("sb-1", &sandbox, Json(), kNow);
  EXPECT_TRUE(IsReady(status));
  EXPECT_EQ((*Condition(status, "Ready"))["message"], "claimed over gRPC");
  EXPECT_EQ(status["sandbox"], Json({{"name", "sb-1"}, {"podIPs", {"10.0.0.9"}}}));
  EXPECT_EQ(GrpcClaimStatus("sb-1", nullptr, Json(), kNow)["sandbox"], Json({{"name", "sb-1"}}));
}

}  // namespace
}  // namespace sbx::k8s

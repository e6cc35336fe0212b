// Tests of src/k8s/conversion.cc: the v1alpha1 <-> v1beta1 conversion of upstream
// agent-sandbox (its documented behaviour, checked field by field) and the ConversionReview.

#include "src/k8s/conversion.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sbx::k8s {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

constexpr char kCoreAlpha[] = "agents.x-k8s.io/v1alpha1";
constexpr char kCoreBeta[] = "agents.x-k8s.io/v1beta1";
constexpr char kExtAlpha[] = "extensions.agents.x-k8s.io/v1alpha1";
constexpr char kExtBeta[] = "extensions.agents.x-k8s.io/v1beta1";

Json Convert(const Json& object, const std::string& to) {
  absl::StatusOr<Json> out = ConvertAgentsObject(object, to);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : Json();
}

Json AlphaSandbox(const Json& replicas) {
  Json s = {{"apiVersion", kCoreAlpha},
            {"kind", "Sandbox"},
            {"metadata",
             {{"name", "sb"},
              {"namespace", "team-a"},
              {"labels", {{"app", "x"}}},
              {"annotations", {{"keep", "me"}}}}},
            {"spec",
             {{"podTemplate",
               {{"metadata", {{"labels", {{"l", "v"}}}}},
                {"spec", {{"containers", {{{"name", "c"}, {"image", "agent-image:latest"}}}}}}}},
              {"volumeClaimTemplates", {{{"metadata", {{"name", "workspace"}}}, {"spec", {}}}}},
              {"shutdownPolicy", "Delete"},
              {"service", true}}},
            {"status", {{"podIPs", {"10.0.0.1"}}, {"serviceFQDN", "sb.team-a.svc"}}}};
  if (!replicas.is_null()) s["spec"]["replicas"] = replicas;
  return s;
}

TEST(ConversionTest, ASandboxsReplicasBecomeItsOperatingModeAndComeBack) {
  for (const Json& replicas : {Json(), Json(1), Json(0)}) {
    SCOPED_TRACE(replicas.dump());
    Json alpha = AlphaSandbox(replicas);
    if (replicas != Json(0)) alpha["status"]["replicas"] = 1;  // 0 is left out (omitempty)
    const Json before = alpha;
    Json beta = Convert(alpha, kCoreBeta);
    EXPECT_EQ(alpha, before) << "the input was changed";
    EXPECT_EQ(beta["apiVersion"], kCoreBeta);
    EXPECT_EQ(beta["spec"]["operatingMode"], replicas == Json(0) ? "Suspended" : "Running");
    EXPECT_FALSE(beta["spec"].contains("replicas"));
    EXPECT_FALSE(beta["status"].contains("replicas"));
    EXPECT_EQ(beta["spec"]["podTemplate"], alpha["spec"]["podTemplate"]);
    EXPECT_EQ(beta["spec"]["volumeClaimTemplates"], alpha["spec"]["volumeClaimTemplates"]);
    EXPECT_EQ(beta["spec"]["shutdownPolicy"], "Delete");
    EXPECT_EQ(beta["spec"]["service"], true);
    EXPECT_EQ(beta["status"]["podIPs"], alpha["status"]["podIPs"]);
    EXPECT_EQ(beta["metadata"]["labels"], alpha["metadata"]["labels"]);
    EXPECT_EQ(beta["metadata"]["annotations"]["keep"], "me");
    ASSERT_TRUE(
        beta["metadata"]["annotations"].contains("api.agents.x-k8s.io/v1alpha1-sandbox-state"));

    Json back = Convert(beta, kCoreAlpha);
    EXPECT_EQ(back, alpha) << "round trip lost something:\n" << back.dump(1);
  }
}

TEST(ConversionTest, ASandboxWrittenInV1beta1ReadsAsReplicas) {
  for (const auto& [mode, replicas] :
       {std::pair<Json, int>{"Running", 1}, {"Suspended", 0}, {Json(), 1}}) {
    SCOPED_TRACE(mode.dump());
    Json beta = {{"apiVersion", kCoreBeta},
                 {"kind", "Sandbox"},
                 {"metadata", {{"name", "sb"}}},
                 {"spec", {{"podTemplate", {{"spec", {{"containers", Json::array()}}}}}}},
                 {"status", {{"nodeName", "node-1"}, {"podIPs", {"10.0.0.2"}}}}};
    if (!mode.is_null()) beta["spec"]["operatingMode"] = mode;
    Json alpha = Convert(beta, kCoreAlpha);
    EXPECT_EQ(alpha["spec"]["replicas"], replicas);
    EXPECT_FALSE(alpha["spec"].contains("operatingMode"));
    EXPECT_FALSE(alpha["status"].contains("nodeName")) << "nodeName is not in v1alpha1";
    EXPECT_EQ(alpha["status"].value("replicas", 0), replicas);
    EXPECT_EQ(alpha["status"]["podIPs"], beta["status"]["podIPs"]);
    EXPECT_FALSE(alpha["metadata"].contains("annotations"));
  }
}

// Upstream restores status.replicas from the state annotation, i.e. from the status of the
// last v1alpha1 write; a Sandbox applied with kubectl (no status) then reads 0 while it
// runs. sbx keeps status what v1beta1 observes.
TEST(ConversionTest, ASandboxsStatusReplicasFollowItsModeNotTheLastV1alpha1Write) {
  Json beta = Convert(AlphaSandbox(Json()), kCoreBeta);  // applied without a status
  beta["status"] = {{"conditions", Json::array()}};
  EXPECT_EQ(Convert(beta, kCoreAlpha)["status"]["replicas"], 1);
}

TEST(ConversionTest, ASandboxSuspendedInV1alpha1AndResumedInV1beta1ReadsAsRunning) {
  Json beta = Convert(AlphaSandbox(0), kCoreBeta);
  ASSERT_EQ(beta["spec"]["operatingMode"], "Suspended");
  beta["spec"]["operatingMode"] = "Running";  // kubectl patch in v1beta1
  Json alpha = Convert(beta, kCoreAlpha);
  EXPECT_EQ(alpha["spec"]["replicas"], 1);
  EXPECT_FALSE(
      alpha["metadata"]["annotations"].contains("api.agents.x-k8s.io/v1alpha1-sandbox-state"));
}

TEST(ConversionTest, AClaimsWarmpoolPolicyBecomesItsWarmPoolRef) {
  struct Case {
    const char* name;
    Json warmpool;
    const char* sandbox;
    const char* want_pool;
  };
  for (const Case& c : {
           Case{"a pool named", "python-pool", "", "python-pool"},
           Case{"default, not bound yet", "default", "", "shadow-pool-python"},
           Case{"unset, bound cold (sandbox named as the claim)", Json(), "my-claim",
                "shadow-pool-python"},
           Case{"none, bound to a warm member", "none", "python-pool-x7k2p", "python-pool"},
       }) {
    SCOPED_TRACE(c.name);
    Json alpha = {{"apiVersion", kExtAlpha},
                  {"kind", "SandboxClaim"},
                  {"metadata", {{"name", "my-claim"}, {"namespace", "default"}}},
                  {"spec",
                   {{"sandboxTemplateRef", {{"name", "python"}}},
                    {"lifecycle", {{"shutdownPolicy", "Retain"}, {"ttlSecondsAfterFinished", 30}}},
                    {"env", {{{"name", "A"}, {"value", "1"}}}}}}};
    if (!c.warmpool.is_null()) alpha["spec"]["warmpool"] = c.warmpool;
    if (*c.sandbox != '\0') alpha["status"] = {{"sandbox", {{"name", c.sandbox}}}};
    Json beta = Convert(alpha, kExtBeta);
    EXPECT_EQ(beta["spec"]["warmPoolRef"], Json({{"name", c.want_pool}}));
    EXPECT_FALSE(beta["spec"].contains("sandboxTemplateRef"));
    EXPECT_FALSE(beta["spec"].contains("warmpool"));
    EXPECT_EQ(beta["spec"]["lifecycle"], alpha["spec"]["lifecycle"]);
    EXPECT_EQ(beta["spec"]["env"], alpha["spec"]["env"]);
    EXPECT_EQ(Convert(beta, kExtAlpha), alpha) << "the v1alpha1 writer gets back what it wrote";
  }
}

TEST(ConversionTest, AClaimWrittenInV1beta1ReadsAsTemplateAndPool) {
  Json beta = {{"apiVersion", kExtBeta},
               {"kind", "SandboxClaim"},
               {"metadata", {{"name", "c"}}},
               {"spec",
                {{"warmPoolRef", {{"name", "python-pool"}}},
                 {"volumeClaimTemplates", {{{"metadata", {{"name", "w"}}}, {"spec", {}}}}}}},
               {"status", {{"sandbox", {{"name", "python-pool-abcde"}, {"podIPs", {"1.2.3.4"}}}}}}};
  Json alpha = Convert(beta, kExtAlpha);
  EXPECT_EQ(alpha["spec"]["sandboxTemplateRef"], Json({{"name", "python-pool"}}));
  EXPECT_EQ(alpha["spec"]["warmpool"], "python-pool");
  EXPECT_FALSE(alpha["spec"].contains("volumeClaimTemplates")) << "not in v1alpha1";
  EXPECT_EQ(alpha["status"], beta["status"]);

  beta["spec"]["warmPoolRef"]["name"] = "shadow-pool-python";
  alpha = Convert(beta, kExtAlpha);
  EXPECT_EQ(alpha["spec"]["sandboxTemplateRef"], Json({{"name", "python"}}));
  EXPECT_EQ(alpha["spec"]["warmpool"], "default");
}

TEST(ConversionTest, AClaimMovedToAnotherPoolInV1beta1ReadsWithThatPool) {
  Json alpha = {{"apiVersion", kExtAlpha},
                {"kind", "SandboxClaim"},
                {"metadata", {{"name", "c"}}},
                {"spec", {{"sandboxTemplateRef", {{"name", "python"}}}, {"warmpool", "p1"}}}};
  Json beta = Convert(alpha, kExtBeta);
  beta["spec"]["warmPoolRef"]["name"] = "p2";
  Json back = Convert(beta, kExtAlpha);
  EXPECT_EQ(back["spec"]["warmpool"], "p2");
  EXPECT_EQ(back["spec"]["sandboxTemplateRef"], Json({{"name", "python"}}));
}

TEST(ConversionTest, ATemplatesVolumeClaimTemplatesPolicyTravelsInAnAnnotation) {
  const std::string key = "api.agents.x-k8s.io/v1beta1-volume-claim-templates-policy";
  Json beta = {{"apiVersion", kExtBeta},
               {"kind", "SandboxTemplate"},
               {"metadata", {{"name", "t"}}},
               {"spec",
                {{"podTemplate", {{"spec", {{"containers", Json::array()}}}}},
                 {"volumeClaimTemplatesPolicy", "Overrides"},
                 {"networkPolicy", {{"ingress", Json::array()}, {"podSelector", Json::object()}}},
                 {"networkPolicyManagement", "Unmanaged"}}}};
  Json alpha = Convert(beta, kExtAlpha);
  EXPECT_EQ(alpha["metadata"]["annotations"][key], "Overrides");
  EXPECT_FALSE(alpha["spec"].contains("volumeClaimTemplatesPolicy"));
  EXPECT_EQ(alpha["spec"]["networkPolicy"], Json({{"ingress", Json::array()}}))
      << "only ingress and egress are in a template's networkPolicy";
  EXPECT_EQ(alpha["spec"]["networkPolicyManagement"], "Unmanaged");

  Json up = Convert(alpha, kExtBeta);
  EXPECT_EQ(up["spec"]["volumeClaimTemplatesPolicy"], "Overrides");
  EXPECT_FALSE(up["metadata"]["annotations"].contains(key));

  alpha["metadata"]["annotations"][key] = "Sometimes";
  absl::StatusOr<Json> bad = ConvertAgentsObject(alpha, kExtBeta);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("\"Sometimes\""));
}

TEST(ConversionTest, AWarmPoolsReplicasAreRequiredInV1alpha1) {
  Json beta = {{"apiVersion", kExtBeta},
               {"kind", "SandboxWarmPool"},
               {"metadata", {{"name", "p"}}},
               {"spec", {{"sandboxTemplateRef", {{"name", "python"}}}}},
               {"status", {{"replicas", 2}, {"readyReplicas", 1}, {"observedGeneration", 3}}}};
  Json alpha = Convert(beta, kExtAlpha);
  EXPECT_EQ(alpha["spec"]["replicas"], 1) << "v1beta1 left it out: upstream reads 1";
  EXPECT_EQ(alpha["status"], Json({{"replicas", 2}, {"readyReplicas", 1}}));
  alpha["spec"]["replicas"] = 5;
  Json up = Convert(alpha, kExtBeta);
  EXPECT_EQ(up["spec"]["replicas"], 5);
  EXPECT_EQ(up["spec"]["sandboxTemplateRef"], Json({{"name", "python"}}));
}

TEST(ConversionTest, AnObjectAlreadyInTheDesiredVersionComesBackUnchanged) {
  Json alpha = AlphaSandbox(0);
  EXPECT_EQ(Convert(alpha, kCoreAlpha), alpha);
}

TEST(ConversionTest, WhatCannotBeConvertedIsNamed) {
  struct Case {
    Json object;
    const char* to;
    const char* says;
  };
  Json bad_replicas = AlphaSandbox("one");
  Json bad_state = Convert(AlphaSandbox(1), kCoreBeta);
  bad_state["metadata"]["annotations"]["api.agents.x-k8s.io/v1alpha1-sandbox-state"] = "{not json";
  Json deep_state = bad_state;
  deep_state["metadata"]["annotations"]["api.agents.x-k8s.io/v1alpha1-sandbox-state"] =
      std::string(5000, '[') + std::string(5000, ']');
  for (const Case& c : {
           Case{{{"apiVersion", "apps/v1"}, {"kind", "Deployment"}},
                "apps/v2",
                "kind Deployment of group apps is not converted"},
           Case{AlphaSandbox(1), kExtBeta, "to group extensions.agents.x-k8s.io"},
           Case{AlphaSandbox(1), "agents.x-k8s.io/v2", "has no version v2"},
           Case{AlphaSandbox(1), "v1beta1", "is not group/version"},
           Case{bad_replicas, kCoreBeta, "spec.replicas must be an integer, not string"},
           Case{bad_state, kCoreAlpha, "is not the JSON of a v1alpha1 Sandbox"},
           Case{deep_state, kCoreAlpha, "nests deeper than"},
           Case{Json::array(), kCoreBeta, "must be a JSON object"},
       }) {
    absl::StatusOr<Json> out = ConvertAgentsObject(c.object, c.to);
    ASSERT_FALSE(out.ok()) << c.says;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(out.status().message(), HasSubstr(c.says));
  }
}

TEST(ConversionTest, AReviewIsAnsweredWithItsUid) {
  Json review = {{"apiVersion", "apiextensions.k8s.io/v1"},
                 {"kind", "ConversionReview"},
                 {"request",
                  {{"uid", "705ab4f5-6393-11e8-b7cc-42010a800002"},
                   {"desiredAPIVersion", kCoreBeta},
                   {"objects", {AlphaSandbox(0), AlphaSandbox(Json())}}}}};
  absl::StatusOr<Json> answer = ReviewConversion(review.dump());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ((*answer)["apiVersion"], "apiextensions.k8s.io/v1");
  EXPECT_EQ((*answer)["kind"], "ConversionReview");
  const Json& response = (*answer)["response"];
  EXPECT_EQ(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
  EXPECT_EQ(response["result"]["status"], "Success");
  ASSERT_EQ(response["convertedObjects"].size(), 2u);
  EXPECT_EQ(response["convertedObjects"][0]["spec"]["operatingMode"], "Suspended");
  EXPECT_EQ(response["convertedObjects"][1]["spec"]["operatingMode"], "Running");

  review["request"]["objects"][1]["spec"]["replicas"] = "x";
  answer = ReviewConversion(review.dump());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ((*answer)["response"]["result"]["status"], "Failure");
  EXPECT_THAT((*answer)["response"]["result"]["message"].get<std::string>(),
              HasSubstr("objects[1]: Sandbox \"sb\" from agents.x-k8s.io/v1alpha1"));
  EXPECT_FALSE((*answer)["response"].contains("convertedObjects"));
}

TEST(ConversionTest, WhatIsNotAReviewIsRefused) {
  for (const std::string& body :
       {std::string("not json"), std::string("[]"),
        Json({{"apiVersion", "v1"}, {"kind", "ConversionReview"}}).dump(),
        Json({{"apiVersion", "apiextensions.k8s.io/v1"}, {"kind", "ConversionReview"}}).dump()}) {
    absl::StatusOr<Json> answer = ReviewConversion(body);
    EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument) << body;
  }
}

// The attack: a caller inside the cluster (any pod can reach the webhook's port) sends an
// object nested a million levels deep. Copying or printing such a document recurses once
// per level and overflows the stack, which would kill every replica the Service sends it to.
TEST(ConversionTest, ADeeplyNestedReviewIsRefusedBeforeItIsParsed) {
  const int depth = 1'000'000;
  std::string deep = std::string(depth, '[') + std::string(depth, ']');
  std::string body = R"({"apiVersion":"apiextensions.k8s.io/v1","kind":"ConversionReview",)"
                     R"("request":{"uid":"u","desiredAPIVersion":"agents.x-k8s.io/v1beta1",)"
                     R"("objects":[{"apiVersion":"agents.x-k8s.io/v1alpha1","kind":"Sandbox",)"
                     R"("metadata":{"name":"deep"},"spec":{"podTemplate":)" +
                     deep + "}}]}}";
  absl::StatusOr<Json> answer = ReviewConversion(body);
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(answer.status().message(), HasSubstr("nests deeper than 100 levels"));
}

TEST(ConversionTest, NestingIsCountedOutsideStringsOnly) {
  EXPECT_FALSE(JsonNestsDeeperThan(R"({"a":"[[[[[[[[[[","b":"\"[[[["})", 2));
  EXPECT_TRUE(JsonNestsDeeperThan(R"({"a":[[1]]})", 2));
  EXPECT_FALSE(JsonNestsDeeperThan(R"({"a":[1],"b":[2]})", 2));
}

}  // namespace
}  // namespace sbx::k8s

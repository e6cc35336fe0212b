#include "src/k8s/sandbox_objects.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sbx::k8s {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

Json Sandbox() {
  return Json::parse(R"({
    "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
    "metadata": {"name": "my-sandbox", "namespace": "team", "uid": "u-1", "generation": 3},
    "spec": {
      "podTemplate": {
        "metadata": {
          "labels": {"app": "demo", "agents.x-k8s.io/foo": "x", "extensions.agents.x-k8s.io/bar": "y"},
          "annotations": {"note": "kept", "agents.x-k8s.io/secret": "dropped"}},
        "spec": {
          "containers": [{"name": "main", "image": "python:3.12-slim",
                          "ports": [{"name": "http", "containerPort": 8080},
                                    {"containerPort": 9090, "protocol": "UDP"}]}],
          "volumes": [{"name": "data", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]}},
      "volumeClaimTemplates": [
        {"metadata": {"name": "data"}, "spec": {"resources": {"requests": {"storage": "1Gi"}}}},
        {"metadata": {"name": "cache"}, "spec": {}}]}
  })");
}

Json RunningPod(bool ready = true) {
  return Json::parse(std::string(R"({
    "metadata": {"name": "my-sandbox", "uid": "p-1"},
    "spec": {"nodeName": "node-1"},
    "status": {"phase": "Running", "podIP": "10.0.0.7", "podIPs": [{"ip": "10.0.0.7"}],
               "conditions": [{"type": "PodScheduled", "status": "True"},
                              {"type": "Ready", "status": ")") +
                     (ready ? "True" : "False") + R"("}]}})");
}

std::string Reason(const Json& status, const std::string& type) {
  for (const Json& c : status["conditions"]) {
    if (c["type"] == type)
      return c["reason"].get<std::string>() + "/" + c["status"].get<std::string>();
  }
  return "absent";
}

// The objects as the controller gets them: decoded at the edge.
template <class T>
T Decoded(absl::StatusOr<T> typed) {
  EXPECT_TRUE(typed.ok()) << typed.status();
  return typed.ok() ? *std::move(typed) : T();
}
types::Sandbox Typed(const Json& sandbox) { return Decoded(types::DecodeSandbox(sandbox)); }
types::Pod TypedPod(const Json& pod) { return Decoded(types::DecodePod(pod)); }
types::Service TypedService(const Json& service) { return Decoded(types::DecodeService(service)); }
types::PersistentVolumeClaim TypedPvc(const Json& pvc) {
  return Decoded(types::DecodePersistentVolumeClaim(pvc));
}

// Observed::pods as the controller fills it (shared with the typed cache).
std::vector<std::shared_ptr<const types::Pod>> Pods(const std::vector<Json>& pods) {
  std::vector<std::shared_ptr<const types::Pod>> out;
  for (const Json& pod : pods) out.push_back(std::make_shared<const types::Pod>(TypedPod(pod)));
  return out;
}

// ComputeStatus of the JSON objects, encoded as the controller sends it.
Json Status(const Json& sandbox, const Observed& observed, const Json& old_status, absl::Time now) {
  const types::SandboxStatus old = Typed(Json{{"status", old_status}}).status;
  return types::Encode(ComputeStatus(Typed(sandbox), observed, old, now));
}

TEST(SandboxObjectsTest, NameHashIsFnv1a32) {
  // Reference values computed independently (Python) for FNV-1a 32-bit.
  EXPECT_EQ(NameHash("my-sandbox"), "374de8f5");
  EXPECT_EQ(NameHash(""), "811c9dc5");
  EXPECT_EQ(NameHash("a"), "e40c292c");
}

TEST(SandboxObjectsTest, PodFollowsTheTemplateWithoutReservedMetadata) {
  Json pod = DesiredPod(Typed(Sandbox()));
  EXPECT_EQ(pod["metadata"]["name"], "my-sandbox");
  EXPECT_EQ(pod["metadata"]["namespace"], "team");
  const Json& labels = pod["metadata"]["labels"];
  EXPECT_EQ(labels["app"], "demo");
  EXPECT_EQ(labels[kNameHashLabel], "374de8f5");
  EXPECT_FALSE(labels.contains("agents.x-k8s.io/foo"));
  EXPECT_FALSE(labels.contains("extensions.agents.x-k8s.io/bar"));
  // The template's own metadata, and which keys it gave (upstream's propagated-* notes).
  EXPECT_EQ(pod["metadata"]["annotations"], Json({{"note", "kept"},
                                                  {kPropagatedLabelsAnnotation, "app"},
                                                  {kPropagatedAnnotationsAnnotation, "note"}}));
  const Json& owner = pod["metadata"]["ownerReferences"][0];
  EXPECT_EQ(owner["kind"], "Sandbox");
  EXPECT_EQ(owner["uid"], "u-1");
  EXPECT_EQ(owner["controller"], true);
  EXPECT_EQ(ControllerUid(pod), "u-1");
  // "data" replaces the emptyDir of that name; "cache" is added; "tmp" stays.
  const Json& volumes = pod["spec"]["volumes"];
  ASSERT_EQ(volumes.size(), 3u) << volumes.dump();
  EXPECT_EQ(volumes[0]["persistentVolumeClaim"]["claimName"], "data-my-sandbox");
  EXPECT_FALSE(volumes[0].contains("emptyDir"));
  EXPECT_EQ(volumes[1]["name"], "tmp");
  EXPECT_EQ(volumes[2]["persistentVolumeClaim"]["claimName"], "cache-my-sandbox");
}

// The template's NetworkPolicy selects pods by sandbox-template-ref-hash: a Sandbox of a
// warm pool or a claim passes it on; one anybody else made does not (upstream's
// computeExtensionPodLabels). Fails on 660dada, whose pods never had the label.
TEST(SandboxObjectsTest, PodCarriesTheTemplateRefHashOnlyFromPoolsAndClaims) {
  for (const char* kind : {"SandboxWarmPool", "SandboxClaim"}) {
    Json sandbox = Sandbox();
    sandbox["metadata"]["labels"] = {{kTemplateRefHashLabel, NameHash("python")}};
    sandbox["metadata"]["ownerReferences"] = {{{"apiVersion", "extensions.agents.x-k8s.io/v1beta1"},
                                               {"kind", kind},
                                               {"name", "owner"},
                                               {"uid", "o-1"},
                                               {"controller", true}}};
    EXPECT_EQ(DesiredPod(Typed(sandbox))["metadata"]["labels"].value(kTemplateRefHashLabel, ""),
              NameHash("python"))
        << kind;
  }
  Json plain = Sandbox();
  plain["metadata"]["labels"] = {{kTemplateRefHashLabel, NameHash("python")}};
  EXPECT_FALSE(DesiredPod(Typed(plain))["metadata"]["labels"].contains(kTemplateRefHashLabel));
  plain["metadata"]["ownerReferences"] = {{{"apiVersion", "example.com/v1"},
                                           {"kind", "Thing"},
                                           {"name", "t"},
                                           {"uid", "t-1"},
                                           {"controller", true}}};
  EXPECT_FALSE(DesiredPod(Typed(plain))["metadata"]["labels"].contains(kTemplateRefHashLabel));
  // Through the pod template it is reserved, as every agents.x-k8s.io/ label.
  Json sneaky = Sandbox();
  sneaky["spec"]["podTemplate"]["metadata"]["labels"][kTemplateRefHashLabel] = "00000000";
  EXPECT_FALSE(DesiredPod(Typed(sneaky))["metadata"]["labels"].contains(kTemplateRefHashLabel));
}

// After `kubectl delete --cascade=orphan` of a Sandbox and a re-apply, its pod and Service
// are adopted as upstream adopts them: unowned, with the tracking label (or the adoptable
// one); a Service only when headless.
TEST(SandboxObjectsTest, AnOrphanedPodOrServiceWithTheTrackingLabelMayBeAdopted) {
  const Json sandbox = Sandbox();
  Json orphan = {{"metadata",
                  {{"name", "my-sandbox"},
                   {"resourceVersion", "41"},
                   {"labels", {{kNameHashLabel, NameHash("my-sandbox")}}}}}};
  EXPECT_TRUE(MayAdopt(Typed(sandbox), TypedPod(orphan)));
  Json owned = orphan;
  owned["metadata"]["ownerReferences"] = {{{"uid", "other"}, {"controller", true}}};
  EXPECT_FALSE(MayAdopt(Typed(sandbox), TypedPod(owned)));
  Json unlabelled = orphan;
  unlabelled["metadata"]["labels"] = {{"app", "x"}};
  EXPECT_FALSE(MayAdopt(Typed(sandbox), TypedPod(unlabelled)));
  Json other_hash = orphan;
  other_hash["metadata"]["labels"][kNameHashLabel] = NameHash("another");
  EXPECT_FALSE(MayAdopt(Typed(sandbox), TypedPod(other_hash)));
  Json adoptable = unlabelled;
  adoptable["metadata"]["labels"][kAdoptableLabel] = "true";
  EXPECT_TRUE(MayAdopt(Typed(sandbox), TypedPod(adoptable)));
  Json deleting = orphan;
  deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z";
  EXPECT_FALSE(MayAdopt(Typed(sandbox), TypedPod(deleting)));
  Json service = orphan;
  service["spec"] = {{"clusterIP", "None"}};
  EXPECT_TRUE(MayAdopt(Typed(sandbox), TypedService(service)));
  service["spec"]["clusterIP"] = "10.96.0.7";
  EXPECT_FALSE(MayAdopt(Typed(sandbox), TypedService(service))) << "clusterIP cannot change";

  // The patch: the Sandbox becomes the controller (other owners kept), guarded by the
  // version it was judged on.
  Json with_owner = orphan;
  with_owner["metadata"]["ownerReferences"] = {{{"uid", "gc-only"}, {"kind", "Thing"}}};
  Json adopted = with_owner;
  adopted.merge_patch(AdoptionPatch(Typed(sandbox), TypedPod(with_owner)));
  EXPECT_EQ(ControllerUid(adopted), "u-1");
  EXPECT_EQ(adopted["metadata"]["ownerReferences"].size(), 2u);
  EXPECT_EQ(AdoptionPatch(Typed(sandbox), TypedPod(orphan))["metadata"]["resourceVersion"], "41");
  Json svc = orphan;
  svc["spec"] = {{"clusterIP", "None"}, {"selector", {{"app", "old"}}}};
  svc.merge_patch(AdoptionPatch(Typed(sandbox), TypedService(svc)));
  EXPECT_EQ(svc["spec"]["selector"], DesiredService(Typed(sandbox))["spec"]["selector"]);
  EXPECT_EQ(svc["spec"]["ports"], DesiredService(Typed(sandbox))["spec"]["ports"]);
}

TEST(SandboxObjectsTest, PvcsAndService) {
  std::vector<Json> pvcs = DesiredPvcs(Typed(Sandbox()));
  ASSERT_EQ(pvcs.size(), 2u);
  EXPECT_EQ(pvcs[0]["metadata"]["name"], "data-my-sandbox");
  EXPECT_EQ(pvcs[0]["spec"]["resources"]["requests"]["storage"], "1Gi");
  EXPECT_EQ(ControllerUid(pvcs[1]), "u-1");

  Json service = DesiredService(Typed(Sandbox()));
  EXPECT_EQ(service["spec"]["clusterIP"], "None");
  EXPECT_EQ(service["spec"]["selector"][kNameHashLabel], "374de8f5");
  ASSERT_EQ(service["spec"]["ports"].size(), 2u);
  EXPECT_EQ(service["spec"]["ports"][0]["name"], "http");
  EXPECT_EQ(service["spec"]["ports"][0]["port"], 8080);
  EXPECT_EQ(service["spec"]["ports"][1]["protocol"], "UDP");
}

TEST(SandboxObjectsTest, OnlyAPvcControlledByTheSandboxAndNotBeingDeletedFits) {
  Json ours = DesiredPvcs(Typed(Sandbox()))[0];
  std::string why;
  EXPECT_EQ(FitOfPvc(TypedPvc(ours), Typed(Sandbox()), &why), PvcFit::kUsable);
  EXPECT_EQ(why, "");

  // An earlier Sandbox of the same name (another uid): upstream's wording.
  Json earlier = ours;
  earlier["metadata"]["ownerReferences"][0]["uid"] = "u-0";
  EXPECT_EQ(FitOfPvc(TypedPvc(earlier), Typed(Sandbox()), &why), PvcFit::kRefused);
  EXPECT_EQ(why,
            "PVC \"data-my-sandbox\" is owned by Sandbox/my-sandbox (UID: u-0), not by sandbox "
            "\"my-sandbox\"");
  // Nobody's: refused too (upstream adopts only with labels; sbx never adopts).
  Json nobodys = ours;
  nobodys["metadata"].erase("ownerReferences");
  EXPECT_EQ(FitOfPvc(TypedPvc(nobodys), Typed(Sandbox()), &why), PvcFit::kRefused);
  EXPECT_THAT(why, ::testing::HasSubstr("\"data-my-sandbox\" exists, has no controller"));
  // Being deleted, whoever's: not usable, waited for.
  earlier["metadata"]["deletionTimestamp"] = "2026-12-05T08:00:00Z";
  EXPECT_EQ(FitOfPvc(TypedPvc(earlier), Typed(Sandbox()), &why), PvcFit::kBeingDeleted);
  EXPECT_THAT(why, ::testing::HasSubstr("\"data-my-sandbox\" of Sandbox/my-sandbox (UID: u-0) "
                                        "is being deleted"));
  ours["metadata"]["deletionTimestamp"] = "2026-12-05T08:00:00Z";
  EXPECT_EQ(FitOfPvc(TypedPvc(ours), Typed(Sandbox()), nullptr), PvcFit::kBeingDeleted);
}

TEST(SandboxObjectsTest, ReadyWhenThePodIsRunningReadyWithAnIp) {
  Observed observed;
  observed.pods = Pods({RunningPod()});
  Json status = Status(Sandbox(), observed, Json::object(), kNow);
  EXPECT_EQ(Reason(status, "Ready"), "DependenciesReady/True");
  EXPECT_EQ(Reason(status, "Suspended"), "NotSuspended/False");
  EXPECT_EQ(Reason(status, "PodScheduled"), "Scheduled/True");
  EXPECT_EQ(Reason(status, "Finished"), "absent");
  EXPECT_EQ(status["podIPs"], Json::array({"10.0.0.7"}));
  EXPECT_EQ(status["nodeName"], "node-1");
  EXPECT_EQ(status["selector"], "agents.x-k8s.io/sandbox-name-hash=374de8f5");
  EXPECT_FALSE(status.contains("service"));
  EXPECT_TRUE(IsReady(status));
  for (const Json& c : status["conditions"]) EXPECT_EQ(c["observedGeneration"], 3);

  // Asked for a Service that does not exist yet: not Ready.
  observed.service_wanted = true;
  EXPECT_EQ(Reason(Status(Sandbox(), observed, Json::object(), kNow), "Ready"),
            "DependenciesNotReady/False");
  observed.service =
      std::make_shared<const types::Service>(TypedService(DesiredService(Typed(Sandbox()))));
  Json with_service = Status(Sandbox(), observed, Json::object(), kNow);
  EXPECT_TRUE(IsReady(with_service));
  EXPECT_EQ(with_service["serviceFQDN"], "my-sandbox.team.svc.cluster.local");
}

TEST(SandboxObjectsTest, NotReadyReasons) {
  Json status;
  Observed none;
  EXPECT_EQ(Reason(Status(Sandbox(), none, {}, kNow), "Ready"), "DependenciesNotReady/False");
  Observed no_pvc;
  no_pvc.pvcs_missing = "PVC \"data-my-sandbox\" is being deleted";
  status = Status(Sandbox(), no_pvc, {}, kNow);
  EXPECT_EQ(Reason(status, "Ready"), "DependenciesNotReady/False");
  EXPECT_EQ(status["conditions"][0]["message"], no_pvc.pvcs_missing);
  Observed unready;
  unready.pods = Pods({RunningPod(/*ready=*/false)});
  EXPECT_EQ(Reason(Status(Sandbox(), unready, {}, kNow), "Ready"), "DependenciesNotReady/False");
  Observed failed;
  Json failed_pod = RunningPod();
  failed_pod["status"]["phase"] = "Failed";
  failed.pods = Pods({failed_pod});
  status = Status(Sandbox(), failed, {}, kNow);
  EXPECT_EQ(Reason(status, "Ready"), "PodFailed/False");
  EXPECT_EQ(Reason(status, "Finished"), "PodFailed/True");
  Observed two;
  two.pods = Pods({RunningPod(), RunningPod()});
  EXPECT_EQ(Reason(Status(Sandbox(), two, {}, kNow), "Ready"), "MultiplePods/False");
  Observed suspended;
  suspended.suspended = true;
  status = Status(Sandbox(), suspended, {}, kNow);
  EXPECT_EQ(Reason(status, "Ready"), "SandboxSuspended/False");
  EXPECT_EQ(Reason(status, "Suspended"), "PodTerminated/True");
  suspended.pods = Pods({RunningPod()});
  EXPECT_EQ(Reason(Status(Sandbox(), suspended, {}, kNow), "Suspended"), "PodTerminating/False");
  Observed expired;
  expired.expired = true;
  EXPECT_EQ(Reason(Status(Sandbox(), expired, {}, kNow), "Ready"), "SandboxExpired/False");
  Observed broken;
  broken.error = "pod \"my-sandbox\" exists and is not controlled by this Sandbox";
  status = Status(Sandbox(), broken, {}, kNow);
  EXPECT_EQ(Reason(status, "Ready"), "ReconcilerError/False");
  EXPECT_THAT(status["conditions"][0]["message"].get<std::string>(),
              ::testing::HasSubstr("not controlled"));
}

TEST(SandboxObjectsTest, UnchangedWorldGivesAnEqualStatus) {
  Observed observed;
  Json pod = RunningPod();
  observed.pods = Pods({pod});
  Json first = Status(Sandbox(), observed, Json::object(), kNow);
  // Later, nothing changed: transition times are kept, so the status is equal (no write).
  Json again = Status(Sandbox(), observed, first, kNow + absl::Minutes(5));
  EXPECT_EQ(first, again);
  // Ready flips: its transition time moves, the others' stay.
  pod["status"]["phase"] = "Failed";
  observed.pods = Pods({pod});
  Json failed = Status(Sandbox(), observed, first, kNow + absl::Minutes(5));
  EXPECT_NE(failed["conditions"][0]["lastTransitionTime"],
            first["conditions"][0]["lastTransitionTime"]);
  EXPECT_EQ(failed["conditions"][1]["lastTransitionTime"],
            first["conditions"][1]["lastTransitionTime"]);
}

}  // namespace
}  // namespace sbx::k8s

// Tests of src/k8s/objects_types.cc: the typed objects against the CRDs that
// scripts/gen_crds.py writes (every property their schemas declare has a member, in both
// served versions), against the vendored Kubernetes OpenAPI definitions (ObjectMeta,
// OwnerReference), the lossless round trip (examples, unknown fields, nulls) and the
// decode errors.

#include "src/k8s/objects_types.h"

#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/k8s/emulator_process.h"

namespace sbx::k8s::types {
namespace {

using ::testing::HasSubstr;

const std::string kSource = SBX_SOURCE_DIR;

// A value for every property `schema` declares: objects with all their properties, maps
// with one key, arrays with one item, the first enum value, int-or-string as an integer.
// A "$ref" (OpenAPI v2) is looked up in `definitions` when given.
Json Sample(const Json& schema, const Json* definitions = nullptr) {
  if (definitions != nullptr && schema.contains("$ref")) {
    const std::string ref = schema["$ref"];
    const std::string name = ref.substr(ref.rfind('/') + 1);
    // As scripts/gen_crds.py's SPECIAL: these are not in the vendored subset.
    if (name.ends_with(".v1.Time") || name.ends_with(".v1.MicroTime")) {
      return "2026-12-07T10:00:00Z";
    }
    return definitions->contains(name) ? Sample((*definitions)[name], definitions) : Json::object();
  }
  if (schema.contains("enum")) return schema["enum"][0];
  if (schema.value("x-kubernetes-int-or-string", false)) return 1;
  const std::string type = schema.value("type", "");
  if (type == "object" || schema.contains("properties")) {
    Json out = Json::object();
    if (schema.contains("properties")) {
      for (auto it = schema["properties"].begin(); it != schema["properties"].end(); ++it) {
        out[it.key()] = Sample(*it, definitions);
      }
    } else if (schema.contains("additionalProperties") &&
               schema["additionalProperties"].is_object()) {
      out["some-key"] = Sample(schema["additionalProperties"], definitions);
    }
    return out;
  }
  if (type == "array") {
    return Json::array({Sample(schema.value("items", Json::object()), definitions)});
  }
  if (type == "integer") return 3;
  if (type == "boolean") return true;
  if (type == "string") {
    return schema.value("format", "") == "date-time" ? Json("2026-12-07T10:00:00Z") : Json("s");
  }
  return Json::object();  // x-kubernetes-preserve-unknown-fields and the like
}

// Decodes `object` as its kind and encodes it again.
absl::StatusOr<Json> RoundTrip(const Json& object, EncodeOptions options = {}) {
  const std::string kind = object.value("kind", "");
  auto encode = [&](auto decoded) -> absl::StatusOr<Json> {
    if (!decoded.ok()) return decoded.status();
    return Encode(*decoded, options);
  };
  if (kind == "Sandbox") return encode(DecodeSandbox(object));
  if (kind == "SandboxClaim") return encode(DecodeSandboxClaim(object));
  if (kind == "SandboxWarmPool") return encode(DecodeSandboxWarmPool(object));
  if (kind == "SandboxTemplate") return encode(DecodeSandboxTemplate(object));
  if (kind == "Lease") return encode(DecodeLease(object));
  if (kind == "Pod") return encode(DecodePod(object));
  if (kind == "Service") return encode(DecodeService(object));
  if (kind == "PersistentVolumeClaim") return encode(DecodePersistentVolumeClaim(object));
  if (kind == "NetworkPolicy") return encode(DecodeNetworkPolicy(object));
  return absl::InvalidArgumentError("no type for kind \"" + kind + "\"");
}

// Each served version of each CRD: its kind, version and sample object.
struct CrdVersion {
  std::string kind;
  std::string version;
  Json sample;
};
std::vector<CrdVersion> CrdVersions() {
  std::vector<CrdVersion> out;
  for (const Json& crd : emulator::LoadManifests(kSource + "/charts/sbx/crds")) {
    const std::string kind = crd["spec"]["names"]["kind"];
    for (const Json& version : crd["spec"]["versions"]) {
      Json sample = Sample(version["schema"]["openAPIV3Schema"]);
      sample["apiVersion"] =
          crd["spec"]["group"].get<std::string>() + "/" + version["name"].get<std::string>();
      sample["kind"] = kind;
      out.push_back({kind, version["name"], std::move(sample)});
    }
  }
  return out;
}

TEST(ObjectsTypesTest, EveryPropertyOfEveryServedCrdVersionHasAMember) {
  const std::vector<CrdVersion> versions = CrdVersions();
  // Four kinds, two versions each: a CRD that went missing would make this vacuous.
  ASSERT_EQ(versions.size(), 8u);
  for (const CrdVersion& v : versions) {
    SCOPED_TRACE(v.kind + " " + v.version);
    // The typed members alone (no unknown fields) must give back every property: one
    // without a member (a typo, or a property the schema gained) is missing here.
    absl::StatusOr<Json> typed = RoundTrip(v.sample, EncodeOptions{.unknown = false});
    ASSERT_TRUE(typed.ok()) << typed.status();
    EXPECT_EQ(*typed, v.sample) << "properties without a member (JSON patch from the typed "
                                   "encoding to the schema's sample): "
                                << Json::diff(*typed, v.sample).dump();
  }
}

TEST(ObjectsTypesTest, ASchemaPropertyWithoutAMemberIsCaught) {
  // The check above can fail: a property the structs do not declare is not in the typed
  // encoding.
  Json claim = CrdVersions()[0].sample;
  claim["spec"]["lifecycle"]["shutdownAfter"] = "1h";
  absl::StatusOr<Json> typed = RoundTrip(claim, EncodeOptions{.unknown = false});
  ASSERT_TRUE(typed.ok()) << typed.status();
  EXPECT_NE(*typed, claim);
  EXPECT_EQ(*RoundTrip(claim), claim) << "kept as unknown in the lossless encoding";
}

// The typed fields of ObjectMeta and OwnerReference are the Kubernetes API's own names.
TEST(ObjectsTypesTest, MetadataMembersAreTheOpenApiDefinitionsProperties) {
  std::ifstream in(kSource + "/third_party/kubernetes-openapi/definitions.json");
  ASSERT_TRUE(in.good());
  const Json definitions = Json::parse(in)["definitions"];
  const Json& meta_def = definitions["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"];
  const Json& owner_def = definitions["io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference"];
  ASSERT_TRUE(meta_def.contains("properties"));
  ASSERT_TRUE(owner_def.contains("properties"));

  const Json owner = Sample(owner_def, &definitions);
  Json meta = Sample(meta_def, &definitions);
  ASSERT_EQ(meta["ownerReferences"], Json::array({owner}));
  ASSERT_TRUE(meta["creationTimestamp"].is_string());

  absl::StatusOr<ObjectMeta> decoded = DecodeObjectMeta(meta);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(Encode(*decoded), meta);
  const Json typed = Encode(*decoded, EncodeOptions{.unknown = false});
  std::vector<std::string> keys;
  for (auto it = typed.begin(); it != typed.end(); ++it) keys.push_back(it.key());
  EXPECT_THAT(keys, ::testing::UnorderedElementsAre(
                        "name", "generateName", "namespace", "uid", "resourceVersion", "generation",
                        "creationTimestamp", "deletionTimestamp", "labels", "annotations",
                        "ownerReferences", "finalizers"));
  // Every OwnerReference property is typed.
  EXPECT_EQ(typed["ownerReferences"][0], owner);
}

// The example objects of docs/examples/k8s (upstream agent-sandbox's shapes), every CRD's
// sample in both versions with unknown fields at every level, and nulls.
TEST(ObjectsTypesTest, ExamplesDecodeAndEncodeToTheSameJson) {
  std::vector<Json> objects = emulator::LoadManifests(kSource + "/docs/examples/k8s");
  ASSERT_GE(objects.size(), 4u);
  for (const CrdVersion& v : CrdVersions()) {
    Json with_unknown = v.sample;
    with_unknown["topLevelFuture"] = {{"x", 1}};
    with_unknown["metadata"] = {{"name", "n"},
                                {"namespace", "ns"},
                                {"creationTimestamp", nullptr},
                                {"managedFields", Json::array({{{"manager", "m"}}})}};
    with_unknown["spec"]["futureSpecField"] = Json::array({1, "two"});
    if (with_unknown.contains("status")) {
      with_unknown["status"]["futureStatusField"] = nullptr;
      if (with_unknown["status"].contains("conditions")) {
        with_unknown["status"]["conditions"][0]["lastProbeTime"] = nullptr;
      }
    }
    objects.push_back(std::move(with_unknown));
  }
  for (const Json& object : objects) {
    SCOPED_TRACE(object.dump());
    absl::StatusOr<Json> again = RoundTrip(object);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, object) << Json::diff(object, *again).dump();
  }
}

TEST(ObjectsTypesTest, EmptyPartsStayAndAbsentPartsStayAbsent) {
  const Json claim = {
      {"kind", "SandboxClaim"},
      {"metadata", {{"name", "c"}, {"labels", Json::object()}}},
      {"spec",
       {{"warmPoolRef", {{"name", "p"}}}, {"lifecycle", Json::object()}, {"env", Json::array()}}}};
  absl::StatusOr<SandboxClaim> decoded = DecodeSandboxClaim(claim);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(Encode(*decoded), claim);
  EXPECT_FALSE(decoded->status.present);
  EXPECT_TRUE(decoded->spec.lifecycle.present);
  ASSERT_TRUE(decoded->spec.env.has_value());
  EXPECT_TRUE(decoded->spec.env->empty());
}

TEST(ObjectsTypesTest, TypedMembersReadWhatTheJsonSays) {
  const Json sandbox = {
      {"apiVersion", "agents.x-k8s.io/v1beta1"},
      {"kind", "Sandbox"},
      {"metadata",
       {{"name", "sb"},
        {"namespace", "team-a"},
        {"uid", "u-1"},
        {"generation", 4},
        {"deletionTimestamp", "2026-12-07T10:00:00Z"},
        {"labels", {{"agents.x-k8s.io/claim-uid", "c-1"}}},
        {"ownerReferences",
         {{{"kind", "SandboxClaim"}, {"name", "c"}, {"uid", "c-1"}, {"controller", true}}}}}},
      {"spec",
       {{"podTemplate", {{"spec", {{"containers", {{{"name", "main"}, {"image", "i"}}}}}}}},
        {"operatingMode", "Suspended"}}},
      {"status",
       {{"podIPs", {"10.0.0.7"}},
        {"conditions",
         {{{"type", "Ready"}, {"status", "True"}, {"reason", "DependenciesReady"}}}}}}};
  absl::StatusOr<Sandbox> decoded = DecodeSandbox(sandbox);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->metadata.Name(), "sb");
  EXPECT_EQ(decoded->metadata.Namespace(), "team-a");
  EXPECT_EQ(decoded->metadata.generation, 4);
  EXPECT_TRUE(decoded->metadata.BeingDeleted());
  EXPECT_EQ(decoded->metadata.Label("agents.x-k8s.io/claim-uid"), "c-1");
  EXPECT_EQ(decoded->metadata.Label("absent"), "");
  ASSERT_NE(decoded->metadata.Controller(), nullptr);
  EXPECT_EQ(decoded->metadata.Controller()->uid, "c-1");
  EXPECT_EQ(decoded->spec.operating_mode, "Suspended");
  EXPECT_EQ(decoded->spec.pod_template.spec->at("containers")[0]["image"], "i");
  ASSERT_NE(FindCondition(decoded->status.conditions, "Ready"), nullptr);
  EXPECT_EQ(FindCondition(decoded->status.conditions, "Ready")->reason, "DependenciesReady");
  EXPECT_EQ(FindCondition(decoded->status.conditions, "Finished"), nullptr);
  EXPECT_EQ(decoded->status.pod_ips, std::vector<std::string>{"10.0.0.7"});
}

TEST(ObjectsTypesTest, BuiltObjectsEncodeOnlyWhatWasSet) {
  SandboxClaim claim;
  claim.kind = "SandboxClaim";
  claim.metadata.name = "job";
  claim.spec.warm_pool_ref.name = "pool";
  EXPECT_EQ(Encode(claim), Json({{"kind", "SandboxClaim"},
                                 {"metadata", {{"name", "job"}}},
                                 {"spec", {{"warmPoolRef", {{"name", "pool"}}}}}}));
}

// The Pod, Service, Lease, PVC and NetworkPolicy fields sbx reads, under the API's names,
// with the rest kept.
TEST(ObjectsTypesTest, CoreObjectsKeepTheirTypedFieldsAndTheRest) {
  const Json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", "p"}, {"namespace", "default"}}},
      {"spec", {{"nodeName", "node-1"}, {"containers", {{{"name", "c"}, {"image", "i"}}}}}},
      {"status",
       {{"phase", "Running"},
        {"podIP", "10.0.0.1"},
        {"podIPs", {{{"ip", "10.0.0.1"}}}},
        {"reason", "r"},
        {"message", "m"},
        {"hostIP", "192.168.0.1"},
        {"conditions", {{{"type", "Ready"}, {"status", "True"}, {"lastProbeTime", nullptr}}}}}}};
  absl::StatusOr<Pod> p = DecodePod(pod);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->spec.node_name, "node-1");
  EXPECT_EQ(p->status.phase, "Running");
  EXPECT_EQ(p->status.pod_ips->at(0).ip, "10.0.0.1");
  EXPECT_EQ(Encode(*p), pod);
  EXPECT_EQ(Encode(*p, {.unknown = false})["status"].size(), 6u) << "hostIP is not typed";

  const Json lease = {{"apiVersion", "coordination.k8s.io/v1"},
                      {"kind", "Lease"},
                      {"metadata", {{"name", "sbx"}, {"annotations", {{"a", "b"}}}}},
                      {"spec",
                       {{"holderIdentity", "r-1"},
                        {"leaseDurationSeconds", 15},
                        {"acquireTime", "2026-12-07T10:00:00.000000Z"},
                        {"renewTime", "2026-12-07T10:00:05.000000Z"},
                        {"leaseTransitions", 2}}}};
  absl::StatusOr<Lease> l = DecodeLease(lease);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->spec.lease_transitions, 2);
  EXPECT_EQ(Encode(*l, {.unknown = false}), lease) << "every LeaseSpec field is typed";

  const Json service = {{"apiVersion", "v1"},
                        {"kind", "Service"},
                        {"metadata", {{"name", "sb"}}},
                        {"spec", {{"clusterIP", "None"}, {"ports", {{{"port", 8888}}}}}}};
  absl::StatusOr<Service> s = DecodeService(service);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->spec.cluster_ip, "None");
  EXPECT_EQ(Encode(*s), service);

  const Json pvc = {{"apiVersion", "v1"},
                    {"kind", "PersistentVolumeClaim"},
                    {"metadata", {{"name", "ws-sb"}}},
                    {"spec", {{"accessModes", {"ReadWriteOnce"}}}},
                    {"status", {{"phase", "Bound"}}}};
  EXPECT_EQ(*RoundTrip(pvc), pvc);
  const Json policy = {{"apiVersion", "networking.k8s.io/v1"},
                       {"kind", "NetworkPolicy"},
                       {"metadata", {{"name", "np"}}},
                       {"spec", {{"podSelector", Json::object()}, {"policyTypes", {"Ingress"}}}}};
  EXPECT_EQ(*RoundTrip(policy), policy);
}

TEST(ObjectsTypesTest, DecodeErrorsNameTheObjectAndTheField) {
  Json claim = {{"kind", "SandboxClaim"},
                {"metadata", {{"name", "job-42"}, {"namespace", "team-a"}}},
                {"spec", {{"lifecycle", {{"ttlSecondsAfterFinished", "5"}}}}}};
  absl::StatusOr<SandboxClaim> decoded = DecodeSandboxClaim(claim);
  ASSERT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(decoded.status().message(),
              HasSubstr("SandboxClaim \"team-a/job-42\": spec.lifecycle.ttlSecondsAfterFinished "
                        "is a string (\"5\"), not an integer"));

  claim["spec"] = {{"env", {{{"name", "A"}, {"value", 1}}}}};
  EXPECT_THAT(DecodeSandboxClaim(claim).status().message(),
              HasSubstr("spec.env[0].value is an integer (1), not a string"));

  Json sandbox = {{"kind", "Sandbox"}, {"metadata", {{"name", "sb"}, {"labels", {{"app", true}}}}}};
  EXPECT_THAT(DecodeSandbox(sandbox).status().message(),
              HasSubstr("Sandbox \"sb\": metadata.labels[\"app\"] is a boolean (true), not a "
                        "string"));

  EXPECT_THAT(DecodeSandboxWarmPool(Json::array()).status().message(),
              HasSubstr("SandboxWarmPool \"\": the object is an array"));
  EXPECT_THAT(DecodeSandboxWarmPool({{"spec", {{"replicas", 1.5}}}}).status().message(),
              HasSubstr("spec.replicas is a fractional number (1.5), not an integer"));
}

// What the controllers' informer handlers read of an event: the metadata alone.
TEST(ObjectsTypesTest, TheMetadataOfAnyObjectDecodesAlone) {
  Json pod = {{"kind", "Pod"},
              {"metadata",
               {{"name", "p"},
                {"namespace", "team-a"},
                {"generation", 3},
                {"labels", {{"a", "b"}}},
                {"managedFields", Json::array()}}},
              {"spec", {{"containers", 7}}}};  // not looked at
  absl::StatusOr<ObjectMeta> meta = DecodeMetadataOf(pod);
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_EQ(meta->Name(), "p");
  EXPECT_EQ(meta->Namespace(), "team-a");
  EXPECT_EQ(meta->generation, 3);
  EXPECT_EQ(meta->Label("a"), "b");
  EXPECT_EQ(Encode(*meta), pod["metadata"]);  // managedFields kept

  absl::StatusOr<ObjectMeta> none = DecodeMetadataOf({{"kind", "Pod"}});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->present);
  EXPECT_EQ(none->Name(), "");

  pod["metadata"]["uid"] = 12;
  EXPECT_THAT(DecodeMetadataOf(pod).status().message(),
              HasSubstr("object \"team-a/p\": metadata.uid is an integer (12), not a string"));
  EXPECT_THAT(DecodeMetadataOf(Json("x")).status().message(),
              HasSubstr("the object is a string, not an object"));
}

TEST(ObjectsTypesTest, AWarmPoolStatusEncodesWhatIsSet) {
  SandboxWarmPoolStatus status;
  status.replicas = 3;
  status.ready_replicas = 2;
  status.selector = "k=v";
  EXPECT_EQ(Encode(status),
            Json::parse(R"({"replicas": 3, "readyReplicas": 2, "selector": "k=v"})"));
  status.observed_generation = 4;
  EXPECT_EQ(Encode(status)["observedGeneration"], 4);
}

}  // namespace
}  // namespace sbx::k8s::types

#pragma once
// Typed Kubernetes objects: plain structs for the agents.x-k8s.io kinds (SandboxClaim,
// Sandbox, SandboxWarmPool, SandboxTemplate; the v1beta1 fields, and the v1alpha1 ones
// that v1beta1 lacks, marked so), the coordination.k8s.io Lease, and the fields of Pod,
// Service, PersistentVolumeClaim and NetworkPolicy that sbx reads, each with its metadata
// typed. What sbx does not read is kept, as client-go mixes typed and unstructured
// objects: the pod template's spec, PVC specs and network policy rules are JSON members,
// and every field a struct does not declare (a newer API's, a user's typo, managedFields)
// stays in the struct's `unknown` member, so Decode then Encode gives back the same JSON.
//
// Presence is kept: a scalar or list member is std::optional (absent stays absent, `[]`
// stays `[]`); a nested struct is written when it was read (`present`) or has anything
// set. A field that is null is kept as unknown (it re-encodes as null), not typed.
//
// Decode returns INVALID_ARGUMENT naming the object (kind "namespace/name") and the field
// (`spec.lifecycle.ttlSecondsAfterFinished`) when a declared field has another JSON type.
// tests/k8s/objects_types_test.cc checks the structs against the CRDs scripts/gen_crds.py
// writes (every property of the schema has a member) and the round trip.
//
// Thread-safety: plain values; Decode and Encode are pure functions.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace sbx::k8s::types {

using Json = nlohmann::json;
using StringMap = std::map<std::string, std::string>;

// What every nested struct has: whether it was in the decoded JSON (so an empty `{}`
// re-encodes) and the fields it does not declare.
struct Part {
  bool present = false;
  Json unknown = Json::object();
};

// meta/v1 OwnerReference.
struct OwnerReference : Part {
  std::optional<std::string> api_version;  // apiVersion
  std::optional<std::string> kind;
  std::optional<std::string> name;
  std::optional<std::string> uid;
  std::optional<bool> controller;
  std::optional<bool> block_owner_deletion;  // blockOwnerDeletion
};

// meta/v1 ObjectMeta: the fields sbx reads or writes; the rest (managedFields,
// generateName, ...) in `unknown`.
struct ObjectMeta : Part {
  std::optional<std::string> name;
  std::optional<std::string> generate_name;  // generateName
  std::optional<std::string> ns;             // namespace
  std::optional<std::string> uid;
  std::optional<std::string> resource_version;  // resourceVersion
  std::optional<int64_t> generation;
  std::optional<std::string> creation_timestamp;  // creationTimestamp (RFC 3339)
  std::optional<std::string> deletion_timestamp;  // deletionTimestamp (RFC 3339)
  std::optional<StringMap> labels;
  std::optional<StringMap> annotations;
  std::optional<std::vector<OwnerReference>> owner_references;  // ownerReferences
  std::optional<std::vector<std::string>> finalizers;

  // name / namespace / uid, or "" when absent.
  const std::string& Name() const;
  const std::string& Namespace() const;
  const std::string& Uid() const;
  // The value of label / annotation `key`, or "" when absent.
  const std::string& Label(const std::string& key) const;
  const std::string& Annotation(const std::string& key) const;
  bool BeingDeleted() const { return deletion_timestamp.has_value(); }
  // The owner reference with controller: true, or null.
  const OwnerReference* Controller() const;
};

// meta/v1 Condition (and the Pod's PodCondition, whose lastProbeTime stays unknown).
struct Condition : Part {
  std::optional<std::string> type;
  std::optional<std::string> status;                // "True", "False", "Unknown"
  std::optional<int64_t> observed_generation;       // observedGeneration
  std::optional<std::string> last_transition_time;  // lastTransitionTime
  std::optional<std::string> reason;
  std::optional<std::string> message;
};
// The condition of `type` in `conditions`, or null.
const Condition* FindCondition(const std::optional<std::vector<Condition>>& conditions,
                               const std::string& type);

// A name reference (sandboxTemplateRef, warmPoolRef).
struct NameRef : Part {
  std::optional<std::string> name;
};

// labels and annotations only (a pod template's metadata, additionalPodMetadata).
struct LabelsAndAnnotations : Part {
  std::optional<StringMap> labels;
  std::optional<StringMap> annotations;
};

// A pod template: its metadata typed, its spec (a core/v1 PodSpec) kept as JSON.
struct PodTemplate : Part {
  LabelsAndAnnotations metadata;
  std::optional<Json> spec;
};

// The metadata of a volumeClaimTemplates entry.
struct NamedMetadata : Part {
  std::optional<std::string> name;
  std::optional<StringMap> labels;
  std::optional<StringMap> annotations;
};

// A volumeClaimTemplates entry: its spec (a core/v1 PersistentVolumeClaimSpec) as JSON.
struct VolumeClaimTemplate : Part {
  NamedMetadata metadata;
  std::optional<Json> spec;
};

// ---- agents.x-k8s.io Sandbox ----
struct SandboxSpec : Part {
  PodTemplate pod_template;  // podTemplate
  std::optional<std::vector<VolumeClaimTemplate>> volume_claim_templates;
  std::optional<bool> service;
  std::optional<std::string> shutdown_time;    // shutdownTime (RFC 3339)
  std::optional<std::string> shutdown_policy;  // shutdownPolicy: Retain, Delete
  std::optional<std::string> operating_mode;   // operatingMode: Running, Suspended
  std::optional<int64_t> replicas;             // v1alpha1 only: 1 running, 0 suspended
};
struct SandboxStatus : Part {
  std::optional<std::vector<Condition>> conditions;
  std::optional<std::vector<std::string>> pod_ips;  // podIPs
  std::optional<std::string> node_name;             // nodeName (v1beta1)
  std::optional<std::string> service;
  std::optional<std::string> service_fqdn;  // serviceFQDN
  std::optional<std::string> selector;
  std::optional<int64_t> replicas;  // v1alpha1 only
};
struct Sandbox : Part {
  std::optional<std::string> api_version;
  std::optional<std::string> kind;
  ObjectMeta metadata;
  SandboxSpec spec;
  SandboxStatus status;
};

// ---- extensions.agents.x-k8s.io SandboxClaim ----
struct ClaimLifecycle : Part {
  std::optional<std::string> shutdown_time;           // shutdownTime (RFC 3339)
  std::optional<int64_t> ttl_seconds_after_finished;  // ttlSecondsAfterFinished
  std::optional<std::string> shutdown_policy;         // Retain, Delete, DeleteForeground
};
struct ClaimEnvVar : Part {
  std::optional<std::string> name;
  std::optional<std::string> value;
  std::optional<std::string> container_name;  // containerName
};
struct SandboxClaimSpec : Part {
  NameRef warm_pool_ref;  // warmPoolRef
  ClaimLifecycle lifecycle;
  LabelsAndAnnotations additional_pod_metadata;  // additionalPodMetadata
  std::optional<std::vector<ClaimEnvVar>> env;
  std::optional<std::vector<VolumeClaimTemplate>> volume_claim_templates;
  NameRef sandbox_template_ref;         // v1alpha1 only: sandboxTemplateRef
  std::optional<std::string> warmpool;  // v1alpha1 only: "none", "default" or a pool's name
};
struct ClaimSandboxRef : Part {
  std::optional<std::string> name;
  std::optional<std::vector<std::string>> pod_ips;  // podIPs
};
struct SandboxClaimStatus : Part {
  std::optional<std::vector<Condition>> conditions;
  ClaimSandboxRef sandbox;
};
struct SandboxClaim : Part {
  std::optional<std::string> api_version;
  std::optional<std::string> kind;
  ObjectMeta metadata;
  SandboxClaimSpec spec;
  SandboxClaimStatus status;
};

// ---- extensions.agents.x-k8s.io SandboxWarmPool ----
struct UpdateStrategy : Part {
  std::optional<std::string> type;  // OnReplenish, Recreate
};
struct SandboxWarmPoolSpec : Part {
  std::optional<int64_t> replicas;
  NameRef sandbox_template_ref;    // sandboxTemplateRef
  UpdateStrategy update_strategy;  // updateStrategy
};
struct SandboxWarmPoolStatus : Part {
  std::optional<int64_t> replicas;
  std::optional<int64_t> ready_replicas;  // readyReplicas
  std::optional<std::string> selector;
  std::optional<int64_t> observed_generation;  // observedGeneration (v1beta1)
};
struct SandboxWarmPool : Part {
  std::optional<std::string> api_version;
  std::optional<std::string> kind;
  ObjectMeta metadata;
  SandboxWarmPoolSpec spec;
  SandboxWarmPoolStatus status;
};

// ---- extensions.agents.x-k8s.io SandboxTemplate ----
struct TemplateNetworkPolicy : Part {
  std::optional<std::vector<Json>> ingress;  // networking/v1 NetworkPolicyIngressRule
  std::optional<std::vector<Json>> egress;   // networking/v1 NetworkPolicyEgressRule
};
struct SandboxTemplateSpec : Part {
  PodTemplate pod_template;  // podTemplate
  std::optional<std::vector<VolumeClaimTemplate>> volume_claim_templates;
  std::optional<bool> service;
  TemplateNetworkPolicy network_policy;                      // networkPolicy
  std::optional<std::string> network_policy_management;      // Managed, Unmanaged
  std::optional<std::string> env_vars_injection_policy;      // Disallowed, Allowed, Overrides
  std::optional<std::string> volume_claim_templates_policy;  // v1beta1: same values
};
struct SandboxTemplate : Part {
  std::optional<std::string> api_version;
  std::optional<std::string> kind;
  ObjectMeta metadata;
  SandboxTemplateSpec spec;
};

// ---- coordination.k8s.io/v1 Lease ----
struct LeaseSpec : Part {
  std::optional<std::string> holder_identity;     // holderIdentity
  std::optional<int64_t> lease_duration_seconds;  // leaseDurationSeconds
  std::optional<std::string> acquire_time;        // acquireTime (RFC 3339, micro)
  std::optional<std::string> renew_time;          // renewTime
  std::optional<int64_t> lease_transitions;       // leaseTransitions
};
struct Lease : Part {
  std::optional<std::string> api_version;
  std::optional<std::string> kind;
  ObjectMeta metadata;
  LeaseSpec spec;
};

// ---- core/v1 Pod: the fields sbx reads ----
struct PodSpecFields : Part {            // the rest of the PodSpec (containers, ...) in `unknown`
  std::optional<std::string> node_name;  // nodeName
};
struct PodIP : Part {
  std::optional<std::string> ip;
};
struct PodStatus : Part {
  std::optional<std::string> phase;
  std::optional<std::string> reason;
  std::optional<std::string> message;
  std::optional<std::string> pod_ip;          // podIP
  std::optional<std::vector<PodIP>> pod_ips;  // podIPs
  std::optional<std::vector<Condition>> conditions;
};
struct Pod : Part {
  std::optional<std::string> api_version;
  std::optional<std::string> kind;
  ObjectMeta metadata;
  PodSpecFields spec;
  PodStatus status;
};

// ---- core/v1 Service: the fields sbx reads ----
struct ServiceSpecFields : Part {         // ports, ... in `unknown`
  std::optional<std::string> cluster_ip;  // clusterIP
  std::optional<StringMap> selector;
};
struct Service : Part {
  std::optional<std::string> api_version;
  std::optional<std::string> kind;
  ObjectMeta metadata;
  ServiceSpecFields spec;
  std::optional<Json> status;
};

// ---- core/v1 PersistentVolumeClaim and networking/v1 NetworkPolicy: metadata typed ----
struct PersistentVolumeClaim : Part {
  std::optional<std::string> api_version;
  std::optional<std::string> kind;
  ObjectMeta metadata;
  std::optional<Json> spec;  // a PersistentVolumeClaimSpec
  std::optional<Json> status;
};
struct NetworkPolicy : Part {
  std::optional<std::string> api_version;
  std::optional<std::string> kind;
  ObjectMeta metadata;
  std::optional<Json> spec;  // podSelector, policyTypes, ingress, egress
};

// How to encode: with the unknown fields (the default, lossless), or the typed members
// alone (what the schema test compares against the CRDs).
struct EncodeOptions {
  bool unknown = true;
};

// Decode: `object` as a T. INVALID_ARGUMENT, naming the object and the field, when a
// declared field has another JSON type or `object` is not a JSON object.
[[nodiscard]] absl::StatusOr<Sandbox> DecodeSandbox(const Json& object);
[[nodiscard]] absl::StatusOr<SandboxClaim> DecodeSandboxClaim(const Json& object);
[[nodiscard]] absl::StatusOr<SandboxWarmPool> DecodeSandboxWarmPool(const Json& object);
[[nodiscard]] absl::StatusOr<SandboxTemplate> DecodeSandboxTemplate(const Json& object);
[[nodiscard]] absl::StatusOr<Lease> DecodeLease(const Json& object);
[[nodiscard]] absl::StatusOr<Pod> DecodePod(const Json& object);
[[nodiscard]] absl::StatusOr<Service> DecodeService(const Json& object);
[[nodiscard]] absl::StatusOr<PersistentVolumeClaim> DecodePersistentVolumeClaim(const Json& object);
[[nodiscard]] absl::StatusOr<NetworkPolicy> DecodeNetworkPolicy(const Json& object);
[[nodiscard]] absl::StatusOr<ObjectMeta> DecodeObjectMeta(const Json& metadata);
// The metadata of a whole object of any kind (an informer's event), read alone: an empty
// ObjectMeta when it has none; INVALID_ARGUMENT naming the object and field as above.
[[nodiscard]] absl::StatusOr<ObjectMeta> DecodeMetadataOf(const Json& object);

// Encode: the JSON of a typed object (never fails).
Json Encode(const Sandbox& object, EncodeOptions options = {});
Json Encode(const SandboxClaim& object, EncodeOptions options = {});
Json Encode(const SandboxWarmPool& object, EncodeOptions options = {});
Json Encode(const SandboxTemplate& object, EncodeOptions options = {});
Json Encode(const Lease& object, EncodeOptions options = {});
Json Encode(const Pod& object, EncodeOptions options = {});
Json Encode(const Service& object, EncodeOptions options = {});
Json Encode(const PersistentVolumeClaim& object, EncodeOptions options = {});
Json Encode(const NetworkPolicy& object, EncodeOptions options = {});
Json Encode(const ObjectMeta& metadata, EncodeOptions options = {});
Json Encode(const Condition& condition, EncodeOptions options = {});
Json Encode(const OwnerReference& reference, EncodeOptions options = {});
Json Encode(const LabelsAndAnnotations& part, EncodeOptions options = {});
Json Encode(const VolumeClaimTemplate& part, EncodeOptions options = {});
Json Encode(const SandboxClaimStatus& part, EncodeOptions options = {});
Json Encode(const SandboxStatus& part, EncodeOptions options = {});
Json Encode(const SandboxWarmPoolStatus& part, EncodeOptions options = {});

}  // namespace sbx::k8s::types

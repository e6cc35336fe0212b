#pragma once
// Conversion of the agents.x-k8s.io objects between the deprecated v1alpha1 and the
// v1beta1 storage version, as upstream agent-sandbox's conversion webhook does it
// (facts: docs/kubernetes.md, "v1alpha1"), and the ConversionReview that the API server
// sends to a CRD's conversion webhook.
//
// The differences (everything else is the same JSON in both versions):
//   Sandbox          v1alpha1 spec.replicas (0 or 1)  <->  v1beta1 spec.operatingMode
//                    (Suspended / Running); v1alpha1 status.replicas; v1beta1
//                    status.nodeName
//   SandboxClaim     v1alpha1 spec.sandboxTemplateRef + spec.warmpool ("none", "default"
//                    or a pool's name)  <->  v1beta1 spec.warmPoolRef (a cold claim's pool
//                    is "shadow-pool-<template>"); v1beta1 spec.volumeClaimTemplates
//   SandboxTemplate  v1beta1 spec.volumeClaimTemplatesPolicy, kept in v1alpha1 as the
//                    annotation api.agents.x-k8s.io/v1beta1-volume-claim-templates-policy
//   SandboxWarmPool  spec.replicas required in v1alpha1 (1 when v1beta1 leaves it out);
//                    v1beta1 status.observedGeneration
// Going up, the whole v1alpha1 object is kept in an annotation
// api.agents.x-k8s.io/v1alpha1-<kind>-state so that a v1alpha1 reader gets back what it
// wrote (a Sandbox's replicas, a claim's template and warmpool policy); going down, the
// annotation is read and removed.
//
// Pure functions of their arguments: thread-safe, no I/O.

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace sbx::k8s {

// The deepest nesting of JSON arrays and objects a conversion accepts. Kubernetes objects
// stay far below it (a Sandbox with a full PodSpec nests about 15 deep); a deeper document
// is refused before it is parsed, since copying or printing it recurses once per level.
inline constexpr int kMaxConversionJsonDepth = 100;

// `object` (a Sandbox, SandboxClaim, SandboxTemplate or SandboxWarmPool of v1alpha1 or
// v1beta1) in `desired_api_version` (the same group's v1alpha1 or v1beta1). An object
// already in that version comes back unchanged. INVALID_ARGUMENT names what is wrong: an
// unknown group, version or kind, a field of the wrong type, or a state annotation that
// is not JSON of the object's kind.
[[nodiscard]] absl::StatusOr<nlohmann::json> ConvertAgentsObject(
    const nlohmann::json& object, absl::string_view desired_api_version);

// The answer to a ConversionReview (apiextensions.k8s.io/v1 or v1beta1) given as its
// JSON text: the same apiVersion and kind, `response.uid` = the request's, and either
// `convertedObjects` with `result.status` "Success" or `result.status` "Failure" with a
// message naming the object that could not be converted (the API server then fails the
// request that needed it). INVALID_ARGUMENT when `body` is not a ConversionReview at all
// (not JSON, nested deeper than kMaxConversionJsonDepth, no request or uid): there is no
// uid to answer to.
[[nodiscard]] absl::StatusOr<nlohmann::json> ReviewConversion(absl::string_view body);

// Whether `text` nests arrays and objects deeper than `max_depth` (brackets inside JSON
// strings do not count). Linear, no recursion.
bool JsonNestsDeeperThan(absl::string_view text, int max_depth);

}  // namespace sbx::k8s

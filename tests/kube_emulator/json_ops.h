// Pure JSON helpers of the Kubernetes API emulator: label and field selectors,
// the three patch kinds, and structural-schema pruning, defaulting and
// validation for custom resources. Stateless and thread-compatible.
#pragma once

#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace kube_emulator {

using json = nlohmann::json;

struct LabelRequirement {
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kNotExists };
  std::string key;
  Op op = Op::kExists;
  std::vector<std::string> values;
};
using LabelSelector = std::vector<LabelRequirement>;

// Parses a label selector ("a=b,c!=d,e in (f,g),!h"); INVALID_ARGUMENT names the bad term.
absl::StatusOr<LabelSelector> ParseLabelSelector(absl::string_view text);
// True when `labels` (an object or null) satisfies every requirement.
bool LabelsMatch(const LabelSelector& selector, const json& labels);

struct FieldRequirement {
  std::string path;  // dotted, e.g. status.phase
  bool negate = false;
  std::string value;
};
using FieldSelector = std::vector<FieldRequirement>;

// Parses "metadata.name=x,status.phase!=Running"; INVALID_ARGUMENT on a bad term.
absl::StatusOr<FieldSelector> ParseFieldSelector(absl::string_view text);
bool FieldsMatch(const FieldSelector& selector, const json& object);

struct Selectors {
  LabelSelector labels;
  FieldSelector fields;
};

// The value at a dotted path ("spec.replicas"), or nullptr when absent.
const json* GetPath(const json& object, absl::string_view dotted);
// Sets the value at a dotted path, creating objects on the way.
void SetPath(json& object, absl::string_view dotted, json value);

// RFC 7386 JSON merge patch.
json MergePatch(const json& target, const json& patch);
// RFC 6902 JSON patch; INVALID_ARGUMENT (test op failure, bad path) or the result.
absl::StatusOr<json> JsonPatch(const json& target, const json& patch);
// Strategic merge patch for built-in kinds: lists of objects merged by their
// well-known key (containers by name, ports by containerPort/port, conditions by
// type, ...) and the $patch / $retainKeys / $setElementOrder / $deleteFromPrimitiveList
// directives applied or stripped.
json StrategicMergePatch(const json& target, const json& patch);

struct SchemaError {
  std::string field;    // e.g. spec.replicas
  std::string reason;   // FieldValueRequired, FieldValueInvalid, FieldValueNotSupported, ...
  std::string message;  // e.g. "Required value"
};

// Prunes unknown fields and applies defaults as a structural openAPIV3Schema
// asks (the root keeps apiVersion, kind and metadata), then validates. The
// dotted paths of pruned fields are appended to `pruned` when it is not null.
std::vector<SchemaError> ApplySchema(json& object, const json& schema,
                                     std::vector<std::string>* pruned = nullptr);

// Prunes unknown fields as ApplySchema does, without defaulting or validating (what the API
// server does to a custom resource converted to another version).
void PruneToSchema(json& object, const json& schema);

// Transition rules (x-kubernetes-validations that read oldSelf) between the stored `old`
// object and its update `object`, on object properties (not inside arrays). The CEL they
// are written in is evaluated for the subset immutability rules use: `self`, `oldSelf`,
// field selections, `has()`, `==`, `!=`, `!`, `&&`, `||`, parentheses (so upstream's
// `has(self.x) == has(oldSelf.x) && (!has(self.x) || self.x == oldSelf.x)`); a rule
// outside it is not emulated, nor are rules without oldSelf. A rule applies only when both
// versions have the field, as Kubernetes evaluates transition rules.
std::vector<SchemaError> CheckTransitionRules(const json& object, const json& old,
                                              const json& schema);

// Parses a YAML document (YAML 1.2 core schema scalars) into JSON;
// INVALID_ARGUMENT with the parser's message when it is not valid YAML.
absl::StatusOr<json> YamlToJson(const std::string& text);

// Renders a JSON value as Kubernetes error messages quote it.
std::string QuoteValue(const json& v);

}  // namespace kube_emulator

#include "src/k8s/objects_types.h"

#include <algorithm>
#include <concepts>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace sbx::k8s::types {

namespace {

// Each struct's fields are listed once, in a Visit that the decoder and the encoder both
// walk: v("jsonName", member). The member's type says how it is read and written.
#define SBX_VISIT(Type)                               \
  template <class S, class V>                         \
  requires std::same_as<std::remove_const_t<S>, Type> \
  void Visit(S& o, V& v)

SBX_VISIT(OwnerReference) {
  v("apiVersion", o.api_version);
  v("kind", o.kind);
  v("name", o.name);
  v("uid", o.uid);
  v("controller", o.controller);
  v("blockOwnerDeletion", o.block_owner_deletion);
}

SBX_VISIT(ObjectMeta) {
  v("name", o.name);
  v("generateName", o.generate_name);
  v("namespace", o.ns);
  v("uid", o.uid);
  v("resourceVersion", o.resource_version);
  v("generation", o.generation);
  v("creationTimestamp", o.creation_timestamp);
  v("deletionTimestamp", o.deletion_timestamp);
  v("labels", o.labels);
  v("annotations", o.annotations);
  v("ownerReferences", o.owner_references);
  v("finalizers", o.finalizers);
}

SBX_VISIT(Condition) {
  v("type", o.type);
  v("status", o.status);
  v("observedGeneration", o.observed_generation);
  v("lastTransitionTime", o.last_transition_time);
  v("reason", o.reason);
  v("message", o.message);
}

SBX_VISIT(NameRef) { v("name", o.name); }

SBX_VISIT(LabelsAndAnnotations) {
  v("labels", o.labels);
  v("annotations", o.annotations);
}

SBX_VISIT(NamedMetadata) {
  v("name", o.name);
  v("labels", o.labels);
  v("annotations", o.annotations);
}

SBX_VISIT(PodTemplate) {
  v("metadata", o.metadata);
  v("spec", o.spec);
}

SBX_VISIT(VolumeClaimTemplate) {
  v("metadata", o.metadata);
  v("spec", o.spec);
}

SBX_VISIT(SandboxSpec) {
  v("podTemplate", o.pod_template);
  v("volumeClaimTemplates", o.volume_claim_templates);
  v("service", o.service);
  v("shutdownTime", o.shutdown_time);
  v("shutdownPolicy", o.shutdown_policy);
  v("operatingMode", o.operating_mode);
  v("replicas", o.replicas);
}

SBX_VISIT(SandboxStatus) {
  v("conditions", o.conditions);
  v("podIPs", o.pod_ips);
  v("nodeName", o.node_name);
  v("service", o.service);
  v("serviceFQDN", o.service_fqdn);
  v("selector", o.selector);
  v("replicas", o.replicas);
}

SBX_VISIT(Sandbox) {
  v("apiVersion", o.api_version);
  v("kind", o.kind);
  v("metadata", o.metadata);
  v("spec", o.spec);
  v("status", o.status);
}

SBX_VISIT(ClaimLifecycle) {
  v("shutdownTime", o.shutdown_time);
  v("ttlSecondsAfterFinished", o.ttl_seconds_after_finished);
  v("shutdownPolicy", o.shutdown_policy);
}

SBX_VISIT(ClaimEnvVar) {
  v("name", o.name);
  v("value", o.value);
  v("containerName", o.container_name);
}

SBX_VISIT(SandboxClaimSpec) {
  v("warmPoolRef", o.warm_pool_ref);
  v("lifecycle", o.lifecycle);
  v("additionalPodMetadata", o.additional_pod_metadata);
  v("env", o.env);
  v("volumeClaimTemplates", o.volume_claim_templates);
  v("sandboxTemplateRef", o.sandbox_template_ref);
  v("warmpool", o.warmpool);
}

SBX_VISIT(ClaimSandboxRef) {
  v("name", o.name);
  v("podIPs", o.pod_ips);
}

SBX_VISIT(SandboxClaimStatus) {
  v("conditions", o.conditions);
  v("sandbox", o.sandbox);
}

SBX_VISIT(SandboxClaim) {
  v("apiVersion", o.api_version);
  v("kind", o.kind);
  v("metadata", o.metadata);
  v("spec", o.spec);
  v("status", o.status);
}

SBX_VISIT(UpdateStrategy) { v("type", o.type); }

SBX_VISIT(SandboxWarmPoolSpec) {
  v("replicas", o.replicas);
  v("sandboxTemplateRef", o.sandbox_template_ref);
  v("updateStrategy", o.update_strategy);
}

SBX_VISIT(SandboxWarmPoolStatus) {
  v("replicas", o.replicas);
  v("readyReplicas", o.ready_replicas);
  v("selector", o.selector);
  v("observedGeneration", o.observed_generation);
}

SBX_VISIT(SandboxWarmPool) {
  v("apiVersion", o.api_version);
  v("kind", o.kind);
  v("metadata", o.metadata);
  v("spec", o.spec);
  v("status", o.status);
}

SBX_VISIT(TemplateNetworkPolicy) {
  v("ingress", o.ingress);
  v("egress", o.egress);
}

SBX_VISIT(SandboxTemplateSpec) {
  v("podTemplate", o.pod_template);
  v("volumeClaimTemplates", o.volume_claim_templates);
  v("service", o.service);
  v("networkPolicy", o.network_policy);
  v("networkPolicyManagement", o.network_policy_management);
  v("envVarsInjectionPolicy", o.env_vars_injection_policy);
  v("volumeClaimTemplatesPolicy", o.volume_claim_templates_policy);
}

SBX_VISIT(SandboxTemplate) {
  v("apiVersion", o.api_version);
  v("kind", o.kind);
  v("metadata", o.metadata);
  v("spec", o.spec);
}

SBX_VISIT(LeaseSpec) {
  v("holderIdentity", o.holder_identity);
  v("leaseDurationSeconds", o.lease_duration_seconds);
  v("acquireTime", o.acquire_time);
  v("renewTime", o.renew_time);
  v("leaseTransitions", o.lease_transitions);
}

SBX_VISIT(Lease) {
  v("apiVersion", o.api_version);
  v("kind", o.kind);
  v("metadata", o.metadata);
  v("spec", o.spec);
}

SBX_VISIT(PodSpecFields) { v("nodeName", o.node_name); }

SBX_VISIT(PodIP) { v("ip", o.ip); }

SBX_VISIT(PodStatus) {
  v("phase", o.phase);
  v("reason", o.reason);
  v("message", o.message);
  v("podIP", o.pod_ip);
  v("podIPs", o.pod_ips);
  v("conditions", o.conditions);
}

SBX_VISIT(Pod) {
  v("apiVersion", o.api_version);
  v("kind", o.kind);
  v("metadata", o.metadata);
  v("spec", o.spec);
  v("status", o.status);
}

SBX_VISIT(ServiceSpecFields) {
  v("clusterIP", o.cluster_ip);
  v("selector", o.selector);
}

SBX_VISIT(Service) {
  v("apiVersion", o.api_version);
  v("kind", o.kind);
  v("metadata", o.metadata);
  v("spec", o.spec);
  v("status", o.status);
}

SBX_VISIT(PersistentVolumeClaim) {
  v("apiVersion", o.api_version);
  v("kind", o.kind);
  v("metadata", o.metadata);
  v("spec", o.spec);
  v("status", o.status);
}

SBX_VISIT(NetworkPolicy) {
  v("apiVersion", o.api_version);
  v("kind", o.kind);
  v("metadata", o.metadata);
  v("spec", o.spec);
}

#undef SBX_VISIT

template <class T>
constexpr bool kIsPart = std::is_base_of_v<Part, T>;

std::string Join(const std::string& path, const char* key) {
  return path.empty() ? std::string(key) : absl::StrCat(path, ".", key);
}

const char* TypeName(const Json& value) {
  switch (value.type()) {
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_float:
      return "a fractional number";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    default:
      return "null";
  }
}

// Records the first error: `path` holds `value`, which is not `want`.
bool Fail(std::string* error, const std::string& path, const Json& value, const char* want) {
  if (error->empty()) {
    std::string shown = value.dump();
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    *error = absl::StrCat(path.empty() ? "the object" : path, " is ", TypeName(value), " (", shown,
                          "), not ", want);
  }
  return false;
}

template <class S>
bool DecodeStruct(const Json& value, const std::string& path, S* out, std::string* error);

bool Convert(const Json& v, const std::string& path, std::string* out, std::string* error) {
  if (!v.is_string()) return Fail(error, path, v, "a string");
  *out = v.get_ref<const std::string&>();
  return true;
}
bool Convert(const Json& v, const std::string& path, int64_t* out, std::string* error) {
  if (!v.is_number_integer()) return Fail(error, path, v, "an integer");
  *out = v.get<int64_t>();
  return true;
}
bool Convert(const Json& v, const std::string& path, bool* out, std::string* error) {
  if (!v.is_boolean()) return Fail(error, path, v, "a boolean");
  *out = v.get<bool>();
  return true;
}
bool Convert(const Json& v, const std::string&, Json* out, std::string*) {
  *out = v;
  return true;
}
bool Convert(const Json& v, const std::string& path, StringMap* out, std::string* error) {
  if (!v.is_object()) return Fail(error, path, v, "an object of strings");
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it->is_string()) {
      return Fail(error, absl::StrCat(path, "[\"", it.key(), "\"]"), *it, "a string");
    }
    out->emplace(it.key(), it->get_ref<const std::string&>());
  }
  return true;
}
template <class T>
bool Convert(const Json& v, const std::string& path, std::vector<T>* out, std::string* error) {
  if (!v.is_array()) return Fail(error, path, v, "an array");
  out->reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = absl::StrCat(path, "[", i, "]");
    T item;
    bool ok;
    if constexpr (kIsPart<T>) {
      ok = DecodeStruct(v[i], at, &item, error);
    } else {
      ok = Convert(v[i], at, &item, error);
    }
    if (!ok) return false;
    out->push_back(std::move(item));
  }
  return true;
}

// Reads the declared fields of one JSON object; what it took is left out of the rest.
class Decoder {
 public:
  Decoder(const Json& object, const std::string& path, std::string* error)
      : object_(object), path_(path), error_(error) {}

  template <class T>
  void operator()(const char* key, std::optional<T>& out) {
    const Json* value = Find(key);
    if (value == nullptr) return;
    T typed{};
    if (Convert(*value, Join(path_, key), &typed, error_)) out = std::move(typed);
  }
  template <class S>
  requires kIsPart<S>
  void operator()(const char* key, S& out) {
    const Json* value = Find(key);
    if (value != nullptr) DecodeStruct(*value, Join(path_, key), &out, error_);
  }

  // The fields of the object that no member took (null ones included).
  Json Rest() const {
    Json rest = Json::object();
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (std::find(taken_.begin(), taken_.end(), it.key()) == taken_.end()) {
        rest.emplace(it.key(), *it);
      }
    }
    return rest;
  }

 private:
  // The value of `key` when it is there and not null (then it counts as taken).
  const Json* Find(const char* key) {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    taken_.push_back(key);
    return &*it;
  }

  const Json& object_;
  const std::string& path_;
  std::string* const error_;
  std::vector<const char*> taken_;
};

template <class S>
bool DecodeStruct(const Json& value, const std::string& path, S* out, std::string* error) {
  if (!value.is_object()) return Fail(error, path, value, "an object");
  Decoder decoder(value, path, error);
  Visit(*out, decoder);
  if (!error->empty()) return false;
  out->present = true;
  out->unknown = decoder.Rest();
  return true;
}

Json ToJson(const std::string& v, EncodeOptions) { return v; }
Json ToJson(int64_t v, EncodeOptions) { return v; }
Json ToJson(bool v, EncodeOptions) { return v; }
Json ToJson(const Json& v, EncodeOptions) { return v; }
Json ToJson(const StringMap& v, EncodeOptions) { return Json(v); }
template <class S>
requires kIsPart<S> Json ToJson(const S& v, EncodeOptions options);
template <class T>
Json ToJson(const std::vector<T>& v, EncodeOptions options) {
  Json out = Json::array();
  for (const T& item : v) out.push_back(ToJson(item, options));
  return out;
}

class Encoder {
 public:
  Encoder(const Part& part, EncodeOptions options)
      : out_(options.unknown && part.unknown.is_object() ? part.unknown : Json::object()),
        options_(options) {}

  template <class T>
  void operator()(const char* key, const std::optional<T>& value) {
    if (value.has_value()) out_[key] = ToJson(*value, options_);
  }
  template <class S>
  requires kIsPart<S>
  void operator()(const char* key, const S& value) {
    Json part = ToJson(value, options_);
    if (value.present || !part.empty()) out_[key] = std::move(part);
  }

  Json Take() && { return std::move(out_); }

 private:
  Json out_;
  const EncodeOptions options_;
};

template <class S>
requires kIsPart<S> Json ToJson(const S& v, EncodeOptions options) {
  Encoder encoder(v, options);
  Visit(v, encoder);
  return std::move(encoder).Take();
}

// `kind "namespace/name"` of a JSON object, for errors.
std::string Describe(const Json& object, const char* kind) {
  std::string name;
  if (object.is_object()) {
    auto meta = object.find("metadata");
    if (meta != object.end() && meta->is_object()) {
      auto ns = meta->find("namespace");
      auto n = meta->find("name");
      if (ns != meta->end() && ns->is_string()) name = ns->get<std::string>() + "/";
      if (n != meta->end() && n->is_string()) name += n->get<std::string>();
    }
  }
  return absl::StrCat(kind, " \"", name, "\"");
}

template <class T>
absl::StatusOr<T> Decode(const Json& object, const char* kind) {
  T out;
  std::string error;
  if (!DecodeStruct(object, "", &out, &error)) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(object, kind), ": ", error));
  }
  return out;
}

const std::string& Empty() {
  static const std::string* const kEmpty = new std::string();
  return *kEmpty;
}

const std::string& ValueOf(const std::optional<StringMap>& map, const std::string& key) {
  if (!map.has_value()) return Empty();
  auto it = map->find(key);
  return it == map->end() ? Empty() : it->second;
}

}  // namespace

const std::string& ObjectMeta::Name() const { return name ? *name : Empty(); }
const std::string& ObjectMeta::Namespace() const { return ns ? *ns : Empty(); }
const std::string& ObjectMeta::Uid() const { return uid ? *uid : Empty(); }
const std::string& ObjectMeta::Label(const std::string& key) const { return ValueOf(labels, key); }
const std::string& ObjectMeta::Annotation(const std::string& key) const {
  return ValueOf(annotations, key);
}

const OwnerReference* ObjectMeta::Controller() const {
  if (!owner_references.has_value()) return nullptr;
  for (const OwnerReference& ref : *owner_references) {
    if (ref.controller.value_or(false)) return &ref;
  }
  return nullptr;
}

const Condition* FindCondition(const std::optional<std::vector<Condition>>& conditions,
                               const std::string& type) {
  if (!conditions.has_value()) return nullptr;
  for (const Condition& c : *conditions) {
    if (c.type == type) return &c;
  }
  return nullptr;
}

absl::StatusOr<Sandbox> DecodeSandbox(const Json& object) {
  return Decode<Sandbox>(object, "Sandbox");
}
absl::StatusOr<SandboxClaim> DecodeSandboxClaim(const Json& object) {
  return Decode<SandboxClaim>(object, "SandboxClaim");
}
absl::StatusOr<SandboxWarmPool> DecodeSandboxWarmPool(const Json& object) {
  return Decode<SandboxWarmPool>(object, "SandboxWarmPool");
}
absl::StatusOr<SandboxTemplate> DecodeSandboxTemplate(const Json& object) {
  return Decode<SandboxTemplate>(object, "SandboxTemplate");
}
absl::StatusOr<Lease> DecodeLease(const Json& object) { return Decode<Lease>(object, "Lease"); }
absl::StatusOr<Pod> DecodePod(const Json& object) { return Decode<Pod>(object, "Pod"); }
absl::StatusOr<Service> DecodeService(const Json& object) {
  return Decode<Service>(object, "Service");
}
absl::StatusOr<PersistentVolumeClaim> DecodePersistentVolumeClaim(const Json& object) {
  return Decode<PersistentVolumeClaim>(object, "PersistentVolumeClaim");
}
absl::StatusOr<NetworkPolicy> DecodeNetworkPolicy(const Json& object) {
  return Decode<NetworkPolicy>(object, "NetworkPolicy");
}
absl::StatusOr<ObjectMeta> DecodeObjectMeta(const Json& metadata) {
  ObjectMeta out;
  std::string error;
  if (!DecodeStruct(metadata, "metadata", &out, &error)) {
    return absl::InvalidArgumentError(error);
  }
  return out;
}

absl::StatusOr<ObjectMeta> DecodeMetadataOf(const Json& object) {
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the object is ", TypeName(object), ", not an object"));
  }
  auto metadata = object.find("metadata");
  if (metadata == object.end() || metadata->is_null()) return ObjectMeta();
  ObjectMeta out;
  std::string error;
  if (!DecodeStruct(*metadata, "metadata", &out, &error)) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(object, "object"), ": ", error));
  }
  return out;
}

Json Encode(const Sandbox& object, EncodeOptions options) { return ToJson(object, options); }
Json Encode(const SandboxClaim& object, EncodeOptions options) { return ToJson(object, options); }
Json Encode(const SandboxWarmPool& object, EncodeOptions options) {
  return ToJson(object, options);
}
Json Encode(const SandboxTemplate& object, EncodeOptions options) {
  return ToJson(object, options);
}
Json Encode(const Lease& object, EncodeOptions options) { return ToJson(object, options); }
Json Encode(const Pod& object, EncodeOptions options) { return ToJson(object, options); }
Json Encode(const Service& object, EncodeOptions options) { return ToJson(object, options); }
Json Encode(const PersistentVolumeClaim& object, EncodeOptions options) {
  return ToJson(object, options);
}
Json Encode(const NetworkPolicy& object, EncodeOptions options) { return ToJson(object, options); }
Json Encode(const ObjectMeta& metadata, EncodeOptions options) { return ToJson(metadata, options); }
Json Encode(const Condition& condition, EncodeOptions options) {
  return ToJson(condition, options);
}
Json Encode(const OwnerReference& reference, EncodeOptions options) {
  return ToJson(reference, options);
}
Json Encode(const LabelsAndAnnotations& part, EncodeOptions options) {
  return ToJson(part, options);
}
Json Encode(const VolumeClaimTemplate& part, EncodeOptions options) {
  return ToJson(part, options);
}
Json Encode(const SandboxClaimStatus& part, EncodeOptions options) { return ToJson(part, options); }
Json Encode(const SandboxStatus& part, EncodeOptions options) { return ToJson(part, options); }
Json Encode(const SandboxWarmPoolStatus& part, EncodeOptions options) {
  return ToJson(part, options);
}

}  // namespace sbx::k8s::types

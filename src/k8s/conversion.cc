#include "src/k8s/conversion.h"

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "src/common/status_macros.h"

namespace sbx::k8s {
namespace {

using Json = nlohmann::json;

constexpr absl::string_view kCoreGroup = "agents.x-k8s.io";
constexpr absl::string_view kExtensionsGroup = "extensions.agents.x-k8s.io";
constexpr absl::string_view kAlpha = "v1alpha1";
constexpr absl::string_view kBeta = "v1beta1";
constexpr char kShadowPoolPrefix[] = "shadow-pool-";
constexpr char kVolumeClaimTemplatesPolicyAnnotation[] =
    "api.agents.x-k8s.io/v1beta1-volume-claim-templates-policy";

// The fields each version's spec and status have beside the ones converted by hand; their
// values are the same JSON in both versions (PodSpec, PVC templates, conditions...).
constexpr std::initializer_list<const char*> kSandboxSpecShared = {
    "podTemplate", "volumeClaimTemplates", "shutdownTime", "shutdownPolicy", "service"};
constexpr std::initializer_list<const char*> kSandboxStatusShared = {
    "serviceFQDN", "service", "conditions", "selector", "podIPs"};
constexpr std::initializer_list<const char*> kTemplateSpecShared = {
    "podTemplate", "volumeClaimTemplates", "networkPolicyManagement", "envVarsInjectionPolicy",
    "service"};
constexpr std::initializer_list<const char*> kWarmPoolStatusShared = {"replicas", "readyReplicas",
                                                                      "selector"};
constexpr std::initializer_list<const char*> kClaimSpecShared = {"additionalPodMetadata"};

// The kind's state annotation (upstream's names).
std::string StateAnnotation(absl::string_view kind) {
  std::string lower;
  for (char c : kind) lower += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return absl::StrCat("api.agents.x-k8s.io/v1alpha1-", lower, "-state");
}

const Json& Field(const Json& object, const char* key) {
  static const Json kNull;
  if (!object.is_object()) return kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

std::string Str(const Json& object, const char* key) {
  const Json& value = Field(object, key);
  return value.is_string() ? value.get<std::string>() : std::string();
}

// A map of the `keys` of `from` that are present (and not null).
Json Pick(const Json& from, std::initializer_list<const char*> keys) {
  Json out = Json::object();
  for (const char* key : keys) {
    const Json& value = Field(from, key);
    if (!value.is_null()) out[key] = value;
  }
  return out;
}

absl::Status WrongType(absl::string_view path, absl::string_view want, const Json& value) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, " must be ", want, ", not ", value.type_name()));
}

// The string at `object[key]` ("" when absent); INVALID_ARGUMENT for another type.
absl::StatusOr<std::string> OptionalString(const Json& object, const char* key,
                                           absl::string_view path) {
  const Json& value = Field(object, key);
  if (value.is_null()) return std::string();
  if (!value.is_string()) return WrongType(path, "a string", value);
  return value.get<std::string>();
}

// The int32 at `object[key]`, or nullopt when absent.
absl::StatusOr<std::optional<int64_t>> OptionalInt32(const Json& object, const char* key,
                                                     absl::string_view path) {
  const Json& value = Field(object, key);
  if (value.is_null()) return std::optional<int64_t>();
  if (!value.is_number_integer()) return WrongType(path, "an integer", value);
  int64_t n = value.get<int64_t>();
  if (n < INT32_MIN || n > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(path, " ", n, " is out of int32 range"));
  }
  return std::optional<int64_t>(n);
}

absl::Status CheckMap(const Json& value, absl::string_view path) {
  if (!value.is_null() && !value.is_object()) return WrongType(path, "an object", value);
  return absl::OkStatus();
}

// Copies of the object's metadata annotations without `key`, and whether it had `key`
// (its value in *value).
void TakeAnnotation(Json& object, const std::string& key, std::string* value, bool* had) {
  *had = false;
  Json& metadata = object["metadata"];
  auto annotations = metadata.find("annotations");
  if (annotations == metadata.end() || !annotations->is_object()) return;
  auto it = annotations->find(key);
  if (it == annotations->end()) return;
  *had = true;
  if (it->is_string()) *value = it->get<std::string>();
  annotations->erase(it);
  if (annotations->empty()) metadata.erase(annotations);
}

// Going up: the v1alpha1 object, without its own state annotation, kept in `converted`.
void KeepAlphaState(const Json& alpha, absl::string_view kind, Json& converted) {
  const std::string key = StateAnnotation(kind);
  Json state = alpha;
  std::string ignored;
  bool had = false;
  TakeAnnotation(state, key, &ignored, &had);
  converted["metadata"]["annotations"][key] = state.dump();
}

// Going down: the v1alpha1 object kept in `beta`'s state annotation, removed from
// `converted`; null when there is none.
absl::StatusOr<Json> TakeAlphaState(absl::string_view kind, Json& converted) {
  const std::string key = StateAnnotation(kind);
  std::string text;
  bool had = false;
  TakeAnnotation(converted, key, &text, &had);
  if (!had) return Json();
  if (JsonNestsDeeperThan(text, kMaxConversionJsonDepth)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metadata.annotations[", key, "] nests deeper than ", kMaxConversionJsonDepth, " levels"));
  }
  Json state = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!state.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata.annotations[", key, "] is not the JSON of a v1alpha1 ", kind));
  }
  RETURN_IF_ERROR(CheckMap(Field(state, "spec"), absl::StrCat(key, ": spec")));
  RETURN_IF_ERROR(CheckMap(Field(state, "status"), absl::StrCat(key, ": status")));
  return state;
}

// Sets object[key] = value, or removes key when the map is empty (Go's omitempty).
void SetOrOmit(Json& object, const char* key, Json value) {
  if (value.is_object() && value.empty()) {
    object.erase(key);
  } else {
    object[key] = std::move(value);
  }
}

// --- Sandbox ---

absl::StatusOr<Json> SandboxUp(const Json& alpha, Json out) {
  const Json& spec = Field(alpha, "spec");
  ASSIGN_OR_RETURN(std::optional<int64_t> replicas,
                   OptionalInt32(spec, "replicas", "spec.replicas"));
  Json beta_spec = Pick(spec, kSandboxSpecShared);
  beta_spec["operatingMode"] = replicas.has_value() && *replicas == 0 ? "Suspended" : "Running";
  out["spec"] = std::move(beta_spec);
  SetOrOmit(out, "status", Pick(Field(alpha, "status"), kSandboxStatusShared));
  KeepAlphaState(alpha, "Sandbox", out);
  return out;
}

absl::StatusOr<Json> SandboxDown(const Json& beta, Json out) {
  const Json& spec = Field(beta, "spec");
  ASSIGN_OR_RETURN(std::string mode, OptionalString(spec, "operatingMode", "spec.operatingMode"));
  const bool suspended = mode == "Suspended";
  Json alpha_spec = Pick(spec, kSandboxSpecShared);
  alpha_spec["replicas"] = suspended ? 0 : 1;
  Json status = Pick(Field(beta, "status"), kSandboxStatusShared);
  const int64_t status_replicas = suspended ? 0 : 1;

  ASSIGN_OR_RETURN(Json original, TakeAlphaState("Sandbox", out));
  if (!original.is_null()) {
    ASSIGN_OR_RETURN(std::optional<int64_t> wrote,
                     OptionalInt32(Field(original, "spec"), "replicas", "spec.replicas"));
    if (!suspended) {
      // Running: what the v1alpha1 writer said, unless it said 0 (since resumed).
      if (!wrote.has_value()) {
        alpha_spec.erase("replicas");
      } else if (*wrote != 0) {
        alpha_spec["replicas"] = *wrote;
      }
    }
    // status.replicas stays what the v1beta1 status says (1 unless suspended): upstream
    // restores it from the annotation too, which holds the status of the last v1alpha1
    // write (none for a kubectl apply), so a running Sandbox read 0 there.
  }
  if (status_replicas != 0) status["replicas"] = status_replicas;
  out["spec"] = std::move(alpha_spec);
  SetOrOmit(out, "status", std::move(status));
  return out;
}

// --- SandboxTemplate ---

Json TemplateSpecShared(const Json& spec) {
  Json out = Pick(spec, kTemplateSpecShared);
  const Json& policy = Field(spec, "networkPolicy");
  if (!policy.is_null()) out["networkPolicy"] = Pick(policy, {"ingress", "egress"});
  return out;
}

absl::StatusOr<Json> TemplateUp(const Json& alpha, Json out) {
  Json beta_spec = TemplateSpecShared(Field(alpha, "spec"));
  std::string policy;
  bool had = false;
  TakeAnnotation(out, kVolumeClaimTemplatesPolicyAnnotation, &policy, &had);
  if (had) {
    if (policy != "Disallowed" && policy != "Allowed" && policy != "Overrides") {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata.annotations[", kVolumeClaimTemplatesPolicyAnnotation, "] \"",
                       policy, "\" is not Disallowed, Allowed or Overrides"));
    }
    beta_spec["volumeClaimTemplatesPolicy"] = policy;
  }
  out["spec"] = std::move(beta_spec);
  KeepAlphaState(alpha, "SandboxTemplate", out);
  return out;
}

absl::StatusOr<Json> TemplateDown(const Json& beta, Json out) {
  const Json& spec = Field(beta, "spec");
  ASSIGN_OR_RETURN(std::string policy, OptionalString(spec, "volumeClaimTemplatesPolicy",
                                                      "spec.volumeClaimTemplatesPolicy"));
  out["spec"] = TemplateSpecShared(spec);
  RETURN_IF_ERROR(TakeAlphaState("SandboxTemplate", out).status());
  std::string old;
  bool had = false;
  TakeAnnotation(out, kVolumeClaimTemplatesPolicyAnnotation, &old, &had);
  if (!policy.empty())
    out["metadata"]["annotations"][kVolumeClaimTemplatesPolicyAnnotation] = policy;
  return out;
}

// --- SandboxWarmPool ---

// A warm pool's spec and status in the other version: spec.replicas is optional in
// v1beta1 and required in v1alpha1, hence `missing_replicas` when it is absent.
absl::StatusOr<Json> WarmPoolIn(const Json& from, Json out, int64_t missing_replicas) {
  const Json& spec = Field(from, "spec");
  ASSIGN_OR_RETURN(std::optional<int64_t> replicas,
                   OptionalInt32(spec, "replicas", "spec.replicas"));
  Json converted = Json::object();
  converted["replicas"] = replicas.value_or(missing_replicas);
  converted["sandboxTemplateRef"] = Pick(Field(spec, "sandboxTemplateRef"), {"name"});
  const Json& strategy = Field(spec, "updateStrategy");
  if (!strategy.is_null()) converted["updateStrategy"] = Pick(strategy, {"type"});
  out["spec"] = std::move(converted);
  SetOrOmit(out, "status", Pick(Field(from, "status"), kWarmPoolStatusShared));
  return out;
}

absl::StatusOr<Json> WarmPoolUp(const Json& alpha, Json out) {
  ASSIGN_OR_RETURN(out, WarmPoolIn(alpha, std::move(out), /*missing_replicas=*/0));
  KeepAlphaState(alpha, "SandboxWarmPool", out);
  return out;
}

absl::StatusOr<Json> WarmPoolDown(const Json& beta, Json out) {
  ASSIGN_OR_RETURN(out, WarmPoolIn(beta, std::move(out), /*missing_replicas=*/1));
  RETURN_IF_ERROR(TakeAlphaState("SandboxWarmPool", out).status());
  return out;
}

// --- SandboxClaim ---

bool IsSpecificPool(absl::string_view policy) {
  return !policy.empty() && policy != "none" && policy != "default";
}

// A warm sandbox's name is its pool's name and a random suffix.
std::string StripRandomSuffix(const std::string& name) {
  size_t dash = name.rfind('-');
  return dash == std::string::npos ? name : name.substr(0, dash);
}

Json ClaimLifecycle(const Json& lifecycle) {
  Json out = Pick(lifecycle, {"shutdownTime", "ttlSecondsAfterFinished"});
  const Json& policy = Field(lifecycle, "shutdownPolicy");
  if (policy.is_string() && !policy.get<std::string>().empty()) out["shutdownPolicy"] = policy;
  return out;
}

absl::StatusOr<Json> ClaimSpecShared(const Json& spec) {
  Json out = Pick(spec, kClaimSpecShared);
  const Json& lifecycle = Field(spec, "lifecycle");
  if (!lifecycle.is_null()) out["lifecycle"] = ClaimLifecycle(lifecycle);
  const Json& env = Field(spec, "env");
  if (!env.is_null()) {
    if (!env.is_array()) return WrongType("spec.env", "a list", env);
    Json list = Json::array();
    for (const Json& var : env) list.push_back(Pick(var, {"name", "value", "containerName"}));
    out["env"] = std::move(list);
  }
  return out;
}

Json ClaimStatus(const Json& status) {
  Json out = Pick(status, {"conditions"});
  const Json& sandbox = Field(status, "sandbox");
  if (!sandbox.is_null()) SetOrOmit(out, "sandbox", Pick(sandbox, {"name", "podIPs"}));
  return out;
}

absl::StatusOr<Json> ClaimUp(const Json& alpha, Json out) {
  const Json& spec = Field(alpha, "spec");
  ASSIGN_OR_RETURN(Json beta_spec, ClaimSpecShared(spec));
  ASSIGN_OR_RETURN(std::string policy, OptionalString(spec, "warmpool", "spec.warmpool"));
  ASSIGN_OR_RETURN(
      std::string template_name,
      OptionalString(Field(spec, "sandboxTemplateRef"), "name", "spec.sandboxTemplateRef.name"));
  ASSIGN_OR_RETURN(
      std::string sandbox_name,
      OptionalString(Field(Field(alpha, "status"), "sandbox"), "name", "status.sandbox.name"));
  ASSIGN_OR_RETURN(std::string claim_name,
                   OptionalString(Field(alpha, "metadata"), "name", "metadata.name"));
  std::string pool;
  if (IsSpecificPool(policy)) {
    pool = policy;
  } else if (!sandbox_name.empty() && sandbox_name != claim_name) {
    pool = StripRandomSuffix(sandbox_name);  // already bound to a warm pool's member
  } else {
    pool = kShadowPoolPrefix + template_name;
  }
  beta_spec["warmPoolRef"] = Json{{"name", pool}};
  out["spec"] = std::move(beta_spec);
  SetOrOmit(out, "status", ClaimStatus(Field(alpha, "status")));
  KeepAlphaState(alpha, "SandboxClaim", out);
  return out;
}

// Whether a v1beta1 claim still points at the pool its v1alpha1 writer meant.
bool PoolMatches(const std::string& actual, const std::string& expected,
                 const std::string& sandbox_name) {
  if (actual == expected || actual == kShadowPoolPrefix + expected) return true;
  return !sandbox_name.empty() &&
         (actual == sandbox_name || actual == StripRandomSuffix(sandbox_name));
}

absl::StatusOr<Json> ClaimDown(const Json& beta, Json out) {
  const Json& spec = Field(beta, "spec");
  ASSIGN_OR_RETURN(Json alpha_spec, ClaimSpecShared(spec));
  ASSIGN_OR_RETURN(std::string pool,
                   OptionalString(Field(spec, "warmPoolRef"), "name", "spec.warmPoolRef.name"));
  if (absl::StartsWith(pool, kShadowPoolPrefix)) {
    alpha_spec["sandboxTemplateRef"] = Json{{"name", pool.substr(sizeof(kShadowPoolPrefix) - 1)}};
    alpha_spec["warmpool"] = "default";
  } else {
    alpha_spec["sandboxTemplateRef"] = Json{{"name", pool}};
    alpha_spec["warmpool"] = pool;
  }
  ASSIGN_OR_RETURN(std::string sandbox_name, OptionalString(Field(Field(beta, "status"), "sandbox"),
                                                            "name", "status.sandbox.name"));
  ASSIGN_OR_RETURN(Json original, TakeAlphaState("SandboxClaim", out));
  if (!original.is_null()) {
    const Json& wrote = Field(original, "spec");
    ASSIGN_OR_RETURN(std::string policy, OptionalString(wrote, "warmpool", "spec.warmpool"));
    ASSIGN_OR_RETURN(
        std::string template_name,
        OptionalString(Field(wrote, "sandboxTemplateRef"), "name", "spec.sandboxTemplateRef.name"));
    const std::string expected = IsSpecificPool(policy) ? policy : template_name;
    alpha_spec["sandboxTemplateRef"] = Pick(Field(wrote, "sandboxTemplateRef"), {"name"});
    if (!PoolMatches(pool, expected, sandbox_name)) {
      alpha_spec["warmpool"] = pool;  // someone moved the claim to another pool since
    } else if (Field(wrote, "warmpool").is_null()) {
      alpha_spec.erase("warmpool");
    } else {
      alpha_spec["warmpool"] = policy;
    }
  }
  out["spec"] = std::move(alpha_spec);
  SetOrOmit(out, "status", ClaimStatus(Field(beta, "status")));
  return out;
}

struct KindConversion {
  absl::string_view group;
  absl::string_view kind;
  absl::StatusOr<Json> (*up)(const Json& alpha, Json out);
  absl::StatusOr<Json> (*down)(const Json& beta, Json out);
};

constexpr KindConversion kKinds[] = {
    {kCoreGroup, "Sandbox", SandboxUp, SandboxDown},
    {kExtensionsGroup, "SandboxClaim", ClaimUp, ClaimDown},
    {kExtensionsGroup, "SandboxTemplate", TemplateUp, TemplateDown},
    {kExtensionsGroup, "SandboxWarmPool", WarmPoolUp, WarmPoolDown},
};

// "group/version" split; INVALID_ARGUMENT when it has no slash.
absl::Status SplitApiVersion(absl::string_view api_version, absl::string_view what,
                             absl::string_view* group, absl::string_view* version) {
  size_t slash = api_version.find('/');
  if (slash == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", api_version, "\" is not group/version"));
  }
  *group = api_version.substr(0, slash);
  *version = api_version.substr(slash + 1);
  return absl::OkStatus();
}

}  // namespace

bool JsonNestsDeeperThan(absl::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

absl::StatusOr<Json> ConvertAgentsObject(const Json& object,
                                         absl::string_view desired_api_version) {
  if (!object.is_object()) return WrongType("the object", "a JSON object", object);
  ASSIGN_OR_RETURN(std::string api_version, OptionalString(object, "apiVersion", "apiVersion"));
  ASSIGN_OR_RETURN(std::string kind, OptionalString(object, "kind", "kind"));
  absl::string_view group, version, desired_group, desired_version;
  RETURN_IF_ERROR(SplitApiVersion(api_version, "apiVersion", &group, &version));
  RETURN_IF_ERROR(
      SplitApiVersion(desired_api_version, "desiredAPIVersion", &desired_group, &desired_version));
  const KindConversion* conversion = nullptr;
  for (const KindConversion& k : kKinds) {
    if (k.group == group && k.kind == kind) conversion = &k;
  }
  if (conversion == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("kind ", kind, " of group ", group, " is not converted by sbx"));
  }
  if (desired_group != group) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot convert a ", kind, " of group ", group, " to group ", desired_group));
  }
  for (absl::string_view v : {version, desired_version}) {
    if (v != kAlpha && v != kBeta) {
      return absl::InvalidArgumentError(
          absl::StrCat(group, " has no version ", v, " (v1alpha1 and v1beta1 are served)"));
    }
  }
  RETURN_IF_ERROR(CheckMap(Field(object, "metadata"), "metadata"));
  RETURN_IF_ERROR(
      CheckMap(Field(Field(object, "metadata"), "annotations"), "metadata.annotations"));
  RETURN_IF_ERROR(CheckMap(Field(object, "spec"), "spec"));
  RETURN_IF_ERROR(CheckMap(Field(object, "status"), "status"));
  if (version == desired_version) return object;

  // Everything but spec and status (apiVersion, kind, metadata) carries over.
  Json out = Json::object();
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (it.key() != "spec" && it.key() != "status") out[it.key()] = it.value();
  }
  out["apiVersion"] = std::string(desired_api_version);
  if (!out.contains("metadata")) out["metadata"] = Json::object();
  absl::StatusOr<Json> converted = desired_version == kBeta
                                       ? conversion->up(object, std::move(out))
                                       : conversion->down(object, std::move(out));
  if (!converted.ok()) {
    return absl::Status(
        converted.status().code(),
        absl::StrCat(kind, " ", Field(Field(object, "metadata"), "name").dump(), " from ",
                     api_version, " to ", desired_api_version, ": ", converted.status().message()));
  }
  return converted;
}

absl::StatusOr<Json> ReviewConversion(absl::string_view body) {
  if (JsonNestsDeeperThan(body, kMaxConversionJsonDepth + 3)) {
    return absl::InvalidArgumentError(absl::StrCat("the ConversionReview nests deeper than ",
                                                   kMaxConversionJsonDepth, " levels"));
  }
  Json review = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!review.is_object()) {
    return absl::InvalidArgumentError("the body is not a JSON ConversionReview");
  }
  const std::string api_version = Str(review, "apiVersion");
  if (api_version != "apiextensions.k8s.io/v1" && api_version != "apiextensions.k8s.io/v1beta1") {
    return absl::InvalidArgumentError(
        absl::StrCat("apiVersion \"", api_version,
                     "\" is not apiextensions.k8s.io/v1 (or v1beta1) of a ConversionReview"));
  }
  if (Str(review, "kind") != "ConversionReview") {
    return absl::InvalidArgumentError("kind is not ConversionReview");
  }
  const Json& request = Field(review, "request");
  const std::string uid = Str(request, "uid");
  if (uid.empty()) return absl::InvalidArgumentError("the ConversionReview has no request.uid");

  Json answer = {{"apiVersion", api_version}, {"kind", "ConversionReview"}};
  Json& response = answer["response"];
  response["uid"] = uid;
  auto fail = [&](absl::string_view message) {
    response["result"] = {{"status", "Failure"}, {"message", std::string(message)}};
    return answer;
  };
  const std::string desired = Str(request, "desiredAPIVersion");
  if (desired.empty()) return fail("request.desiredAPIVersion is missing");
  const Json& objects = Field(request, "objects");
  if (!objects.is_array()) return fail("request.objects is not a list");
  Json converted = Json::array();
  for (size_t i = 0; i < objects.size(); ++i) {
    absl::StatusOr<Json> one = ConvertAgentsObject(objects[i], desired);
    if (!one.ok()) return fail(absl::StrCat("objects[", i, "]: ", one.status().message()));
    converted.push_back(*std::move(one));
  }
  response["convertedObjects"] = std::move(converted);
  response["result"] = {{"status", "Success"}};
  return answer;
}

}  // namespace sbx::k8s

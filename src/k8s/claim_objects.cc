#include "src/k8s/claim_objects.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "src/k8s/json_fields.h"
#include "src/k8s/kube_runtime.h"
#include "src/k8s/sandbox_objects.h"
#include "src/k8s/template_objects.h"

namespace sbx::k8s {

using json_fields::Field;
using json_fields::Str;

namespace {

// The claim's agents.x-k8s.io/created-by label as written ("" without one): upstream
// copies it onto the claim's Sandbox.
const std::string& ClaimCreatedBy(const types::SandboxClaim& claim) {
  return claim.metadata.Label(kCreatedByLabel);
}

absl::Time ParseRfc3339(const std::string& s, absl::Time fallback) {
  absl::Time t;
  std::string err;
  return absl::ParseTime(absl::RFC3339_full, s, &t, &err) ? t : fallback;
}

std::string Rfc3339Seconds(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

template <class T>
bool NonEmpty(const std::optional<std::vector<T>>& list) {
  return list.has_value() && !list->empty();
}

const std::string& NameOr(const std::optional<std::string>& name) {
  static const std::string* const kEmpty = new std::string();
  return name ? *name : *kEmpty;
}

// The env policy's verdict (envVarsInjectionPolicy; upstream's default is Disallowed).
std::optional<ClaimRefusal> CheckEnv(const std::vector<types::ClaimEnvVar>& env,
                                     const Json& sandbox_template) {
  const std::string template_name = Str(Field(sandbox_template, "metadata"), "name");
  const Json& tspec = Field(sandbox_template, "spec");
  std::string policy = Str(tspec, "envVarsInjectionPolicy");
  if (policy.empty()) policy = "Disallowed";
  if (policy == "Disallowed") {
    return ClaimRefusal{"EnvVarsInjectionRejected",
                        absl::StrCat("SandboxTemplate \"", template_name,
                                     "\" does not allow env in claims (envVarsInjectionPolicy: "
                                     "Disallowed)")};
  }
  if (policy != "Allowed") return std::nullopt;  // Overrides may replace the template's
  const Json& containers = Field(Field(Field(tspec, "podTemplate"), "spec"), "containers");
  if (!containers.is_array()) return std::nullopt;
  for (const types::ClaimEnvVar& e : env) {
    for (const Json& c : containers) {
      const Json& have = Field(c, "env");
      if (!have.is_array()) continue;
      for (const Json& h : have) {
        if (Str(h, "name") != NameOr(e.name)) continue;
        return ClaimRefusal{"EnvVarsInjectionRejected",
                            absl::StrCat("env \"", NameOr(e.name),
                                         "\" is set by the template; its "
                                         "envVarsInjectionPolicy Allowed forbids overriding")};
      }
    }
  }
  return std::nullopt;
}

// Appends `env` (the claim's) to every container it targets, replacing a variable of the
// same name.
void InjectEnv(const std::optional<std::vector<types::ClaimEnvVar>>& env, Json* pod_spec) {
  if (!env.has_value() || !Field(*pod_spec, "containers").is_array()) return;
  for (Json& c : (*pod_spec)["containers"]) {
    for (const types::ClaimEnvVar& e : *env) {
      const std::string& target = NameOr(e.container_name);
      if (!target.empty() && target != Str(c, "name")) continue;
      Json& list = c["env"];
      if (!list.is_array()) list = Json::array();
      const Json var = {{"name", NameOr(e.name)}, {"value", NameOr(e.value)}};
      bool replaced = false;
      for (Json& have : list) {
        if (Str(have, "name") == NameOr(e.name)) {
          have = var;
          replaced = true;
        }
      }
      if (!replaced) list.push_back(var);
    }
  }
}

}  // namespace

Json ClaimRef(const types::SandboxClaim& claim) {
  return {{"apiVersion", "extensions.agents.x-k8s.io/v1beta1"},
          {"kind", "SandboxClaim"},
          {"name", claim.metadata.Name()},
          {"uid", claim.metadata.Uid()},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

bool NeedsOwnSandbox(const types::SandboxClaim& claim) {
  return NonEmpty(claim.spec.env) || NonEmpty(claim.spec.volume_claim_templates);
}

std::optional<ClaimRefusal> CheckClaimAgainstTemplate(const types::SandboxClaim& claim,
                                                      const Json& sandbox_template) {
  if (NonEmpty(claim.spec.env)) {
    if (std::optional<ClaimRefusal> refused = CheckEnv(*claim.spec.env, sandbox_template)) {
      return refused;
    }
  }
  if (NonEmpty(claim.spec.volume_claim_templates)) {
    const std::string policy = Str(Field(sandbox_template, "spec"), "volumeClaimTemplatesPolicy");
    if (policy.empty() || policy == "Disallowed") {
      return ClaimRefusal{
          "VolumeClaimTemplatesError",
          absl::StrCat("SandboxTemplate \"", Str(Field(sandbox_template, "metadata"), "name"),
                       "\" does not allow volumeClaimTemplates in claims")};
    }
  }
  return std::nullopt;
}

Json ColdSandbox(const types::SandboxClaim& claim, const Json& sandbox_template,
                 const std::string& ns) {
  const types::SandboxClaimSpec& spec = claim.spec;
  const Json& tspec = Field(sandbox_template, "spec");
  const std::string template_name = Str(Field(sandbox_template, "metadata"), "name");
  Json sb_spec = {{"podTemplate", Field(tspec, "podTemplate")}};
  if (Field(tspec, "service").is_boolean()) sb_spec["service"] = tspec["service"];
  if (spec.volume_claim_templates.has_value()) {
    // The claim's entries, each as it was written (unknown fields included).
    Json vct = Json::array();
    for (const types::VolumeClaimTemplate& entry : *spec.volume_claim_templates) {
      vct.push_back(types::Encode(entry));
    }
    sb_spec["volumeClaimTemplates"] = std::move(vct);
  } else if (const Json& vct = Field(tspec, "volumeClaimTemplates"); vct.is_array()) {
    sb_spec["volumeClaimTemplates"] = vct;
  }
  Json& pod = sb_spec["podTemplate"];
  if (!pod.is_object()) pod = Json::object();
  Json& pod_spec = pod["spec"];
  if (!pod_spec.is_object()) pod_spec = Json::object();
  ApplyPodSecureDefaults(sandbox_template, &pod_spec);
  InjectEnv(spec.env, &pod_spec);
  const types::LabelsAndAnnotations& extra = spec.additional_pod_metadata;
  for (const auto& [part, values] :
       {std::pair{"labels", &extra.labels}, std::pair{"annotations", &extra.annotations}}) {
    if (!values->has_value()) continue;
    Json& into = pod["metadata"][part];
    if (!into.is_object()) into = Json::object();
    into.update(Json(**values));
  }
  Json labels = {{kClaimUidLabel, claim.metadata.Uid()},
                 {kLaunchTypeLabel, "cold"},
                 {kTemplateRefHashLabel, NameHash(template_name)},
                 {"sbx.dev/template", template_name}};
  // As upstream: the claim's created-by (a client library's), when it has one.
  if (const std::string& by = ClaimCreatedBy(claim); !by.empty()) labels[kCreatedByLabel] = by;
  return {{"apiVersion", "agents.x-k8s.io/v1beta1"},
          {"kind", "Sandbox"},
          {"metadata",
           {{"name", claim.metadata.Name()},
            {"namespace", ns},
            {"labels", std::move(labels)},
            {"annotations", {{kTemplateRefAnnotation, template_name}}},
            {"ownerReferences", Json::array({ClaimRef(claim)})}}},
          {"spec", std::move(sb_spec)}};
}

bool BoundTo(const Json& sandbox, const std::string& claim_uid) {
  return Str(Field(Field(sandbox, "metadata"), "labels"), kClaimUidLabel) == claim_uid &&
         ControllerUid(sandbox) == claim_uid;
}

Json BindingPatch(const types::SandboxClaim& claim, const std::string& sandbox,
                  const std::string& launch_type) {
  const std::string& created_by = ClaimCreatedBy(claim);
  return {{"metadata",
           {{"ownerReferences", Json::array({ClaimRef(claim)})},
            // The pod keeps its name (the member's): upstream records it on adoption.
            {"annotations", {{kPodNameAnnotation, sandbox}}},
            {"labels",
             {{kWarmPoolLabel, nullptr},
              {kClaimUidLabel, claim.metadata.Uid()},
              {kLaunchTypeLabel, launch_type},
              // As upstream: the claim's, or none (not the member's "controller").
              {kCreatedByLabel, created_by.empty() ? Json(nullptr) : Json(created_by)}}}}}};
}

Json PodMetadataPatch(const Json& additional_pod_metadata) {
  if (!additional_pod_metadata.is_object() || additional_pod_metadata.empty()) return nullptr;
  Json patch = {{"metadata", Json::object()}};
  for (const char* part : {"labels", "annotations"}) {
    if (Field(additional_pod_metadata, part).is_object()) {
      patch["metadata"][part] = additional_pod_metadata[part];
    }
  }
  return patch;
}

Json ClaimCondition(const std::string& type, bool status, const std::string& reason,
                    const std::string& message, const Json& old_status, absl::Time now) {
  const std::string s = status ? "True" : "False";
  std::string since = Rfc3339Seconds(now);
  if (const Json* old = json_fields::FindCondition(old_status, type);
      old != nullptr && Str(*old, "status") == s) {
    since = Str(*old, "lastTransitionTime");
  }
  return {{"type", type},
          {"status", s},
          {"reason", reason},
          {"message", message},
          {"lastTransitionTime", since}};
}

Json RefusedStatus(const Json& old_status, const ClaimRefusal& refusal, absl::Time now) {
  Json status = old_status.is_object() ? old_status : Json::object();
  status["conditions"] =
      Json::array({ClaimCondition("Ready", false, refusal.reason, refusal.message, status, now)});
  return status;
}

Json BoundClaimStatus(const Json& old_status, const std::string& sandbox_name, bool cold,
                      const Json* sandbox, absl::Time now) {
  Json next = old_status.is_object() ? old_status : Json::object();
  if (sandbox == nullptr) {
    if (cold) {
      next["conditions"] = Json::array({ClaimCondition("Ready", false, "SandboxCreatePending",
                                                       "the sandbox is being created", next, now)});
    }
    next["sandbox"] = {{"name", sandbox_name}};
    return next;
  }
  const Json& sb_status = Field(*sandbox, "status");
  const Json* ready = json_fields::FindCondition(sb_status, "Ready");
  Json conditions = Json::array();
  conditions.push_back(ClaimCondition(
      "Ready", IsReady(sb_status),
      ready != nullptr ? Str(*ready, "reason") : std::string("SandboxNotReady"),
      ready != nullptr ? Str(*ready, "message") : std::string("the sandbox is not ready yet"), next,
      now));
  if (const Json* finished = json_fields::FindCondition(sb_status, "Finished")) {
    conditions.push_back(*finished);
  }
  next["conditions"] = std::move(conditions);
  next["sandbox"] = {{"name", sandbox_name}};
  if (Field(sb_status, "podIPs").is_array()) next["sandbox"]["podIPs"] = sb_status["podIPs"];
  return next;
}

bool StatusShows(const Json& old_status, const Json& next) {
  if (!old_status.is_object()) return false;
  for (auto it = next.begin(); it != next.end(); ++it) {
    if (!old_status.contains(it.key()) || old_status[it.key()] != it.value()) return false;
  }
  return true;
}

bool ClaimChangeNeedsReconcile(const Json& before, const Json& after) {
  if (Field(before, "spec") != Field(after, "spec")) return true;
  Json b = Field(before, "metadata");
  Json a = Field(after, "metadata");
  for (Json* meta : {&b, &a}) {
    if (!meta->is_object()) continue;
    meta->erase("resourceVersion");
    meta->erase("managedFields");
  }
  return b != a;
}

bool SandboxChangeConcernsClaim(const Json& before, const Json& after) {
  const Json& b = Field(before, "metadata");
  const Json& a = Field(after, "metadata");
  return Field(b, "uid") != Field(a, "uid") ||
         Field(b, "deletionTimestamp") != Field(a, "deletionTimestamp") ||
         Field(before, "status") != Field(after, "status");
}

LifecycleVerdict ShutdownVerdict(const types::SandboxClaim& claim, absl::Time now) {
  const types::ClaimLifecycle& lifecycle = claim.spec.lifecycle;
  const std::string& shutdown = NameOr(lifecycle.shutdown_time);
  if (shutdown.empty()) return {};
  const absl::Time at = ParseRfc3339(shutdown, absl::InfiniteFuture());
  if (now < at) return {ClaimEnd::kNone, at};
  const std::string& policy = NameOr(lifecycle.shutdown_policy);
  if (policy == "Delete") return {ClaimEnd::kDeleteBackground};
  if (policy == "DeleteForeground") return {ClaimEnd::kDeleteForeground};
  return {ClaimEnd::kRetain};
}

LifecycleVerdict TtlVerdict(const types::SandboxClaim& claim, const Json& sandbox_status,
                            absl::Time now) {
  const std::optional<int64_t>& ttl = claim.spec.lifecycle.ttl_seconds_after_finished;
  const Json* finished = json_fields::FindCondition(sandbox_status, "Finished");
  if (finished == nullptr || Str(*finished, "status") != "True" || !ttl.has_value()) {
    return {};
  }
  const absl::Time at =
      ParseRfc3339(Str(*finished, "lastTransitionTime"), now) + absl::Seconds(*ttl);
  if (now < at) return {ClaimEnd::kNone, at};
  return {ClaimEnd::kDelete};
}

absl::Time ClaimCreatedAt(const types::SandboxClaim& claim, absl::Time fallback) {
  return ParseRfc3339(NameOr(claim.metadata.creation_timestamp), fallback);
}

std::optional<absl::Time> ClientRequestedAt(const types::SandboxClaim& claim) {
  const std::string& asked = claim.metadata.Annotation(kClientRequestedAtAnnotation);
  const absl::Time at = ParseRfc3339(asked, absl::InfinitePast());
  if (at == absl::InfinitePast()) return std::nullopt;
  return at;
}

types::SandboxClaim GrpcSandboxClaim(const store::ClaimRecord& claim, const std::string& name,
                                     const NamespacedName& where, const std::string& sandbox) {
  types::SandboxClaim out;
  out.api_version = "extensions.agents.x-k8s.io/v1beta1";
  out.kind = "SandboxClaim";
  out.metadata.name = name;
  out.metadata.ns = where.ns;
  out.metadata.labels = types::StringMap{{"sbx.dev/source", "grpc"}};
  out.metadata.annotations = types::StringMap{{kSbxOwnerAnnotation, claim.owner},
                                              {kSbxClaimIdAnnotation, claim.id},
                                              {kSandboxNameAnnotation, sandbox}};
  out.spec.warm_pool_ref.name = where.name;
  return out;
}

Json GrpcClaimStatus(const std::string& sandbox_name, const Json* sandbox, const Json& old_status,
                     absl::Time now) {
  Json status = {
      {"conditions", Json::array({ClaimCondition("Ready", true, "DependenciesReady",
                                                 "claimed over gRPC", old_status, now)})},
      {"sandbox", {{"name", sandbox_name}}}};
  if (sandbox != nullptr) {
    const Json& ips = Field(Field(*sandbox, "status"), "podIPs");
    if (ips.is_array()) status["sandbox"]["podIPs"] = ips;
  }
  return status;
}

}  // namespace sbx::k8s

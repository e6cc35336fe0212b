#include "src/k8s/sandbox_objects.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "src/common/hash.h"
#include "src/k8s/json_fields.h"
#include "src/k8s/leader_election.h"

namespace sbx::k8s {
namespace {

using types::StringMap;

bool Reserved(const std::string& key) {
  return absl::StartsWith(key, kReservedPrefix) || absl::StartsWith(key, kReservedExtensionsPrefix);
}

StringMap WithoutReserved(const std::optional<StringMap>& map) {
  StringMap out;
  if (!map.has_value()) return out;
  for (const auto& [key, value] : *map) {
    if (!Reserved(key)) out.emplace(key, value);
  }
  return out;
}

// The keys of `map` (sorted, as a std::map holds them), joined by commas.
std::string SortedKeys(const StringMap& map) {
  std::vector<std::string> keys;
  keys.reserve(map.size());
  for (const auto& [key, value] : map) keys.push_back(key);
  return absl::StrJoin(keys, ",");
}

types::Condition MakeCondition(const std::string& type, bool status, const std::string& reason,
                               const std::string& message, int64_t generation) {
  types::Condition c;
  c.type = type;
  c.status = status ? "True" : "False";
  c.reason = reason;
  c.message = message;
  c.observed_generation = generation;
  return c;
}

const types::Condition* PodCondition(const types::Pod& pod, const std::string& type) {
  return types::FindCondition(pod.status.conditions, type);
}

bool ExtensionsGroup(const types::OwnerReference& ref) {
  return absl::StartsWith(ref.api_version.value_or(""), absl::StrCat(kExtensionsGroup, "/"));
}

// True when the controller owner of the object of `metadata` is in the
// extensions.agents.x-k8s.io group.
bool ControlledByExtensions(const types::ObjectMeta& metadata) {
  const types::OwnerReference* ref = metadata.Controller();
  return ref != nullptr && ExtensionsGroup(*ref);
}

// The ports of the containers of pod spec `spec` (pass-through JSON: the template's), as a
// Service exposes them; a port without an integer containerPort is left out.
Json ServicePorts(const std::optional<Json>& spec) {
  Json ports = Json::array();
  if (!spec.has_value()) return ports;
  const Json& containers = json_fields::Field(*spec, "containers");
  if (!containers.is_array()) return ports;
  for (const Json& container : containers) {
    const Json& container_ports = json_fields::Field(container, "ports");
    if (!container_ports.is_array()) continue;
    for (const Json& p : container_ports) {
      const Json& number = json_fields::Field(p, "containerPort");
      if (!number.is_number_integer()) continue;
      const std::string protocol = json_fields::Str(p, "protocol");
      const std::string name = json_fields::Str(p, "name");
      Json port = {{"port", number},
                   {"targetPort", number},
                   {"protocol", protocol.empty() ? "TCP" : protocol}};
      if (!name.empty()) port.emplace("name", name);
      ports.push_back(std::move(port));
    }
  }
  return ports;
}

// The owner references of `metadata` with `sandbox`'s controller reference added.
Json OwnersWith(const types::ObjectMeta& metadata, const types::Sandbox& sandbox) {
  Json owners = Json::array();
  if (metadata.owner_references.has_value()) {
    for (const types::OwnerReference& ref : *metadata.owner_references) {
      owners.push_back(types::Encode(ref));
    }
  }
  owners.push_back(ControllerRef(sandbox));
  return owners;
}

Json AdoptionMetadata(const types::ObjectMeta& metadata, const types::Sandbox& sandbox) {
  return {{"resourceVersion", metadata.resource_version.value_or("")},
          {"ownerReferences", OwnersWith(metadata, sandbox)},
          {"labels", {{kNameHashLabel, NameHash(sandbox.metadata.Name())}}}};
}

// Whether `sandbox` may adopt the object of `metadata` (MayAdopt, the Service's clusterIP
// aside).
bool MayAdoptObject(const types::Sandbox& sandbox, const types::ObjectMeta& metadata) {
  if (!ControllerUid(metadata).empty() || metadata.BeingDeleted()) return false;
  return metadata.Label(kNameHashLabel) == NameHash(sandbox.metadata.Name()) ||
         metadata.Label(kAdoptableLabel) == "true";
}

}  // namespace

std::string NameHash(const std::string& name) { return absl::StrFormat("%08x", Fnv1a32(name)); }

Json ControllerRef(const types::Sandbox& owner) {
  return {{"apiVersion", owner.api_version.value_or("")},
          {"kind", owner.kind.value_or("")},
          {"name", owner.metadata.Name()},
          {"uid", owner.metadata.Uid()},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

std::string ControllerUid(const types::ObjectMeta& metadata) {
  const types::OwnerReference* ref = metadata.Controller();
  return ref != nullptr ? ref->uid.value_or("") : "";
}

std::string ControllerUid(const Json& object) {
  const Json& refs = json_fields::Field(json_fields::Field(object, "metadata"), "ownerReferences");
  if (!refs.is_array()) return "";
  for (const Json& ref : refs) {
    const Json& controller = json_fields::Field(ref, "controller");
    if (controller.is_boolean() && controller.get<bool>()) return json_fields::Str(ref, "uid");
  }
  return "";
}

std::string CreatedBy(const types::ObjectMeta& metadata) {
  const std::string& by = metadata.Label(kCreatedByLabel);
  if (by == "go-client" || by == "python-client" || by == "controller") return by;
  return "unknown";
}

std::string CreatedBy(const Json& object) {
  const std::string by = json_fields::Str(
      json_fields::Field(json_fields::Field(object, "metadata"), "labels"), kCreatedByLabel);
  if (by == "go-client" || by == "python-client" || by == "controller") return by;
  return "unknown";
}

std::string ExtensionsControllerKind(const types::ObjectMeta& metadata) {
  const types::OwnerReference* ref = metadata.Controller();
  if (ref == nullptr || !ExtensionsGroup(*ref)) return "None";
  const std::string kind = ref->kind.value_or("");
  return kind == "SandboxClaim" || kind == "SandboxWarmPool" ? kind : "None";
}

std::string ExtensionsControllerKind(const Json& object) {
  const Json& refs = json_fields::Field(json_fields::Field(object, "metadata"), "ownerReferences");
  if (!refs.is_array()) return "None";
  for (const Json& ref : refs) {
    const Json& controller = json_fields::Field(ref, "controller");
    if (!controller.is_boolean() || !controller.get<bool>()) continue;
    const std::string kind = json_fields::Str(ref, "kind");
    const bool extensions =
        absl::StartsWith(json_fields::Str(ref, "apiVersion"), absl::StrCat(kExtensionsGroup, "/"));
    return extensions && (kind == "SandboxClaim" || kind == "SandboxWarmPool") ? kind : "None";
  }
  return "None";
}

Json DesiredPod(const types::Sandbox& sandbox) {
  const types::ObjectMeta& meta = sandbox.metadata;
  const std::string& name = meta.Name();
  const types::PodTemplate& tmpl = sandbox.spec.pod_template;
  StringMap labels = WithoutReserved(tmpl.metadata.labels);
  StringMap annotations = WithoutReserved(tmpl.metadata.annotations);
  // Which of the pod's labels and annotations came from the template, as upstream records.
  const std::string label_keys = SortedKeys(labels);
  const std::string annotation_keys = SortedKeys(annotations);
  if (!label_keys.empty()) annotations[kPropagatedLabelsAnnotation] = label_keys;
  if (!annotation_keys.empty()) annotations[kPropagatedAnnotationsAnnotation] = annotation_keys;
  labels[kNameHashLabel] = NameHash(name);
  // The launch type is the controller's to state (warm members keep theirs).
  if (const std::string& launch = meta.Label(kLaunchTypeLabel); !launch.empty()) {
    labels[kLaunchTypeLabel] = launch;
  }
  // The template's NetworkPolicy selects the pods of warm members and claims by this label.
  const std::string& template_hash = meta.Label(kTemplateRefHashLabel);
  if (!template_hash.empty() && ControlledByExtensions(meta)) {
    labels[kTemplateRefHashLabel] = template_hash;
  }
  // The pod's spec is the template's (pass-through JSON); its volumes are edited below.
  Json spec = tmpl.spec.has_value() && tmpl.spec->is_object() ? *tmpl.spec : Json::object();
  // Each volumeClaimTemplates entry replaces the pod volume of its name (or adds one).
  if (sandbox.spec.volume_claim_templates.has_value()) {
    Json& volumes = spec["volumes"];
    if (!volumes.is_array()) volumes = Json::array();
    for (const types::VolumeClaimTemplate& entry : *sandbox.spec.volume_claim_templates) {
      const std::string volume = entry.metadata.name.value_or("");
      if (volume.empty()) continue;
      Json pvc_volume = {{"name", volume},
                         {"persistentVolumeClaim", {{"claimName", volume + "-" + name}}}};
      bool replaced = false;
      for (Json& v : volumes) {
        if (json_fields::Str(v, "name") == volume) {
          v = pvc_volume;
          replaced = true;
        }
      }
      if (!replaced) volumes.push_back(pvc_volume);
    }
  }
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata",
           {{"name", name},
            {"namespace", meta.Namespace()},
            {"labels", labels},
            {"annotations", annotations},
            {"ownerReferences", Json::array({ControllerRef(sandbox)})}}},
          {"spec", std::move(spec)}};
}

Json DesiredPod(const Json& sandbox) {
  absl::StatusOr<types::Sandbox> typed = types::DecodeSandbox(sandbox);
  if (!typed.ok()) {
    spdlog::error("no pod for a Sandbox that does not decode: {}", typed.status().ToString());
    return Json();
  }
  return DesiredPod(*typed);
}

void SetSandboxdSecret(Json* pod, const std::string& port_name, const std::string& secret) {
  Json& containers = (*pod)["spec"]["containers"];
  if (!containers.is_array()) return;
  for (Json& container : containers) {
    const Json& ports = json_fields::Field(container, "ports");
    if (!ports.is_array()) continue;
    bool serves = false;
    for (const Json& p : ports) serves = serves || json_fields::Str(p, "name") == port_name;
    if (!serves) continue;
    Json& env = container["env"];
    if (!env.is_array()) env = Json::array();
    Json kept = Json::array();
    for (Json& e : env) {
      if (json_fields::Str(e, "name") != kSandboxdSecretEnv) kept.push_back(std::move(e));
    }
    kept.push_back({{"name", kSandboxdSecretEnv}, {"value", secret}});
    env = std::move(kept);
  }
}

std::vector<Json> DesiredPvcs(const types::Sandbox& sandbox) {
  std::vector<Json> out;
  if (!sandbox.spec.volume_claim_templates.has_value()) return out;
  for (const types::VolumeClaimTemplate& entry : *sandbox.spec.volume_claim_templates) {
    const std::string volume = entry.metadata.name.value_or("");
    if (volume.empty()) continue;
    StringMap labels = WithoutReserved(entry.metadata.labels);
    labels[kNameHashLabel] = NameHash(sandbox.metadata.Name());  // what the controller watches
    Json pvc = {
        {"apiVersion", "v1"},
        {"kind", "PersistentVolumeClaim"},
        {"metadata",
         {{"name", volume + "-" + sandbox.metadata.Name()},
          {"namespace", sandbox.metadata.Namespace()},
          {"labels", labels},
          {"annotations", WithoutReserved(entry.metadata.annotations)},
          {"ownerReferences", Json::array({ControllerRef(sandbox)})}}},
        {"spec", entry.spec.has_value() && entry.spec->is_object() ? *entry.spec : Json::object()}};
    out.push_back(std::move(pvc));
  }
  return out;
}

PvcFit FitOfPvc(const types::PersistentVolumeClaim& pvc, const types::Sandbox& sandbox,
                std::string* why) {
  const types::ObjectMeta& meta = pvc.metadata;
  const std::string& name = meta.Name();
  const std::string& sandbox_name = sandbox.metadata.Name();
  const std::string& uid = sandbox.metadata.Uid();
  std::string owner;  // "Kind/name (UID: u)" of its controller, "" when it has none
  if (const types::OwnerReference* ref = meta.Controller()) {
    owner = absl::StrCat(ref->kind.value_or(""), "/", ref->name.value_or(""),
                         " (UID: ", ref->uid.value_or(""), ")");
  }
  if (meta.BeingDeleted()) {
    if (why != nullptr) {
      *why = absl::StrCat("PVC \"", name, "\"", owner.empty() ? "" : " of ", owner,
                          " is being deleted; the Sandbox's own is made once it is gone");
    }
    return PvcFit::kBeingDeleted;
  }
  if (!uid.empty() && ControllerUid(meta) == uid) return PvcFit::kUsable;
  if (why != nullptr) {
    // Upstream's wording (controllers/sandbox_controller.go, reconcilePVCs).
    *why = owner.empty() ? absl::StrCat("PVC \"", name,
                                        "\" exists, has no controller and is not "
                                        "adopted by sandbox \"",
                                        sandbox_name, "\"")
                         : absl::StrCat("PVC \"", name, "\" is owned by ", owner,
                                        ", not by sandbox \"", sandbox_name, "\"");
  }
  return PvcFit::kRefused;
}

Json DesiredService(const types::Sandbox& sandbox) {
  const std::string& name = sandbox.metadata.Name();
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata",
           {{"name", name},
            {"namespace", sandbox.metadata.Namespace()},
            {"labels", {{kNameHashLabel, NameHash(name)}}},
            {"ownerReferences", Json::array({ControllerRef(sandbox)})}}},
          {"spec",
           {{"clusterIP", "None"},
            {"selector", {{kNameHashLabel, NameHash(name)}}},
            {"ports", ServicePorts(sandbox.spec.pod_template.spec)}}}};
}

bool MayAdopt(const types::Sandbox& sandbox, const types::Pod& pod) {
  return MayAdoptObject(sandbox, pod.metadata);
}

bool MayAdopt(const types::Sandbox& sandbox, const types::Service& service) {
  if (!MayAdoptObject(sandbox, service.metadata)) return false;
  const std::string cluster_ip = service.spec.cluster_ip.value_or("");
  return cluster_ip.empty() || cluster_ip == "None";
}

Json AdoptionPatch(const types::Sandbox& sandbox, const types::Pod& pod) {
  return {{"metadata", AdoptionMetadata(pod.metadata, sandbox)}};
}

Json AdoptionPatch(const types::Sandbox& sandbox, const types::Service& service) {
  // A merge patch merges maps: keys of the old selector that the Sandbox's lacks go.
  const std::string hash = NameHash(sandbox.metadata.Name());
  Json selector = {{kNameHashLabel, hash}};
  if (service.spec.selector.has_value()) {
    for (const auto& [key, value] : *service.spec.selector) {
      if (key != kNameHashLabel) selector.emplace(key, nullptr);
    }
  }
  return {{"metadata", AdoptionMetadata(service.metadata, sandbox)},
          {"spec",
           {{"selector", std::move(selector)},
            {"ports", ServicePorts(sandbox.spec.pod_template.spec)}}}};
}

types::SandboxStatus ComputeStatus(const types::Sandbox& sandbox, const Observed& observed,
                                   const types::SandboxStatus& old_status, absl::Time now) {
  const std::string& name = sandbox.metadata.Name();
  const int64_t generation = sandbox.metadata.generation.value_or(0);
  const types::Pod* pod = observed.pods.size() == 1 ? observed.pods[0].get() : nullptr;
  static const types::PodStatus kNoPodStatus;
  const types::PodStatus& pod_status = pod != nullptr ? pod->status : kNoPodStatus;
  const std::string phase = pod_status.phase.value_or("");

  types::SandboxStatus status;
  std::vector<types::Condition> conditions;

  // Ready.
  if (!observed.error.empty()) {
    conditions.push_back(
        MakeCondition("Ready", false, "ReconcilerError", observed.error, generation));
  } else if (observed.expired) {
    conditions.push_back(MakeCondition("Ready", false, "SandboxExpired",
                                       "the Sandbox passed its shutdownTime", generation));
  } else if (observed.suspended) {
    conditions.push_back(MakeCondition("Ready", false, "SandboxSuspended",
                                       "operatingMode is Suspended", generation));
  } else if (observed.pods.size() > 1) {
    conditions.push_back(MakeCondition(
        "Ready", false, "MultiplePods",
        absl::StrCat(observed.pods.size(), " pods are controlled by this Sandbox"), generation));
  } else if (phase == "Succeeded") {
    conditions.push_back(
        MakeCondition("Ready", false, "PodSucceeded", "the pod completed", generation));
  } else if (phase == "Failed") {
    conditions.push_back(
        MakeCondition("Ready", false, "PodFailed",
                      absl::StrCat("the pod failed: ", pod_status.reason.value_or(""), " ",
                                   pod_status.message.value_or("")),
                      generation));
  } else {
    std::string waiting;
    if (pod == nullptr && !observed.pvcs_missing.empty()) {
      waiting = observed.pvcs_missing;
    } else if (pod == nullptr) {
      waiting = "the pod does not exist (yet)";
    } else {
      const types::Condition* ready = PodCondition(*pod, "Ready");
      const bool pod_ready = ready != nullptr && ready->status == "True";
      if (phase != "Running") {
        waiting = absl::StrCat("the pod is ", phase.empty() ? "Pending" : phase);
      } else if (!pod_ready) {
        waiting = "the pod is not Ready";
      } else if (pod_status.pod_ip.value_or("").empty()) {
        waiting = "the pod has no IP";
      } else if (observed.service_wanted && observed.service == nullptr) {
        waiting = "the Service does not exist (yet)";
      }
    }
    if (waiting.empty()) {
      conditions.push_back(MakeCondition("Ready", true, "DependenciesReady",
                                         "the pod is Running and Ready", generation));
    } else {
      conditions.push_back(
          MakeCondition("Ready", false, "DependenciesNotReady", waiting, generation));
    }
  }

  // Suspended.
  if (observed.suspended) {
    if (observed.pods.empty()) {
      conditions.push_back(
          MakeCondition("Suspended", true, "PodTerminated", "the pod is gone", generation));
    } else {
      conditions.push_back(MakeCondition("Suspended", false, "PodTerminating",
                                         "the pod is being deleted", generation));
    }
  } else {
    conditions.push_back(
        MakeCondition("Suspended", false, "NotSuspended", "operatingMode is Running", generation));
  }

  // PodScheduled mirrors the pod's; Finished when the pod is terminal.
  if (pod != nullptr) {
    if (const types::Condition* scheduled = PodCondition(*pod, "PodScheduled")) {
      // A pod's condition may carry no reason (PodScheduled=True has none); a Sandbox
      // condition must have one.
      const std::string scheduled_status = scheduled->status.value_or("");
      std::string reason = scheduled->reason.value_or("");
      if (reason.empty()) reason = scheduled_status == "True" ? "Scheduled" : "NotScheduled";
      types::Condition c = MakeCondition("PodScheduled", scheduled_status == "True", reason,
                                         scheduled->message.value_or(""), generation);
      c.status = scheduled_status;
      conditions.push_back(std::move(c));
    }
    if (phase == "Succeeded" || phase == "Failed") {
      conditions.push_back(MakeCondition("Finished", true,
                                         phase == "Succeeded" ? "PodSucceeded" : "PodFailed",
                                         absl::StrCat("the pod is ", phase), generation));
    }
  }

  // Transition times: kept when the condition's status is unchanged.
  const std::string now_text = FormatMicroTime(now).substr(0, 19) + "Z";
  for (types::Condition& c : conditions) {
    std::string since = now_text;
    if (old_status.conditions.has_value()) {
      for (const types::Condition& old : *old_status.conditions) {
        if (old.type.value_or("") == c.type.value_or("") &&
            old.status.value_or("") == c.status.value_or("") &&
            !old.last_transition_time.value_or("").empty()) {
          since = *old.last_transition_time;
        }
      }
    }
    c.last_transition_time = since;
  }
  status.conditions = std::move(conditions);

  if (pod != nullptr) {
    std::vector<std::string> ips;
    if (pod_status.pod_ips.has_value()) {
      for (const types::PodIP& ip : *pod_status.pod_ips) {
        if (!ip.ip.value_or("").empty()) ips.push_back(*ip.ip);
      }
    }
    if (ips.empty() && !pod_status.pod_ip.value_or("").empty()) ips.push_back(*pod_status.pod_ip);
    if (!ips.empty()) status.pod_ips = std::move(ips);
    if (!pod->spec.node_name.value_or("").empty()) status.node_name = pod->spec.node_name;
  }
  if (observed.service != nullptr) {
    status.service = name;
    status.service_fqdn =
        absl::StrCat(name, ".", sandbox.metadata.Namespace(), ".svc.cluster.local");
  }
  status.selector = absl::StrCat(kNameHashLabel, "=", NameHash(name));
  return status;
}

bool IsReady(const types::SandboxStatus& status) {
  const types::Condition* ready = types::FindCondition(status.conditions, "Ready");
  return ready != nullptr && ready->status == "True";
}

bool IsReady(const Json& status) {
  const Json* ready = json_fields::FindCondition(status, "Ready");
  return ready != nullptr && json_fields::Str(*ready, "status") == "True";
}

}  // namespace sbx::k8s

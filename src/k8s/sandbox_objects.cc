#include "src/k8s/sandbox_objects.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/common/hash.h"
#include "src/k8s/json_fields.h"
#include "src/k8s/leader_election.h"

namespace sbx::k8s {
namespace {

using json_fields::Field;
using json_fields::Str;

bool Reserved(const std::string& key) {
  return absl::StartsWith(key, kReservedPrefix) || absl::StartsWith(key, kReservedExtensionsPrefix);
}

Json WithoutReserved(const Json& map) {
  Json out = Json::object();
  if (!map.is_object()) return out;
  for (const auto& [key, value] : map.items()) {
    if (!Reserved(key) && value.is_string()) out[key] = value;
  }
  return out;
}

Json Condition(const std::string& type, bool status, const std::string& reason,
               const std::string& message, int64_t generation) {
  return {{"type", type},
          {"status", status ? "True" : "False"},
          {"reason", reason},
          {"message", message},
          {"observedGeneration", generation}};
}

const Json* PodCondition(const Json& pod, const std::string& type) {
  return json_fields::FindCondition(Field(pod, "status"), type);
}

// True when `object`'s controller owner is in the extensions.agents.x-k8s.io group.
// The keys of JSON object `map`, sorted, joined by commas.
std::string SortedKeys(const Json& map) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : map.items()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  return absl::StrJoin(keys, ",");
}

bool ControlledByExtensions(const Json& object) {
  const Json& refs = Field(Field(object, "metadata"), "ownerReferences");
  if (!refs.is_array()) return false;
  for (const Json& ref : refs) {
    if (Field(ref, "controller").is_boolean() && ref["controller"].get<bool>()) {
      return absl::StartsWith(Str(ref, "apiVersion"), absl::StrCat(kExtensionsGroup, "/"));
    }
  }
  return false;
}

}  // namespace

std::string NameHash(const std::string& name) { return absl::StrFormat("%08x", Fnv1a32(name)); }

Json ControllerRef(const Json& owner) {
  const Json& meta = Field(owner, "metadata");
  return {{"apiVersion", Str(owner, "apiVersion")},
          {"kind", Str(owner, "kind")},
          {"name", Str(meta, "name")},
          {"uid", Str(meta, "uid")},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

std::string ControllerUid(const Json& object) {
  const Json& refs = Field(Field(object, "metadata"), "ownerReferences");
  if (!refs.is_array()) return "";
  for (const Json& ref : refs) {
    if (Field(ref, "controller").is_boolean() && ref["controller"].get<bool>()) {
      return Str(ref, "uid");
    }
  }
  return "";
}

std::string CreatedBy(const Json& object) {
  const std::string by = Str(Field(Field(object, "metadata"), "labels"), kCreatedByLabel);
  if (by == "go-client" || by == "python-client" || by == "controller") return by;
  return "unknown";
}

std::string CreatedBy(const types::ObjectMeta& metadata) {
  const std::string& by = metadata.Label(kCreatedByLabel);
  if (by == "go-client" || by == "python-client" || by == "controller") return by;
  return "unknown";
}

std::string ExtensionsControllerKind(const Json& object) {
  const Json& refs = Field(Field(object, "metadata"), "ownerReferences");
  if (!refs.is_array()) return "None";
  for (const Json& ref : refs) {
    if (!Field(ref, "controller").is_boolean() || !ref["controller"].get<bool>()) continue;
    const std::string kind = Str(ref, "kind");
    const bool extensions =
        absl::StartsWith(Str(ref, "apiVersion"), absl::StrCat(kExtensionsGroup, "/"));
    if (extensions && (kind == "SandboxClaim" || kind == "SandboxWarmPool")) return kind;
    return "None";
  }
  return "None";
}

Json DesiredPod(const Json& sandbox) {
  const Json& meta = Field(sandbox, "metadata");
  const std::string name = Str(meta, "name");
  const Json& tmpl = Field(Field(sandbox, "spec"), "podTemplate");
  const Json& tmpl_meta = Field(tmpl, "metadata");
  Json labels = WithoutReserved(Field(tmpl_meta, "labels"));
  Json annotations = WithoutReserved(Field(tmpl_meta, "annotations"));
  // Which of the pod's labels and annotations came from the template, as upstream records.
  const std::string label_keys = SortedKeys(labels);
  const std::string annotation_keys = SortedKeys(annotations);
  if (!label_keys.empty()) annotations[kPropagatedLabelsAnnotation] = label_keys;
  if (!annotation_keys.empty()) annotations[kPropagatedAnnotationsAnnotation] = annotation_keys;
  labels[kNameHashLabel] = NameHash(name);
  // The launch type is the controller's to state (warm members keep theirs).
  const std::string launch = Str(Field(meta, "labels"), kLaunchTypeLabel);
  if (!launch.empty()) labels[kLaunchTypeLabel] = launch;
  // The template's NetworkPolicy selects the pods of warm members and claims by this label.
  const std::string template_hash = Str(Field(meta, "labels"), kTemplateRefHashLabel);
  if (!template_hash.empty() && ControlledByExtensions(sandbox)) {
    labels[kTemplateRefHashLabel] = template_hash;
  }
  Json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata",
               {{"name", name},
                {"namespace", Str(meta, "namespace")},
                {"labels", labels},
                {"annotations", std::move(annotations)},
                {"ownerReferences", Json::array({ControllerRef(sandbox)})}}},
              {"spec", Field(tmpl, "spec").is_object() ? Field(tmpl, "spec") : Json::object()}};
  // Each volumeClaimTemplates entry replaces the pod volume of its name (or adds one).
  const Json& claims = Field(Field(sandbox, "spec"), "volumeClaimTemplates");
  if (claims.is_array()) {
    Json& volumes = pod["spec"]["volumes"];
    if (!volumes.is_array()) volumes = Json::array();
    for (const Json& entry : claims) {
      const std::string volume = Str(Field(entry, "metadata"), "name");
      if (volume.empty()) continue;
      Json pvc_volume = {{"name", volume},
                         {"persistentVolumeClaim", {{"claimName", volume + "-" + name}}}};
      bool replaced = false;
      for (Json& v : volumes) {
        if (Str(v, "name") == volume) {
          v = pvc_volume;
          replaced = true;
        }
      }
      if (!replaced) volumes.push_back(pvc_volume);
    }
  }
  return pod;
}

void SetSandboxdSecret(Json* pod, const std::string& port_name, const std::string& secret) {
  Json& containers = (*pod)["spec"]["containers"];
  if (!containers.is_array()) return;
  for (Json& container : containers) {
    const Json& ports = Field(container, "ports");
    if (!ports.is_array()) continue;
    bool serves = false;
    for (const Json& p : ports) serves = serves || Str(p, "name") == port_name;
    if (!serves) continue;
    Json& env = container["env"];
    if (!env.is_array()) env = Json::array();
    Json kept = Json::array();
    for (Json& e : env) {
      if (Str(e, "name") != kSandboxdSecretEnv) kept.push_back(std::move(e));
    }
    kept.push_back({{"name", kSandboxdSecretEnv}, {"value", secret}});
    env = std::move(kept);
  }
}

std::vector<Json> DesiredPvcs(const Json& sandbox) {
  std::vector<Json> out;
  const Json& meta = Field(sandbox, "metadata");
  const Json& claims = Field(Field(sandbox, "spec"), "volumeClaimTemplates");
  if (!claims.is_array()) return out;
  for (const Json& entry : claims) {
    const Json& entry_meta = Field(entry, "metadata");
    const std::string volume = Str(entry_meta, "name");
    if (volume.empty()) continue;
    Json pvc = {{"apiVersion", "v1"},
                {"kind", "PersistentVolumeClaim"},
                {"metadata",
                 {{"name", volume + "-" + Str(meta, "name")},
                  {"namespace", Str(meta, "namespace")},
                  {"labels", WithoutReserved(Field(entry_meta, "labels"))},
                  {"annotations", WithoutReserved(Field(entry_meta, "annotations"))},
                  {"ownerReferences", Json::array({ControllerRef(sandbox)})}}},
                {"spec", Field(entry, "spec").is_object() ? Field(entry, "spec") : Json::object()}};
    out.push_back(std::move(pvc));
  }
  return out;
}

PvcFit FitOfPvc(const Json& pvc, const Json& sandbox, std::string* why) {
  const Json& meta = Field(pvc, "metadata");
  const std::string name = Str(meta, "name");
  const std::string sandbox_name = Str(Field(sandbox, "metadata"), "name");
  const std::string uid = Str(Field(sandbox, "metadata"), "uid");
  std::string owner;  // "Kind/name (UID: u)" of its controller, "" when it has none
  const Json& refs = Field(meta, "ownerReferences");
  if (refs.is_array()) {
    for (const Json& ref : refs) {
      if (Field(ref, "controller").is_boolean() && ref["controller"].get<bool>()) {
        owner =
            absl::StrCat(Str(ref, "kind"), "/", Str(ref, "name"), " (UID: ", Str(ref, "uid"), ")");
      }
    }
  }
  if (!Str(meta, "deletionTimestamp").empty()) {
    if (why != nullptr) {
      *why = absl::StrCat("PVC \"", name, "\"", owner.empty() ? "" : " of ", owner,
                          " is being deleted; the Sandbox's own is made once it is gone");
    }
    return PvcFit::kBeingDeleted;
  }
  if (!uid.empty() && ControllerUid(pvc) == uid) return PvcFit::kUsable;
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

Json DesiredService(const Json& sandbox) {
  const Json& meta = Field(sandbox, "metadata");
  const std::string name = Str(meta, "name");
  Json ports = Json::array();
  const Json& containers =
      Field(Field(Field(Field(sandbox, "spec"), "podTemplate"), "spec"), "containers");
  if (containers.is_array()) {
    for (const Json& container : containers) {
      const Json& container_ports = Field(container, "ports");
      if (!container_ports.is_array()) continue;
      for (const Json& p : container_ports) {
        if (!Field(p, "containerPort").is_number_integer()) continue;
        Json port = {{"port", p["containerPort"]},
                     {"targetPort", p["containerPort"]},
                     {"protocol", Str(p, "protocol").empty() ? "TCP" : Str(p, "protocol")}};
        if (!Str(p, "name").empty()) port["name"] = Str(p, "name");
        ports.push_back(std::move(port));
      }
    }
  }
  return {{"apiVersion", "v1"},
          {"kind", "Service"},
          {"metadata",
           {{"name", name},
            {"namespace", Str(meta, "namespace")},
            {"labels", {{kNameHashLabel, NameHash(name)}}},
            {"ownerReferences", Json::array({ControllerRef(sandbox)})}}},
          {"spec",
           {{"clusterIP", "None"},
            {"selector", {{kNameHashLabel, NameHash(name)}}},
            {"ports", ports}}}};
}

bool MayAdopt(const Json& sandbox, const Json& object, Adoptee what) {
  const Json& meta = Field(object, "metadata");
  if (!ControllerUid(object).empty() || json_fields::BeingDeleted(object)) return false;
  const Json& labels = Field(meta, "labels");
  const std::string name = Str(Field(sandbox, "metadata"), "name");
  if (Str(labels, kNameHashLabel) != NameHash(name) && Str(labels, kAdoptableLabel) != "true") {
    return false;
  }
  if (what == Adoptee::kService) {
    const std::string cluster_ip = Str(Field(object, "spec"), "clusterIP");
    if (!cluster_ip.empty() && cluster_ip != "None") return false;
  }
  return true;
}

Json AdoptionPatch(const Json& sandbox, const Json& object, Adoptee what) {
  const Json& meta = Field(object, "metadata");
  Json owners = Json::array();
  if (const Json& refs = Field(meta, "ownerReferences"); refs.is_array()) owners = refs;
  owners.push_back(ControllerRef(sandbox));
  const std::string name = Str(Field(sandbox, "metadata"), "name");
  Json patch = {{"metadata",
                 {{"resourceVersion", Str(meta, "resourceVersion")},
                  {"ownerReferences", std::move(owners)},
                  {"labels", {{kNameHashLabel, NameHash(name)}}}}}};
  if (what == Adoptee::kService) {
    const Json desired = DesiredService(sandbox);
    // A merge patch merges maps: keys of the old selector that the Sandbox's lacks go.
    Json selector = desired["spec"]["selector"];
    if (const Json& old = Field(Field(object, "spec"), "selector"); old.is_object()) {
      for (const auto& [key, value] : old.items()) {
        if (!selector.contains(key)) selector[key] = nullptr;
      }
    }
    patch["spec"] = {{"selector", std::move(selector)}, {"ports", desired["spec"]["ports"]}};
  }
  return patch;
}

Json ComputeStatus(const Json& sandbox, const Observed& observed, const Json& old_status,
                   absl::Time now) {
  const Json& meta = Field(sandbox, "metadata");
  const std::string name = Str(meta, "name");
  const std::string ns = Str(meta, "namespace");
  const int64_t generation =
      Field(meta, "generation").is_number_integer() ? meta["generation"].get<int64_t>() : 0;
  const Json* pod = observed.pods.size() == 1 ? observed.pods[0].get() : nullptr;
  const std::string phase = pod != nullptr ? Str(Field(*pod, "status"), "phase") : "";
  const Json& pod_status = pod != nullptr ? Field(*pod, "status") : Field(Json(), "x");

  Json status = Json::object();
  std::vector<Json> conditions;

  // Ready.
  if (!observed.error.empty()) {
    conditions.push_back(Condition("Ready", false, "ReconcilerError", observed.error, generation));
  } else if (observed.expired) {
    conditions.push_back(Condition("Ready", false, "SandboxExpired",
                                   "the Sandbox passed its shutdownTime", generation));
  } else if (observed.suspended) {
    conditions.push_back(
        Condition("Ready", false, "SandboxSuspended", "operatingMode is Suspended", generation));
  } else if (observed.pods.size() > 1) {
    conditions.push_back(Condition(
        "Ready", false, "MultiplePods",
        absl::StrCat(observed.pods.size(), " pods are controlled by this Sandbox"), generation));
  } else if (phase == "Succeeded") {
    conditions.push_back(
        Condition("Ready", false, "PodSucceeded", "the pod completed", generation));
  } else if (phase == "Failed") {
    conditions.push_back(Condition("Ready", false, "PodFailed",
                                   absl::StrCat("the pod failed: ", Str(pod_status, "reason"), " ",
                                                Str(pod_status, "message")),
                                   generation));
  } else {
    std::string waiting;
    if (pod == nullptr && !observed.pvcs_missing.empty()) {
      waiting = observed.pvcs_missing;
    } else if (pod == nullptr) {
      waiting = "the pod does not exist (yet)";
    } else {
      const Json* ready = PodCondition(*pod, "Ready");
      const bool pod_ready = ready != nullptr && Str(*ready, "status") == "True";
      if (phase != "Running") {
        waiting = absl::StrCat("the pod is ", phase.empty() ? "Pending" : phase);
      } else if (!pod_ready) {
        waiting = "the pod is not Ready";
      } else if (Str(pod_status, "podIP").empty()) {
        waiting = "the pod has no IP";
      } else if (observed.service_wanted && !observed.service.has_value()) {
        waiting = "the Service does not exist (yet)";
      }
    }
    if (waiting.empty()) {
      conditions.push_back(Condition("Ready", true, "DependenciesReady",
                                     "the pod is Running and Ready", generation));
    } else {
      conditions.push_back(Condition("Ready", false, "DependenciesNotReady", waiting, generation));
    }
  }

  // Suspended.
  if (observed.suspended) {
    if (observed.pods.empty()) {
      conditions.push_back(
          Condition("Suspended", true, "PodTerminated", "the pod is gone", generation));
    } else {
      conditions.push_back(
          Condition("Suspended", false, "PodTerminating", "the pod is being deleted", generation));
    }
  } else {
    conditions.push_back(
        Condition("Suspended", false, "NotSuspended", "operatingMode is Running", generation));
  }

  // PodScheduled mirrors the pod's; Finished when the pod is terminal.
  if (pod != nullptr) {
    if (const Json* scheduled = PodCondition(*pod, "PodScheduled")) {
      // A pod's condition may carry no reason (PodScheduled=True has none); a Sandbox
      // condition must have one.
      std::string reason = Str(*scheduled, "reason");
      if (reason.empty())
        reason = Str(*scheduled, "status") == "True" ? "Scheduled" : "NotScheduled";
      Json c = Condition("PodScheduled", Str(*scheduled, "status") == "True", reason,
                         Str(*scheduled, "message"), generation);
      c["status"] = Str(*scheduled, "status");
      conditions.push_back(std::move(c));
    }
    if (phase == "Succeeded" || phase == "Failed") {
      conditions.push_back(Condition("Finished", true,
                                     phase == "Succeeded" ? "PodSucceeded" : "PodFailed",
                                     absl::StrCat("the pod is ", phase), generation));
    }
  }

  // Transition times: kept when the condition's status is unchanged.
  const Json& old_conditions = Field(old_status, "conditions");
  const std::string now_text = FormatMicroTime(now).substr(0, 19) + "Z";
  for (Json& c : conditions) {
    std::string since = now_text;
    if (old_conditions.is_array()) {
      for (const Json& old : old_conditions) {
        if (Str(old, "type") == Str(c, "type") && Str(old, "status") == Str(c, "status") &&
            !Str(old, "lastTransitionTime").empty()) {
          since = Str(old, "lastTransitionTime");
        }
      }
    }
    c["lastTransitionTime"] = since;
  }
  status["conditions"] = conditions;

  if (pod != nullptr) {
    Json ips = Json::array();
    const Json& pod_ips = Field(pod_status, "podIPs");
    if (pod_ips.is_array()) {
      for (const Json& ip : pod_ips) {
        if (!Str(ip, "ip").empty()) ips.push_back(Str(ip, "ip"));
      }
    }
    if (ips.empty() && !Str(pod_status, "podIP").empty()) ips.push_back(Str(pod_status, "podIP"));
    if (!ips.empty()) status["podIPs"] = ips;
    const std::string node = Str(Field(*pod, "spec"), "nodeName");
    if (!node.empty()) status["nodeName"] = node;
  }
  if (observed.service.has_value()) {
    status["service"] = name;
    status["serviceFQDN"] = absl::StrCat(name, ".", ns, ".svc.cluster.local");
  }
  status["selector"] = absl::StrCat(kNameHashLabel, "=", NameHash(name));
  return status;
}

bool IsReady(const Json& status) {
  const Json& conditions = Field(status, "conditions");
  if (!conditions.is_array()) return false;
  for (const Json& c : conditions) {
    if (Str(c, "type") == "Ready") return Str(c, "status") == "True";
  }
  return false;
}

}  // namespace sbx::k8s

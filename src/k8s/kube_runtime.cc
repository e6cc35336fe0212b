#include "src/k8s/kube_runtime.h"
#include "src/common/dropped.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"
#include "src/common/status_macros.h"
#include "src/k8s/json_fields.h"
#include "src/k8s/sandbox_objects.h"
#include "src/k8s/template_objects.h"
#include "src/k8s/thread_priority.h"

namespace sbx::k8s {
namespace {

using json_fields::Field;
using json_fields::Str;

// True when the Sandbox's pod cannot be scheduled (it waits for capacity, not replaced).
bool Unschedulable(const types::Sandbox& sandbox) {
  if (!sandbox.status.conditions.has_value()) return false;
  for (const types::Condition& c : *sandbox.status.conditions) {
    if (c.type == "PodScheduled" && c.status == "False" && c.reason == "Unschedulable") {
      return true;
    }
  }
  return false;
}

// True when the Sandbox's pod has ended (Finished=True): it will not serve again.
bool Finished(const types::Sandbox& sandbox) {
  if (!sandbox.status.conditions.has_value()) return false;
  for (const types::Condition& c : *sandbox.status.conditions) {
    if (c.type == "Finished" && c.status == "True") return true;
  }
  return false;
}

// When the Sandbox's Ready condition last turned (whole seconds, as the controller writes
// it); InfinitePast when it has none or it cannot be read.
absl::Time ReadySince(const types::Sandbox& sandbox) {
  if (!sandbox.status.conditions.has_value()) return absl::InfinitePast();
  for (const types::Condition& c : *sandbox.status.conditions) {
    if (c.type != "Ready") continue;
    absl::Time since;
    std::string err;
    if (absl::ParseTime(absl::RFC3339_full, c.last_transition_time.value_or(""), &since, &err)) {
      return since;
    }
  }
  return absl::InfinitePast();
}

prometheus::Histogram* ReadyToWarmHistogram(prometheus::Registry& registry) {
  return &prometheus::BuildHistogram()
              .Name("sbx_k8s_member_ready_to_warm_seconds")
              .Help(
                  "From a new warm member's Ready condition (its lastTransitionTime, whole "
                  "seconds) until the runtime hands it to the allocator")
              .Register(registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30,
                                                               60, 120});
}

std::string FirstPodIp(const types::Sandbox& sandbox) {
  const std::optional<std::vector<std::string>>& ips = sandbox.status.pod_ips;
  return ips.has_value() && !ips->empty() ? ips->front() : "";
}

// The node of a Ready Sandbox's pod ("" when unknown).
std::string NodeOf(const types::Sandbox& sandbox) { return sandbox.status.node_name.value_or(""); }

}  // namespace

absl::Status KubeRuntimeOptions::Validate() const {
  if (absl::Status s = namespaces.Validate("kubernetes runtime"); !s.ok()) return s;
  if (ready_timeout <= absl::ZeroDuration() || check_interval <= absl::ZeroDuration() ||
      resume_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("kubernetes runtime: timeouts must be > 0");
  }
  return absl::OkStatus();
}

std::string TemplateSpecHash(const Json& sandbox_template) {
  return NameHash(Field(sandbox_template, "spec").dump());
}

std::string PodTemplateHash(const Json& sandbox_template) {
  return NameHash(Field(Field(sandbox_template, "spec"), "podTemplate").dump());
}

std::string BlueprintHash(const Json& sandbox_template) {
  const Json& tspec = Field(sandbox_template, "spec");
  Json blueprint = Json::object();
  // The fields of upstream's SandboxBlueprint, as the template has them.
  for (const char* field : {"podTemplate", "volumeClaimTemplates", "service"}) {
    if (tspec.is_object() && tspec.contains(field)) blueprint[field] = tspec[field];
  }
  return NameHash(blueprint.dump());
}

Json WarmMember(const Json& pool, const Json& sandbox_template) {
  const Json& pool_meta = Field(pool, "metadata");
  const std::string pool_name = Str(pool_meta, "name");
  const std::string template_name = Str(Field(sandbox_template, "metadata"), "name");
  const Json& tspec = Field(sandbox_template, "spec");
  Json spec = {{"podTemplate", Field(tspec, "podTemplate")}};
  if (Field(tspec, "volumeClaimTemplates").is_array()) {
    spec["volumeClaimTemplates"] = tspec["volumeClaimTemplates"];
  }
  if (Field(tspec, "service").is_boolean()) spec["service"] = tspec["service"];
  // Secure defaults of pods made from a template (upstream-api.md).
  Json& pod_spec = spec["podTemplate"]["spec"];
  if (!pod_spec.is_object()) pod_spec = Json::object();
  ApplyPodSecureDefaults(sandbox_template, &pod_spec);
  Json owner = {{"apiVersion", "extensions.agents.x-k8s.io/v1beta1"},
                {"kind", "SandboxWarmPool"},
                {"name", pool_name},
                {"uid", Str(pool_meta, "uid")},
                {"controller", true},
                {"blockOwnerDeletion", true}};
  return {{"apiVersion", "agents.x-k8s.io/v1beta1"},
          {"kind", "Sandbox"},
          {"metadata",
           {{"generateName", pool_name + "-"},
            {"namespace", Str(pool_meta, "namespace")},
            {"labels",
             {{kWarmPoolLabel, NameHash(pool_name)},
              {kTemplateRefHashLabel, NameHash(template_name)},
              {kLaunchTypeLabel, "warm"},
              {kCreatedByLabel, "controller"},
              {kPodTemplateHashLabel, PodTemplateHash(sandbox_template)},
              {kBlueprintHashLabel, BlueprintHash(sandbox_template)},
              {kSbxPoolLabel, pool_name},
              {kSbxTemplateHashLabel, TemplateSpecHash(sandbox_template)},
              {"sbx.dev/template", template_name}}},
            {"annotations", {{kTemplateRefAnnotation, template_name}}},
            {"ownerReferences", Json::array({owner})}}},
          {"spec", std::move(spec)}};
}

std::string SandboxEndpoint(const types::Sandbox& sandbox, const Json& sandbox_template,
                            const std::string& port_name) {
  const std::string ip = FirstPodIp(sandbox);
  if (ip.empty()) return "";
  const Json& containers =
      Field(Field(Field(Field(sandbox_template, "spec"), "podTemplate"), "spec"), "containers");
  if (containers.is_array()) {
    for (const Json& c : containers) {
      const Json& ports = Field(c, "ports");
      if (!ports.is_array()) continue;
      for (const Json& p : ports) {
        if (Str(p, "name") == port_name && Field(p, "containerPort").is_number_integer()) {
          return absl::StrCat(ip, ":", p["containerPort"].get<int64_t>());
        }
      }
    }
  }
  return ip;
}

std::vector<std::string> ContainerImages(const Json& pod_template) {
  std::vector<std::string> images;
  const Json& containers = Field(Field(pod_template, "spec"), "containers");
  if (!containers.is_array()) return images;
  for (const Json& c : containers) {
    std::string image = Str(c, "image");
    if (!image.empty()) images.push_back(std::move(image));
  }
  return images;
}

std::vector<std::string> KubeRuntime::SandboxTemplateImages(
    const std::string& name, const std::string& sandbox_template) const {
  const NamespacedName where = options_.namespaces.Split(name);
  ObjectPtr t = templates_->Get(where.ns, sandbox_template);
  if (t == nullptr) return {};
  return ContainerImages(Field(Field(*t, "spec"), "podTemplate"));
}

KubeRuntime::KubeRuntime(Client* client, WriteScheduler* writes, const Informer* sandboxes,
                         const Informer* pools, const Informer* templates,
                         KubeRuntimeOptions options)
    : client_(client),
      writes_(writes),
      sandboxes_(sandboxes),
      typed_sandboxes_(TypedCache<types::Sandbox>::Over(sandboxes)),
      pools_(pools),
      templates_(templates),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &Clock::Real()),
      registry_(options_.registry ? options_.registry : std::make_shared<prometheus::Registry>()),
      ready_to_warm_(ReadyToWarmHistogram(*registry_)) {
  checker_ = BackgroundThread("sbx-k8s-ready", [this] {
    absl::MutexLock lock(&mu_);
    while (!stopping_) {
      clock_->AwaitUntil(mu_, &stopping_, clock_->Now() + options_.check_interval);
      if (stopping_) break;
      mu_.Unlock();
      CheckTimeouts();
      mu_.Lock();
    }
  });
}

KubeRuntime::~KubeRuntime() { Shutdown(); }

void KubeRuntime::Shutdown() {
  absl::flat_hash_map<std::string, Pending> pending;
  absl::flat_hash_map<std::string, Resuming> resuming;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    pending.swap(pending_);
    resuming.swap(resuming_);
  }
  if (checker_.joinable()) checker_.join();
  for (auto& [name, p] : pending) {
    std::move(p.done)(absl::CancelledError(absl::StrCat("sandbox \"", name, "\": shutting down")));
  }
  for (auto& [name, r] : resuming) {
    std::move(r.done)(absl::CancelledError(absl::StrCat("sandbox \"", name, "\": shutting down")));
  }
}

void KubeRuntime::Create(runtime::CreateRequest request, runtime::CreateCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return std::move(done)(absl::CancelledError("shutting down"));
  }
  const NamespacedName where = options_.namespaces.Split(request.pool);
  ObjectPtr pool =
      options_.namespaces.Serves(where.ns) ? pools_->Get(where.ns, where.name) : nullptr;
  if (pool == nullptr) {
    return std::move(done)(absl::NotFoundError(absl::StrCat(
        "SandboxWarmPool \"", where.name, "\" not found in namespace \"", where.ns, "\"")));
  }
  const std::string template_name = Str(Field(Field(*pool, "spec"), "sandboxTemplateRef"), "name");
  ObjectPtr sandbox_template = templates_->Get(where.ns, template_name);
  if (sandbox_template == nullptr) {
    return std::move(done)(absl::FailedPreconditionError(
        absl::StrCat("SandboxWarmPool \"", where.name, "\": SandboxTemplate \"", template_name,
                     "\" not found in namespace \"", where.ns, "\"")));
  }
  Json member = WarmMember(*pool, *sandbox_template);
  auto shared_done = std::make_shared<runtime::CreateCallback>(std::move(done));
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_[request.pool];
  }
  writes_->Submit(
      WritePriority::kRefill,
      [this, member = std::move(member), pool_name = request.pool, ns = where.ns, shared_done] {
        absl::StatusOr<Json> answer = client_->Create(kSandboxes, ns, member);
        absl::StatusOr<types::Sandbox> created =
            answer.ok() ? types::DecodeSandbox(*answer)
                        : absl::StatusOr<types::Sandbox>(answer.status());
        std::string name;
        {
          absl::MutexLock lock(&mu_);
          CreateAnsweredLocked(pool_name);
          if (created.ok() && !stopping_) {
            name = created->metadata.Name();
            pending_[options_.namespaces.Qualify(ns, name)] =
                Pending{pool_name, clock_->Now(), std::move(*shared_done)};
          }
        }
        if (!created.ok()) return std::move(*shared_done)(created.status());
        if (name.empty()) return std::move(*shared_done)(absl::CancelledError("shutting down"));
        // The informer may have shown it Ready before the create answered.
        if (SandboxPtr seen = Cached(ns, name)) MaybeReady(*seen);
      },
      [this, pool_name = request.pool, shared_done] {
        {
          absl::MutexLock lock(&mu_);
          CreateAnsweredLocked(pool_name);
        }
        std::move (*shared_done)(absl::CancelledError("shutting down"));
      });
}

void KubeRuntime::CreateAnsweredLocked(const std::string& pool) {
  auto it = in_flight_.find(pool);
  if (it != in_flight_.end() && --it->second <= 0) in_flight_.erase(it);
}

void KubeRuntime::Delete(std::string id, runtime::DeleteCallback done) {
  auto shared_done = std::make_shared<runtime::DeleteCallback>(std::move(done));
  writes_->Submit(
      WritePriority::kCleanup,
      [this, id, shared_done] {
        DeleteOptions options;
        options.propagation_policy = "Background";
        const NamespacedName where = options_.namespaces.Split(id);
        // Guarded by the version this replica knows (its cache, then a fresh read after a
        // 409): each try passes the client's fence again, so a write that a deposed leader
        // held back while paused fails 409 rather than deleting what its successor changed.
        auto guard = [&options](const types::ObjectMeta& meta) {
          options.precondition_uid = meta.Uid();
          options.precondition_resource_version = meta.resource_version.value_or("");
        };
        if (SandboxPtr cached = Cached(where.ns, where.name)) guard(cached->metadata);
        absl::Status s = client_->Delete(kSandboxes, where.ns, where.name, options);
        for (int retry = 0; absl::IsAborted(s) && retry < 3; ++retry) {
          absl::StatusOr<Json> read = client_->Get(kSandboxes, where.ns, where.name);
          absl::StatusOr<types::Sandbox> fresh =
              read.ok() ? types::DecodeSandbox(*read)
                        : absl::StatusOr<types::Sandbox>(read.status());
          if (!fresh.ok()) {
            s = fresh.status();
            break;
          }
          guard(fresh->metadata);
          s = client_->Delete(kSandboxes, where.ns, where.name, options);
        }
        std::move (*shared_done)(s);
      },
      [shared_done] { std::move (*shared_done)(absl::CancelledError("shutting down")); });
}

namespace {

Json OperatingMode(const char* mode) { return {{"spec", {{"operatingMode", mode}}}}; }

absl::Status Named(const std::string& id, const char* doing, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(doing, " Sandbox \"", id, "\": ", s.message()));
}

// The generation the Ready condition was computed for (0 when it says none).
int64_t ReadyGeneration(const types::Sandbox& sandbox) {
  const types::Condition* ready = types::FindCondition(sandbox.status.conditions, "Ready");
  return ready != nullptr ? ready->observed_generation.value_or(0) : 0;
}

}  // namespace

void KubeRuntime::Suspend(std::string id, runtime::DoneCallback done) {
  auto shared_done = std::make_shared<runtime::DoneCallback>(std::move(done));
  writes_->Submit(
      WritePriority::kClaim,
      [this, id, shared_done] {
        const NamespacedName where = options_.namespaces.Split(id);
        absl::StatusOr<Json> patched = client_->Patch(
            kSandboxes, where.ns, where.name, PatchType::kMerge, OperatingMode("Suspended"));
        std::move (*shared_done)(patched.ok() ? absl::OkStatus()
                                              : Named(id, "suspending", patched.status()));
      },
      [shared_done] { std::move (*shared_done)(absl::CancelledError("shutting down")); });
}

void KubeRuntime::Resume(std::string id, runtime::ResumeCallback done) {
  auto shared_done = std::make_shared<runtime::ResumeCallback>(std::move(done));
  writes_->Submit(
      WritePriority::kClaim,
      [this, id, shared_done] {
        const NamespacedName where = options_.namespaces.Split(id);
        absl::StatusOr<Json> answer = client_->Patch(kSandboxes, where.ns, where.name,
                                                     PatchType::kMerge, OperatingMode("Running"));
        absl::StatusOr<types::Sandbox> patched =
            answer.ok() ? types::DecodeSandbox(*answer)
                        : absl::StatusOr<types::Sandbox>(answer.status());
        if (!patched.ok()) {
          return std::move(*shared_done)(Named(id, "resuming", patched.status()));
        }
        {
          absl::MutexLock lock(&mu_);
          if (stopping_) return std::move(*shared_done)(absl::CancelledError("shutting down"));
          resuming_[id] = Resuming{patched->metadata.generation.value_or(0), clock_->Now(),
                                   std::move(*shared_done)};
        }
        // Already Ready for this generation (it was running: the write changed nothing).
        if (SandboxPtr seen = Cached(where.ns, where.name)) MaybeResumed(*seen);
      },
      [shared_done] { std::move (*shared_done)(absl::CancelledError("shutting down")); });
}

void KubeRuntime::MaybeResumed(const types::Sandbox& sandbox) {
  const types::ObjectMeta& meta = sandbox.metadata;
  const std::string name = options_.namespaces.Qualify(meta.Namespace(), meta.Name());
  {
    absl::MutexLock lock(&mu_);
    auto it = resuming_.find(name);
    if (it == resuming_.end() || ReadyGeneration(sandbox) < it->second.generation) return;
  }
  if (!IsReady(sandbox.status)) return;
  runtime::SandboxInfo info;
  info.id = name;
  info.pool = options_.namespaces.Qualify(meta.Namespace(), meta.Label(kSbxPoolLabel));
  info.endpoint = EndpointOf(sandbox);
  info.node = NodeOf(sandbox);
  info.node_labels = NodeLabelsOf(info.node);
  if (info.endpoint.empty()) return;
  runtime::ResumeCallback done;
  {
    absl::MutexLock lock(&mu_);
    auto it = resuming_.find(name);
    if (it == resuming_.end()) return;
    done = std::move(it->second.done);
    resuming_.erase(it);
  }
  std::move(done)(std::move(info));
}

absl::StatusOr<std::vector<runtime::SandboxInfo>> KubeRuntime::List() {
  // The restart reconciliation marks the claims of stored sandboxes missing from this
  // answer LOST, so only a confirmed absence may leave one out: a cache that has not
  // completed a list proves nothing.
  if (!sandboxes_->WaitForSync(options_.list_sync_timeout)) {
    return absl::UnavailableError(
        absl::StrCat("kubernetes runtime: the Sandboxes of ",
                     options_.namespaces.watch.empty()
                         ? std::string("every namespace")
                         : absl::StrCat("namespace \"", options_.namespaces.watch, "\""),
                     " have not been listed completely within ",
                     absl::FormatDuration(options_.list_sync_timeout),
                     " (API server unreachable or failing): which sandboxes exist is unknown"));
  }
  std::vector<runtime::SandboxInfo> out;
  for (const ObjectPtr& object : sandboxes_->List()) {
    // What does not decode cannot be told from a stranger: it is not listed, and said so.
    ASSIGN_OR_RETURN(SandboxPtr sandbox, Typed(object));
    const types::ObjectMeta& meta = sandbox->metadata;
    const std::string& ns = meta.Namespace();
    if (!options_.namespaces.Serves(ns)) continue;
    const std::string& pool = meta.Label(kSbxPoolLabel);
    if (pool.empty()) continue;
    // Ended for good (what on_gone reports while running); readiness does not matter.
    if (meta.BeingDeleted() || Finished(*sandbox)) continue;
    runtime::SandboxInfo info;
    info.id = options_.namespaces.Qualify(ns, meta.Name());
    info.pool = options_.namespaces.Qualify(ns, pool);
    info.endpoint = EndpointOf(*sandbox);
    info.node = NodeOf(*sandbox);
    info.node_labels = NodeLabelsOf(info.node);
    info.ready = IsReady(sandbox->status) && !info.endpoint.empty();
    info.suspended = sandbox->spec.operating_mode == "Suspended";
    info.held_by_claim = meta.Label(kClaimUidLabel);
    out.push_back(std::move(info));
  }
  absl::MutexLock lock(&mu_);
  for (const runtime::SandboxInfo& info : out) live_[info.id] = info.pool;
  return out;
}

std::map<std::string, std::string> KubeRuntime::NodeLabelsOf(const std::string& node) const {
  std::map<std::string, std::string> out;
  if (options_.nodes == nullptr || node.empty()) return out;
  ObjectPtr object = options_.nodes->Get("", node);
  if (object == nullptr) return out;
  // A Node's metadata only: the decode edge of an object sbx reads nothing else of.
  absl::StatusOr<types::ObjectMeta> meta = types::DecodeObjectMeta(Field(*object, "metadata"));
  if (!meta.ok()) {
    spdlog::warn("Node \"{}\": {}", node, meta.status().ToString());
    return out;
  }
  if (meta->labels.has_value()) out.insert(meta->labels->begin(), meta->labels->end());
  return out;
}

std::string KubeRuntime::EndpointOf(const types::Sandbox& sandbox) const {
  // The port comes from the pool's template; a member whose pool or template is gone
  // is reached by IP alone.
  const std::string& ns = sandbox.metadata.Namespace();
  const std::string& pool = sandbox.metadata.Label(kSbxPoolLabel);
  Json sandbox_template;
  if (ObjectPtr p = pools_->Get(ns, pool)) {
    const std::string t = Str(Field(Field(*p, "spec"), "sandboxTemplateRef"), "name");
    if (ObjectPtr found = templates_->Get(ns, t)) sandbox_template = *found;
  }
  return SandboxEndpoint(sandbox, sandbox_template, options_.sandboxd_port_name);
}

KubeRuntime::SandboxPtr KubeRuntime::Cached(const std::string& ns, const std::string& name) const {
  ObjectPtr object = sandboxes_->Get(ns, name);
  if (object == nullptr) return nullptr;
  absl::StatusOr<SandboxPtr> typed = Typed(object);
  if (!typed.ok()) {
    spdlog::warn("Sandbox {}/{}: {}", ns, name, typed.status().ToString());
    return nullptr;
  }
  return *std::move(typed);
}

absl::StatusOr<KubeRuntime::SandboxPtr> KubeRuntime::Typed(const ObjectPtr& object) const {
  if (typed_sandboxes_ != nullptr) return typed_sandboxes_->Of(object);
  ASSIGN_OR_RETURN(types::Sandbox sandbox, types::DecodeSandbox(*object));
  return std::make_shared<const types::Sandbox>(std::move(sandbox));
}

bool KubeRuntime::Concerns(const Json& object) const {
  const std::string id = options_.namespaces.Qualify(object);
  absl::MutexLock lock(&mu_);
  return pending_.contains(id) || resuming_.contains(id) || live_.contains(id);
}

void KubeRuntime::OnSandbox(const ObjectPtr& object) {
  // Most events are of Sandboxes the runtime waits for nothing of: told from the event's
  // JSON (the edge, on the informer's one thread) without decoding them there.
  if (!Concerns(*object)) return;
  absl::StatusOr<SandboxPtr> typed = Typed(object);
  if (!typed.ok()) {
    // The API server validates Sandboxes against the CRD's schema: only a store that skips
    // that can hold one that does not decode. It is looked at again at its next change.
    spdlog::warn("{}: {}", KeyOf(*object), typed.status().ToString());
    return;
  }
  const types::Sandbox& sandbox = **typed;
  if (!options_.namespaces.Serves(sandbox.metadata.Namespace())) return;
  if (Finished(sandbox) || sandbox.metadata.BeingDeleted()) {
    Gone(sandbox);
    return;
  }
  MaybeReady(sandbox);
  MaybeResumed(sandbox);
}

void KubeRuntime::MaybeReady(const types::Sandbox& sandbox) {
  if (!IsReady(sandbox.status)) return;
  const std::string name =
      options_.namespaces.Qualify(sandbox.metadata.Namespace(), sandbox.metadata.Name());
  // Most Ready events are of members reported long ago: no endpoint to work out for them.
  if (!IsPending(name)) return;
  const std::string endpoint = EndpointOf(sandbox);
  if (endpoint.empty()) return;
  runtime::CreateCallback done;
  runtime::SandboxInfo info;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(name);
    if (it == pending_.end()) return;
    done = std::move(it->second.done);
    info.pool = it->second.pool;
    pending_.erase(it);
    handing_.insert(name);
    live_[name] = info.pool;
  }
  info.id = name;
  info.endpoint = endpoint;
  info.node = NodeOf(sandbox);
  info.node_labels = NodeLabelsOf(info.node);
  // Observed as the member is handed over (the allocator's AddSandbox, in `done`, does
  // not wait), so that whoever sees it warm also finds it counted.
  if (const absl::Time since = ReadySince(sandbox); since != absl::InfinitePast()) {
    ready_to_warm_->Observe(std::max(0.0, absl::ToDoubleSeconds(clock_->Now() - since)));
  }
  std::move(done)(std::move(info));
  absl::MutexLock lock(&mu_);
  handing_.erase(name);
}

void KubeRuntime::OnSandboxDeleted(const ObjectPtr& object) {
  if (!Concerns(*object)) return;
  absl::StatusOr<SandboxPtr> typed = Typed(object);
  if (!typed.ok()) {
    spdlog::warn("{} (deleted): {}", KeyOf(*object), typed.status().ToString());
    return;
  }
  Gone(**typed);
}

void KubeRuntime::Gone(const types::Sandbox& sandbox) {
  const types::ObjectMeta& meta = sandbox.metadata;
  if (!options_.namespaces.Serves(meta.Namespace())) return;
  const std::string name = options_.namespaces.Qualify(meta.Namespace(), meta.Name());
  runtime::CreateCallback failed;
  runtime::ResumeCallback resume_failed;
  bool gone = false;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = resuming_.find(name); it != resuming_.end()) {
      resume_failed = std::move(it->second.done);
      resuming_.erase(it);
    }
    if (auto it = pending_.find(name); it != pending_.end()) {
      failed = std::move(it->second.done);
      pending_.erase(it);
    } else if (live_.erase(name) > 0) {
      gone = true;
    }
  }
  if (failed) {
    std::move(failed)(absl::UnavailableError(
        absl::StrCat("Sandbox \"", name, "\" was deleted or its pod ended before it was ready")));
  }
  if (resume_failed) {
    std::move(resume_failed)(absl::NotFoundError(
        absl::StrCat("Sandbox \"", name, "\" was deleted or its pod ended while it resumed")));
  }
  if (gone) {
    spdlog::info("Sandbox \"{}/{}\" is gone ({}): reported to the allocator", meta.Namespace(),
                 meta.Name(), Finished(sandbox) ? "its pod has finished" : "deleted");
    if (options_.on_gone) options_.on_gone(name);
  }
}

void KubeRuntime::CheckTimeouts() {
  const absl::Time now = clock_->Now();
  std::vector<std::string> late;
  std::vector<std::pair<std::string, runtime::ResumeCallback>> late_resumes;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, p] : pending_) {
      if (now - p.created >= options_.ready_timeout) late.push_back(name);
    }
    for (auto it = resuming_.begin(); it != resuming_.end();) {
      if (now - it->second.since < options_.resume_timeout) {
        ++it;
        continue;
      }
      late_resumes.emplace_back(it->first, std::move(it->second.done));
      resuming_.erase(it++);
    }
  }
  for (auto& [name, done] : late_resumes) {
    std::move(done)(absl::DeadlineExceededError(
        absl::StrCat("Sandbox \"", name, "\" not Ready again within ",
                     absl::FormatDuration(options_.resume_timeout), " of being resumed")));
  }
  for (const std::string& name : late) {
    const NamespacedName where = options_.namespaces.Split(name);
    SandboxPtr seen = Cached(where.ns, where.name);
    if (seen != nullptr && Unschedulable(*seen)) continue;  // waits for capacity
    runtime::CreateCallback failed;
    {
      absl::MutexLock lock(&mu_);
      auto it = pending_.find(name);
      if (it == pending_.end()) continue;
      failed = std::move(it->second.done);
      pending_.erase(it);
    }
    spdlog::warn("Sandbox \"{}\" not ready after {}: replacing it", Namespaces::Path(where),
                 absl::FormatDuration(options_.ready_timeout));
    Delete(name, DropTo{"k8s.unready_member_delete", absl::StatusCode::kNotFound});
    std::move(failed)(absl::DeadlineExceededError(absl::StrCat(
        "Sandbox \"", name, "\" not ready after ", absl::FormatDuration(options_.ready_timeout))));
  }
}

bool KubeRuntime::IsPending(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  return pending_.contains(name);
}

bool KubeRuntime::InPassage(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  return pending_.contains(name) || handing_.contains(name);
}

int64_t KubeRuntime::CreatesInFlight(const std::string& pool) const {
  absl::MutexLock lock(&mu_);
  auto it = in_flight_.find(pool);
  return it == in_flight_.end() ? 0 : it->second;
}

int64_t KubeRuntime::PendingIn(const std::string& pool) const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [name, p] : pending_) n += p.pool == pool;
  return n;
}

size_t KubeRuntime::pending() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

}  // namespace sbx::k8s

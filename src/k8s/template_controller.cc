#include "src/k8s/template_controller.h"

#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"
#include "src/common/status_macros.h"
#include "src/k8s/objects_types.h"
#include "src/k8s/thread_priority.h"

namespace sbx::k8s {
namespace {

// How long a written policy may stay unseen by the informer before the cache is trusted.
constexpr absl::Duration kExpectationTimeout = absl::Seconds(10);

}  // namespace

absl::Status TemplateControllerOptions::Validate() const {
  if (workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("template controller workers ", workers, " must be at least 1"));
  }
  if (resync <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "template controller resync ", absl::FormatDuration(resync), " must be positive"));
  }
  for (const auto& [key, value] : network_policy.server_pod_labels) {
    if (key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sbx-server pod label with an empty key (value \"", value, "\")"));
    }
  }
  return absl::OkStatus();
}

TemplateController::TemplateController(Client* client, TemplateControllerOptions options)
    : client_(client),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &Clock::Real()),
      registry_(options_.registry ? options_.registry : std::make_shared<prometheus::Registry>()),
      reconciles_(*registry_, kTemplateControllerName),
      queue_([this] {
        WorkQueueOptions queue = options_.queue;
        if (queue.clock == nullptr) queue.clock = clock_;
        return queue;
      }()),
      templates_(client, InformerOn(kSandboxTemplates)),
      policies_(client, InformerOn(kNetworkPolicies)),
      typed_templates_(&templates_, &types::DecodeSandboxTemplate) {
  InformerHandler template_handler;
  template_handler.on_add = [this](const ObjectPtr& o) { queue_.Add(KeyOf(*o)); };
  template_handler.on_update = [this](const ObjectPtr&, const ObjectPtr& o) {
    queue_.Add(KeyOf(*o));
  };
  // Garbage collection deletes the policy with its template: nothing to do.
  templates_.AddHandler(std::move(template_handler));

  // Our policies changed or deleted behind our back are put back; a foreign policy of the
  // name going away lets the template have its own.
  InformerHandler policy_handler;
  policy_handler.on_add = [this](const ObjectPtr& o) {
    Seen(KeyOf(*o));
    EnqueueFor(*o);
  };
  policy_handler.on_update = [this](const ObjectPtr&, const ObjectPtr& o) {
    Seen(KeyOf(*o));
    EnqueueFor(*o);
  };
  policy_handler.on_delete = policy_handler.on_add;
  policies_.AddHandler(std::move(policy_handler));
}

TemplateController::~TemplateController() { Stop(); }

InformerOptions TemplateController::InformerOn(const Resource& resource) const {
  InformerOptions options = NamespaceInformer(resource, options_.ns);
  options.clock = clock_;
  return options;
}

void TemplateController::EnqueueFor(const Json& policy) {
  // Its metadata alone (the API server validates it: one that does not decode is nobody's).
  absl::StatusOr<types::ObjectMeta> meta = types::DecodeMetadataOf(policy);
  if (!meta.ok()) return;
  const std::string& ns = meta->Namespace();
  const std::string& name = meta->Name();
  if (absl::EndsWith(name, kNetworkPolicySuffix)) {
    queue_.Add(absl::StrCat(ns, "/", name.substr(0, name.size() - strlen(kNetworkPolicySuffix))));
  }
  if (!meta->owner_references.has_value()) return;
  for (const types::OwnerReference& ref : *meta->owner_references) {
    if (ref.kind == "SandboxTemplate" && ref.controller.value_or(false)) {
      queue_.Add(absl::StrCat(ns, "/", ref.name.value_or("")));
    }
  }
}

absl::Status TemplateController::Start(absl::Duration sync_timeout) {
  RETURN_IF_ERROR(options_.Validate());
  templates_.Start();
  policies_.Start();
  // A wait for the API server (I/O), not a timer: real time, whatever the clock.
  const absl::Time deadline = absl::Now() + sync_timeout;
  for (Informer* informer : {&templates_, &policies_}) {
    if (!informer->WaitForSync(deadline - absl::Now())) {
      return absl::DeadlineExceededError(absl::StrCat(
          "template controller: caches did not sync within ", absl::FormatDuration(sync_timeout),
          " (are the extensions.agents.x-k8s.io CRDs installed, and may sbx list "
          "networkpolicies.networking.k8s.io?)"));
    }
  }
  for (int i = 0; i < options_.workers; ++i) {
    workers_.push_back(BackgroundThread("sbx-k8s-tmpl", [this] { Worker(); }));
  }
  resync_ = std::make_unique<PeriodicPass>("sbx-k8s-tmplsy", options_.resync, *clock_, [this] {
    for (const ObjectPtr& t : templates_.List()) queue_.Add(KeyOf(*t));
  });
  return absl::OkStatus();
}

void TemplateController::Stop() {
  if (stopping_.exchange(true, std::memory_order_acq_rel)) return;
  queue_.ShutDown();
  for (std::thread& w : workers_) w.join();
  workers_.clear();
  if (resync_ != nullptr) resync_->Stop();
  templates_.Stop();
  policies_.Stop();
}

void TemplateController::Worker() {
  std::string key;
  while (queue_.Get(&key)) {
    reconciles_.SetDepth(queue_.Depth());
    if (options_.is_leader && !options_.is_leader()) {
      // The leader writes; the resync hands every template to a new leader.
      queue_.Forget(key);
      queue_.Done(key);
      continue;
    }
    absl::Status s = Reconcile(key);
    reconciles_.Reconciled(s.ok() ? ReconcileMetrics::Result::kSuccess
                                  : ReconcileMetrics::Result::kError);
    if (s.ok()) {
      queue_.Forget(key);
      absl::MutexLock lock(&warned_mu_);
      warned_.erase(key);
    } else if (absl::IsFailedPrecondition(s)) {
      // Someone else's policy has the name: no retry (its deletion queues the template
      // again), and said once, not at every resync.
      queue_.Forget(key);
      bool first = false;
      {
        absl::MutexLock lock(&warned_mu_);
        first = warned_.insert(key).second;
      }
      if (first) spdlog::warn("SandboxTemplate \"{}\": {}", key, std::string(s.message()));
    } else {
      spdlog::warn("SandboxTemplate \"{}\": {} (retry {})", key, s.ToString(),
                   queue_.Failures(key) + 1);
      queue_.AddRateLimited(key);
    }
    queue_.Done(key);
  }
}

ObjectPtr TemplateController::Expected(const std::string& id) {
  absl::MutexLock lock(&expect_mu_);
  auto it = expected_.find(id);
  if (it == expected_.end()) return nullptr;
  if (clock_->Now() - it->second.written > kExpectationTimeout) {
    expected_.erase(it);
    return nullptr;
  }
  return it->second.policy;
}

void TemplateController::BeginWrite(const std::string& id) {
  absl::MutexLock lock(&expect_mu_);
  expected_[id] = Expectation{clock_->Now(), nullptr};
}

void TemplateController::EndWrite(const std::string& id, ObjectPtr written) {
  absl::MutexLock lock(&expect_mu_);
  auto it = expected_.find(id);
  if (it == expected_.end()) return;  // an event came during the write: the cache decides
  if (written == nullptr) {
    expected_.erase(it);
    return;
  }
  it->second = Expectation{clock_->Now(), std::move(written)};
}

void TemplateController::Seen(const std::string& id) {
  absl::MutexLock lock(&expect_mu_);
  expected_.erase(id);
}

absl::Status TemplateController::Reconcile(const std::string& key) {
  std::vector<std::string> parts = absl::StrSplit(key, absl::MaxSplits('/', 1));
  if (parts.size() != 2) return absl::InvalidArgumentError(absl::StrCat("bad key \"", key, "\""));
  const std::string& ns = parts[0];
  const std::string& name = parts[1];
  // The informer's copy, typed. The API server validates templates against the CRD's
  // schema: one that does not decode can only come from a store that skips that; it
  // waits for its next change.
  absl::StatusOr<TypedCache<types::SandboxTemplate>::Ptr> found = typed_templates_.Get(ns, name);
  if (!found.ok()) {
    spdlog::warn("SandboxTemplate \"{}\" not reconciled: {}", key, found.status().ToString());
    return absl::OkStatus();
  }
  // Garbage collection deletes the policy of a deleted template (it owns it).
  if (*found == nullptr || (*found)->metadata.BeingDeleted()) return absl::OkStatus();
  const types::SandboxTemplate& sandbox_template = **found;
  const std::string& uid = sandbox_template.metadata.Uid();
  const std::string policy_name = NetworkPolicyName(name);
  const std::string id = absl::StrCat(ns, "/", policy_name);
  ObjectPtr existing_object = Expected(id);
  if (existing_object == nullptr) existing_object = policies_.Get(ns, policy_name);
  std::optional<types::NetworkPolicy> existing;
  if (existing_object != nullptr) {
    absl::StatusOr<types::NetworkPolicy> decoded = types::DecodeNetworkPolicy(*existing_object);
    if (!decoded.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SandboxTemplate \"", key, "\": its NetworkPolicy: ", decoded.status().message()));
    }
    existing = *std::move(decoded);
  }
  const types::OwnerReference* controller =
      existing.has_value() ? existing->metadata.Controller() : nullptr;
  const bool ours = controller != nullptr && controller->uid.value_or("") == uid;

  // The API server refusing the template's rules is the template's problem: said, and not
  // retried until the template changes (or the resync).
  auto refused = [&](const absl::Status& s) {
    if (!absl::IsInvalidArgument(s)) return s;
    spdlog::warn("SandboxTemplate \"{}\": the API server refuses its NetworkPolicy \"{}\": {}", key,
                 policy_name, std::string(s.message()));
    return absl::OkStatus();
  };

  if (!NetworkPolicyManaged(sandbox_template)) {
    if (!ours) return absl::OkStatus();  // none, or someone else's: left alone
    DeleteOptions options;
    options.precondition_uid = existing->metadata.Uid();
    absl::Status deleted = client_->Delete(kNetworkPolicies, ns, policy_name, options);
    if (!deleted.ok() && !absl::IsNotFound(deleted)) return deleted;
    Seen(id);
    spdlog::info("SandboxTemplate \"{}\" is Unmanaged: its NetworkPolicy \"{}\" is deleted", key,
                 policy_name);
    return absl::OkStatus();
  }

  types::NetworkPolicy desired = DesiredNetworkPolicy(sandbox_template, options_.network_policy);
  if (existing.has_value()) {
    if (!ours) {
      return absl::FailedPreconditionError(
          absl::StrCat("NetworkPolicy \"", id,
                       "\" exists and is not controlled by this "
                       "SandboxTemplate: it is left alone, and the template's pods get no "
                       "policy from sbx until it is deleted"));
    }
    if (NormalizedNetworkPolicySpec(existing->spec.value_or(Json())) == desired.spec) {
      return absl::OkStatus();
    }
    // The whole object back with its resourceVersion: a concurrent change is a conflict
    // (ABORTED), retried from the newer cache.
    types::NetworkPolicy updated = *std::move(existing);
    updated.spec = std::move(desired.spec);
    BeginWrite(id);
    absl::StatusOr<Json> written = client_->Update(kNetworkPolicies, ns, types::Encode(updated));
    if (!written.ok()) {
      EndWrite(id, nullptr);
      return refused(written.status());
    }
    EndWrite(id, std::make_shared<const Json>(*std::move(written)));
    spdlog::info("SandboxTemplate \"{}\": NetworkPolicy \"{}\" updated", key, policy_name);
    return absl::OkStatus();
  }
  BeginWrite(id);
  absl::StatusOr<Json> created = client_->Create(kNetworkPolicies, ns, types::Encode(desired));
  EndWrite(id, created.ok() ? std::make_shared<const Json>(*created) : nullptr);
  if (created.ok()) {
    spdlog::info("SandboxTemplate \"{}\": NetworkPolicy \"{}\" created", key, policy_name);
    return absl::OkStatus();
  }
  // Already there and not in the cache yet: its watch event queues the template again.
  if (absl::IsAlreadyExists(created.status())) return absl::OkStatus();
  return refused(created.status());
}

}  // namespace sbx::k8s

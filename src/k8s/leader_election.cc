#include "src/k8s/leader_election.h"

#include "src/k8s/json_fields.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sbx::k8s {

std::string FormatMicroTime(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", t, absl::UTCTimeZone());
}

absl::Time ParseTime(const std::string& text) {
  absl::Time t;
  std::string error;
  if (absl::ParseTime(absl::RFC3339_full, text, &t, &error)) return t;
  return absl::InfinitePast();
}

LeaseTerm LeaseTermOf(const Json& lease) {
  LeaseTerm t;
  const Json& annotations =
      json_fields::Field(json_fields::Field(lease, "metadata"), "annotations");
  t.replicated = annotations.is_object() && annotations.contains(kSyncReplicaAnnotation) &&
                 annotations.contains(kTermLeaderAnnotation);
  t.leader = json_fields::Str(annotations, kTermLeaderAnnotation);
  t.sync_replica = json_fields::Str(annotations, kSyncReplicaAnnotation);
  const Json& spec = json_fields::Field(lease, "spec");
  if (spec.is_object()) t.term = spec.value("leaseTransitions", int64_t{0});
  return t;
}

absl::Status LeaderElectionOptions::Validate() const {
  if (identity.empty()) return absl::InvalidArgumentError("leader election identity is empty");
  if (lease_name.empty() || lease_namespace.empty()) {
    return absl::InvalidArgumentError("leader election lease name and namespace must be set");
  }
  if (!(retry_period > absl::ZeroDuration() && renew_deadline > retry_period &&
        lease_duration > renew_deadline)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "leader election needs lease_duration > renew_deadline > retry_period > 0 (got ",
        absl::FormatDuration(lease_duration), ", ", absl::FormatDuration(renew_deadline), ", ",
        absl::FormatDuration(retry_period), ")"));
  }
  return absl::OkStatus();
}

LeaderElector::LeaderElector(Client* client, LeaderElectionOptions options,
                             std::function<void()> on_started, std::function<void()> on_stopped)
    : client_(client),
      options_(std::move(options)),
      clock_(options_.clock ? options_.clock : &Clock::Real()),
      on_started_(std::move(on_started)),
      on_stopped_(std::move(on_stopped)),
      address_(options_.address) {}

LeaderElector::~LeaderElector() { Stop(); }

void LeaderElector::Start() {
  thread_ = std::thread([this] { Run(); });
}

void LeaderElector::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool LeaderElector::Sleep(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  sleeping_until_ = clock_->Now() + d;
  clock_->AwaitUntil(mu_, &stopping_, sleeping_until_);
  sleeping_until_ = absl::InfinitePast();
  return !stopping_;
}

void LeaderElector::SetAddress(std::string address) {
  absl::MutexLock lock(&mu_);
  address_ = std::move(address);
}

std::string LeaderElector::LeaderAddress() const {
  absl::MutexLock lock(&mu_);
  return IsLeader() ? address_ : observed_address_;
}

absl::Time LeaderElector::SleepingUntil() const {
  absl::MutexLock lock(&mu_);
  return sleeping_until_;
}

bool LeaderElector::TryAcquireOrRenew() {
  const absl::Time now = clock_->Now();
  const std::string now_text = FormatMicroTime(now);
  const int64_t duration_s = absl::ToInt64Seconds(options_.lease_duration);
  absl::StatusOr<Json> lease = client_->Get(kLeases, options_.lease_namespace, options_.lease_name);
  std::string address;
  {
    absl::MutexLock lock(&mu_);
    address = address_;
  }
  const bool acquiring = !IsLeader();
  if (absl::IsNotFound(lease.status())) {
    Json fresh = {{"metadata",
                   {{"name", options_.lease_name},
                    {"annotations",
                     {{kLeaderAddressAnnotation, address},
                      {kTermLeaderAnnotation, options_.identity},
                      {kSyncReplicaAnnotation, ""}}}}},
                  {"spec",
                   {{"holderIdentity", options_.identity},
                    {"leaseDurationSeconds", duration_s},
                    {"acquireTime", now_text},
                    {"renewTime", now_text},
                    {"leaseTransitions", 0}}}};
    if (!client_->Create(kLeases, options_.lease_namespace, fresh).ok()) return false;
    term_.store(0, std::memory_order_release);
    return true;
  }
  if (!lease.ok()) return false;
  Json& spec = (*lease)["spec"];
  if (!spec.is_object()) spec = Json::object();
  const std::string holder = spec.value("holderIdentity", std::string());
  const bool mine = holder == options_.identity;
  if (!mine && !holder.empty()) {
    const absl::Time renewed = ParseTime(spec.value("renewTime", std::string()));
    const int64_t their_duration = spec.value("leaseDurationSeconds", duration_s);
    if (renewed + absl::Seconds(their_duration) > now) {  // held and fresh
      std::string observed = json_fields::Str(
          json_fields::Field(json_fields::Field(*lease, "metadata"), "annotations"),
          kLeaderAddressAnnotation);
      absl::MutexLock lock(&mu_);
      observed_address_ = std::move(observed);
      observed_expiry_ = renewed + absl::Seconds(their_duration);
      return false;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    observed_address_.clear();
  }
  if (acquiring && options_.may_lead && !options_.may_lead(LeaseTermOf(*lease))) return false;
  if (!mine) {
    spec["acquireTime"] = now_text;
    spec["leaseTransitions"] = spec.value("leaseTransitions", int64_t{0}) + 1;
  }
  Json& annotations = (*lease)["metadata"]["annotations"];
  annotations[kLeaderAddressAnnotation] = address;
  if (acquiring) {
    // A new term of this replica: its store is the truth, and no standby has it yet.
    annotations[kTermLeaderAnnotation] = options_.identity;
    annotations[kSyncReplicaAnnotation] = "";
  }
  spec["holderIdentity"] = options_.identity;
  spec["leaseDurationSeconds"] = duration_s;
  spec["renewTime"] = now_text;
  // The lease's resourceVersion makes this a compare-and-swap: a competing replica's
  // write in between turns it into ABORTED.
  if (!client_->Update(kLeases, options_.lease_namespace, *lease).ok()) return false;
  if (acquiring) term_.store(spec.value("leaseTransitions", int64_t{0}), std::memory_order_release);
  return true;
}

absl::Status LeaderElector::PublishSyncReplica(const std::string& identity) {
  // A few tries: the elector's own renewals race with this write.
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (!IsLeader()) {
      return absl::FailedPreconditionError(absl::StrCat(options_.identity, " does not hold Lease ",
                                                        options_.lease_namespace, "/",
                                                        options_.lease_name));
    }
    absl::StatusOr<Json> lease =
        client_->Get(kLeases, options_.lease_namespace, options_.lease_name);
    if (!lease.ok()) return absl::UnavailableError(lease.status().message());
    const Json& spec = json_fields::Field(*lease, "spec");
    const std::string holder =
        spec.is_object() ? spec.value("holderIdentity", std::string()) : std::string();
    const int64_t term = spec.is_object() ? spec.value("leaseTransitions", int64_t{0}) : 0;
    if (holder != options_.identity || term != Term()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Lease ", options_.lease_namespace, "/", options_.lease_name, " is held by \"", holder,
          "\" in term ", term, ", not by ", options_.identity, " in term ", Term()));
    }
    (*lease)["metadata"]["annotations"][kSyncReplicaAnnotation] = identity;
    absl::Status written = client_->Update(kLeases, options_.lease_namespace, *lease).status();
    if (written.ok()) return absl::OkStatus();
    if (!absl::IsAborted(written)) return absl::UnavailableError(written.message());
  }
  return absl::UnavailableError("the Lease kept changing while naming the in-sync standby");
}

void LeaderElector::Release() {
  absl::StatusOr<Json> lease = client_->Get(kLeases, options_.lease_namespace, options_.lease_name);
  if (!lease.ok() || (*lease)["spec"].value("holderIdentity", std::string()) != options_.identity) {
    return;
  }
  (*lease)["spec"]["holderIdentity"] = "";
  (*lease)["spec"]["renewTime"] = FormatMicroTime(clock_->Now());
  absl::Status released = client_->Update(kLeases, options_.lease_namespace, *lease).status();
  if (!released.ok()) spdlog::warn("leader election: releasing the lease: {}", released.ToString());
}

void LeaderElector::Run() {
  while (true) {
    // Campaign: look again after retry_period, or as soon as the holder's term runs out
    // (so that a standby takes over a dead leader's Lease when it expires, not up to
    // retry_period later).
    while (!TryAcquireOrRenew()) {
      absl::Duration wait = options_.retry_period;
      {
        absl::MutexLock lock(&mu_);
        const absl::Duration left = observed_expiry_ - clock_->Now();
        if (left < wait) wait = std::max(left, absl::Milliseconds(10));
        observed_expiry_ = absl::InfiniteFuture();
      }
      if (!Sleep(wait)) return;
    }
    spdlog::info("leader election: {} leads through lease {}/{}", options_.identity,
                 options_.lease_namespace, options_.lease_name);
    leader_.store(true, std::memory_order_release);
    if (on_started_) on_started_();
    // Lead: renew until stopped or unable to renew within the deadline.
    absl::Time last_renew = clock_->Now();
    bool stopping = false;
    while (true) {
      if (!Sleep(options_.retry_period)) {
        stopping = true;
        break;
      }
      if (TryAcquireOrRenew()) {
        last_renew = clock_->Now();
      } else if (clock_->Now() - last_renew >= options_.renew_deadline) {
        spdlog::warn("leader election: {} could not renew lease {}/{} for {}; stepping down",
                     options_.identity, options_.lease_namespace, options_.lease_name,
                     absl::FormatDuration(options_.renew_deadline));
        break;
      }
    }
    leader_.store(false, std::memory_order_release);
    if (on_stopped_) on_stopped_();
    if (stopping) {
      Release();
      return;
    }
  }
}

}  // namespace sbx::k8s

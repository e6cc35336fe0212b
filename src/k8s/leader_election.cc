#include "src/k8s/leader_election.h"

#include <algorithm>
#include <chrono>
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

LeaseTerm LeaseTermOf(const types::Lease& lease) {
  LeaseTerm t;
  const std::optional<types::StringMap>& annotations = lease.metadata.annotations;
  t.replicated = annotations.has_value() && annotations->contains(kSyncReplicaAnnotation) &&
                 annotations->contains(kTermLeaderAnnotation);
  t.leader = lease.metadata.Annotation(kTermLeaderAnnotation);
  t.sync_replica = lease.metadata.Annotation(kSyncReplicaAnnotation);
  t.promote = lease.metadata.Annotation(kPromoteAnnotation);
  t.term = lease.spec.lease_transitions.value_or(0);
  return t;
}

LeaseTerm LeaseTermOf(const Json& lease) {
  absl::StatusOr<types::Lease> typed = types::DecodeLease(lease);
  return typed.ok() ? LeaseTermOf(*typed) : LeaseTerm();
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

absl::Time LeaderElector::Monotonic() const {
  if (clock_ != &Clock::Real()) return clock_->Now();  // a test's clock
  return absl::UnixEpoch() + absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

absl::Time LeaderElector::WindowEnd() const {
  if (!leader_.load(std::memory_order_acquire)) return absl::InfinitePast();
  return absl::FromUnixNanos(window_end_ns_.load(std::memory_order_acquire));
}

bool LeaderElector::IsLeader() const { return Monotonic() < WindowEnd(); }

absl::StatusOr<absl::Duration> LeaderElector::WriteWindow() const {
  if (!leader_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(absl::StrCat(options_.identity, " does not hold Lease ",
                                                      options_.lease_namespace, "/",
                                                      options_.lease_name));
  }
  const absl::Duration left = WindowEnd() - Monotonic();
  if (left <= absl::ZeroDuration()) {
    return absl::FailedPreconditionError(
        absl::StrCat(options_.identity, " has not renewed Lease ", options_.lease_namespace, "/",
                     options_.lease_name, " for ",
                     absl::FormatDuration(options_.renew_deadline - left), " (renew deadline ",
                     absl::FormatDuration(options_.renew_deadline), "): another replica may lead"));
  }
  return left;
}

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

bool LeaderElector::TryAcquireOrRenew(absl::Time attempt_start) {
  const absl::Time now = clock_->Now();
  const std::string now_text = FormatMicroTime(now);
  const int64_t duration_s = absl::ToInt64Seconds(options_.lease_duration);
  absl::StatusOr<Json> lease = client_->Get(kLeases, options_.lease_namespace, options_.lease_name);
  std::string address;
  {
    absl::MutexLock lock(&mu_);
    address = address_;
  }
  const bool acquiring = !leader_.load(std::memory_order_acquire);
  if (absl::IsNotFound(lease.status())) {
    // No Lease says whose store is the truth: only a replica whose store may lead makes
    // one (a new cluster's first replica; docs/operations.md for the lost-Lease case).
    LeaseTerm missing;
    missing.exists = false;
    if (options_.may_lead && !options_.may_lead(missing)) return false;
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
    window_end_ns_.store(absl::ToUnixNanos(attempt_start + options_.renew_deadline),
                         std::memory_order_release);
    return true;
  }
  if (!lease.ok()) return false;
  absl::StatusOr<types::Lease> decoded = types::DecodeLease(*lease);
  if (!decoded.ok()) {
    // Only a store that skips the API's validation can hold one: nobody acts on it.
    spdlog::warn("leader election: {} does not use Lease {}/{}: {}", options_.identity,
                 options_.lease_namespace, options_.lease_name, decoded.status().ToString());
    return false;
  }
  types::Lease& typed = *decoded;
  types::LeaseSpec& spec = typed.spec;
  const std::string holder = spec.holder_identity.value_or("");
  const bool mine = holder == options_.identity;
  if (!mine && !holder.empty()) {
    const std::string renew_time = spec.renew_time.value_or("");
    const absl::Time renewed = ParseTime(renew_time);
    const int64_t their_duration = spec.lease_duration_seconds.value_or(duration_s);
    std::string renewal = absl::StrCat(holder, "|", renew_time);
    bool unreachable_and_stale = false;
    {
      absl::MutexLock lock(&mu_);
      if (renewal != observed_renewal_) {
        observed_renewal_ = std::move(renewal);
        observed_renewal_at_ = attempt_start;
      } else if (options_.leader_unreachable && options_.leader_unreachable() &&
                 attempt_start - observed_renewal_at_ >=
                     options_.renew_deadline + options_.takeover_margin) {
        // The holder's write window closed by now on its own clock (it began before its
        // renewal reached the API server, which is before this replica first saw it).
        unreachable_and_stale = true;
      }
    }
    if (renewed + absl::Seconds(their_duration) > now && !unreachable_and_stale) {
      std::string observed = typed.metadata.Annotation(kLeaderAddressAnnotation);
      absl::MutexLock lock(&mu_);
      observed_address_ = std::move(observed);
      observed_expiry_ = renewed + absl::Seconds(their_duration);
      return false;
    }
    if (unreachable_and_stale) {
      spdlog::warn(
          "leader election: {} cannot reach leader \"{}\", whose Lease renewal has not changed "
          "for {} (renew deadline {}): its write window has closed; taking the Lease",
          options_.identity, holder,
          absl::FormatDuration(options_.renew_deadline + options_.takeover_margin),
          absl::FormatDuration(options_.renew_deadline));
    }
  }
  {
    absl::MutexLock lock(&mu_);
    observed_address_.clear();
  }
  if (acquiring && options_.may_lead && !options_.may_lead(LeaseTermOf(typed))) return false;
  if (!mine) {
    spec.acquire_time = now_text;
    spec.lease_transitions = spec.lease_transitions.value_or(0) + 1;
  }
  types::StringMap& annotations = typed.metadata.annotations ? *typed.metadata.annotations
                                                             : typed.metadata.annotations.emplace();
  annotations[kLeaderAddressAnnotation] = address;
  if (acquiring) {
    // A new term of this replica: its store is the truth, and no standby has it yet.
    annotations[kTermLeaderAnnotation] = options_.identity;
    annotations[kSyncReplicaAnnotation] = "";
    // An operator's promotion is used once.
    annotations.erase(kPromoteAnnotation);
  }
  spec.holder_identity = options_.identity;
  spec.lease_duration_seconds = duration_s;
  spec.renew_time = now_text;
  // The lease's resourceVersion makes this a compare-and-swap: a competing replica's
  // write in between turns it into ABORTED.
  if (!client_->Update(kLeases, options_.lease_namespace, types::Encode(typed)).ok()) {
    return false;
  }
  if (acquiring) term_.store(spec.lease_transitions.value_or(0), std::memory_order_release);
  window_end_ns_.store(absl::ToUnixNanos(attempt_start + options_.renew_deadline),
                       std::memory_order_release);
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
    absl::StatusOr<types::Lease> typed = types::DecodeLease(*lease);
    if (!typed.ok()) return absl::UnavailableError(typed.status().message());
    const std::string holder = typed->spec.holder_identity.value_or("");
    const int64_t term = typed->spec.lease_transitions.value_or(0);
    if (holder != options_.identity || term != Term()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Lease ", options_.lease_namespace, "/", options_.lease_name, " is held by \"", holder,
          "\" in term ", term, ", not by ", options_.identity, " in term ", Term()));
    }
    types::StringMap& annotations = typed->metadata.annotations
                                        ? *typed->metadata.annotations
                                        : typed->metadata.annotations.emplace();
    annotations[kSyncReplicaAnnotation] = identity;
    absl::Status written =
        client_->Update(kLeases, options_.lease_namespace, types::Encode(*typed)).status();
    if (written.ok()) return absl::OkStatus();
    if (!absl::IsAborted(written)) return absl::UnavailableError(written.message());
  }
  return absl::UnavailableError("the Lease kept changing while naming the in-sync standby");
}

void LeaderElector::Release() {
  absl::StatusOr<Json> lease = client_->Get(kLeases, options_.lease_namespace, options_.lease_name);
  if (!lease.ok()) return;
  absl::StatusOr<types::Lease> typed = types::DecodeLease(*lease);
  if (!typed.ok() || typed->spec.holder_identity != options_.identity) return;
  typed->spec.holder_identity = "";
  typed->spec.renew_time = FormatMicroTime(clock_->Now());
  absl::Status released =
      client_->Update(kLeases, options_.lease_namespace, types::Encode(*typed)).status();
  if (!released.ok()) spdlog::warn("leader election: releasing the lease: {}", released.ToString());
}

void LeaderElector::Run() {
  while (true) {
    // Campaign: look again after retry_period, or as soon as the holder's term runs out
    // (so that a standby takes over a dead leader's Lease when it expires, not up to
    // retry_period later), or every fast_poll while the leader is unreachable.
    while (!TryAcquireOrRenew(Monotonic())) {
      absl::Duration wait = options_.retry_period;
      if (options_.leader_unreachable && options_.leader_unreachable()) {
        wait = std::min(wait, options_.fast_poll);
      }
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
    // Lead: renew until stopped, or until the write window closes (renew_deadline after
    // the start of the last successful renewal). The window closes by itself for every
    // writer; this loop only notices it and steps down.
    bool stopping = false;
    bool renewed = true;
    while (true) {
      // After a failed renewal, try again sooner: the window leaves room for several tries.
      if (!Sleep(renewed ? options_.retry_period
                         : std::min(options_.retry_period, options_.fast_poll))) {
        stopping = true;
        break;
      }
      const absl::Time attempt = Monotonic();
      if (attempt >= WindowEnd()) {
        // Paused, or renewals kept failing: not even an attempt is made past the window
        // (a renewal now would extend a term another replica may have begun).
        spdlog::warn(
            "leader election: {} has not renewed lease {}/{} within its renew deadline {}; "
            "stepping down",
            options_.identity, options_.lease_namespace, options_.lease_name,
            absl::FormatDuration(options_.renew_deadline));
        break;
      }
      renewed = TryAcquireOrRenew(attempt);
      if (!renewed && Monotonic() >= WindowEnd()) {
        spdlog::warn("leader election: {} could not renew lease {}/{} for {}; stepping down",
                     options_.identity, options_.lease_namespace, options_.lease_name,
                     absl::FormatDuration(options_.renew_deadline));
        break;
      }
    }
    leader_.store(false, std::memory_order_release);
    window_end_ns_.store(0, std::memory_order_release);
    if (on_stopped_) on_stopped_();
    if (stopping) {
      Release();
      return;
    }
  }
}

}  // namespace sbx::k8s

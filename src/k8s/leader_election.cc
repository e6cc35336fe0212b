#include "src/k8s/leader_election.h"

#include "src/k8s/json_fields.h"

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
  if (absl::IsNotFound(lease.status())) {
    Json fresh = {
        {"metadata",
         {{"name", options_.lease_name}, {"annotations", {{kLeaderAddressAnnotation, address}}}}},
        {"spec",
         {{"holderIdentity", options_.identity},
          {"leaseDurationSeconds", duration_s},
          {"acquireTime", now_text},
          {"renewTime", now_text},
          {"leaseTransitions", 0}}}};
    return client_->Create(kLeases, options_.lease_namespace, fresh).ok();
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
      return false;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    observed_address_.clear();
  }
  if (!mine) {
    spec["acquireTime"] = now_text;
    spec["leaseTransitions"] = spec.value("leaseTransitions", 0) + 1;
  }
  (*lease)["metadata"]["annotations"][kLeaderAddressAnnotation] = address;
  spec["holderIdentity"] = options_.identity;
  spec["leaseDurationSeconds"] = duration_s;
  spec["renewTime"] = now_text;
  // The lease's resourceVersion makes this a compare-and-swap: a competing replica's
  // write in between turns it into ABORTED.
  return client_->Update(kLeases, options_.lease_namespace, *lease).ok();
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
    // Campaign.
    while (!TryAcquireOrRenew()) {
      if (!Sleep(options_.retry_period)) return;
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

#include "src/k8s/fleet_health.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace sbx::k8s {

absl::Status FleetHealthOptions::Validate() const {
  if (!probe) return absl::InvalidArgumentError("fleet health: no probe");
  if (!(bound > absl::ZeroDuration()) || !(interval > absl::ZeroDuration()) || interval > bound) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fleet health: the bound (", absl::FormatDuration(bound), ") and the probe interval (",
        absl::FormatDuration(interval), ") must be > 0 with interval <= bound"));
  }
  return absl::OkStatus();
}

FleetHealth::FleetHealth(FleetHealthOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &Clock::Real()),
      last_ok_(clock_->Now()) {}

FleetHealth::~FleetHealth() { Stop(); }

void FleetHealth::Start() {
  absl::MutexLock lock(&mu_);
  if (thread_.joinable() || stopping_) return;
  thread_ = std::thread([this] { Run(); });
}

void FleetHealth::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool FleetHealth::Healthy() const {
  absl::MutexLock lock(&mu_);
  return clock_->Now() - last_ok_ <= options_.bound;
}

void FleetHealth::ProbeOnce() {
  // The probe is I/O: outside the lock.
  absl::Status s = options_.probe();
  bool changed = false;
  bool healthy = true;
  absl::Status last_error;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    if (s.ok()) {
      last_ok_ = now;
    } else {
      last_error_ = s;
    }
    healthy = now - last_ok_ <= options_.bound;
    if (healthy != reported_healthy_) {
      reported_healthy_ = healthy;
      changed = true;
      last_error = last_error_;
    }
  }
  if (changed && options_.on_change) options_.on_change(healthy, last_error);
}

void FleetHealth::Run() {
  while (true) {
    ProbeOnce();
    absl::MutexLock lock(&mu_);
    if (clock_->AwaitUntil(mu_, &stopping_, clock_->Now() + options_.interval)) return;
  }
}

}  // namespace sbx::k8s

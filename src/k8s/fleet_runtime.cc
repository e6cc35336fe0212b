#include "src/k8s/fleet_runtime.h"

#include <algorithm>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "src/common/ids.h"

namespace sbx::k8s {

namespace {

// A create that failed for a reason of its cluster's (not of the request, nor a shutdown).
bool IsClusterTrouble(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::Status FleetRuntimeOptions::Validate() const {
  if (clusters.empty()) return absl::InvalidArgumentError("a fleet needs at least one cluster");
  absl::flat_hash_set<std::string> names;
  for (const FleetCluster& c : clusters) {
    if (absl::Status s = ValidateName("fleet cluster name", c.name); !s.ok()) return s;
    if (!names.insert(c.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("fleet cluster \"", c.name, "\" is named twice"));
    }
    if (c.runtime == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("fleet cluster \"", c.name, "\" has no runtime"));
    }
    if (!(c.weight > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fleet cluster \"", c.name, "\": weight ", c.weight, " is not > 0"));
    }
    if (c.min < 0 || c.max < 0 || (c.max > 0 && c.min > c.max)) {
      return absl::InvalidArgumentError(
          absl::StrCat("fleet cluster \"", c.name, "\": min ", c.min, " and max ", c.max,
                       " must be >= 0 with min <= max (max 0: none)"));
    }
  }
  if (!(failure_backoff > absl::ZeroDuration()) || max_failure_backoff < failure_backoff) {
    return absl::InvalidArgumentError(
        absl::StrCat("fleet failure backoff ", absl::FormatDuration(failure_backoff),
                     " must be > 0 and <= ", absl::FormatDuration(max_failure_backoff)));
  }
  if (!(rate_window > absl::ZeroDuration())) {
    return absl::InvalidArgumentError(
        absl::StrCat("fleet rate window ", absl::FormatDuration(rate_window), " is not > 0"));
  }
  return absl::OkStatus();
}

FleetRuntime::FleetRuntime(FleetRuntimeOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &Clock::Real()),
      counts_(options_.clusters.size()),
      ready_times_(options_.clusters.size()),
      failures_(options_.clusters.size(), 0),
      backoff_until_(options_.clusters.size(), absl::InfinitePast()) {}

std::string FleetRuntime::FleetId(size_t cluster, const std::string& local_id) const {
  if (cluster == 0) return local_id;
  return absl::StrCat(options_.clusters[cluster].name, ":", local_id);
}

absl::StatusOr<std::pair<size_t, std::string>> FleetRuntime::Route(const std::string& id) const {
  const size_t colon = id.find(':');
  if (colon == std::string::npos) return std::make_pair(size_t{0}, id);
  const absl::string_view prefix(id.data(), colon);
  for (size_t i = 1; i < options_.clusters.size(); ++i) {
    if (options_.clusters[i].name == prefix) return std::make_pair(i, id.substr(colon + 1));
  }
  return absl::NotFoundError(absl::StrCat("sandbox \"", id, "\": cluster \"", prefix,
                                          "\" is not a member cluster of this fleet"));
}

runtime::SandboxInfo FleetRuntime::ToFleet(size_t cluster, runtime::SandboxInfo info) const {
  info.id = FleetId(cluster, info.id);
  if (cluster != 0 && !info.node.empty()) {
    info.node = absl::StrCat(options_.clusters[cluster].name, ":", info.node);
  }
  info.node_labels[kClusterLabel] = options_.clusters[cluster].name;
  return info;
}

void FleetRuntime::ReleaseLocked(size_t cluster, const std::string& pool) {
  auto it = counts_[cluster].find(pool);
  if (it != counts_[cluster].end() && --it->second <= 0) counts_[cluster].erase(it);
}

void FleetRuntime::ForgetLocked(const std::string& fleet_id) {
  auto it = members_.find(fleet_id);
  if (it == members_.end()) return;
  ReleaseLocked(it->second.cluster, it->second.pool);
  members_.erase(it);
}

double FleetRuntime::RateOfLocked(const std::deque<Answered>& answered, absl::Time now) const {
  absl::Duration took;
  int64_t n = 0;
  for (const Answered& a : answered) {
    if (a.at < now - options_.rate_window) continue;
    took += a.took;
    ++n;
  }
  if (n == 0) return 0;
  // At least 1 ms a create: an answer as fast as the clock's step still has a finite rate.
  took = std::max(took, n * absl::Milliseconds(1));
  return static_cast<double>(n) / absl::ToDoubleSeconds(took);
}

double FleetRuntime::RateLocked(size_t cluster, absl::Time now) {
  std::deque<Answered>& answered = ready_times_[cluster];
  while (!answered.empty() && answered.front().at < now - options_.rate_window) {
    answered.pop_front();
  }
  return RateOfLocked(answered, now);
}

void FleetRuntime::Create(runtime::CreateRequest request, runtime::CreateCallback done) {
  absl::StatusOr<size_t> placed;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_->Now();
    std::vector<ClusterLoad> loads;
    loads.reserve(options_.clusters.size());
    for (size_t i = 0; i < options_.clusters.size(); ++i) {
      const FleetCluster& c = options_.clusters[i];
      ClusterLoad load;
      load.name = c.name;
      auto it = counts_[i].find(request.pool);
      load.members = it != counts_[i].end() ? it->second : 0;
      load.min = c.min;
      load.max = c.max;
      load.weight = c.weight;
      load.create_rate = RateLocked(i, now);
      load.healthy = !c.healthy || c.healthy();
      if (!load.healthy) {
        load.unhealthy_reason = "excluded (its API does not answer)";
      } else if (now < backoff_until_[i]) {
        load.healthy = false;
        load.unhealthy_reason =
            absl::StrCat("backing off after ", failures_[i], " failed creates in a row");
      }
      loads.push_back(std::move(load));
    }
    placed = PlaceCreate(request.pool, loads, options_.placement);
    if (placed.ok()) ++counts_[*placed][request.pool];
  }
  if (!placed.ok()) return std::move(done)(placed.status());
  const size_t cluster = *placed;
  std::string pool = request.pool;
  const absl::Time asked = clock_->Now();
  options_.clusters[cluster].runtime->Create(
      std::move(request), [this, cluster, asked, pool = std::move(pool), done = std::move(done)](
                              absl::StatusOr<runtime::SandboxInfo> made) mutable {
        if (!made.ok()) {
          {
            absl::MutexLock lock(&mu_);
            ReleaseLocked(cluster, pool);
            if (IsClusterTrouble(made.status())) {
              const int n = ++failures_[cluster];
              absl::Duration backoff = options_.failure_backoff;
              for (int i = 1; i < n && backoff < options_.max_failure_backoff; ++i) backoff *= 2;
              backoff_until_[cluster] =
                  clock_->Now() + std::min(backoff, options_.max_failure_backoff);
            }
          }
          return std::move(done)(absl::Status(
              made.status().code(), absl::StrCat("cluster \"", options_.clusters[cluster].name,
                                                 "\": ", made.status().message())));
        }
        runtime::SandboxInfo info = ToFleet(cluster, *std::move(made));
        {
          absl::MutexLock lock(&mu_);
          members_[info.id] = Member{cluster, pool};
          failures_[cluster] = 0;
          backoff_until_[cluster] = absl::InfinitePast();
          const absl::Time now = clock_->Now();
          ready_times_[cluster].push_back(Answered{now, now - asked});
        }
        std::move(done)(std::move(info));
      });
}

void FleetRuntime::Delete(std::string id, runtime::DeleteCallback done) {
  absl::StatusOr<std::pair<size_t, std::string>> route = Route(id);
  if (!route.ok()) return std::move(done)(route.status());
  options_.clusters[route->first].runtime->Delete(
      route->second, [this, id, done = std::move(done)](absl::Status s) mutable {
        if (s.ok() || absl::IsNotFound(s)) {
          absl::MutexLock lock(&mu_);
          ForgetLocked(id);
        }
        std::move(done)(std::move(s));
      });
}

void FleetRuntime::Suspend(std::string id, runtime::DoneCallback done) {
  absl::StatusOr<std::pair<size_t, std::string>> route = Route(id);
  if (!route.ok()) return std::move(done)(route.status());
  options_.clusters[route->first].runtime->Suspend(route->second, std::move(done));
}

void FleetRuntime::Resume(std::string id, runtime::ResumeCallback done) {
  absl::StatusOr<std::pair<size_t, std::string>> route = Route(id);
  if (!route.ok()) return std::move(done)(route.status());
  const size_t cluster = route->first;
  options_.clusters[cluster].runtime->Resume(
      route->second, [this, cluster, done = std::move(done)](
                         absl::StatusOr<runtime::SandboxInfo> resumed) mutable {
        if (!resumed.ok()) return std::move(done)(resumed.status());
        std::move(done)(ToFleet(cluster, *std::move(resumed)));
      });
}

absl::StatusOr<std::vector<runtime::SandboxInfo>> FleetRuntime::List() {
  std::vector<runtime::SandboxInfo> all;
  std::vector<std::vector<runtime::SandboxInfo>> per_cluster(options_.clusters.size());
  for (size_t i = 0; i < options_.clusters.size(); ++i) {
    absl::StatusOr<std::vector<runtime::SandboxInfo>> listed = options_.clusters[i].runtime->List();
    if (!listed.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cluster \"", options_.clusters[i].name,
                       "\" cannot list its sandboxes: ", listed.status().ToString()));
    }
    per_cluster[i] = *std::move(listed);
  }
  absl::MutexLock lock(&mu_);
  // A recount: what the clusters hold now, plus the creates still in flight (counted
  // already and not yet members).
  std::vector<absl::flat_hash_map<std::string, int64_t>> counts(options_.clusters.size());
  for (size_t i = 0; i < counts_.size(); ++i) {
    counts[i] = counts_[i];
  }
  for (const auto& [fleet_id, member] : members_) {
    auto it = counts[member.cluster].find(member.pool);
    if (it != counts[member.cluster].end() && --it->second <= 0) counts[member.cluster].erase(it);
  }
  members_.clear();
  for (size_t i = 0; i < per_cluster.size(); ++i) {
    for (runtime::SandboxInfo& info : per_cluster[i]) {
      runtime::SandboxInfo mapped = ToFleet(i, std::move(info));
      if (members_.emplace(mapped.id, Member{i, mapped.pool}).second) ++counts[i][mapped.pool];
      all.push_back(std::move(mapped));
    }
  }
  counts_ = std::move(counts);
  return all;
}

std::string FleetRuntime::Gone(size_t cluster, const std::string& local_id) {
  std::string id = FleetId(cluster, local_id);
  absl::MutexLock lock(&mu_);
  ForgetLocked(id);
  return id;
}

std::vector<FleetClusterState> FleetRuntime::State() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<FleetClusterState> out;
  for (size_t i = 0; i < options_.clusters.size(); ++i) {
    FleetClusterState s;
    s.name = options_.clusters[i].name;
    for (const auto& [pool, n] : counts_[i]) s.members[pool] = n;
    s.create_rate = RateOfLocked(ready_times_[i], now);
    s.failures = failures_[i];
    s.backoff_until = backoff_until_[i];
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace sbx::k8s

namespace sbx::k8s {

std::vector<std::string> FleetRuntime::MembersOf(size_t cluster) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, member] : members_) {
    if (member.cluster == cluster) out.push_back(id);
  }
  return out;
}

}  // namespace sbx::k8s

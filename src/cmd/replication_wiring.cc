#include "src/cmd/replication_wiring.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/metric_family.h"
#include "spdlog/spdlog.h"
#include "src/replication/service.h"

namespace sbx::cmd {
namespace {

// Reads the hub and follower at scrape time.
class ReplicationCollector final : public prometheus::Collectable {
 public:
  using Read = std::function<void(replication::HubStats*, replication::FollowerStats*)>;
  explicit ReplicationCollector(Read read) : read_(std::move(read)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    replication::HubStats hub;
    replication::FollowerStats follower;
    read_(&hub, &follower);
    std::vector<prometheus::MetricFamily> out;
    auto family = [&](const char* name, const char* help, prometheus::MetricType type,
                      double value) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = type;
      prometheus::ClientMetric m;
      if (type == prometheus::MetricType::Counter) {
        m.counter.value = value;
      } else {
        m.gauge.value = value;
      }
      f.metric.push_back(m);
      out.push_back(std::move(f));
    };
    family("sbx_replication_sync_standby",
           "1 while the Lease names a standby that holds every acknowledged commit (the "
           "leader then waits for it before acknowledging); 0 while the leader acknowledges "
           "alone",
           prometheus::MetricType::Gauge, hub.named.empty() ? 0 : 1);
    family("sbx_replication_groups_shipped_total",
           "Group commits this leader shipped to its standby (or would have, without one)",
           prometheus::MetricType::Counter, static_cast<double>(hub.shipped));
    family("sbx_replication_standby_drops_total",
           "Standbys this leader dropped (no acknowledgement within the ack timeout, stream "
           "ended, too far behind)",
           prometheus::MetricType::Counter, static_cast<double>(hub.drops));
    family("sbx_replication_refused_total",
           "Group commits this leader refused, unacknowledged, because no standby was in sync "
           "and it keeps two copies (--replication_copies=2)",
           prometheus::MetricType::Counter, static_cast<double>(hub.refused));
    family("sbx_replication_following",
           "1 while this standby follows the leader (its snapshot loaded)",
           prometheus::MetricType::Gauge, follower.following ? 1 : 0);
    family("sbx_replication_snapshots_loaded_total",
           "Snapshots of the leader's store this standby loaded", prometheus::MetricType::Counter,
           static_cast<double>(follower.loads));
    return out;
  }

 private:
  Read read_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Replication>> Replication::Create(store::Store* store,
                                                                 ReplicationOptions options) {
  store::Replicable* r = store::ReplicationOf(store);
  if (r == nullptr) {
    return absl::FailedPreconditionError("this store cannot be replicated to a standby");
  }
  return std::unique_ptr<Replication>(new Replication(r, std::move(options)));
}

Replication::Replication(store::Replicable* store, ReplicationOptions options)
    : store_(store), options_(std::move(options)) {}

Replication::~Replication() { Stop(); }

std::shared_ptr<replication::ReplicationHub> Replication::hub() const {
  absl::MutexLock lock(&mu_);
  return hub_;
}

std::shared_ptr<grpc::Service> Replication::NewService() {
  return std::make_shared<replication::ReplicationService>(options_.token,
                                                           [this] { return hub(); });
}

void Replication::RefuseOnce(const std::string& why, const std::string& message) {
  absl::MutexLock lock(&mu_);
  if (why == last_refusal_) return;  // a refusing replica keeps refusing: said once
  last_refusal_ = why;
  spdlog::warn("{}", message);
}

bool Replication::MayLead(const k8s::LeaseTerm& lease) {
  if (!lease.promote.empty() && lease.promote == options_.identity) {
    // An operator's word (docs/operations.md): this replica leads with what its store has.
    absl::StatusOr<std::optional<store::ReplicaMarker>> marker = store_->ReadMarker();
    absl::MutexLock lock(&mu_);
    approved_.reset();
    if (marker.ok()) approved_ = *marker;
    spdlog::warn(
        "the Lease's {} annotation names this replica (\"{}\"): taking the Lease with this "
        "store as it is; acknowledged claims only the lost stores held are gone",
        k8s::kPromoteAnnotation, options_.identity);
    return true;
  }
  if (!lease.promote.empty()) {
    const std::string why = absl::StrCat("the Lease's ", k8s::kPromoteAnnotation,
                                         " annotation names \"", lease.promote, "\"");
    RefuseOnce(why, absl::StrCat("not taking the Lease: ", why, ", not this replica (\"",
                                 options_.identity, "\")"));
    return false;
  }
  if (!lease.exists) {
    // Nothing says which store is the truth, and an empty store that led would erase the
    // cluster's claimed sandboxes: only a new cluster's first replica makes the Lease.
    absl::StatusOr<std::optional<store::ReplicaMarker>> marker = store_->ReadMarker();
    const size_t in_cluster = options_.cluster_sandboxes ? options_.cluster_sandboxes() : 0;
    std::string why;
    if (!marker.ok()) {
      why = marker.status().ToString();
    } else if (marker->has_value()) {
      why = absl::StrCat("this replica's store holds leader \"", (*marker)->leader, "\"'s term ",
                         (*marker)->term,
                         ", and with no Lease nothing says whether another replica holds a newer "
                         "one");
    } else if (in_cluster > 0) {
      why = absl::StrCat("this replica's store is empty and the cluster has ", in_cluster,
                         " Sandboxes made or bound by sbx: leading would give up their claims");
    } else {
      absl::MutexLock lock(&mu_);
      approved_.reset();
      return true;  // a new cluster
    }
    RefuseOnce(why, absl::StrCat("the Lease is missing and this replica does not make it: ", why,
                                 ". Name the replica to lead by creating the Lease with the "
                                 "annotation ",
                                 k8s::kPromoteAnnotation,
                                 "=<identity> (docs/operations.md, \"Losing the only complete "
                                 "copy\")"));
    return false;
  }
  if (!lease.replicated) {
    absl::MutexLock lock(&mu_);
    approved_.reset();
    return true;  // the first leader, or a Lease from before replication
  }
  absl::StatusOr<std::optional<store::ReplicaMarker>> marker = store_->ReadMarker();
  std::string why;
  if (!marker.ok()) {
    why = marker.status().ToString();
  } else if (!marker->has_value()) {
    why = "this replica's store holds no leader's commits (it is new, or was emptied)";
  } else if (const store::ReplicaMarker& m = **marker; !m.complete) {
    why = absl::StrCat("this replica's store is half way through loading leader \"", m.leader,
                       "\"'s snapshot");
  } else if (m.leader != lease.leader || m.term != lease.term) {
    why = absl::StrCat("this replica's store holds leader \"", m.leader, "\" of term ", m.term);
  } else if (m.self != lease.leader && m.self != lease.sync_replica) {
    why = absl::StrCat(
        "the Lease names ",
        lease.sync_replica.empty() ? std::string("no standby") : "\"" + lease.sync_replica + "\"",
        " as holding every acknowledged commit, not this store (written as \"", m.self, "\")");
  } else {
    absl::MutexLock lock(&mu_);
    approved_ = m;
    last_refusal_.clear();
    return true;
  }
  RefuseOnce(
      why, absl::StrCat("not taking the Lease of leader \"", lease.leader, "\" (term ", lease.term,
                        "): ", why,
                        ". Its acknowledged claims may be only in its store and its "
                        "in-sync standby's; this replica waits for one of them (to lead "
                        "anyway, accepting their loss, annotate the Lease ",
                        k8s::kPromoteAnnotation, "=", options_.identity, ": docs/operations.md)"));
  return false;
}

void Replication::StartFollowing(std::function<std::string()> leader_address) {
  replication::FollowerOptions o;
  o.identity = options_.identity;
  o.leader_address = std::move(leader_address);
  o.credentials = options_.credentials;
  o.token = options_.token;
  o.store = store_;
  follower_ = std::make_unique<replication::Follower>(std::move(o));
  follower_->Start();
  following_.store(follower_.get(), std::memory_order_release);
}

bool Replication::LeaderUnreachable() const {
  const replication::Follower* f = following_.load(std::memory_order_acquire);
  return f != nullptr && !f->Stats().following;
}

absl::Status Replication::Lead(int64_t term,
                               std::function<absl::Status(const std::string&)> publish) {
  if (follower_ != nullptr) follower_->Stop();  // nothing more is written from the old leader
  std::optional<store::ReplicaMarker> approved;
  {
    absl::MutexLock lock(&mu_);
    approved = approved_;
  }
  if (approved.has_value()) {
    absl::StatusOr<std::optional<store::ReplicaMarker>> now = store_->ReadMarker();
    if (!now.ok()) return now.status();
    if (!now->has_value() || !(**now == *approved)) {
      return absl::FailedPreconditionError(
          "this replica's store changed between taking the Lease and leading (a new snapshot "
          "began): it may not hold every acknowledged commit");
    }
  }
  store::ReplicaMarker mine{options_.identity, term, options_.identity, true};
  if (absl::Status s = store_->WriteMarker(mine); !s.ok()) return s;
  replication::HubOptions o;
  o.identity = options_.identity;
  o.term = term;
  o.ack_timeout = options_.ack_timeout;
  o.copies = options_.copies;
  o.publish = std::move(publish);
  auto hub = std::make_shared<replication::ReplicationHub>(store_, std::move(o));
  absl::MutexLock lock(&mu_);
  hub_ = std::move(hub);
  return absl::OkStatus();
}

void Replication::Stop() {
  // The shutdown and a deposed leader's elector thread may both stop it.
  absl::MutexLock serialized(&stop_mu_);
  if (follower_ != nullptr) follower_->Stop();
  std::shared_ptr<replication::ReplicationHub> hub;
  {
    absl::MutexLock lock(&mu_);
    hub = hub_;
  }
  if (hub != nullptr) hub->Stop();
}

std::shared_ptr<prometheus::Collectable> Replication::Collector() {
  return std::make_shared<ReplicationCollector>(
      [this](replication::HubStats* h, replication::FollowerStats* f) {
        if (auto hub = this->hub()) *h = hub->Stats();
        if (follower_ != nullptr) *f = follower_->Stats();
      });
}

}  // namespace sbx::cmd

#include "src/replication/hub.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sbx::replication {

// Every field is guarded by the hub's mu_ (a feed belongs to one hub).
class ReplicationHub::Feed {
 public:
  explicit Feed(std::string id) : identity(std::move(id)) {}
  const std::string identity;
  std::deque<v1::LeaderMessage> queue;
  size_t queued_bytes = 0;
  // Groups shipped while the snapshot is read: queued after its last chunk.
  std::deque<v1::LeaderMessage> after_snapshot;
  bool loading = true;
  uint64_t snapshot_ticket = 0;  // the snapshot holds every group up to this one
  uint64_t queued_up_to = 0;     // the last ticket queued for it
  uint64_t acked = 0;
  bool in_sync = false;
  bool dropped = false;
  absl::Status why;
};

ReplicationHub::ReplicationHub(store::Replicable* store, HubOptions options)
    : store_(store), options_(std::move(options)) {
  store_->SetShipper(this);
  publisher_ = std::thread([this] { PublishLoop(); });
}

ReplicationHub::~ReplicationHub() {
  Stop();
  store_->SetShipper(nullptr);
}

void ReplicationHub::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    if (fatal_.ok()) {
      fatal_ = absl::UnavailableError(
          "this replica is shutting down and acknowledges nothing more; retry on the new "
          "leader");
    }
    if (feed_ != nullptr) DropLocked(*feed_, absl::UnavailableError("the leader is stopping"));
  }
  // Still the store's shipper: every later commit fails (until the destructor detaches).
  if (publisher_.joinable()) publisher_.join();
}

absl::StatusOr<std::shared_ptr<ReplicationHub::Feed>> ReplicationHub::Attach(
    const std::string& identity) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_ || !fatal_.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("this replica does not lead any more: ", fatal_.message()));
    }
    if (feed_ != nullptr && feed_->identity != identity) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "standby \"", feed_->identity, "\" is attached; the leader replicates to one standby"));
    }
  }
  auto feed = std::make_shared<Feed>(identity);
  v1::LeaderMessage chunk;
  size_t chunk_bytes = 0;
  auto flush = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (chunk_bytes == 0) return;
    PushLocked(*feed, std::move(chunk));
    chunk = v1::LeaderMessage();
    chunk_bytes = 0;
  };
  std::string other;  // another standby that attached meanwhile
  absl::Status read = store_->Snapshot(
      [&] {
        absl::MutexLock lock(&mu_);
        if (feed_ != nullptr && feed_->identity != identity) {
          other = feed_->identity;
          feed->dropped = true;
          return;
        }
        if (feed_ != nullptr) {
          DropLocked(*feed_, absl::AbortedError("replaced by a new stream of the same standby"));
        }
        feed_ = feed;
        feed->snapshot_ticket = shipped_;
        feed->queued_up_to = shipped_;
        v1::LeaderMessage start;
        start.mutable_start()->set_leader(options_.identity);
        start.mutable_start()->set_term(options_.term);
        PushLocked(*feed, std::move(start));
      },
      [&](absl::string_view key, absl::string_view value) {
        v1::Chunk* c = chunk.mutable_chunk();
        c->add_keys(key.data(), key.size());
        c->add_values(value.data(), value.size());
        chunk_bytes += key.size() + value.size();
        if (chunk_bytes >= options_.chunk_bytes && other.empty()) {
          absl::MutexLock lock(&mu_);
          flush();
        }
      });
  absl::MutexLock lock(&mu_);
  if (!other.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("standby \"", other, "\" is attached; the leader replicates to one standby"));
  }
  if (!read.ok()) {
    DropLocked(*feed, read);
    return read;
  }
  flush();
  v1::LeaderMessage end;
  end.mutable_snapshot_end()->set_ticket(feed->snapshot_ticket);
  PushLocked(*feed, std::move(end));
  while (!feed->after_snapshot.empty()) {
    PushLocked(*feed, std::move(feed->after_snapshot.front()));
    feed->after_snapshot.pop_front();
  }
  feed->loading = false;
  if (feed->dropped) return feed->why;
  spdlog::info("replication: standby \"{}\" attached; sending a snapshot at group {}", identity,
               feed->snapshot_ticket);
  return feed;
}

void ReplicationHub::PushLocked(Feed& feed, v1::LeaderMessage message) {
  if (feed.dropped) return;
  const size_t bytes = message.ByteSizeLong();
  if (feed.queued_bytes + bytes > options_.max_queued_bytes) {
    DropLocked(feed, absl::ResourceExhaustedError(
                         absl::StrCat("standby \"", feed.identity, "\" is more than ",
                                      options_.max_queued_bytes, " bytes behind")));
    return;
  }
  feed.queued_bytes += bytes;
  feed.queue.push_back(std::move(message));
}

std::optional<v1::LeaderMessage> ReplicationHub::Next(Feed& feed, absl::Duration timeout,
                                                      absl::Status* dropped) {
  absl::MutexLock lock(&mu_);
  auto ready = [&feed]() { return feed.dropped || !feed.queue.empty(); };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (feed.dropped) {
    *dropped = feed.why;
    return std::nullopt;
  }
  if (feed.queue.empty()) return std::nullopt;
  v1::LeaderMessage m = std::move(feed.queue.front());
  feed.queue.pop_front();
  feed.queued_bytes -= std::min(feed.queued_bytes, m.ByteSizeLong());
  return m;
}

absl::Status ReplicationHub::Ack(Feed& feed, uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  if (feed.dropped) return feed.why;
  if (feed.loading || ticket > feed.queued_up_to || ticket < feed.acked ||
      ticket < feed.snapshot_ticket) {
    absl::Status bad = absl::InvalidArgumentError(
        absl::StrCat("standby \"", feed.identity, "\" acknowledged group ", ticket,
                     ", which was not sent to it (sent up to ", feed.queued_up_to,
                     ", acknowledged ", feed.acked, ")"));
    DropLocked(feed, bad);
    return bad;
  }
  feed.acked = ticket;
  if (!feed.in_sync && ticket >= shipped_) {
    feed.in_sync = true;
    desired_ = feed.identity;
    spdlog::info("replication: standby \"{}\" is in sync at group {}; the Lease is to name it",
                 feed.identity, ticket);
  }
  return absl::OkStatus();
}

void ReplicationHub::Detach(Feed& feed, const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  DropLocked(feed, why);
}

void ReplicationHub::DropLocked(Feed& feed, absl::Status why) {
  if (feed.dropped) return;
  feed.dropped = true;
  feed.why = std::move(why);
  feed.queue.clear();
  feed.after_snapshot.clear();
  feed.queued_bytes = 0;
  if (feed_.get() == &feed) feed_.reset();
  ++drops_;
  if (options_.copies == Copies::kTwo) {
    // Still named: it holds every group acknowledged so far, and nothing is acknowledged
    // without it (or another standby, once in sync and named), so it may still take over.
    spdlog::warn(
        "replication: standby \"{}\" dropped ({}); this leader keeps two copies, so every "
        "commit is refused until a standby is in sync and named again",
        feed.identity, feed.why.ToString());
    return;
  }
  desired_.clear();
  spdlog::warn(
      "replication: standby \"{}\" dropped ({}); groups wait until the Lease names no "
      "in-sync standby, then are acknowledged by this replica alone",
      feed.identity, feed.why.ToString());
}

absl::StatusOr<uint64_t> ReplicationHub::Ship(std::string group) {
  absl::MutexLock lock(&mu_);
  if (options_.copies == Copies::kTwo) {
    // Refused before the store writes it: a refused commit leaves nothing behind.
    if (!fatal_.ok()) return fatal_;
    if (!SecondCopyLocked(nullptr)) return NoSecondCopyLocked("commit refused, nothing written");
  }
  const uint64_t ticket = ++shipped_;
  if (feed_ == nullptr) return ticket;
  v1::LeaderMessage m;
  m.mutable_group()->set_ticket(ticket);
  *m.mutable_group()->mutable_data() = std::move(group);
  feed_->queued_up_to = ticket;
  if (feed_->loading) {
    feed_->after_snapshot.push_back(std::move(m));
  } else {
    PushLocked(*feed_, std::move(m));
  }
  return ticket;
}

bool ReplicationHub::ReplicatedLocked(uint64_t ticket) const {
  for (const std::string& name : maybe_named_) {
    if (name.empty()) continue;
    if (feed_ == nullptr || feed_->identity != name || feed_->dropped || feed_->loading ||
        feed_->acked < ticket) {
      return false;
    }
  }
  return true;
}

bool ReplicationHub::SecondCopyLocked(std::string* why) const {
  auto no = [why](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return false;
  };
  if (feed_ == nullptr || feed_->dropped) {
    return no(named_.empty()
                  ? std::string("no standby is attached")
                  : absl::StrCat("standby \"", named_, "\", named by the Lease, is not attached"));
  }
  const std::string& id = feed_->identity;
  if (feed_->loading) return no(absl::StrCat("standby \"", id, "\" is loading a snapshot"));
  if (!feed_->in_sync) {
    return no(absl::StrCat("standby \"", id, "\" is catching up: it acknowledged group ",
                           feed_->acked, " of ", shipped_));
  }
  if (named_ != id || maybe_named_.size() > 1) {
    return no(absl::StrCat("standby \"", id, "\" is in sync but the Lease does not name it yet"));
  }
  return true;
}

absl::Status ReplicationHub::NoSecondCopyLocked(absl::string_view what) {
  std::string why;
  SecondCopyLocked(&why);
  ++refused_;
  return absl::UnavailableError(absl::StrCat(
      what, ": no standby is in sync (", why,
      ") and this leader was told to keep two copies of every commit "
      "(--replication_copies=2); retry (with the same claim id) once a standby is in sync"));
}

absl::Status ReplicationHub::AwaitReplicated(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + options_.ack_timeout;
  const bool two = options_.copies == Copies::kTwo;
  auto ready = [this, ticket, two]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return !fatal_.ok() || ReplicatedLocked(ticket) || (two && !SecondCopyLocked(nullptr));
  };
  while (true) {
    if (!fatal_.ok()) return fatal_;
    // With two copies the Lease must name the standby that acknowledged (ReplicatedLocked
    // alone also holds once the Lease names no one).
    if (ReplicatedLocked(ticket) && (!two || !named_.empty())) return absl::OkStatus();
    if (two && !SecondCopyLocked(nullptr)) {
      // Its standby was dropped before acknowledging it: the group is in this replica's
      // store (and maybe the standby's) but is failed, never acknowledged on one copy.
      return NoSecondCopyLocked(
          absl::StrCat("group ", ticket, " was written on this leader but not acknowledged"));
    }
    if (feed_ != nullptr && maybe_named_.count(feed_->identity) > 0 && absl::Now() >= deadline) {
      DropLocked(*feed_, absl::DeadlineExceededError(
                             absl::StrCat("no acknowledgement of group ", ticket, " within ",
                                          absl::FormatDuration(options_.ack_timeout))));
    }
    mu_.AwaitWithDeadline(absl::Condition(&ready),
                          std::min(deadline, absl::Now() + options_.retry_period));
  }
}

void ReplicationHub::LocalWriteFailed(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  if (feed_ == nullptr) return;
  DropLocked(*feed_, absl::AbortedError(absl::StrCat(
                         "this replica's own write of group ", ticket,
                         " failed after shipping it; the standby loads a new snapshot")));
}

HubStats ReplicationHub::Stats() const {
  absl::MutexLock lock(&mu_);
  HubStats s;
  s.attached = feed_ != nullptr;
  s.in_sync = feed_ != nullptr && feed_->in_sync;
  s.named = named_;
  s.shipped = shipped_;
  s.acked = feed_ != nullptr ? feed_->acked : 0;
  s.drops = drops_;
  s.publishes = publishes_;
  s.refused = refused_;
  return s;
}

void ReplicationHub::PublishLoop() {
  absl::MutexLock lock(&mu_);
  auto due = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return stopped_ || !fatal_.ok() || desired_ != named_ || maybe_named_.size() > 1;
  };
  while (true) {
    mu_.Await(absl::Condition(&due));
    if (stopped_ || !fatal_.ok()) return;
    const std::string target = desired_;
    maybe_named_.insert(target);
    mu_.Unlock();
    absl::Status published = options_.publish(target);
    mu_.Lock();
    if (published.ok()) {
      ++publishes_;
      named_ = target;
      maybe_named_ = {target};
      spdlog::info("replication: the Lease names {} as the in-sync standby",
                   target.empty() ? std::string("no one") : "\"" + target + "\"");
      continue;
    }
    if (absl::IsFailedPrecondition(published)) {
      // UNAVAILABLE for the clients of the commits that fail: the new leader serves them.
      fatal_ =
          absl::UnavailableError(absl::StrCat("this replica no longer leads (", published.message(),
                                              "); nothing more is acknowledged"));
      spdlog::error("replication: {}", std::string(fatal_.message()));
      if (feed_ != nullptr) DropLocked(*feed_, fatal_);
      return;
    }
    spdlog::warn("replication: naming {} in the Lease failed, retrying: {}",
                 target.empty() ? std::string("no one") : "\"" + target + "\"",
                 published.ToString());
    auto stopping = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopped_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.retry_period);
  }
}

}  // namespace sbx::replication

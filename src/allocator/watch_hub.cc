#include "src/allocator/watch_hub.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace sbx::allocator {
namespace {

// The subscription whose `ready` runs on this thread, if any: a Cancel from inside its own
// `ready` (a gRPC reactor that finishes inline and is deleted) must not wait for itself.
thread_local const void* running_ready = nullptr;

bool MatchesFilter(const WatchRequest& f, const store::ClaimRecord& c) {
  if (!f.all_owners && c.owner != f.owner) return false;
  if (!f.pool.empty() && c.pool != f.pool) return false;
  for (const auto& [k, v] : f.labels) {
    auto it = c.labels.find(k);
    if (it == c.labels.end() || it->second != v) return false;
  }
  return true;
}

}  // namespace

// One watch: its filter, its queue and its consumer's callback.
class WatchHub::Subscription {
 public:
  Subscription(WatchRequest filter, std::function<void()> ready, size_t limit)
      : filter_(std::move(filter)), ready_(std::move(ready)), limit_(limit) {}

  const WatchRequest& filter() const { return filter_; }
  bool Matches(const store::ClaimRecord& c) const { return MatchesFilter(filter_, c); }

  // What Offer did: whether the watch stays registered, and whether to wake its consumer.
  struct Offered {
    bool keep = true;
    bool wake = false;
  };

  // Queues a published event (the hub's lock is held). Ends the watch with ABORTED when
  // its queue is full.
  Offered Offer(const ClaimEventPtr& event) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    Offered out;
    if (!ended_.ok()) {
      out.keep = false;
      return out;
    }
    if (!suppress_.empty()) {
      // The initial state already showed this claim at a revision at or after this change.
      auto it = suppress_.find(store::ClaimKey(event->claim.owner, event->claim.id));
      if (it != suppress_.end() && event->revision <= it->second) {
        if (event->revision == it->second) suppress_.erase(it);
        return out;
      }
    }
    if (queue_.size() - backlog_ >= limit_) {
      ended_ = absl::AbortedError(absl::StrCat(
          "the client read too slowly: more than ", limit_,
          " claim events were waiting to be sent; resume the watch from the last revision "
          "received"));
      queue_.clear();
      backlog_ = 0;
      suppress_.clear();
      out.keep = false;
    } else {
      queue_.push_back(event);
    }
    out.wake = armed_;
    armed_ = false;
    return out;
  }

  // Queues replayed history while the watch is being registered (not counted against the
  // bound).
  void AddBacklog(const ClaimEventPtr& event) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(event);
    ++backlog_;
  }

  // Puts the initial state, taken at revision `snapshot`, before whatever was published
  // since the watch was registered, dropping the changes the initial state already shows.
  void SetInitial(uint64_t snapshot, std::vector<store::ClaimRecord> claims)
      ABSL_LOCKS_EXCLUDED(mu_) {
    std::sort(claims.begin(), claims.end(),
              [](const store::ClaimRecord& a, const store::ClaimRecord& b) { return a.id < b.id; });
    std::deque<ClaimEventPtr> initial;
    absl::flat_hash_map<std::string, uint64_t> newer;
    for (store::ClaimRecord& c : claims) {
      if (c.revision > snapshot) newer[store::ClaimKey(c.owner, c.id)] = c.revision;
      auto e = std::make_shared<ClaimEvent>();
      e->type = ClaimEvent::Type::kAdded;
      e->revision = snapshot;
      e->initial = true;
      e->claim = std::move(c);
      initial.push_back(std::move(e));
    }
    absl::MutexLock lock(&mu_);
    if (!ended_.ok()) return;
    if (!newer.empty()) {
      std::deque<ClaimEventPtr> kept;
      for (ClaimEventPtr& e : queue_) {
        auto it = newer.find(store::ClaimKey(e->claim.owner, e->claim.id));
        if (it != newer.end() && e->revision <= it->second) {
          if (e->revision == it->second) newer.erase(it);
          continue;
        }
        kept.push_back(std::move(e));
      }
      queue_ = std::move(kept);
      suppress_ = std::move(newer);
    }
    backlog_ += initial.size();
    queue_.insert(queue_.begin(), std::make_move_iterator(initial.begin()),
                  std::make_move_iterator(initial.end()));
  }

  absl::Status Poll(std::vector<ClaimEventPtr>* out, size_t max) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const size_t n = std::min(max, queue_.size());
    for (size_t i = 0; i < n; ++i) {
      out->push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    backlog_ -= std::min(backlog_, n);
    if (n > 0) return absl::OkStatus();
    if (!ended_.ok()) return ended_;
    armed_ = true;
    return absl::OkStatus();
  }

  // Ends the watch with `status` (unless it has ended already). Returns whether to wake
  // its consumer. Queued events stay to be taken.
  bool End(const absl::Status& status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!ended_.ok()) return false;
    ended_ = status;
    const bool wake = armed_;
    armed_ = false;
    return wake;
  }

  // Runs the consumer's callback, unless the watch was cancelled.
  void Notify() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return;
      ++calling_;
    }
    const void* outer = running_ready;
    running_ready = this;
    ready_();
    running_ready = outer;
    absl::MutexLock lock(&mu_);
    --calling_;
  }

  // Ends the watch for good and waits until no `ready` call is running (but the one this
  // thread is inside of, if any).
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_) {
    const int own = running_ready == this ? 1 : 0;
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (ended_.ok()) ended_ = absl::CancelledError("the watch was cancelled");
    queue_.clear();
    backlog_ = 0;
    suppress_.clear();
    auto idle = [this, own]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calling_ <= own; };
    mu_.Await(absl::Condition(&idle));
  }

 private:
  const WatchRequest filter_;
  const std::function<void()> ready_;
  const size_t limit_;

  absl::Mutex mu_;
  std::deque<ClaimEventPtr> queue_ ABSL_GUARDED_BY(mu_);
  // The first backlog_ events of queue_ are initial state or replayed history: they do
  // not count against limit_.
  size_t backlog_ ABSL_GUARDED_BY(mu_) = 0;
  // Not OK once the watch has ended (overflow, close, cancel).
  absl::Status ended_ ABSL_GUARDED_BY(mu_);
  // A Poll found nothing: the next event (or the end) wakes the consumer.
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // `ready` calls running now.
  int calling_ ABSL_GUARDED_BY(mu_) = 0;
  // Claims whose initial-state event showed a change newer than the snapshot: events for
  // them up to that revision are dropped (the consumer has seen their result).
  absl::flat_hash_map<std::string, uint64_t> suppress_ ABSL_GUARDED_BY(mu_);
};

// What Subscribe returns: cancels the subscription when destroyed.
class WatchHub::Handle final : public ClaimWatch {
 public:
  Handle(std::shared_ptr<WatchHub> hub, SubscriptionPtr sub)
      : hub_(std::move(hub)), sub_(std::move(sub)) {}
  ~Handle() override { Cancel(); }

  absl::Status Poll(std::vector<ClaimEventPtr>* out, size_t max) override {
    return sub_->Poll(out, max);
  }
  void Cancel() override {
    hub_->Remove(sub_);
    sub_->Cancel();
  }

 private:
  const std::shared_ptr<WatchHub> hub_;
  const SubscriptionPtr sub_;
};

WatchHub::WatchHub(uint64_t revision, size_t history, size_t queue)
    : history_limit_(history),
      queue_limit_(queue),
      next_(revision + 1),
      published_(revision),
      settled_(revision),
      floor_(revision) {}

WatchHub::~WatchHub() = default;

uint64_t WatchHub::Reserve(uint64_t n) { return next_.fetch_add(n, std::memory_order_relaxed); }

uint64_t WatchHub::revision() const { return published_.load(std::memory_order_acquire); }

void WatchHub::Complete(uint64_t revision, ClaimEventPtr event) {
  std::vector<SubscriptionPtr> wake;
  {
    absl::MutexLock lock(&mu_);
    if (revision != settled_ + 1) {
      pending_.emplace(revision, std::move(event));
      return;
    }
    PublishLocked(event, &wake);
    settled_ = revision;
    while (!pending_.empty() && pending_.begin()->first == settled_ + 1) {
      PublishLocked(pending_.begin()->second, &wake);
      settled_ = pending_.begin()->first;
      pending_.erase(pending_.begin());
    }
  }
  for (const SubscriptionPtr& sub : wake) sub->Notify();
}

void WatchHub::PublishLocked(const ClaimEventPtr& event, std::vector<SubscriptionPtr>* wake) {
  if (event == nullptr) return;  // abandoned: nothing happened at this revision
  if (history_limit_ > 0) {
    history_.push_back(event);
    if (history_.size() > history_limit_) {
      floor_ = history_.front()->revision;
      history_.pop_front();
    }
  } else {
    floor_ = event->revision;
  }
  published_.store(event->revision, std::memory_order_release);
  OfferLocked(event, event->claim.owner, wake);
  OfferLocked(event, "", wake);  // the all-owners watches
}

void WatchHub::OfferLocked(const ClaimEventPtr& event, const std::string& owner,
                           std::vector<SubscriptionPtr>* wake) {
  auto it = subs_.find(owner);
  if (it == subs_.end()) return;
  std::vector<SubscriptionPtr>& subs = it->second;
  for (size_t i = 0; i < subs.size();) {
    Subscription::Offered o;
    if (subs[i]->Matches(event->claim)) o = subs[i]->Offer(event);
    if (o.wake) wake->push_back(subs[i]);
    if (o.keep) {
      ++i;
    } else {
      subs[i] = std::move(subs.back());
      subs.pop_back();
    }
  }
  if (subs.empty()) subs_.erase(it);
}

absl::StatusOr<std::unique_ptr<ClaimWatch>> WatchHub::Subscribe(WatchRequest request,
                                                                std::function<void()> ready,
                                                                Snapshot snapshot) {
  if (request.owner.empty() && !request.all_owners) {
    return absl::InvalidArgumentError("watch: owner is empty");
  }
  if (ready == nullptr) return absl::InvalidArgumentError("watch: no ready callback");
  const uint64_t start = request.start_revision;
  auto sub = std::make_shared<Subscription>(std::move(request), std::move(ready), queue_limit_);
  uint64_t snapshot_revision = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    const uint64_t current = published_.load(std::memory_order_relaxed);
    if (start > current) {
      return absl::OutOfRangeError(
          absl::StrCat("start_revision ", start, " is newer than the current revision ", current));
    }
    if (start > 0 && start < floor_) {
      return absl::OutOfRangeError(absl::StrCat(
          "start_revision ", start,
          " is older than the changes this server still keeps (a watch can resume from revision ",
          floor_, " on); list again and watch from the list's revision"));
    }
    if (start > 0) {
      auto first =
          std::upper_bound(history_.begin(), history_.end(), start,
                           [](uint64_t rev, const ClaimEventPtr& e) { return rev < e->revision; });
      for (auto it = first; it != history_.end(); ++it) {
        if (sub->Matches((*it)->claim)) sub->AddBacklog(*it);
      }
    }
    snapshot_revision = current;
    subs_[sub->filter().owner].push_back(sub);
  }
  if (start == 0) sub->SetInitial(snapshot_revision, snapshot(sub->filter()));
  return std::make_unique<Handle>(shared_from_this(), std::move(sub));
}

void WatchHub::Remove(const SubscriptionPtr& sub) {
  absl::MutexLock lock(&mu_);
  auto it = subs_.find(sub->filter().owner);
  if (it == subs_.end()) return;
  auto& subs = it->second;
  subs.erase(std::remove(subs.begin(), subs.end(), sub), subs.end());
  if (subs.empty()) subs_.erase(it);
}

void WatchHub::Close(absl::Status status) {
  std::vector<SubscriptionPtr> wake;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return;
    closed_ = status.ok() ? absl::UnavailableError("watches are closed") : std::move(status);
    for (auto& [owner, subs] : subs_) {
      for (SubscriptionPtr& sub : subs) {
        if (sub->End(closed_)) wake.push_back(std::move(sub));
      }
    }
    subs_.clear();
  }
  for (const SubscriptionPtr& sub : wake) sub->Notify();
}

size_t WatchHub::watches() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [owner, subs] : subs_) n += subs.size();
  return n;
}

}  // namespace sbx::allocator

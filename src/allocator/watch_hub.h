#pragma once
// The allocator's revision sequence and the fan-out of claim changes to watches
// (Allocator::Watch). Internal to sbx::allocator.
//
// Revisions are handed out by an atomic counter on the change paths (Reserve), written
// into the claim records, and handed back once the store has answered (Complete), in
// whatever order the commits finish. The hub publishes them strictly in revision order:
// a completed revision waits in a small reorder buffer until every lower one has been
// completed too (an abandoned one, whose commit failed, is completed with no event).
// Publishing appends the event to a bounded history (for watches that resume from a
// revision) and to the queue of every matching watch of the claim's owner. So the only
// lock a change takes here is the hub's, once, on the thread that completes it (usually
// the store's committer), and never across a store commit.
//
// A watch's queue is bounded: a consumer that falls too far behind is ended with ABORTED
// instead of holding memory or slowing anyone down. Its `ready` callback runs with no
// lock of the hub or the watch held.
//
// Thread-safety: every method may be called from any thread concurrently.
// Lifetime: held by std::shared_ptr; watches keep the hub alive, so they may outlive the
// allocator (Close ends them first).

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "src/allocator/watch.h"
#include "src/store/records.h"

namespace sbx::allocator {

class WatchHub : public std::enable_shared_from_this<WatchHub> {
 public:
  // `revision`: the last revision already used (recovered from the store); the sequence
  // continues after it. `history`: changes kept for resuming watches. `queue`: events a
  // watch may hold before it is ended with ABORTED.
  WatchHub(uint64_t revision, size_t history, size_t queue);
  ~WatchHub();

  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // Reserves `n` consecutive revisions and returns the first. Lock-free. Every reserved
  // revision must be completed exactly once, or publishing stops at it.
  uint64_t Reserve(uint64_t n = 1);

  // Revision `revision` is settled: `event` (with that revision) is its change, durable and
  // visible in the claim table; nullptr when the change was abandoned. Publishes it and
  // every later settled revision that waited for it, then wakes the watches that were
  // waiting for events.
  void Complete(uint64_t revision, ClaimEventPtr event) ABSL_LOCKS_EXCLUDED(mu_);

  // The last revision published (Allocator::revision).
  uint64_t revision() const;

  // Lists the claims of an initial state (start_revision 0); runs outside the hub's lock,
  // after the watch is registered.
  using Snapshot = absl::FunctionRef<std::vector<store::ClaimRecord>(const WatchRequest&)>;

  // Starts a watch (Allocator::Watch documents the contract and the errors).
  [[nodiscard]] absl::StatusOr<std::unique_ptr<ClaimWatch>> Subscribe(WatchRequest request,
                                                                      std::function<void()> ready,
                                                                      Snapshot snapshot)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Ends every watch with `status` and refuses new ones with it. Idempotent (the first
  // status stays).
  void Close(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_);

  // Number of watches registered (for tests and metrics).
  size_t watches() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Subscription;
  class Handle;
  using SubscriptionPtr = std::shared_ptr<Subscription>;

  // Offers `event` to the watches registered under `owner` ("" = all owners).
  void OfferLocked(const ClaimEventPtr& event, const std::string& owner,
                   std::vector<SubscriptionPtr>* wake) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishLocked(const ClaimEventPtr& event, std::vector<SubscriptionPtr>* wake)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remove(const SubscriptionPtr& sub) ABSL_LOCKS_EXCLUDED(mu_);

  const size_t history_limit_;
  const size_t queue_limit_;

  // The next revision to hand out. Only uniqueness matters (ordering is the reorder
  // buffer's job), so relaxed.
  std::atomic<uint64_t> next_;
  // The last published revision. Stored (release) under mu_ after the change is visible
  // in the claim table; loaded (acquire) by readers that then read the table, so that they
  // see every change up to it.
  std::atomic<uint64_t> published_;

  mutable absl::Mutex mu_;
  // Every revision up to settled_ has been completed.
  uint64_t settled_ ABSL_GUARDED_BY(mu_);
  // Completed revisions above settled_ + 1, waiting for the ones before them (null:
  // abandoned). Small: commits finish roughly in the order they were reserved.
  absl::btree_map<uint64_t, ClaimEventPtr> pending_ ABSL_GUARDED_BY(mu_);
  // The last history_limit_ published events, oldest first.
  std::deque<ClaimEventPtr> history_ ABSL_GUARDED_BY(mu_);
  // Every event with a revision above floor_ is in history_: the oldest revision a watch
  // may resume from.
  uint64_t floor_ ABSL_GUARDED_BY(mu_);
  // Live watches by owner.
  absl::flat_hash_map<std::string, std::vector<SubscriptionPtr>> subs_ ABSL_GUARDED_BY(mu_);
  // Not OK once closed.
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::allocator

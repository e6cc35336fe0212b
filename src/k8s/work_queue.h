#pragma once
// WorkQueue: the keyed queue between informers and a controller's workers. A key is in
// the queue at most once; a key being worked on is never handed to a second worker, and
// if it is added meanwhile it comes back once the first worker is done (so no change is
// lost and no key is reconciled twice at once). Keys can be added after a delay (timers
// such as expiry) and with per-key exponential backoff for retries after errors.
//
// Thread-safety: all methods may be called from any thread.
// Lifetime: ShutDown wakes every Get (which then returns false); destroy after the
// workers are joined.

#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/common/clock.h"

namespace sbx::k8s {

struct WorkQueueOptions {
  // Backoff of AddRateLimited: base * 2^(failures-1), at most max.
  absl::Duration base_backoff = absl::Milliseconds(5);
  absl::Duration max_backoff = absl::Seconds(30);
  // Time of delayed adds and backoffs; the real clock when null. Must outlive the queue.
  const Clock* clock = nullptr;
};

class WorkQueue {
 public:
  explicit WorkQueue(WorkQueueOptions options = {})
      : options_(options), clock_(options.clock ? options.clock : &Clock::Real()) {}

  void Add(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds `key` once `delay` has passed (an earlier pending add for it wins).
  void AddAfter(const std::string& key, absl::Duration delay) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds `key` after its backoff, which doubles with each call until Forget.
  void AddRateLimited(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Resets `key`'s backoff (after a success).
  void Forget(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  int Failures(const std::string& key) const ABSL_LOCKS_EXCLUDED(mu_);

  // Blocks for the next key; false once shut down.
  bool Get(std::string* key) ABSL_LOCKS_EXCLUDED(mu_);
  // Marks `key` (from Get) done; it is queued again if it was added meanwhile.
  void Done(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

  void ShutDown() ABSL_LOCKS_EXCLUDED(mu_);
  // Keys waiting (not counting those being worked on or delayed).
  size_t Depth() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t Delayed() const ABSL_LOCKS_EXCLUDED(mu_);
  // Gets blocked waiting for a key (for tests that must know a worker is waiting).
  int Waiting() const ABSL_LOCKS_EXCLUDED(mu_);
  // True when no key is queued or being worked on (delayed keys do not count): for tests
  // that must know that everything added so far has been reconciled.
  bool Idle() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void AddLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PromoteDueLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkQueueOptions options_;
  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> dirty_ ABSL_GUARDED_BY(mu_);       // queued or re-added
  absl::flat_hash_set<std::string> processing_ ABSL_GUARDED_BY(mu_);  // handed out by Get
  std::multimap<absl::Time, std::string> delayed_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::Time> delayed_at_ ABSL_GUARDED_BY(mu_);
  // Bumped by every AddAfter, so that a Get waiting for a later deadline looks again.
  uint64_t delayed_changes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> failures_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sbx::k8s

#pragma once
// What a watch of claim changes delivers (Allocator::Watch): the events, the request and
// the subscription. Part of the allocator's interface (allocator.h includes it); apart so
// that watch_hub.h, which serves them, need not include allocator.h.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "src/store/records.h"

namespace sbx::allocator {

// One change of a claim, as a watch delivers it.
struct ClaimEvent {
  enum class Type : uint8_t {
    kAdded = 1,     // the claim was granted, or is part of a watch's initial state
    kModified = 2,  // renewed, suspended, resumed, released, expired or lost
    kDeleted = 3,   // its record left the idempotency window (claim: its last value)
  };
  Type type = Type::kAdded;
  // Revision of the change; for the initial state, the revision of the snapshot.
  uint64_t revision = 0;
  // Part of the initial state of a watch from revision 0.
  bool initial = false;
  // The claim after the change. claim.revision is the revision of its last change: the
  // event's revision, except in the initial state, where it may be newer than the
  // snapshot (a change racing with the snapshot; its own event is then not repeated).
  store::ClaimRecord claim;
};
using ClaimEventPtr = std::shared_ptr<const ClaimEvent>;

struct WatchRequest {
  std::string owner;  // required (unless all_owners): a watch sees one tenant's claims
  // Every owner's claims (owner is ignored). For sbx's own components, never for a
  // tenant's request.
  bool all_owners = false;
  std::string pool;  // empty: all pools
  // Every pair must match the claim's labels (labels never change after the claim).
  std::map<std::string, std::string> labels;
  // 0: first the initial state (an ADDED event per matching claim, initial = true, all
  // with the current revision), then every later change. N > 0: every change with a
  // revision above N.
  uint64_t start_revision = 0;
  // Whether the initial state includes ended claims still in the idempotency window.
  bool include_ended = true;
};

// A subscription to claim changes (Allocator::Watch). Events arrive in revision order,
// each after its change is durable.
//
// Thread-safety: Poll and Cancel may be called from any thread; `ready` (see Watch) may
// run concurrently with Poll.
// Lifetime: destroying it cancels it. It may outlive the Allocator (it then reports
// UNAVAILABLE).
class ClaimWatch {
 public:
  virtual ~ClaimWatch() = default;
  // Appends up to `max` queued events to `*out`. OK while the watch lives, whether or not
  // it appended anything; once the watch has ended and nothing is left to take, why it
  // ended: ABORTED (more than AllocatorOptions::watch_queue events waited; the consumer
  // read too slowly and should resume from the last revision it got), UNAVAILABLE (the
  // allocator shut down or closed its watches), CANCELLED (Cancel was called).
  [[nodiscard]] virtual absl::Status Poll(std::vector<ClaimEventPtr>* out, size_t max) = 0;
  // Ends the watch. When it returns, `ready` is not running and will not run again,
  // unless Cancel is called from inside `ready` itself (then that call is the last).
  virtual void Cancel() = 0;
};

}  // namespace sbx::allocator

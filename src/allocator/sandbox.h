#pragma once
// A sandbox as the allocator tracks it: identity, where to reach it, and one atomic state
// word whose Warm→Claimed transition happens exactly once.
//
// Thread-safety: the immutable fields are set before the object is shared; `state` is
// changed only by compare-and-swap, `gone` is atomic and `claim` is guarded by `mu`.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace sbx::allocator {

class Pool;
struct ClaimEntry;  // defined in allocator_impl.h

enum class SandboxState : uint8_t {
  kWarm = 0,     // in its pool's ready set, free to claim
  kClaimed = 1,  // held by exactly one claim (or being committed for one)
  kDead = 2,     // died or was deleted while warm; skipped by claims, never handed out
  kRetired = 3,  // its claim ended; going to deletion, never reused
};

const char* SandboxStateName(SandboxState s);

// Labels of a node (Kubernetes: the Node object's metadata.labels).
using NodeLabels = std::map<std::string, std::string>;
// Shared by the sandboxes of a node (the allocator interns them per node): a Node has tens
// of labels, and a copy in every sandbox would cost more than the rest of it.
using NodeLabelsPtr = std::shared_ptr<const NodeLabels>;

struct Sandbox {
  Sandbox(std::string id_in, std::string endpoint_in, std::string node_in, Pool* pool_in,
          absl::Time created_in, SandboxState initial, NodeLabelsPtr node_labels_in = nullptr)
      : id(std::move(id_in)),
        endpoint(std::move(endpoint_in)),
        node(std::move(node_in)),
        node_labels(std::move(node_labels_in)),
        pool(pool_in),
        created(created_in),
        state(initial) {}

  // Moves the state from `from` to `to` if and only if it is `from`. Returns whether this
  // call made the transition. acq_rel: a winner sees everything the previous owner wrote
  // before its own transition, and publishes its writes to the next one.
  bool Transition(SandboxState from, SandboxState to) {
    return state.compare_exchange_strong(from, to, std::memory_order_acq_rel,
                                         std::memory_order_acquire);
  }
  SandboxState Load() const { return state.load(std::memory_order_acquire); }

  const std::string id;
  const std::string endpoint;
  const std::string node;
  // The labels of `node` when the runtime reported the sandbox; null when it reported none
  // (the local runtime).
  const NodeLabelsPtr node_labels;
  // The owning pool; pools are never freed while the allocator lives (see Allocator).
  Pool* const pool;
  const absl::Time created;
  // The state word. Atomic because claims, death reports and releases race on it from
  // different threads without a lock; see Transition for the memory order.
  std::atomic<SandboxState> state;
  // Set when the runtime reports the sandbox gone. Atomic because the report races with
  // the commit of a claim on it; seq_cst pairs the store here with the load in the claim's
  // activation (see Allocator's SandboxGone).
  std::atomic<bool> gone{false};

  // The count of claimed sandboxes on this sandbox's node kept by the node-aware ready set
  // of its pool (ready_set.h), or null when the pool's policy counts nothing (fifo). Set
  // by that ready set's Push, and by the pool when the sandbox is claimed without passing
  // through the set; read by the pool when the sandbox becomes claimed and when it stops
  // being claimed. Not atomic: only the holder of the sandbox touches it (the ready set
  // while warm, then the one claim that won the Warm->Claimed transition), and each
  // hand-over goes through that transition or a lock.
  std::atomic<int64_t>* node_claims = nullptr;

  // The claim holding it (empty while warm), for death reports.
  absl::Mutex mu;
  std::weak_ptr<ClaimEntry> claim ABSL_GUARDED_BY(mu);
};

using SandboxPtr = std::shared_ptr<Sandbox>;

}  // namespace sbx::allocator

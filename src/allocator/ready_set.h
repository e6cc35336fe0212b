#pragma once
// The ready set of a pool: warm sandboxes waiting to be claimed, behind a selection
// policy that decides which one a claim gets.
//
// Policies (a pool's `selection_policy`):
// - "fifo" (the default): the oldest warm sandbox, on one lock-free queue. Knows nothing
//   of nodes and ignores a claim's node preference.
// - "spread": a sandbox on the node with the fewest claimed sandboxes of the pool, so
//   that one node going down takes as few claims with it as possible.
// - "pack": a sandbox on the node with the most claimed sandboxes of the pool (that
//   still has a warm one), so that the other nodes empty and can be scaled down.
// spread and pack honour a claim's node preference (PopPreferring): among the nodes
// whose labels include every preferred label, then, if none of them has a warm sandbox,
// among all nodes. Node labels come with each sandbox from the runtime (Kubernetes: the
// labels of the pod's node, such as topology.kubernetes.io/zone) and are taken when the
// ready set first sees a node: topology labels do not change in a node's life.
//
// Thread-safety: Push, Pop, PopPreferring, SizeApprox and ClaimCounter may be called
// concurrently from any threads. Pop and PopPreferring are lock-free; Push of a sandbox
// on a node the set has not seen before takes a mutex (once per node).
// Lifetime: the counters ClaimCounter returns live as long as the set.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/allocator/sandbox.h"

namespace sbx::allocator {

class SelectionPolicy {
 public:
  virtual ~SelectionPolicy() = default;
  // Adds a warm sandbox. A node-aware set points the sandbox's node_claims at the count
  // of its node.
  virtual void Push(SandboxPtr sandbox) = 0;
  // Removes and returns the sandbox this policy selects, or nullptr when empty. The
  // sandbox may have died since it was pushed: callers claim it with a CAS and skip it
  // when that fails.
  virtual SandboxPtr Pop() = 0;
  // Pop, preferring a sandbox whose node has every label of `prefer` and taking any
  // sandbox when none has them. Policies that know nothing of nodes ignore `prefer`.
  virtual SandboxPtr PopPreferring(const NodeLabels& prefer) {
    (void)prefer;
    return Pop();
  }
  // Approximate number of entries (including dead ones not yet popped).
  virtual size_t SizeApprox() const = 0;
  // The count of claimed sandboxes on `sandbox`'s node that this policy selects by, for a
  // sandbox claimed without passing through the set (a waiting claim served directly, a
  // cold start, recovery); nullptr when the policy counts nothing. The pool adds and
  // subtracts through Sandbox::node_claims.
  virtual std::atomic<int64_t>* ClaimCounter(const Sandbox& sandbox) {
    (void)sandbox;
    return nullptr;
  }
  // Switches this set to policy `name` in place if it can (spread and pack share one
  // set, so that a switch keeps the counts); false when the pool must move its sandboxes
  // to a new set instead.
  virtual bool SwitchTo(absl::string_view name) {
    (void)name;
    return false;
  }
};

// FIFO on a lock-free queue (moodycamel::ConcurrentQueue from Debian's
// libconcurrentqueue-dev). Order is FIFO per producing thread; sandboxes are produced by
// the reconciler, so in practice the oldest warm sandbox goes first.
std::unique_ptr<SelectionPolicy> NewFifoReadySet();

// A node-aware set ("spread" or "pack"; CHECKs that `name` is one of them).
std::unique_ptr<SelectionPolicy> NewNodeReadySet(absl::string_view name);

// The names NewSelectionPolicy knows, for messages (allocator.h's KnownSelectionPolicies;
// IsSelectionPolicy is NewSelectionPolicy's verdict).
inline constexpr absl::string_view kKnownSelectionPolicies = "fifo, spread, pack";

// The policy named `name` ("fifo", "" for fifo, "spread", "pack"). INVALID_ARGUMENT,
// naming the value and the known ones, for an unknown name.
[[nodiscard]] absl::StatusOr<std::unique_ptr<SelectionPolicy>> NewSelectionPolicy(
    absl::string_view name);

}  // namespace sbx::allocator

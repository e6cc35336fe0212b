#pragma once
// The ready set of a pool: warm sandboxes waiting to be claimed, behind a selection
// policy so that spread/pack-by-node policies can plug in beside FIFO.
//
// Thread-safety: Push and Pop may be called concurrently from any threads.

#include <cstddef>
#include <memory>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "src/allocator/sandbox.h"

namespace sbx::allocator {

class SelectionPolicy {
 public:
  virtual ~SelectionPolicy() = default;
  // Adds a warm sandbox.
  virtual void Push(SandboxPtr sandbox) = 0;
  // Removes and returns the sandbox this policy selects, or nullptr when empty. The
  // sandbox may have died since it was pushed: callers claim it with a CAS and skip it
  // when that fails.
  virtual SandboxPtr Pop() = 0;
  // Approximate number of entries (including dead ones not yet popped).
  virtual size_t SizeApprox() const = 0;
};

// FIFO on a lock-free queue (moodycamel::ConcurrentQueue from Debian's
// libconcurrentqueue-dev). Order is FIFO per producing thread; sandboxes are produced by
// the reconciler, so in practice the oldest warm sandbox goes first.
std::unique_ptr<SelectionPolicy> NewFifoReadySet();

// The policy named `name` ("fifo"). INVALID_ARGUMENT for an unknown name.
absl::StatusOr<std::unique_ptr<SelectionPolicy>> NewSelectionPolicy(absl::string_view name);

}  // namespace sbx::allocator

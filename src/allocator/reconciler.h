#pragma once
// What the allocator tells the reconciler. The reconciler (per runtime) owns all refill
// and clean-up writes to the runtime; the allocator never waits for it.
//
// Thread-safety: implementations must accept calls from any thread, concurrently, and
// must not block or call back into the allocator from inside the call.

#include <string>

#include "src/store/records.h"

namespace sbx::allocator {

class Reconciler {
 public:
  virtual ~Reconciler() = default;
  // Pool `pool` has fewer warm sandboxes than its target (Allocator::GetPoolStatus says
  // how many). Called on the claim path after a take: it must be cheap (set a flag,
  // wake a thread). Calls for the same pool may repeat.
  virtual void PoolBelowTarget(const std::string& pool) = 0;
  // `sandbox` is no longer needed (its claim ended, it died, or its pool was deleted):
  // delete it from the runtime.
  virtual void RetireSandbox(const store::SandboxRecord& sandbox) = 0;
};

}  // namespace sbx::allocator

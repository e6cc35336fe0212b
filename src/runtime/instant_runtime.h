#pragma once
// The instant runtime: sandboxes that exist only as names. Create succeeds at once (on the
// caller's thread) with a new id and no process behind it; Delete, Suspend and Resume
// succeed for ids it made. It is for load tests of the claim path (`sbx-server --runtime
// instant`, `sbx-loadgen`), where a real runtime could not refill pools at thousands of
// sandboxes per second; nothing can run inside its sandboxes (their endpoint is
// "instant:<id>", which SandboxService refuses with FAILED_PRECONDITION).
//
// Thread-safety: every method may be called from any thread.

#include <memory>

#include "src/runtime/runtime.h"

namespace sbx::runtime {

std::unique_ptr<Runtime> NewInstantRuntime();

}  // namespace sbx::runtime

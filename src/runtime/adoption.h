#pragma once
// What a local runtime finds when it starts: the sandboxes of an earlier run under its
// root, adopted when they are alive and provably theirs, killed and removed otherwise (see
// "Lifetime" in bubblewrap_runtime.h). Only what the kernel says and what a runtime wrote
// in folders no sandbox reaches is believed: the state file must be a regular file of ours
// in a real folder of ours; the top process must be the same process (pid and start time)
// and work in that folder, and its daemon must accept connections; the socket and cgroups
// follow from the id.
//
// Thread-safety: AdoptOrCleanUp runs once, in Make(), before the runtime's threads start;
// the caller holds the root's lock, so no other runtime starts sandboxes there meanwhile.
// Lifetime: the adopted sandboxes go to the runtime's table; the rest are gone on return.
// Internal to sbx::runtime_local; consumers use bubblewrap_runtime.h.

#include <string>
#include <vector>

#include "src/runtime/cgroups.h"
#include "src/runtime/local_sandbox.h"

namespace sbx::runtime::local {

// Adopts the live sandboxes under `root` (absolute, normalized) and cleans up everything
// else there: dead, half-made and older sandboxes with their cgroups, and stray processes
// found by the folder they work in. Returns the adopted ones (with pidfds and their output
// FIFOs open); logs what it did.
std::vector<SandboxPtr> AdoptOrCleanUp(const std::string& root, const Cgroups& cgroups);

}  // namespace sbx::runtime::local

#pragma once
// How Make() learns what isolation this machine gives: the daemon's binary opened by
// descriptor, the server's own files to hide and where they are masked, the seccomp
// filter, and a probe that runs `sbx-sandboxd --version` in a sandbox made as the real
// ones are (same user, descriptors, no_new_privs, masks), so that a bubblewrap installed
// yet unusable (no user namespaces for this uid, seccomp refused, a mask it cannot make)
// is found at start, with the true reason.
//
// Thread-safety: FindIsolation runs once, in Make(), on the caller's thread; it keeps no
// state.
// Lifetime: the Isolation it returns is the runtime's for its whole life (it holds the
// daemon's descriptor).
// Internal to sbx::runtime_local; consumers use bubblewrap_runtime.h.

#include <string>

#include "absl/status/statusor.h"
#include "src/runtime/bubblewrap_runtime.h"
#include "src/runtime/local_sandbox.h"

namespace sbx::runtime::local {

// The isolation sandboxes get under `options` with the sandbox root `root` (absolute,
// normalized; always hidden). FAILED_PRECONDITION when the daemon cannot be opened, a
// server file cannot be masked (SystemMasks, or bubblewrap cannot make the masks), or
// bubblewrap cannot isolate here and options.allow_unisolated is false, naming what to
// install or enable. With allow_unisolated, a failing bubblewrap yields the plain-process
// fallback (isolated false), loudly logged.
[[nodiscard]] absl::StatusOr<Isolation> FindIsolation(const BubblewrapRuntimeOptions& options,
                                                      const std::string& root);

}  // namespace sbx::runtime::local

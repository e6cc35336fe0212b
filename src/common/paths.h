#pragma once
// Checks of paths that sbx passes on to a sandbox runtime (a local template's bind
// mounts): one definition of "a normal absolute path" and of the paths inside a local
// sandbox that belong to the runtime, shared by the server (which refuses bad templates
// when they are put) and the runtime (which may check again before it mounts).
//
// Thread-safety: free functions without state.

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sbx {

// Longest path accepted (PATH_MAX on Linux, with its terminating NUL).
inline constexpr size_t kMaxPathBytes = 4095;

// OK when `path` is absolute and normal: it starts with "/", has no empty component
// ("//"), no "." or ".." component, no trailing "/" (except "/" itself), no NUL byte and
// at most kMaxPathBytes bytes, so that it means the same before and after any
// normalization. Otherwise INVALID_ARGUMENT "<what> \"<path>\" <the rule broken>" (the
// path C-escaped).
[[nodiscard]] absl::Status CheckNormalAbsolutePath(absl::string_view what, absl::string_view path);

// Whether `path` is `dir` or lies under it, component by component ("/run/sbxdata" is
// not under "/run/sbx"). Both must be normal absolute paths.
bool PathIsWithin(absl::string_view path, absl::string_view dir);

// The paths inside a local sandbox that its runtime mounts itself: the daemon's socket
// folder, the workspace and the daemon's binary (all under /run/sbx), /proc and /dev.
inline constexpr absl::string_view kSandboxControlPaths[] = {"/run/sbx", "/proc", "/dev"};

// OK when `target` is a normal absolute path (CheckNormalAbsolutePath) that neither is,
// lies under, nor covers (is an ancestor of, like "/" or "/run") any of
// kSandboxControlPaths, so that a bind mount there cannot hide or replace what the
// runtime put there. Otherwise INVALID_ARGUMENT naming `what`, the target and the rule.
[[nodiscard]] absl::Status CheckSandboxMountTarget(absl::string_view what,
                                                   absl::string_view target);

}  // namespace sbx

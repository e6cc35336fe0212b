#pragma once
// The command line of a local sandbox: bubblewrap's isolation options, the system part of
// its root (the host's system folders read-only, with /etc's secrets and the server's own
// files masked), the workspace, the daemon and the template's mounts, or the daemon alone
// in the plain fallback; the checks that keep the server's files out of template mounts;
// and the probe's command line (Make() runs it once to see that bubblewrap isolates).
//
// Thread-safety: the functions keep no state and may run on any thread. SystemMasks and
// CheckMounts look at the host's files (lstat, symbolic links) when called.
// Lifetime: the arguments are plain strings, copied into each spawn.
// Internal to sbx::runtime_local; consumers use bubblewrap_runtime.h.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/runtime/bubblewrap_runtime.h"
#include "src/runtime/image_root.h"
#include "src/runtime/local_sandbox.h"

namespace sbx::runtime::local {

// Where the masks of the hidden paths go in the system folders, with /etc's secrets. A
// mask on a file would not survive the file's replacement by rename (the mount goes with
// the old file: a tokens reload, a renewed key, an editor's save), so a hidden file is
// masked by masking its folder; a hidden folder is masked itself. The mask moves up to the
// first folder on the way that the sandbox may not search (own_uids: with a host uid of
// its own and no groups). A mask inside another one is dropped. FAILED_PRECONDITION naming
// the path when a hidden file lies right in a system folder (masking that folder would
// hide the system) or a hidden folder holds one.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> SystemMasks(
    const std::vector<std::string>& hidden, bool own_uids);

// The system part of every sandbox's root: /usr, /etc and the top-level /bin, /sbin,
// /lib* (as the host has them: folders bound read-only, symbolic links recreated), the
// masks (SystemMasks) in them, and fresh /dev, /proc, /tmp, /var/tmp and /run.
std::vector<std::string> SystemArgs(const std::vector<std::string>& masks);

// OK, or INVALID_ARGUMENT naming the server's file when a template mount's source holds
// one of the hidden paths or lies in one. The source's symbolic links are resolved as
// bubblewrap will.
[[nodiscard]] absl::Status CheckMounts(const LocalSpec& spec,
                                       const std::vector<std::string>& hidden);

// The bubblewrap options of every sandbox: a user namespace in which the workload is
// uid:gid (1000 on the host's root, the image's User in an image) with no capability (and
// which cannot nest another), new pid/ipc/uts/cgroup namespaces, its own session, and the
// seccomp filter (on kSeccompFd).
// (The host-root workload's uid and gid are kUidInside.)
inline constexpr uid_t kUidInside = 1000;
std::vector<std::string> IsolationArgs(const std::string& bwrap, uid_t uid = kUidInside,
                                       gid_t gid = kUidInside);

// The command line of sandbox `id` with host folder `dir`: bwrap with the daemon inside
// (iso.isolated; system_args is SystemArgs(iso.masks)), or the daemon alone (the plain
// fallback, its workspace in `dir`). With `image`: sbx-rootfs first (ImageRootPrefix), the
// image's copy-on-write root instead of the host's system folders, fresh /dev, /proc, /tmp
// and /run, the daemon run by the host's loader with its own libraries (/run/sbx/lib), the
// image's user, environment and working folder (the template's env wins). host_uid is the
// sandbox's host uid. INVALID_ARGUMENT when a template mount would show the server's files
// (CheckMounts); FAILED_PRECONDITION for an image without isolation. `snapshot_dir`
// (with an image only): the sandbox starts at that snapshot, its files shared read-only
// under the sandbox's own layers (ImageRootPrefix).
[[nodiscard]] absl::StatusOr<std::vector<std::string>> SandboxArgv(
    const std::string& id, const std::string& dir, const LocalSpec& spec,
    const BubblewrapRuntimeOptions& options, const Isolation& iso,
    const std::vector<std::string>& system_args, const ImageRun* image = nullptr,
    uid_t host_uid = 0, const std::string& snapshot_dir = "");

// The probe's command line: a sandbox made as the real ones are (network namespace, the
// system folders with `masks`, the daemon by descriptor) running `sbx-sandboxd --version`.
std::vector<std::string> ProbeArgv(const std::string& bwrap, const std::vector<std::string>& masks);

}  // namespace sbx::runtime::local

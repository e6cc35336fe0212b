#pragma once
// Sandboxes of an OCI image, on the runtime's side: what a sandbox takes from its image
// (the user it runs as, its environment, HOME and working folder: ImageRun, resolved from
// the image's config and its own /etc/passwd and /etc/group), the daemon's shared
// libraries (an image has none of the host's, so the daemon runs through the host's
// loader from a folder of its own, /run/sbx/lib), and the command line that puts
// sbx-rootfs (image_root_helper.h) in front of bubblewrap. Also the removal of a host
// folder whose contents the sandbox made unreadable to its owner (its layer's folders).
//
// Thread-safety: the functions keep no state. ResolveImageRun reads the image's files
// (beneath its root, never following a link out of it); DaemonLibraries runs `ldd` once.
// Lifetime: plain values.
// Internal to sbx::runtime_local; consumers use bubblewrap_runtime.h.

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx::runtime::local {

// Where the daemon's libraries and the host's loader are seen in an image sandbox, and
// the folder of the runtime's root that holds their copies.
inline constexpr char kDaemonLibFolder[] = ".daemon-lib";
inline constexpr char kDaemonLibDir[] = "/run/sbx/lib";
inline constexpr char kDaemonLoader[] = "/run/sbx/lib/ld.so";

// What one image gives each of its sandboxes.
struct ImageRun {
  std::string digest;
  std::string rootfs;  // the cache's unpacked root, absolute
  uid_t uid = 0;       // the image's User, inside the sandbox's user namespace
  gid_t gid = 0;
  // The image's Env in order ("K=V" split at the first "="), then HOME when it has none
  // (the user's home in the image's /etc/passwd, else "/").
  std::vector<std::pair<std::string, std::string>> env;
  std::string working_dir;  // absolute, or empty (the workspace)
};

// The ImageRun of image `digest` unpacked at `rootfs`, with its config's User, Env and
// WorkingDir. User is "", "0", "NAME", "UID", "NAME:GROUP" or "UID:GID"; names are looked
// up in the image's /etc/passwd and /etc/group (read beneath the image's root, at most 4
// MiB). INVALID_ARGUMENT naming the image when a name is unknown, a number is out of range
// or WorkingDir is not absolute.
[[nodiscard]] absl::StatusOr<ImageRun> ResolveImageRun(const std::string& digest,
                                                       const std::string& rootfs,
                                                       const std::vector<std::string>& env,
                                                       const std::string& user,
                                                       const std::string& working_dir);

// The daemon's libraries as (host path, file name) and, first, the loader as
// (host path, "ld.so"), from `ldd` of the daemon's binary. Empty for a static binary.
// FAILED_PRECONDITION naming the library when one is not found.
[[nodiscard]] absl::StatusOr<std::vector<std::pair<std::string, std::string>>> DaemonLibraries(
    const std::string& sandboxd_path);

// Copies `libs` (DaemonLibraries) into the folder `dir` (made anew, mode 0755, files
// 0755), which image sandboxes see read-only at /run/sbx/lib: one bind mount instead of
// one per library (each costs bubblewrap two mount calls), and the daemon keeps the
// libraries it was started with when the host's are upgraded. FAILED_PRECONDITION naming
// the file that could not be copied.
[[nodiscard]] absl::Status MakeDaemonLibDir(
    const std::string& dir, const std::vector<std::pair<std::string, std::string>>& libs);

// The sbx-rootfs command line that comes before bubblewrap's for a sandbox of `image` with
// host folder `dir`: idmapped to host_uid when sbx is root (own_uids), the runtime's own
// mount points reset, its own layer a tmpfs of `layer_bytes`, `strict_targets` (the
// template's mount targets, the working folder) checked for links. With `snapshot_dir`
// (absolute: a snapshot's folder), the sandbox starts at that snapshot: its layer and
// workspace shared read-only under the sandbox's own (the workspace's own layer a tmpfs
// of `workspace_bytes`), and bubblewrap must bind WorkspaceMount(dir) as the workspace.
std::vector<std::string> ImageRootPrefix(const std::string& helper, const ImageRun& image,
                                         const std::string& dir, bool own_uids, uid_t host_uid,
                                         int64_t layer_bytes,
                                         const std::vector<std::string>& strict_targets,
                                         const std::string& snapshot_dir = "",
                                         int64_t workspace_bytes = 0);

// Where sbx-rootfs mounts the workspace of a sandbox that starts at a snapshot, in its
// host folder `dir`; and where the workspace's own layer (overlayfs's upper folder) is.
std::string WorkspaceMount(const std::string& dir);
inline constexpr char kWorkspaceUpper[] = "wslayer/upper";

// Removes `path` and everything in it, making folders of its owner searchable and writable
// first where the sandbox left them otherwise (as overlayfs leaves work/work). Never
// follows a symbolic link. Returns false when something stayed.
bool RemoveTree(const std::string& path);

}  // namespace sbx::runtime::local

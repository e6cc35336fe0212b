#pragma once
// The local runtime's snapshots on disk: snapshots_dir/<id>/ holds `root/` (a copy of the
// sandbox's own overlay layer, for a sandbox of an image) and `workspace/` (a copy of its
// workspace). A snapshot is made in <id>.partial/, synced (syncfs), renamed to <id>/ and
// its parent folder synced: a crash leaves a whole snapshot or a .partial folder, which
// SweepPartialSnapshots removes when the runtime starts.
//
// Thread-safety: the functions are reentrant; callers serialize work on one sandbox (its
// op_mu) and one snapshot id. Internal to sbx::runtime_local.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/runtime/local_sandbox.h"
#include "src/runtime/proc.h"
#include "src/runtime/snapshot_copy.h"

namespace sbx::runtime::local {

inline constexpr char kPartialSuffix[] = ".partial";
inline constexpr char kSnapshotRootName[] = "root";
inline constexpr char kSnapshotWorkspaceName[] = "workspace";

// INVALID_ARGUMENT unless `id` is 1 to 64 of [a-z0-9-] (no "." or "/": a file name).
[[nodiscard]] absl::Status CheckSnapshotId(const std::string& id);

// Opens (and makes, mode 0700) the snapshots folder; FAILED_PRECONDITION naming it when it
// cannot, or when it is a symbolic link or not owned by this process's uid.
[[nodiscard]] absl::StatusOr<Fd> OpenSnapshotsDir(const std::string& path);

// Removes every <id>.partial folder (a snapshot a crash interrupted); returns how many.
int SweepPartialSnapshots(int dir);

// The ids of the whole snapshots in the folder.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ListSnapshotIds(int dir);

// Copies the file system of `sb` (frozen by the caller) into snapshot `id` of `dir`:
// its layer when it has an image, its workspace always. `base` (a folder name in `dir`,
// or empty) is the snapshot an image sandbox started at (it shares that snapshot's files
// read-only, image_root_helper.h): the new snapshot is then the base's files (hard-linked)
// with the sandbox's own layers applied over them (MergeTree), whole by itself, so that
// no snapshot ever needs another; `image_rootfs` is then the image's unpacked root (where
// the sandbox's whiteouts are checked against). Errors as Runtime::Snapshot; on error
// nothing of the snapshot is left.
[[nodiscard]] absl::StatusOr<CopyStats> CaptureSandbox(const Sandbox& sb, bool isolated, int dir,
                                                       const std::string& id,
                                                       const CopyCharge& charge,
                                                       const std::string& base = "",
                                                       const std::string& image_rootfs = "");

// Reset: copies snapshot `id`'s workspace into the workspace of `sb` (a sandbox just
// started, frozen by the caller), each entry given to uid and gid `owner` when owner >= 0.
// NOT_FOUND when the snapshot has no files; CopyInto's errors, naming the sandbox.
[[nodiscard]] absl::Status RestoreWorkspace(const Sandbox& sb, bool isolated, int dir,
                                            const std::string& id, int64_t owner);

}  // namespace sbx::runtime::local

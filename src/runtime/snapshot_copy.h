#pragma once
// Copies a sandbox's folder (its root's upper layer, its workspace) into a snapshot, as
// root, from files the sandbox controls. The sandbox is frozen while this runs, but the
// copy trusts nothing in the tree:
// - every entry is lstat'ed (fstatat with AT_SYMLINK_NOFOLLOW) before anything else, and
//   opened relative to its folder's descriptor with O_NOFOLLOW, so no path is resolved
//   twice and no component can be swapped for a link under the copy;
// - a symbolic link is copied as a link (its target text), never followed;
// - only regular files and folders are opened (O_NONBLOCK, O_NOCTTY), and each opened one
//   must still be the inode that was lstat'ed; a FIFO is made anew (mkfifo, never opened), a
//   socket is dropped, a device is dropped, except an overlay whiteout (a character device
//   0:0) when `overlay` is set, which is the layer's meaning of "deleted";
// - of the extended attributes only the overlay's opaque marker (trusted.overlay.opaque,
//   user.overlay.opaque) is kept, on folders, when `overlay` is set; every other one
//   (security.capability included) is dropped;
// - set-user-id and set-group-id bits are cleared; files are owned by whoever runs the
//   copy (root for the server), never by the sandbox's uid;
// - hard links become separate copies.
// Every byte is charged before it is written (`charge`); a refusal stops the copy with
// that status. Folders nested deeper than kMaxCopyDepth are refused (FAILED_PRECONDITION),
// and so is a tree of more than `max_entries` entries (RESOURCE_EXHAUSTED).
//
// Thread-safety: the function is reentrant. Internal to sbx::runtime_local.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/runtime/proc.h"

namespace sbx::runtime::local {

inline constexpr int kMaxCopyDepth = 128;
// The most entries (files, folders, links, FIFOs, whiteouts, dropped ones) one copy takes:
// empty files cost no quota bytes but do cost the data disk's inodes and the copy's time.
inline constexpr int64_t kMaxCopyEntries = 1'000'000;

struct CopyStats {
  int64_t bytes = 0;  // file contents and link targets (what was charged)
  int64_t files = 0;
  int64_t folders = 0;
  int64_t links = 0;
  int64_t fifos = 0;
  int64_t whiteouts = 0;
  int64_t dropped = 0;  // sockets and devices left out
};

// What a copy made that must be synced for it to be durable: the written files and the
// made folders, kept open up to `cap` of them; past the cap `overflow` is set (and nothing
// more is kept) and the caller syncs the whole file system instead (syncfs). Few files:
// fsync each, which does not flush what else the data disk holds dirty; many: one syncfs.
struct SyncList {
  size_t cap = 64;
  std::vector<Fd> fds;
  bool overflow = false;
  void Keep(Fd fd) {
    if (fds.size() < cap) {
      fds.push_back(std::move(fd));
    } else {
      overflow = true;
    }
  }
};

// Called with the bytes about to be copied; a non-OK status stops the copy with it.
using CopyCharge = std::function<absl::Status(int64_t bytes)>;

// Copies the content of the folder open at `src` (a descriptor, not consumed) into a new
// folder `name` (mode 0700) in the folder open at `dst_parent`. Errors: the charge's status;
// FAILED_PRECONDITION for a tree deeper than kMaxCopyDepth or an entry that changed while
// being copied; INTERNAL / RESOURCE_EXHAUSTED (ENOSPC, EDQUOT) for I/O errors, naming the
// path. On error the partial copy is left for the caller to remove.
// `sync` (optional) collects what to sync.
[[nodiscard]] absl::StatusOr<CopyStats> CopyTree(int src, int dst_parent, const std::string& name,
                                                 bool overlay, const CopyCharge& charge,
                                                 SyncList* sync = nullptr,
                                                 int64_t max_entries = kMaxCopyEntries);

// Copies the content of the folder open at `src` into the existing folder open at `dst`
// (neither consumed), as CopyTree does with overlay false and no charge. When owner >= 0
// every entry is created as uid and gid `owner` (the thread's fsuid and fsgid, switched
// around each creation only), so it is the owner's from the start and `dst` must let the
// owner create in it. Reset fills a sandbox's fresh workspace (a tmpfs of the sandbox's
// user namespace, where root cannot create) with it. Errors as CopyTree's; what was copied
// before an error stays.
[[nodiscard]] absl::StatusOr<CopyStats> CopyInto(int src, int dst, int64_t owner,
                                                 int64_t max_entries = kMaxCopyEntries);

// Makes the new folder `name` in `dst_parent` what overlayfs shows of the upper layer open
// at `upper` (a sandbox's own, hostile: read as CopyTree reads) over the folder open at
// `base` (a snapshot's, the server's own and never changed: its files are hard-linked into
// the result, not copied): what the upper layer has replaces what the base has, a whiteout
// deletes, an opaque folder replaces the whole folder, other folders merge. `flat`: the
// result is a plain tree (a workspace, under which nothing lies: whiteouts and opaque
// markers are dropped); otherwise a layer (a root's, over an image: whiteouts and opaque
// markers kept, and a folder of the upper layer over a base's non-folder marked opaque;
// `below` is the folder of the layers under the base, the image's root, open, or -1: a
// whiteout is kept where it hides something of theirs, and dropped where nothing of
// theirs shows, as overlayfs would list it as a name that cannot be opened).
// Only what comes from the upper layer is charged and counted in the stats' bytes (a file
// whose link count is at its limit is copied, and charged). Errors as CopyTree's.
[[nodiscard]] absl::StatusOr<CopyStats> MergeTree(int base, int upper, int below, int dst_parent,
                                                  const std::string& name, bool flat,
                                                  const CopyCharge& charge,
                                                  SyncList* sync = nullptr,
                                                  int64_t max_entries = kMaxCopyEntries);

// Removes the folder `name` in `parent` and everything below it, without following links.
// OK when it does not exist.
[[nodiscard]] absl::Status RemoveTree(int parent, const std::string& name);

}  // namespace sbx::runtime::local

#pragma once
// Tar streams into and out of a directory, with libarchive (the only file that sees it).
//
// ExtractTar treats the archive as hostile. Every entry's name is checked (no absolute
// names, no ".." components) and resolved beneath the target directory's descriptor
// without following any symbolic link: each parent component is opened with
// openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS) (or openat with
// O_NOFOLLOW, one component at a time, where openat2 is missing), so neither a link the
// archive planted earlier nor one a sandbox process swaps in meanwhile is followed. Leaves
// are created under a temporary name and renamed into place (a link at the leaf is
// replaced, never written through). Regular files lose setuid, setgid and sticky bits;
// owners are not applied; device nodes, FIFOs and sockets are skipped and counted. Hard
// links must name a path beneath the directory, resolved the same way.
//
// Thread-safety: the functions are reentrant. They block on their callbacks.

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sbx::sandboxd {

struct TarLimits {
  // Most entries (headers) of the archive; beyond: RESOURCE_EXHAUSTED.
  int64_t max_entries = 100000;
  // Most bytes of file content in all; beyond: RESOURCE_EXHAUSTED.
  int64_t max_bytes = int64_t{16} << 30;
};

struct TarResult {
  int64_t entries = 0;
  int64_t skipped = 0;
  int64_t bytes = 0;
};

// Fills `chunk` with the next bytes of the stream; false at its end (or when it broke).
using ReadChunkFn = std::function<bool(std::string& chunk)>;
// Takes the next bytes of the output; false when nobody takes them any more.
using WriteBytesFn = std::function<bool(absl::string_view data)>;

// Extracts the tar stream (plain or gzip) from `read` into the directory `dir_fd`.
// INVALID_ARGUMENT naming the entry for a refused entry or a malformed archive;
// RESOURCE_EXHAUSTED for a limit; the errors of PathError for the disk.
[[nodiscard]] absl::StatusOr<TarResult> ExtractTar(int dir_fd, const ReadChunkFn& read,
                                                   const TarLimits& limits, bool use_openat2);

// Writes the directory `dir_fd` as a pax tar stream to `write`. CANCELLED when `write`
// returned false.
[[nodiscard]] absl::Status WriteTar(int dir_fd, const WriteBytesFn& write);

}  // namespace sbx::sandboxd

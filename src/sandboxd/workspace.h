#pragma once
// Workspace: the sandbox's writable directory, and the only way sandboxd touches files.
// Every path is relative to the workspace and confined to it: absolute paths, "." and ".."
// components are refused up front (INVALID_ARGUMENT naming the path), and resolution
// happens relative to a descriptor of the workspace, so a symbolic link cannot lead out of
// it either:
// - with openat2(2) (Linux 5.6+): RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS; links that stay
//   inside the workspace are followed, links that would leave it are INVALID_ARGUMENT.
// - without it (older kernels, seccomp filters that deny it, or use_openat2 = false): a
//   walk component by component with O_NOFOLLOW; every symbolic link in a path is refused
//   (stricter, never looser).
//
// Errors of every method: INVALID_ARGUMENT for a bad path (the message names it),
// NOT_FOUND for a missing file or directory, FAILED_PRECONDITION for the wrong kind of
// file ("is a directory", "is not a directory"), PERMISSION_DENIED for EACCES/EPERM,
// RESOURCE_EXHAUSTED for a full disk, INTERNAL for other OS errors (with strerror).
//
// Thread-safety: all methods may be called concurrently from any thread.
// Lifetime: holds a descriptor of the workspace directory until destroyed.

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "src/sandboxd/unique_fd.h"

namespace sbx::sandboxd {

// Longest path accepted, in bytes.
inline constexpr size_t kMaxPathBytes = 4096;
// Most entries one List call returns (the first ones by path).
inline constexpr size_t kMaxListEntries = 10000;

class Workspace {
 public:
  enum class Kind { kOther, kRegular, kDirectory, kSymlink };

  struct Entry {
    // Relative to the workspace, no trailing slash.
    std::string path;
    Kind kind = Kind::kOther;
    int64_t size = 0;
    // st_mode & 07777.
    uint32_t mode = 0;
    absl::Time mtime;
  };

  struct ListResult {
    // Ordered by path (byte-wise).
    std::vector<Entry> entries;
    // More than kMaxListEntries existed; `entries` holds the first ones by path.
    bool truncated = false;
  };

  struct ReadResult {
    std::string content;
    int64_t size = 0;
    bool eof = false;
    uint32_t mode = 0;
  };

  struct WriteOptions {
    // Permission bits 0..07777; 0: 0644 for a new file, an existing file keeps its mode.
    uint32_t mode = 0;
    // Append instead of replacing (atomically, through a temporary file and rename).
    bool append = false;
    // Create missing parent directories (mode 0755) instead of NOT_FOUND.
    bool create_parents = false;
  };

  // Opens the workspace at `root` (an existing directory). `max_file_bytes` bounds
  // WriteFile and ReadFile. With `use_openat2` the kernel is probed once; when openat2 is
  // unavailable the component walk is used. NOT_FOUND / FAILED_PRECONDITION naming `root`
  // when it is missing or not a directory.
  static absl::StatusOr<std::unique_ptr<Workspace>> Open(const std::string& root,
                                                         int64_t max_file_bytes, bool use_openat2);

  // Checks `path` (see the header comment) and returns its components. The empty path
  // (the workspace itself) is accepted only with `allow_root`. INVALID_ARGUMENT naming
  // `what` and the path.
  static absl::StatusOr<std::vector<std::string>> SplitPath(absl::string_view what,
                                                            absl::string_view path,
                                                            bool allow_root);

  // Opens the directory `path` (empty: the workspace) for reading, e.g. as a command's
  // working directory. `what` names the path in error messages ("cwd").
  absl::StatusOr<UniqueFd> OpenDirectory(absl::string_view what, absl::string_view path) const;

  // Writes `content` to `path`; returns the file's size afterwards. INVALID_ARGUMENT when
  // content exceeds max_file_bytes or the mode is above 07777; RESOURCE_EXHAUSTED when an
  // append would exceed max_file_bytes; NOT_FOUND when the parent is missing and
  // create_parents is false.
  absl::StatusOr<int64_t> WriteFile(absl::string_view path, absl::string_view content,
                                    const WriteOptions& options) const;

  // Reads up to `limit` bytes (0: 1 MiB; at most max_file_bytes) from `offset`.
  // FAILED_PRECONDITION when `path` is a directory or not a regular file.
  absl::StatusOr<ReadResult> ReadFile(absl::string_view path, int64_t offset, int64_t limit) const;

  // Lists the directory `path` (empty: the workspace); `recursive` descends into
  // subdirectories (never through symbolic links).
  absl::StatusOr<ListResult> List(absl::string_view path, bool recursive) const;

  const std::string& root() const { return root_; }
  int64_t max_file_bytes() const { return max_file_bytes_; }
  // True when paths are resolved with openat2(RESOLVE_BENEATH).
  bool uses_openat2() const { return use_openat2_; }

 private:
  Workspace(std::string root, UniqueFd root_fd, int64_t max_file_bytes, bool use_openat2)
      : root_(std::move(root)),
        root_fd_(std::move(root_fd)),
        max_file_bytes_(max_file_bytes),
        use_openat2_(use_openat2) {}

  // Opens the first `n` components of `parts` (n == 0: the workspace) with `flags`,
  // confined to the workspace. Returns the descriptor, or -errno (-EXDEV: the path leads
  // outside; -ELOOP: a symbolic link that is not allowed).
  int OpenBeneath(const std::vector<std::string>& parts, size_t n, int flags, mode_t mode) const;
  // The parent directory of `parts` as an O_PATH descriptor, creating it when asked.
  absl::StatusOr<UniqueFd> OpenParent(absl::string_view path, const std::vector<std::string>& parts,
                                      bool create) const;

  const std::string root_;
  const UniqueFd root_fd_;
  const int64_t max_file_bytes_;
  const bool use_openat2_;
};

// Maps an errno from an operation on `path` to a Status with a message naming the path.
absl::Status PathError(int err, absl::string_view path);

}  // namespace sbx::sandboxd

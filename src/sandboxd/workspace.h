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
// Absolute paths: when the workspace is opened with a sandbox root (the sandbox's "/" as
// its processes see it; the daemon runs inside the sandbox's mount namespace, so that is
// the daemon's own "/"), a path beginning with "/" is resolved beneath that root with
// openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS): an absolute symbolic link is read as
// inside the root and ".." cannot climb above it. Without openat2 the walk is used from
// the root (no links at all). Whatever resolves into a proc or sysfs filesystem is
// refused (INVALID_ARGUMENT). Without a sandbox root, absolute paths are INVALID_ARGUMENT.
//
// Errors of every method: INVALID_ARGUMENT for a bad path (the message names it),
// NOT_FOUND for a missing file or directory, FAILED_PRECONDITION for the wrong kind of
// file ("is a directory", "is not a directory"), PERMISSION_DENIED for EACCES/EPERM,
// RESOURCE_EXHAUSTED for a full disk, INTERNAL for other OS errors (with strerror).
//
// Thread-safety: all methods may be called concurrently from any thread.
// Lifetime: holds a descriptor of the workspace directory until destroyed.

#include <sys/stat.h>
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
  // `sandbox_root`: where absolute paths resolve (see above); empty: they are refused.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Workspace>> Open(
      const std::string& root, int64_t max_file_bytes, bool use_openat2,
      const std::string& sandbox_root = "");

  // Checks `path` (see the header comment) and returns its components. The empty path
  // (the workspace itself) is accepted only with `allow_root`. INVALID_ARGUMENT naming
  // `what` and the path.
  [[nodiscard]] static absl::StatusOr<std::vector<std::string>> SplitPath(absl::string_view what,
                                                                          absl::string_view path,
                                                                          bool allow_root);

  // Opens the directory `path` (empty: the workspace) for reading, e.g. as a command's
  // working directory. `what` names the path in error messages ("cwd").
  [[nodiscard]] absl::StatusOr<UniqueFd> OpenDirectory(absl::string_view what,
                                                       absl::string_view path) const;

  // Writes `content` to `path`; returns the file's size afterwards. INVALID_ARGUMENT when
  // content exceeds max_file_bytes or the mode is above 07777; RESOURCE_EXHAUSTED when an
  // append would exceed max_file_bytes; NOT_FOUND when the parent is missing and
  // create_parents is false.
  [[nodiscard]] absl::StatusOr<int64_t> WriteFile(absl::string_view path, absl::string_view content,
                                                  const WriteOptions& options) const;

  // Reads up to `limit` bytes (0: 1 MiB; at most max_file_bytes) from `offset`.
  // FAILED_PRECONDITION when `path` is a directory or not a regular file.
  [[nodiscard]] absl::StatusOr<ReadResult> ReadFile(absl::string_view path, int64_t offset,
                                                    int64_t limit) const;

  // Lists the directory `path` (empty: the workspace); `recursive` descends into
  // subdirectories (never through symbolic links).
  [[nodiscard]] absl::StatusOr<ListResult> List(absl::string_view path, bool recursive) const;

  // A file being written: a temporary file beside the target, renamed over it by Commit.
  // Destroying it uncommitted removes the temporary file (a failed or cancelled upload
  // leaves nothing). Not thread-safe; one writer.
  class PendingFile {
   public:
    ~PendingFile();
    PendingFile(const PendingFile&) = delete;
    PendingFile& operator=(const PendingFile&) = delete;
    // Appends `data`. RESOURCE_EXHAUSTED when the disk is full or more than the
    // `max_bytes` given at creation would be written.
    [[nodiscard]] absl::Status Write(absl::string_view data);
    // Sets the mode and renames the file into place; returns its size.
    [[nodiscard]] absl::StatusOr<int64_t> Commit();
    int64_t written() const { return written_; }

   private:
    friend class Workspace;
    PendingFile() = default;
    UniqueFd parent_;
    UniqueFd fd_;
    std::string tmp_;
    std::string leaf_;
    std::string path_;
    mode_t mode_ = 0644;
    int64_t written_ = 0;
    int64_t max_bytes_ = 0;
    bool committed_ = false;
  };

  // Starts writing `path` (replacing it on Commit). `max_bytes` 0: no limit but the disk.
  // Errors as WriteFile (append is not supported: INVALID_ARGUMENT).
  [[nodiscard]] absl::StatusOr<std::unique_ptr<PendingFile>> CreatePending(
      absl::string_view path, const WriteOptions& options, int64_t max_bytes) const;

  // Opens the regular file `path` for reading; fills `st`. FAILED_PRECONDITION for a
  // directory or another kind of file.
  [[nodiscard]] absl::StatusOr<UniqueFd> OpenRegular(absl::string_view path, struct stat* st) const;

  // Describes `path` (the last component is not followed). The workspace itself ("") is
  // allowed. Entry.path is the normalised path.
  [[nodiscard]] absl::StatusOr<Entry> Stat(absl::string_view path) const;

  // Creates the directory `path` (mode 0: 0755). With `parents`, missing parents are
  // created and an existing directory is fine. ALREADY_EXISTS, NOT_FOUND (parent).
  [[nodiscard]] absl::Status MakeDir(absl::string_view path, uint32_t mode, bool parents) const;

  // Renames `from` to `to`. ALREADY_EXISTS when `to` exists and !overwrite.
  [[nodiscard]] absl::Status Move(absl::string_view from, absl::string_view to, bool overwrite,
                                  bool create_parents) const;

  // Removes `path`; `recursive` removes a directory's contents first (links are removed,
  // never followed). The workspace and the sandbox root themselves are INVALID_ARGUMENT.
  [[nodiscard]] absl::Status Remove(absl::string_view path, bool recursive) const;

  // Opens the directory `path` for extraction (O_RDONLY), creating it and its parents
  // when missing.
  [[nodiscard]] absl::StatusOr<UniqueFd> OpenOrCreateDirectory(absl::string_view path) const;

  const std::string& root() const { return root_; }
  int64_t max_file_bytes() const { return max_file_bytes_; }
  // True when paths are resolved with openat2(RESOLVE_BENEATH).
  bool uses_openat2() const { return use_openat2_; }
  // True when absolute paths are accepted (a sandbox root was given).
  bool has_sandbox_root() const { return sandbox_root_fd_.valid(); }

  // A checked path: components, and whether they start at the sandbox root instead of
  // the workspace.
  struct Parsed {
    bool absolute = false;
    std::vector<std::string> parts;
  };
  // SplitPath, accepting absolute paths when there is a sandbox root.
  [[nodiscard]] absl::StatusOr<Parsed> ParsePath(absl::string_view what, absl::string_view path,
                                                 bool allow_root) const;

 private:
  Workspace(std::string root, UniqueFd root_fd, UniqueFd sandbox_root_fd, int64_t max_file_bytes,
            bool use_openat2)
      : root_(std::move(root)),
        root_fd_(std::move(root_fd)),
        sandbox_root_fd_(std::move(sandbox_root_fd)),
        max_file_bytes_(max_file_bytes),
        use_openat2_(use_openat2) {}

  // Opens the first `n` components of `p` (n == 0: the workspace or the sandbox root) with
  // `flags`, confined to the workspace (or the sandbox root). Returns the descriptor, or
  // -errno (-EXDEV: the path leads outside; -ELOOP: a symbolic link that is not allowed).
  int OpenBeneath(const Parsed& p, size_t n, int flags, mode_t mode) const;
  // The parent directory of `p` as an O_PATH descriptor, creating it when asked.
  [[nodiscard]] absl::StatusOr<UniqueFd> OpenParent(absl::string_view path, const Parsed& p,
                                                    bool create) const;

  const std::string root_;
  const UniqueFd root_fd_;
  // Invalid: no absolute paths.
  const UniqueFd sandbox_root_fd_;
  const int64_t max_file_bytes_;
  const bool use_openat2_;
};

// Maps an errno from an operation on `path` to a Status with a message naming the path.
[[nodiscard]] absl::Status PathError(int err, absl::string_view path);

}  // namespace sbx::sandboxd

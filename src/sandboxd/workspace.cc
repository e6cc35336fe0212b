#include "src/sandboxd/workspace.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace sbx::sandboxd {
namespace {

constexpr int64_t kDefaultReadLimit = 1 << 20;
// Hard stop for a recursive listing, so that a huge tree cannot exhaust memory before
// the result is sorted and cut to kMaxListEntries.
constexpr size_t kMaxListScan = 1'000'000;

std::string Quote(absl::string_view path) { return absl::StrCat("\"", path, "\""); }

int SysOpenat2(int dirfd, const char* path, int flags, mode_t mode) {
  struct open_how how;
  std::memset(&how, 0, sizeof(how));
  how.flags = static_cast<uint64_t>(flags) | O_CLOEXEC;
  how.mode = (flags & (O_CREAT | O_TMPFILE)) != 0 ? mode : 0;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  // EAGAIN: a concurrent rename raced with the ".." checks of RESOLVE_BENEATH; retry.
  for (int attempt = 0; attempt < 16; ++attempt) {
    long fd = ::syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
    if (fd >= 0) return static_cast<int>(fd);
    if (errno != EAGAIN && errno != EINTR) return -errno;
  }
  return -EAGAIN;
}

bool IsSymlinkAt(int dirfd, const std::string& name) {
  struct stat st;
  return ::fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode);
}

absl::Status WriteAll(int fd, absl::string_view data, absl::string_view path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return PathError(errno, path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

Workspace::Kind KindOf(mode_t mode) {
  if (S_ISREG(mode)) return Workspace::Kind::kRegular;
  if (S_ISDIR(mode)) return Workspace::Kind::kDirectory;
  if (S_ISLNK(mode)) return Workspace::Kind::kSymlink;
  return Workspace::Kind::kOther;
}

// Appends the entries below the directory `fd` (named `prefix`, "" for the workspace).
void ListInto(int fd, const std::string& prefix, bool recursive,
              std::vector<Workspace::Entry>& out) {
  int dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return;
  DIR* dir = ::fdopendir(dup_fd);
  if (dir == nullptr) {
    ::close(dup_fd);
    return;
  }
  std::vector<std::string> subdirs;
  while (struct dirent* de = ::readdir(dir)) {
    if (out.size() >= kMaxListScan) break;
    const std::string name = de->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // raced
    Workspace::Entry entry;
    entry.path = prefix.empty() ? name : absl::StrCat(prefix, "/", name);
    entry.kind = KindOf(st.st_mode);
    entry.size = st.st_size;
    entry.mode = st.st_mode & 07777;
    entry.mtime = absl::TimeFromTimespec(st.st_mtim);
    if (recursive && entry.kind == Workspace::Kind::kDirectory) subdirs.push_back(name);
    out.push_back(std::move(entry));
  }
  ::closedir(dir);
  for (const std::string& name : subdirs) {
    UniqueFd sub(::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sub.valid()) continue;  // unreadable or raced: listed, not descended into
    ListInto(sub.get(), prefix.empty() ? name : absl::StrCat(prefix, "/", name), recursive, out);
  }
}

}  // namespace

absl::Status PathError(int err, absl::string_view path) {
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(absl::StrCat("path ", Quote(path), ": no such file or directory"));
    case ENOTDIR:
      return absl::FailedPreconditionError(
          absl::StrCat("path ", Quote(path), ": a component is not a directory"));
    case EISDIR:
      return absl::FailedPreconditionError(absl::StrCat("path ", Quote(path), " is a directory"));
    case EXDEV:
      return absl::InvalidArgumentError(
          absl::StrCat("path ", Quote(path), " resolves outside the workspace"));
    case ELOOP:
      return absl::InvalidArgumentError(
          absl::StrCat("path ", Quote(path),
                       " goes through a symbolic link that is not allowed (links must stay "
                       "inside the workspace)"));
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(absl::StrCat("path ", Quote(path), " is too long"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(
          absl::StrCat("path ", Quote(path), ": ", std::strerror(err)));
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(
          absl::StrCat("path ", Quote(path), ": ", std::strerror(err)));
    case EAGAIN:
      return absl::UnavailableError(
          absl::StrCat("path ", Quote(path), ": resolution raced with a rename, retry"));
    default:
      return absl::InternalError(absl::StrCat("path ", Quote(path), ": ", std::strerror(err)));
  }
}

absl::StatusOr<std::unique_ptr<Workspace>> Workspace::Open(const std::string& root,
                                                           int64_t max_file_bytes,
                                                           bool use_openat2) {
  UniqueFd fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("workspace ", Quote(root), " does not exist"));
    }
    if (err == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("workspace ", Quote(root), " is not a directory"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open workspace ", Quote(root), ": ", std::strerror(err)));
  }
  if (use_openat2) {
    // Probe once: kernels before 5.6 (or seccomp filters) answer ENOSYS or EPERM.
    int probe = SysOpenat2(fd.get(), ".", O_PATH | O_DIRECTORY, 0);
    if (probe >= 0) {
      ::close(probe);
    } else {
      use_openat2 = false;
    }
  }
  return std::unique_ptr<Workspace>(
      new Workspace(root, std::move(fd), max_file_bytes, use_openat2));
}

absl::StatusOr<std::vector<std::string>> Workspace::SplitPath(absl::string_view what,
                                                              absl::string_view path,
                                                              bool allow_root) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", Quote(path), " ", why));
  };
  if (path.size() > kMaxPathBytes) {
    return bad(absl::StrCat("is longer than ", kMaxPathBytes, " bytes"));
  }
  if (path.find('\0') != absl::string_view::npos) return bad("contains a NUL byte");
  if (!path.empty() && path.front() == '/') {
    return bad("is absolute; paths are relative to the workspace");
  }
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(path, '/', absl::SkipEmpty())) {
    if (part == "..") return bad("has a \"..\" component; paths must stay inside the workspace");
    if (part == ".") return bad("has a \".\" component");
    parts.emplace_back(part);
  }
  if (parts.empty() && !allow_root) return bad("is empty; a file path is required");
  return parts;
}

int Workspace::OpenBeneath(const std::vector<std::string>& parts, size_t n, int flags,
                           mode_t mode) const {
  if (use_openat2_) {
    const std::string rel =
        n == 0 ? std::string(".")
               : absl::StrJoin(parts.begin(), parts.begin() + static_cast<ptrdiff_t>(n), "/");
    return SysOpenat2(root_fd_.get(), rel.c_str(), flags, mode);
  }
  // Walk: every directory on the way is opened with O_NOFOLLOW, so no link is followed.
  UniqueFd dir(::fcntl(root_fd_.get(), F_DUPFD_CLOEXEC, 0));
  if (!dir.valid()) return -errno;
  if (n == 0) {
    if ((flags & O_PATH) != 0) return dir.Release();
    int fd = ::openat(root_fd_.get(), ".", flags | O_CLOEXEC, mode);
    return fd >= 0 ? fd : -errno;
  }
  for (size_t i = 0; i + 1 < n; ++i) {
    int next = ::openat(dir.get(), parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) {
      const int err = errno;
      if ((err == ENOTDIR || err == ELOOP) && IsSymlinkAt(dir.get(), parts[i])) return -ELOOP;
      return -err;
    }
    dir.Reset(next);
  }
  const std::string& last = parts[n - 1];
  int fd = ::openat(dir.get(), last.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    const int err = errno;
    if ((err == ENOTDIR || err == ELOOP) && IsSymlinkAt(dir.get(), last)) return -ELOOP;
    return -err;
  }
  if ((flags & O_PATH) != 0 && IsSymlinkAt(dir.get(), last)) {
    // O_PATH | O_NOFOLLOW opens the link itself instead of failing.
    ::close(fd);
    return -ELOOP;
  }
  return fd;
}

absl::StatusOr<UniqueFd> Workspace::OpenDirectory(absl::string_view what,
                                                  absl::string_view path) const {
  auto parts = SplitPath(what, path, /*allow_root=*/true);
  if (!parts.ok()) return parts.status();
  int fd = OpenBeneath(*parts, parts->size(), O_RDONLY | O_DIRECTORY, 0);
  if (fd < 0) {
    if (fd == -ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, " ", Quote(path), " is not a directory"));
    }
    absl::Status s = PathError(-fd, path);
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  return UniqueFd(fd);
}

absl::StatusOr<UniqueFd> Workspace::OpenParent(absl::string_view path,
                                               const std::vector<std::string>& parts,
                                               bool create) const {
  const size_t n = parts.size() - 1;
  int fd = OpenBeneath(parts, n, O_PATH | O_DIRECTORY, 0);
  if (fd >= 0) return UniqueFd(fd);
  if (fd != -ENOENT || !create) {
    if (fd == -ENOENT) {
      return absl::NotFoundError(absl::StrCat("parent directory of path ", Quote(path),
                                              " does not exist (set create_parents)"));
    }
    return PathError(-fd, path);
  }
  // Create the missing directories one by one, each inside its (confined) parent.
  UniqueFd dir(OpenBeneath(parts, 0, O_PATH | O_DIRECTORY, 0));
  if (!dir.valid()) return PathError(EBADF, path);
  for (size_t i = 1; i <= n; ++i) {
    int next = OpenBeneath(parts, i, O_PATH | O_DIRECTORY, 0);
    if (next == -ENOENT) {
      if (::mkdirat(dir.get(), parts[i - 1].c_str(), 0755) != 0 && errno != EEXIST) {
        return PathError(errno, path);
      }
      next = OpenBeneath(parts, i, O_PATH | O_DIRECTORY, 0);
    }
    if (next < 0) return PathError(-next, path);
    dir.Reset(next);
  }
  return dir;
}

absl::StatusOr<int64_t> Workspace::WriteFile(absl::string_view path, absl::string_view content,
                                             const WriteOptions& options) const {
  auto parts = SplitPath("path", path, /*allow_root=*/false);
  if (!parts.ok()) return parts.status();
  if (options.mode > 07777) {
    return absl::InvalidArgumentError(absl::StrCat("mode 0", absl::Hex(options.mode).value,
                                                   " of path ", Quote(path), " is above 07777"));
  }
  if (static_cast<int64_t>(content.size()) > max_file_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("content of ", content.size(),
                                                   " bytes for path ", Quote(path),
                                                   " exceeds max_file_bytes ", max_file_bytes_));
  }
  auto parent = OpenParent(path, *parts, options.create_parents);
  if (!parent.ok()) return parent.status();
  const std::string& leaf = parts->back();

  if (options.append) {
    const mode_t mode = options.mode != 0 ? options.mode : 0644;
    int raw = OpenBeneath(*parts, parts->size(), O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK, mode);
    if (raw < 0) return PathError(-raw, path);
    UniqueFd fd(raw);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return PathError(errno, path);
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("path ", Quote(path), " is not a regular file"));
    }
    const int64_t after = st.st_size + static_cast<int64_t>(content.size());
    if (after > max_file_bytes_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("appending ", content.size(), " bytes to path ", Quote(path), " of ",
                       st.st_size, " bytes would exceed max_file_bytes ", max_file_bytes_));
    }
    if (absl::Status s = WriteAll(fd.get(), content, path); !s.ok()) return s;
    if (options.mode != 0 && ::fchmod(fd.get(), options.mode) != 0) return PathError(errno, path);
    if (::fstat(fd.get(), &st) != 0) return PathError(errno, path);
    return static_cast<int64_t>(st.st_size);
  }

  mode_t mode = options.mode != 0 ? options.mode : 0644;
  struct stat st;
  if (::fstatat(parent->get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat("path ", Quote(path), " is a directory"));
    }
    if (S_ISREG(st.st_mode) && options.mode == 0) mode = st.st_mode & 07777;
  }
  // Write a temporary file beside the target and rename it over the target, so readers
  // see the old or the new content, never a mix. A symbolic link at the target itself is
  // replaced, not followed.
  absl::BitGen gen;
  std::string tmp;
  UniqueFd fd;
  for (int attempt = 0; attempt < 8 && !fd.valid(); ++attempt) {
    tmp = absl::StrCat(".sbx-write-", absl::Hex(absl::Uniform<uint64_t>(gen)));
    fd.Reset(::openat(parent->get(), tmp.c_str(),
                      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid() && errno != EEXIST) return PathError(errno, path);
  }
  if (!fd.valid()) return PathError(EEXIST, path);
  absl::Status s = WriteAll(fd.get(), content, path);
  if (s.ok() && ::fchmod(fd.get(), mode) != 0) s = PathError(errno, path);
  if (s.ok() && ::close(fd.Release()) != 0) s = PathError(errno, path);
  if (s.ok() && ::renameat(parent->get(), tmp.c_str(), parent->get(), leaf.c_str()) != 0) {
    s = PathError(errno, path);
  }
  if (!s.ok()) {
    ::unlinkat(parent->get(), tmp.c_str(), 0);
    return s;
  }
  return static_cast<int64_t>(content.size());
}

absl::StatusOr<Workspace::ReadResult> Workspace::ReadFile(absl::string_view path, int64_t offset,
                                                          int64_t limit) const {
  auto parts = SplitPath("path", path, /*allow_root=*/false);
  if (!parts.ok()) return parts.status();
  if (offset < 0) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " is negative"));
  }
  if (limit < 0 || limit > max_file_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit ", limit, " is outside 0..", max_file_bytes_, " (max_file_bytes)"));
  }
  if (limit == 0) limit = std::min(kDefaultReadLimit, max_file_bytes_);
  // O_NONBLOCK: opening a FIFO must not hang; it is refused below as not a regular file.
  int raw = OpenBeneath(*parts, parts->size(), O_RDONLY | O_NONBLOCK, 0);
  if (raw < 0) return PathError(-raw, path);
  UniqueFd fd(raw);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return PathError(errno, path);
  if (S_ISDIR(st.st_mode)) return PathError(EISDIR, path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("path ", Quote(path), " is not a regular file"));
  }
  ReadResult result;
  result.size = st.st_size;
  result.mode = st.st_mode & 07777;
  const int64_t want = std::max<int64_t>(0, std::min(limit, st.st_size - offset));
  result.content.resize(static_cast<size_t>(want));
  int64_t got = 0;
  while (got < want) {
    ssize_t n = ::pread(fd.get(), result.content.data() + got, static_cast<size_t>(want - got),
                        offset + got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PathError(errno, path);
    }
    if (n == 0) break;  // the file shrank meanwhile
    got += n;
  }
  result.content.resize(static_cast<size_t>(got));
  result.eof = offset + got >= result.size;
  return result;
}

absl::StatusOr<Workspace::ListResult> Workspace::List(absl::string_view path,
                                                      bool recursive) const {
  auto parts = SplitPath("path", path, /*allow_root=*/true);
  if (!parts.ok()) return parts.status();
  int raw = OpenBeneath(*parts, parts->size(), O_RDONLY | O_DIRECTORY, 0);
  if (raw < 0) {
    if (raw == -ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("path ", Quote(path), " is not a directory"));
    }
    return PathError(-raw, path);
  }
  UniqueFd fd(raw);
  ListResult result;
  ListInto(fd.get(), absl::StrJoin(*parts, "/"), recursive, result.entries);
  std::sort(result.entries.begin(), result.entries.end(),
            [](const Entry& a, const Entry& b) { return a.path < b.path; });
  if (result.entries.size() > kMaxListEntries) {
    result.entries.resize(kMaxListEntries);
    result.truncated = true;
  }
  return result;
}

}  // namespace sbx::sandboxd

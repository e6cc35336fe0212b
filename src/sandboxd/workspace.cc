#include "src/sandboxd/workspace.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/statfs.h>
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
#include "src/common/errno_text.h"
#include "src/common/status_macros.h"

namespace sbx::sandboxd {
namespace {

constexpr int64_t kDefaultReadLimit = 1 << 20;
// Hard stop for a recursive listing, so that a huge tree cannot exhaust memory before
// the result is sorted and cut to kMaxListEntries.
constexpr size_t kMaxListScan = 1'000'000;

std::string Quote(absl::string_view path) { return absl::StrCat("\"", path, "\""); }

int SysOpenat2(int dirfd, const char* path, int flags, mode_t mode,
               uint64_t resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) {
  struct open_how how;
  std::memset(&how, 0, sizeof(how));
  how.flags = static_cast<uint64_t>(flags) | O_CLOEXEC;
  how.mode = (flags & (O_CREAT | O_TMPFILE)) != 0 ? mode : 0;
  how.resolve = resolve;
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
  while (struct dirent* de = ::readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): own DIR stream
    if (out.size() >= kMaxListScan) break;
    const std::string name = de->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // raced
    Workspace::Entry entry;
    entry.path = prefix.empty()  ? name
                 : prefix == "/" ? "/" + name
                                 : absl::StrCat(prefix, "/", name);
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
    ListInto(sub.get(),
             prefix.empty()  ? name
             : prefix == "/" ? "/" + name
                             : absl::StrCat(prefix, "/", name),
             recursive, out);
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
          absl::StrCat("path ", Quote(path),
                       path.empty() || path.front() != '/'
                           ? " resolves outside the workspace"
                           : " resolves outside the sandbox's root, or into /proc or /sys"));
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
          absl::StrCat("path ", Quote(path), ": ", sbx::ErrnoText(err)));
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(
          absl::StrCat("path ", Quote(path), ": ", sbx::ErrnoText(err)));
    case EROFS:
      return absl::PermissionDeniedError(
          absl::StrCat("path ", Quote(path), " is on a read-only filesystem"));
    case EEXIST:
      return absl::AlreadyExistsError(absl::StrCat("path ", Quote(path), " already exists"));
    case ENOTEMPTY:
      return absl::FailedPreconditionError(
          absl::StrCat("path ", Quote(path), " is a directory that is not empty"));
    case EAGAIN:
      return absl::UnavailableError(
          absl::StrCat("path ", Quote(path), ": resolution raced with a rename, retry"));
    default:
      return absl::InternalError(absl::StrCat("path ", Quote(path), ": ", sbx::ErrnoText(err)));
  }
}

absl::StatusOr<std::unique_ptr<Workspace>> Workspace::Open(const std::string& root,
                                                           int64_t max_file_bytes, bool use_openat2,
                                                           const std::string& sandbox_root) {
  UniqueFd sandbox_root_fd;
  if (!sandbox_root.empty()) {
    sandbox_root_fd.Reset(::open(sandbox_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!sandbox_root_fd.valid()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot open sandbox root ", Quote(sandbox_root), ": ", sbx::ErrnoText(errno)));
    }
  }
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
        absl::StrCat("cannot open workspace ", Quote(root), ": ", sbx::ErrnoText(err)));
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
      new Workspace(root, std::move(fd), std::move(sandbox_root_fd), max_file_bytes, use_openat2));
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

absl::StatusOr<Workspace::Parsed> Workspace::ParsePath(absl::string_view what,
                                                       absl::string_view path,
                                                       bool allow_root) const {
  Parsed parsed;
  if (!path.empty() && path.front() == '/' && sandbox_root_fd_.valid()) {
    if (path.size() > kMaxPathBytes || path.find('\0') != absl::string_view::npos) {
      // SplitPath names the problem.
      return SplitPath(what, path, allow_root).status();
    }
    absl::string_view rest = path;
    while (!rest.empty() && rest.front() == '/') rest.remove_prefix(1);
    ASSIGN_OR_RETURN(parsed.parts, SplitPath(what, rest, /*allow_root=*/true));
    parsed.absolute = true;
    if (parsed.parts.empty() && !allow_root) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", Quote(path), " is the sandbox's root; a file path is required"));
    }
    return parsed;
  }
  ASSIGN_OR_RETURN(parsed.parts, SplitPath(what, path, allow_root));
  return parsed;
}

namespace {
// Refuses descriptors of proc and sysfs (reached through an absolute path): the daemon's
// own /proc entries and the kernel's knobs are no file API's business.
int RefuseKernelFs(int fd) {
  if (fd < 0) return fd;
  struct statfs fs;
  if (::fstatfs(fd, &fs) == 0 && (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC)) {
    ::close(fd);
    return -EXDEV;
  }
  return fd;
}
}  // namespace

int Workspace::OpenBeneath(const Parsed& p, size_t n, int flags, mode_t mode) const {
  const std::vector<std::string>& parts = p.parts;
  const int base = p.absolute ? sandbox_root_fd_.get() : root_fd_.get();
  if (use_openat2_) {
    const std::string rel =
        n == 0 ? std::string(".")
               : absl::StrJoin(parts.begin(), parts.begin() + static_cast<ptrdiff_t>(n), "/");
    if (!p.absolute) return SysOpenat2(base, rel.c_str(), flags, mode);
    return RefuseKernelFs(
        SysOpenat2(base, rel.c_str(), flags, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS));
  }
  // Walk: every directory on the way is opened with O_NOFOLLOW, so no link is followed.
  UniqueFd dir(::fcntl(base, F_DUPFD_CLOEXEC, 0));
  if (!dir.valid()) return -errno;
  if (n == 0) {
    if ((flags & O_PATH) != 0) return dir.Release();
    int fd = ::openat(base, ".", flags | O_CLOEXEC, mode);
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
  return p.absolute ? RefuseKernelFs(fd) : fd;
}

absl::StatusOr<UniqueFd> Workspace::OpenDirectory(absl::string_view what,
                                                  absl::string_view path) const {
  auto parts = ParsePath(what, path, /*allow_root=*/true);
  if (!parts.ok()) return parts.status();
  int fd = OpenBeneath(*parts, parts->parts.size(), O_RDONLY | O_DIRECTORY, 0);
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

absl::StatusOr<UniqueFd> Workspace::OpenParent(absl::string_view path, const Parsed& p,
                                               bool create) const {
  const std::vector<std::string>& parts = p.parts;
  const size_t n = parts.size() - 1;
  int fd = OpenBeneath(p, n, O_PATH | O_DIRECTORY, 0);
  if (fd >= 0) return UniqueFd(fd);
  if (fd != -ENOENT || !create) {
    if (fd == -ENOENT) {
      return absl::NotFoundError(absl::StrCat("parent directory of path ", Quote(path),
                                              " does not exist (set create_parents)"));
    }
    return PathError(-fd, path);
  }
  // Create the missing directories one by one, each inside its (confined) parent.
  UniqueFd dir(OpenBeneath(p, 0, O_PATH | O_DIRECTORY, 0));
  if (!dir.valid()) return PathError(EBADF, path);
  for (size_t i = 1; i <= n; ++i) {
    int next = OpenBeneath(p, i, O_PATH | O_DIRECTORY, 0);
    if (next == -ENOENT) {
      if (::mkdirat(dir.get(), parts[i - 1].c_str(), 0755) != 0 && errno != EEXIST) {
        return PathError(errno, path);
      }
      next = OpenBeneath(p, i, O_PATH | O_DIRECTORY, 0);
    }
    if (next < 0) return PathError(-next, path);
    dir.Reset(next);
  }
  return dir;
}

absl::StatusOr<int64_t> Workspace::WriteFile(absl::string_view path, absl::string_view content,
                                             const WriteOptions& options) const {
  ASSIGN_OR_RETURN(Parsed parts, ParsePath("path", path, /*allow_root=*/false));
  if (options.mode > 07777) {
    return absl::InvalidArgumentError(absl::StrCat("mode 0", absl::Hex(options.mode).value,
                                                   " of path ", Quote(path), " is above 07777"));
  }
  if (static_cast<int64_t>(content.size()) > max_file_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("content of ", content.size(),
                                                   " bytes for path ", Quote(path),
                                                   " exceeds max_file_bytes ", max_file_bytes_));
  }
  if (options.append) {
    RETURN_IF_ERROR(OpenParent(path, parts, options.create_parents).status());
    const mode_t mode = options.mode != 0 ? options.mode : 0644;
    int raw =
        OpenBeneath(parts, parts.parts.size(), O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK, mode);
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
  ASSIGN_OR_RETURN(std::unique_ptr<PendingFile> file, CreatePending(path, options, 0));
  RETURN_IF_ERROR(file->Write(content));
  return file->Commit();
}

Workspace::PendingFile::~PendingFile() {
  if (!committed_ && parent_.valid() && !tmp_.empty()) ::unlinkat(parent_.get(), tmp_.c_str(), 0);
}

absl::Status Workspace::PendingFile::Write(absl::string_view data) {
  if (max_bytes_ > 0 && written_ + static_cast<int64_t>(data.size()) > max_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("path ", Quote(path_), ": more than ", max_bytes_, " bytes (max_bytes)"));
  }
  RETURN_IF_ERROR(WriteAll(fd_.get(), data, path_));
  written_ += static_cast<int64_t>(data.size());
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Workspace::PendingFile::Commit() {
  if (::fchmod(fd_.get(), mode_) != 0) return PathError(errno, path_);
  if (::close(fd_.Release()) != 0) return PathError(errno, path_);
  if (::renameat(parent_.get(), tmp_.c_str(), parent_.get(), leaf_.c_str()) != 0) {
    return PathError(errno, path_);
  }
  committed_ = true;
  return written_;
}

absl::StatusOr<std::unique_ptr<Workspace::PendingFile>> Workspace::CreatePending(
    absl::string_view path, const WriteOptions& options, int64_t max_bytes) const {
  ASSIGN_OR_RETURN(Parsed parts, ParsePath("path", path, /*allow_root=*/false));
  if (options.mode > 07777) {
    return absl::InvalidArgumentError(absl::StrCat("mode 0", absl::Hex(options.mode).value,
                                                   " of path ", Quote(path), " is above 07777"));
  }
  if (options.append) {
    return absl::InvalidArgumentError("a streamed write cannot append; it replaces the file");
  }
  ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(path, parts, options.create_parents));
  const std::string& leaf = parts.parts.back();
  mode_t mode = options.mode != 0 ? options.mode : 0644;
  struct stat st;
  if (::fstatat(parent.get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat("path ", Quote(path), " is a directory"));
    }
    if (S_ISREG(st.st_mode) && options.mode == 0) mode = st.st_mode & 07777;
  }
  // A temporary file beside the target, renamed over it: readers see the old or the new
  // content, never a mix. A symbolic link at the target itself is replaced, not followed.
  std::unique_ptr<PendingFile> file(new PendingFile());
  absl::BitGen gen;
  for (int attempt = 0; attempt < 8 && !file->fd_.valid(); ++attempt) {
    file->tmp_ = absl::StrCat(".sbx-write-", absl::Hex(absl::Uniform<uint64_t>(gen)));
    file->fd_.Reset(::openat(parent.get(), file->tmp_.c_str(),
                             O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!file->fd_.valid() && errno != EEXIST) return PathError(errno, path);
  }
  if (!file->fd_.valid()) return PathError(EEXIST, path);
  file->parent_ = std::move(parent);
  file->leaf_ = leaf;
  file->path_ = std::string(path);
  file->mode_ = mode;
  file->max_bytes_ = max_bytes;
  return file;
}

absl::StatusOr<UniqueFd> Workspace::OpenRegular(absl::string_view path, struct stat* st) const {
  ASSIGN_OR_RETURN(Parsed parts, ParsePath("path", path, /*allow_root=*/false));
  // O_NONBLOCK: opening a FIFO must not hang; it is refused below as not a regular file.
  int raw = OpenBeneath(parts, parts.parts.size(), O_RDONLY | O_NONBLOCK, 0);
  if (raw < 0) return PathError(-raw, path);
  UniqueFd fd(raw);
  if (::fstat(fd.get(), st) != 0) return PathError(errno, path);
  if (S_ISDIR(st->st_mode)) return PathError(EISDIR, path);
  if (!S_ISREG(st->st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("path ", Quote(path), " is not a regular file"));
  }
  // Reads block normally from here on.
  const int fl = ::fcntl(fd.get(), F_GETFL);
  if (fl >= 0) ::fcntl(fd.get(), F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

absl::StatusOr<Workspace::ReadResult> Workspace::ReadFile(absl::string_view path, int64_t offset,
                                                          int64_t limit) const {
  if (offset < 0) {
    return absl::InvalidArgumentError(absl::StrCat("offset ", offset, " is negative"));
  }
  if (limit < 0 || limit > max_file_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit ", limit, " is outside 0..", max_file_bytes_, " (max_file_bytes)"));
  }
  if (limit == 0) limit = std::min(kDefaultReadLimit, max_file_bytes_);
  struct stat st;
  ASSIGN_OR_RETURN(UniqueFd fd, OpenRegular(path, &st));
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
  ASSIGN_OR_RETURN(Parsed parts, ParsePath("path", path, /*allow_root=*/true));
  int raw = OpenBeneath(parts, parts.parts.size(), O_RDONLY | O_DIRECTORY, 0);
  if (raw < 0) {
    if (raw == -ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("path ", Quote(path), " is not a directory"));
    }
    return PathError(-raw, path);
  }
  UniqueFd fd(raw);
  ListResult result;
  const std::string joined = absl::StrJoin(parts.parts, "/");
  ListInto(fd.get(), parts.absolute ? "/" + joined : joined, recursive, result.entries);
  std::sort(result.entries.begin(), result.entries.end(),
            [](const Entry& a, const Entry& b) { return a.path < b.path; });
  if (result.entries.size() > kMaxListEntries) {
    result.entries.resize(kMaxListEntries);
    result.truncated = true;
  }
  return result;
}

absl::StatusOr<Workspace::Entry> Workspace::Stat(absl::string_view path) const {
  ASSIGN_OR_RETURN(Parsed parts, ParsePath("path", path, /*allow_root=*/true));
  struct stat st;
  const std::string joined = absl::StrJoin(parts.parts, "/");
  if (parts.parts.empty()) {
    UniqueFd fd(OpenBeneath(parts, 0, O_PATH | O_DIRECTORY, 0));
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0) return PathError(errno, path);
  } else {
    ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(path, parts, /*create=*/false));
    if (::fstatat(parent.get(), parts.parts.back().c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return PathError(errno, path);
    }
  }
  Entry entry;
  entry.path = parts.absolute ? "/" + joined : joined;
  entry.kind = KindOf(st.st_mode);
  entry.size = st.st_size;
  entry.mode = st.st_mode & 07777;
  entry.mtime = absl::TimeFromTimespec(st.st_mtim);
  return entry;
}

absl::Status Workspace::MakeDir(absl::string_view path, uint32_t mode, bool parents) const {
  ASSIGN_OR_RETURN(Parsed parts, ParsePath("path", path, /*allow_root=*/false));
  if (mode > 07777) {
    return absl::InvalidArgumentError(
        absl::StrCat("mode 0", absl::Hex(mode).value, " of path ", Quote(path), " is above 07777"));
  }
  ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(path, parts, parents));
  const std::string& leaf = parts.parts.back();
  if (::mkdirat(parent.get(), leaf.c_str(), mode != 0 ? mode : 0755) != 0) {
    const int err = errno;
    struct stat st;
    if (err == EEXIST && parents &&
        ::fstatat(parent.get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode)) {
      return absl::OkStatus();
    }
    return PathError(err, path);
  }
  return absl::OkStatus();
}

absl::Status Workspace::Move(absl::string_view from, absl::string_view to, bool overwrite,
                             bool create_parents) const {
  ASSIGN_OR_RETURN(Parsed src, ParsePath("from", from, /*allow_root=*/false));
  ASSIGN_OR_RETURN(Parsed dst, ParsePath("to", to, /*allow_root=*/false));
  ASSIGN_OR_RETURN(UniqueFd src_parent, OpenParent(from, src, /*create=*/false));
  ASSIGN_OR_RETURN(UniqueFd dst_parent, OpenParent(to, dst, create_parents));
  const unsigned flags = overwrite ? 0 : RENAME_NOREPLACE;
  if (::renameat2(src_parent.get(), src.parts.back().c_str(), dst_parent.get(),
                  dst.parts.back().c_str(), flags) != 0) {
    const int err = errno;
    if (err == ENOENT) return PathError(err, from);
    if (err == EXDEV) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot move ", Quote(from), " to ", Quote(to), ": they are on different filesystems"));
    }
    return PathError(err, to);
  }
  return absl::OkStatus();
}

namespace {
// Removes everything in the directory `fd` (never following a link). -errno or 0.
int RemoveContents(int fd, int depth) {
  if (depth > 4096) return -ELOOP;
  int dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return -errno;
  DIR* dir = ::fdopendir(dup_fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(dup_fd);
    return -err;
  }
  std::vector<std::string> names;
  while (struct dirent* de = ::readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): own DIR stream
    const std::string name = de->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  for (const std::string& name : names) {
    if (::unlinkat(fd, name.c_str(), 0) == 0 || errno == ENOENT) continue;
    if (errno != EISDIR && errno != EPERM) return -errno;
    UniqueFd sub(::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sub.valid()) return -errno;
    if (int r = RemoveContents(sub.get(), depth + 1); r != 0) return r;
    if (::unlinkat(fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) return -errno;
  }
  return 0;
}
}  // namespace

absl::Status Workspace::Remove(absl::string_view path, bool recursive) const {
  ASSIGN_OR_RETURN(Parsed parts, ParsePath("path", path, /*allow_root=*/true));
  if (parts.parts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "path ", Quote(path), " is the workspace (or the sandbox root); it cannot be removed"));
  }
  ASSIGN_OR_RETURN(UniqueFd parent, OpenParent(path, parts, /*create=*/false));
  const std::string& leaf = parts.parts.back();
  struct stat st;
  if (::fstatat(parent.get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return PathError(errno, path);
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(parent.get(), leaf.c_str(), 0) != 0) return PathError(errno, path);
    return absl::OkStatus();
  }
  if (recursive) {
    UniqueFd dir(
        ::openat(parent.get(), leaf.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!dir.valid()) return PathError(errno, path);
    if (int r = RemoveContents(dir.get(), 0); r != 0) return PathError(-r, path);
  }
  if (::unlinkat(parent.get(), leaf.c_str(), AT_REMOVEDIR) != 0) return PathError(errno, path);
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> Workspace::OpenOrCreateDirectory(absl::string_view path) const {
  ASSIGN_OR_RETURN(Parsed parts, ParsePath("path", path, /*allow_root=*/true));
  if (!parts.parts.empty()) {
    absl::Status s = MakeDir(path, 0755, /*parents=*/true);
    if (!s.ok() && !absl::IsAlreadyExists(s)) return s;
  }
  return OpenDirectory("path", path);
}

}  // namespace sbx::sandboxd

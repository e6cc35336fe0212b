#include "src/sandboxd/tar.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "src/common/status_macros.h"
#include "src/sandboxd/unique_fd.h"
#include "src/sandboxd/workspace.h"

namespace sbx::sandboxd {
namespace {

constexpr size_t kCopyBytes = 256 * 1024;
constexpr int kMaxDepth = 1024;

struct ArchiveDeleter {
  void operator()(struct archive* a) const { archive_read_free(a); }
};
struct WriteArchiveDeleter {
  void operator()(struct archive* a) const { archive_write_free(a); }
};
struct EntryDeleter {
  void operator()(struct archive_entry* e) const { archive_entry_free(e); }
};

std::string Quote(absl::string_view s) { return absl::StrCat("\"", s, "\""); }

absl::Status Refuse(absl::string_view name, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("tar entry ", Quote(name), " ", why));
}

// The components of an entry name: "." components and repeated slashes dropped; absolute
// names, ".." components and NUL bytes refused.
absl::StatusOr<std::vector<std::string>> EntryParts(absl::string_view name) {
  if (name.empty()) return Refuse(name, "has an empty name");
  if (name.front() == '/') return Refuse(name, "is absolute; entries must be relative");
  if (name.size() > kMaxPathBytes) return Refuse(name, "has a name longer than 4096 bytes");
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(name, '/', absl::SkipEmpty())) {
    if (part == "..") return Refuse(name, "has a \"..\" component");
    if (part == ".") continue;
    parts.emplace_back(part);
  }
  return parts;
}

// Opens the child directory `name` of `dir` without following a link. -errno.
int OpenChildDir(int dir, const std::string& name, bool use_openat2) {
  if (use_openat2) {
    struct open_how how;
    std::memset(&how, 0, sizeof(how));
    how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    for (int attempt = 0; attempt < 16; ++attempt) {
      long fd = ::syscall(SYS_openat2, dir, name.c_str(), &how, sizeof(how));
      if (fd >= 0) return static_cast<int>(fd);
      if (errno == ENOSYS || errno == EPERM) break;  // no openat2 here: the walk below
      if (errno != EAGAIN && errno != EINTR) return -errno;
    }
    if (errno != ENOSYS && errno != EPERM) return -EAGAIN;
  }
  int fd = ::openat(dir, name.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd >= 0) return fd;
  const int err = errno;
  struct stat st;
  if ((err == ENOTDIR || err == ELOOP) &&
      ::fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
    return -ELOOP;
  }
  return -err;
}

// The directory holding the last of `parts`, beneath `root`, one component at a time
// (creating missing ones when `create`). A link on the way is refused.
absl::StatusOr<UniqueFd> OpenEntryParent(int root, const std::vector<std::string>& parts,
                                         absl::string_view name, bool create, bool use_openat2) {
  UniqueFd dir(::fcntl(root, F_DUPFD_CLOEXEC, 0));
  if (!dir.valid()) return PathError(errno, name);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    int next = OpenChildDir(dir.get(), parts[i], use_openat2);
    if (next == -ENOENT && create) {
      if (::mkdirat(dir.get(), parts[i].c_str(), 0755) != 0 && errno != EEXIST) {
        return PathError(errno, name);
      }
      next = OpenChildDir(dir.get(), parts[i], use_openat2);
    }
    if (next == -ELOOP || next == -EXDEV) {
      return Refuse(name,
                    absl::StrCat("goes through the symbolic link ",
                                 Quote(absl::StrJoin(parts.begin(), parts.begin() + i + 1, "/")),
                                 "; links are never followed while extracting"));
    }
    if (next < 0) return PathError(-next, name);
    dir.Reset(next);
  }
  return dir;
}

std::string TempName(absl::BitGen& gen) {
  return absl::StrCat(".sbx-tar-", absl::Hex(absl::Uniform<uint64_t>(gen)));
}

// Renames `tmp` over `leaf` in `dir`; removes `tmp` on failure.
absl::Status Place(int dir, const std::string& tmp, const std::string& leaf,
                   absl::string_view name) {
  if (::renameat(dir, tmp.c_str(), dir, leaf.c_str()) != 0) {
    const int err = errno;
    ::unlinkat(dir, tmp.c_str(), 0);
    return PathError(err, name);
  }
  return absl::OkStatus();
}

struct Source {
  const ReadChunkFn* read;
  std::string chunk;
};

la_ssize_t ReadCallback(struct archive*, void* data, const void** buffer) {
  auto* src = static_cast<Source*>(data);
  do {
    src->chunk.clear();
    if (!(*src->read)(src->chunk)) return 0;
  } while (src->chunk.empty());
  *buffer = src->chunk.data();
  return static_cast<la_ssize_t>(src->chunk.size());
}

}  // namespace

absl::StatusOr<TarResult> ExtractTar(int dir_fd, const ReadChunkFn& read, const TarLimits& limits,
                                     bool use_openat2) {
  std::unique_ptr<struct archive, ArchiveDeleter> a(archive_read_new());
  archive_read_support_format_tar(a.get());
  archive_read_support_format_gnutar(a.get());
  archive_read_support_filter_gzip(a.get());
  Source src{&read, {}};
  if (archive_read_open(a.get(), &src, nullptr, ReadCallback, nullptr) != ARCHIVE_OK) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a tar stream: ", archive_error_string(a.get())));
  }
  TarResult result;
  absl::BitGen gen;
  std::string buffer(kCopyBytes, '\0');
  for (;;) {
    struct archive_entry* entry = nullptr;
    const int r = archive_read_next_header(a.get(), &entry);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN) {
      return absl::InvalidArgumentError(absl::StrCat("malformed tar stream after ", result.entries,
                                                     " entries: ", archive_error_string(a.get())));
    }
    if (++result.entries > limits.max_entries) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the archive has more than ", limits.max_entries, " entries (max_entries)"));
    }
    const char* raw_name = archive_entry_pathname(entry);
    const std::string name = raw_name != nullptr ? raw_name : "";
    ASSIGN_OR_RETURN(std::vector<std::string> parts, EntryParts(name));
    if (parts.empty()) continue;  // "." or "./": the directory itself
    const mode_t type = archive_entry_filetype(entry);
    const char* hardlink = archive_entry_hardlink(entry);
    const bool is_dir = hardlink == nullptr && type == AE_IFDIR;
    if (hardlink == nullptr && type != AE_IFDIR && type != AE_IFREG && type != AE_IFLNK) {
      ++result.skipped;  // device nodes, FIFOs, sockets
      continue;
    }
    ASSIGN_OR_RETURN(UniqueFd parent,
                     OpenEntryParent(dir_fd, parts, name, /*create=*/true, use_openat2));
    const std::string& leaf = parts.back();
    // Permission bits only: no setuid, setgid or sticky bit.
    const mode_t mode = archive_entry_perm(entry) & 0777;

    if (is_dir) {
      if (::mkdirat(parent.get(), leaf.c_str(), mode | 0700) != 0) {
        const int err = errno;
        struct stat st;
        if (err != EEXIST || ::fstatat(parent.get(), leaf.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
          return PathError(err, name);
        }
        if (!S_ISDIR(st.st_mode)) {
          return Refuse(name, "is a directory, but a file or a symbolic link is in its place");
        }
      }
      continue;
    }
    const std::string tmp = TempName(gen);
    if (hardlink != nullptr) {
      const std::string target_name = hardlink;
      auto target = EntryParts(target_name);
      if (!target.ok()) {
        return Refuse(name, absl::StrCat("is a hard link to ", Quote(target_name),
                                         ", outside the directory"));
      }
      if (target->empty()) return Refuse(name, "is a hard link to the directory itself");
      auto target_parent = OpenEntryParent(dir_fd, *target, name, /*create=*/false, use_openat2);
      if (!target_parent.ok()) return target_parent.status();
      struct stat st;
      if (::fstatat(target_parent->get(), target->back().c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        return Refuse(name, absl::StrCat("is a hard link to ", Quote(target_name),
                                         ", which is not (yet) in the directory"));
      }
      if (!S_ISREG(st.st_mode)) {
        return Refuse(name, absl::StrCat("is a hard link to ", Quote(target_name),
                                         ", which is not a regular file"));
      }
      // Flags 0: a link at the target is linked itself, never followed.
      if (::linkat(target_parent->get(), target->back().c_str(), parent.get(), tmp.c_str(), 0) !=
          0) {
        return PathError(errno, name);
      }
      RETURN_IF_ERROR(Place(parent.get(), tmp, leaf, name));
      continue;
    }
    if (type == AE_IFLNK) {
      const char* target = archive_entry_symlink(entry);
      if (target == nullptr || *target == '\0') return Refuse(name, "is a link without a target");
      if (::symlinkat(target, parent.get(), tmp.c_str()) != 0) return PathError(errno, name);
      RETURN_IF_ERROR(Place(parent.get(), tmp, leaf, name));
      continue;
    }
    // A regular file.
    UniqueFd out(::openat(parent.get(), tmp.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out.valid()) return PathError(errno, name);
    absl::Status status;
    for (;;) {
      const la_ssize_t n = archive_read_data(a.get(), buffer.data(), buffer.size());
      if (n == 0) break;
      if (n < 0) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "malformed tar stream in entry ", Quote(name), ": ", archive_error_string(a.get())));
        break;
      }
      result.bytes += n;
      if (result.bytes > limits.max_bytes) {
        status = absl::ResourceExhaustedError(absl::StrCat("the archive's files hold more than ",
                                                           limits.max_bytes, " bytes (max_bytes)"));
        break;
      }
      size_t done = 0;
      while (done < static_cast<size_t>(n)) {
        const ssize_t w = ::write(out.get(), buffer.data() + done, static_cast<size_t>(n) - done);
        if (w < 0) {
          if (errno == EINTR) continue;
          status = PathError(errno, name);
          break;
        }
        done += static_cast<size_t>(w);
      }
      if (!status.ok()) break;
    }
    if (status.ok() && ::fchmod(out.get(), mode) != 0) status = PathError(errno, name);
    if (status.ok() && archive_entry_mtime_is_set(entry)) {
      struct timespec times[2];
      times[0].tv_sec = 0;
      times[0].tv_nsec = UTIME_OMIT;
      times[1].tv_sec = archive_entry_mtime(entry);
      times[1].tv_nsec = archive_entry_mtime_nsec(entry);
      ::futimens(out.get(), times);
    }
    if (status.ok() && ::close(out.Release()) != 0) status = PathError(errno, name);
    if (!status.ok()) {
      ::unlinkat(parent.get(), tmp.c_str(), 0);
      return status;
    }
    RETURN_IF_ERROR(Place(parent.get(), tmp, leaf, name));
  }
  return result;
}

namespace {

struct Sink {
  const WriteBytesFn* write;
  bool cancelled = false;
};

la_ssize_t WriteCallback(struct archive* a, void* data, const void* buffer, size_t length) {
  auto* sink = static_cast<Sink*>(data);
  if (!(*sink->write)(absl::string_view(static_cast<const char*>(buffer), length))) {
    sink->cancelled = true;
    archive_set_error(a, ECANCELED, "the reader went away");
    return -1;
  }
  return static_cast<la_ssize_t>(length);
}

absl::Status WriteHeader(struct archive* a, struct archive_entry* e, const Sink& sink) {
  if (archive_write_header(a, e) < ARCHIVE_WARN) {
    if (sink.cancelled) return absl::CancelledError("the reader went away");
    return absl::InternalError(absl::StrCat("writing the tar stream: ", archive_error_string(a)));
  }
  return absl::OkStatus();
}

absl::Status WriteDir(struct archive* a, const Sink& sink, int dir_fd, const std::string& prefix,
                      int depth, std::string& buffer) {
  if (depth > kMaxDepth) {
    return absl::FailedPreconditionError(
        absl::StrCat("directory ", Quote(prefix), " is nested more than ", kMaxDepth, " deep"));
  }
  int dup_fd = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (dup_fd < 0) return PathError(errno, prefix);
  DIR* dir = ::fdopendir(dup_fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(dup_fd);
    return PathError(err, prefix);
  }
  std::vector<std::string> names;
  while (struct dirent* de = ::readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): own DIR stream
    const std::string name = de->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  std::unique_ptr<struct archive_entry, EntryDeleter> e(archive_entry_new());
  for (const std::string& name : names) {
    const std::string path = prefix.empty() ? name : absl::StrCat(prefix, "/", name);
    struct stat st;
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // raced
    archive_entry_clear(e.get());
    archive_entry_set_pathname(e.get(), path.c_str());
    if (S_ISDIR(st.st_mode)) {
      UniqueFd sub(::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub.valid()) continue;  // unreadable or raced
      archive_entry_copy_stat(e.get(), &st);
      RETURN_IF_ERROR(WriteHeader(a, e.get(), sink));
      RETURN_IF_ERROR(WriteDir(a, sink, sub.get(), path, depth + 1, buffer));
    } else if (S_ISLNK(st.st_mode)) {
      std::string target(4096, '\0');
      const ssize_t n = ::readlinkat(dir_fd, name.c_str(), target.data(), target.size());
      if (n < 0) continue;
      target.resize(static_cast<size_t>(n));
      archive_entry_copy_stat(e.get(), &st);
      archive_entry_set_size(e.get(), 0);
      archive_entry_set_symlink(e.get(), target.c_str());
      RETURN_IF_ERROR(WriteHeader(a, e.get(), sink));
    } else if (S_ISREG(st.st_mode)) {
      UniqueFd in(::openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
      if (!in.valid() || ::fstat(in.get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      archive_entry_copy_stat(e.get(), &st);
      RETURN_IF_ERROR(WriteHeader(a, e.get(), sink));
      // Exactly the size in the header: cut a file that grew, pad one that shrank.
      int64_t left = st.st_size;
      while (left > 0) {
        ssize_t n = ::read(in.get(), buffer.data(),
                           static_cast<size_t>(std::min<int64_t>(left, buffer.size())));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          n = static_cast<ssize_t>(std::min<int64_t>(left, buffer.size()));
          std::memset(buffer.data(), 0, static_cast<size_t>(n));
        }
        if (archive_write_data(a, buffer.data(), static_cast<size_t>(n)) < 0) {
          if (sink.cancelled) return absl::CancelledError("the reader went away");
          return absl::InternalError(
              absl::StrCat("writing the tar stream: ", archive_error_string(a)));
        }
        left -= n;
      }
    }
    // Other kinds (devices, FIFOs, sockets) are left out.
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteTar(int dir_fd, const WriteBytesFn& write) {
  std::unique_ptr<struct archive, WriteArchiveDeleter> a(archive_write_new());
  archive_write_set_format_pax_restricted(a.get());
  archive_write_set_bytes_per_block(a.get(), 64 * 1024);
  archive_write_set_bytes_in_last_block(a.get(), 1);
  Sink sink{&write};
  if (archive_write_open(a.get(), &sink, nullptr, WriteCallback, nullptr) != ARCHIVE_OK) {
    return absl::InternalError(
        absl::StrCat("starting the tar stream: ", archive_error_string(a.get())));
  }
  std::string buffer(kCopyBytes, '\0');
  RETURN_IF_ERROR(WriteDir(a.get(), sink, dir_fd, "", 0, buffer));
  if (archive_write_close(a.get()) != ARCHIVE_OK) {
    if (sink.cancelled) return absl::CancelledError("the reader went away");
    return absl::InternalError(
        absl::StrCat("ending the tar stream: ", archive_error_string(a.get())));
  }
  return absl::OkStatus();
}

}  // namespace sbx::sandboxd

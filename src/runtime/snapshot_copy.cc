#include "src/runtime/snapshot_copy.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "src/common/errno_text.h"
#include "src/common/status_macros.h"
#include "src/runtime/proc.h"

namespace sbx::runtime::local {
namespace {

constexpr size_t kChunk = size_t{1} << 20;
// The overlay's opaque-folder markers: with the idmapped mount of a root server the overlay
// uses trusted.*, with a user namespace's mount user.*.
constexpr const char* kOpaqueXattrs[] = {"trusted.overlay.opaque", "user.overlay.opaque"};

absl::Status IoError(const std::string& what, const std::string& path) {
  const int err = errno;
  const std::string msg = absl::StrCat(what, " \"", path, "\": ", sbx::ErrnoText(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status Changed(const std::string& path) {
  return absl::FailedPreconditionError(absl::StrCat(
      "\"", path, "\" changed while it was being copied (the sandbox is not frozen?)"));
}

bool SameInode(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino &&
         (a.st_mode & S_IFMT) == (b.st_mode & S_IFMT);
}

// Modes without set-user-id and set-group-id (the sticky bit of a folder stays).
mode_t SafeMode(mode_t mode) { return mode & 01777; }

// Makes this thread create files as uid and gid `owner` (its fsuid and fsgid) while it
// lives, when owner >= 0: what is made then belongs to the owner from its creation, and a
// file system mounted in a user namespace that maps the owner but not root (a sandbox's
// workspace tmpfs) accepts it, where a creation as root fails with EOVERFLOW. Reads stay
// root's (the fsuid goes back to what it was, and with it the capabilities it dropped).
class AsOwner {
 public:
  explicit AsOwner(int64_t owner) : owner_(owner) {
    if (owner_ < 0) return;
    old_gid_ = static_cast<gid_t>(setfsgid(static_cast<gid_t>(owner_)));
    old_uid_ = static_cast<uid_t>(setfsuid(static_cast<uid_t>(owner_)));
  }
  ~AsOwner() {
    if (owner_ < 0) return;
    setfsuid(old_uid_);
    setfsgid(old_gid_);
  }
  AsOwner(const AsOwner&) = delete;
  AsOwner& operator=(const AsOwner&) = delete;

 private:
  const int64_t owner_;
  uid_t old_uid_ = 0;
  gid_t old_gid_ = 0;
};

class Copier {
 public:
  Copier(bool overlay, const CopyCharge& charge, SyncList* sync, int64_t max_entries,
         int64_t owner = -1)
      : overlay_(overlay), charge_(charge), sync_(sync), max_entries_(max_entries), owner_(owner) {}

  absl::Status Folder(int src, int dst, const std::string& path, int depth) {
    if (depth > kMaxCopyDepth) {
      return absl::FailedPreconditionError(absl::StrCat("\"", path, "\" is nested deeper than ",
                                                        kMaxCopyDepth, " folders: not copied"));
    }
    ASSIGN_OR_RETURN(std::vector<std::string> names, List(src, path));
    for (const std::string& name : names) {
      const std::string at = path + "/" + name;
      if (absl::Status s = Entry(src, dst, name, at, depth); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Fills `dst` with the content of the snapshot folder `base`: folders made anew (mode,
  // times and opaque markers as the base's), everything else hard-linked.
  absl::Status LinkFolder(int base, int dst, const std::string& path, int depth) {
    if (depth > kMaxCopyDepth) {
      return absl::FailedPreconditionError(absl::StrCat("\"", path, "\" is nested deeper than ",
                                                        kMaxCopyDepth, " folders: not linked"));
    }
    ASSIGN_OR_RETURN(std::vector<std::string> names, List(base, path));
    for (const std::string& name : names) {
      const std::string at = path + "/" + name;
      if (++entries_ > max_entries_) return TooMany(at);
      struct stat st;
      if (fstatat(base, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return IoError("stat", at);
      if (S_ISDIR(st.st_mode)) {
        const Fd in(openat(base, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!in.valid()) return IoError("open folder", at);
        if (mkdirat(dst, name.c_str(), 0700) != 0) return IoError("make folder", at);
        Fd out(openat(dst, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!out.valid()) return IoError("open made folder", at);
        ++stats.folders;
        RETURN_IF_ERROR(CopyOpaque(in.get(), out.get(), at));
        RETURN_IF_ERROR(LinkFolder(in.get(), out.get(), at, depth + 1));
        RETURN_IF_ERROR(Finish(out, st, at));
        continue;
      }
      if (linkat(base, name.c_str(), dst, name.c_str(), 0) == 0) continue;
      if (errno != EMLINK) return IoError("link", at);
      // The file has as many links as its file system allows: a copy of its own.
      --entries_;
      RETURN_IF_ERROR(Entry(base, dst, name, at, depth));
    }
    return absl::OkStatus();
  }

  // Applies the upper layer open at `upper` to `dst` (LinkFolder's result), as overlayfs
  // shows the one over the other (MergeTree).
  // `below`: the folder of the layers under the base at this path (the image's), or -1
  // when nothing of them shows here (none, an opaque folder on the way, a flat tree): a
  // whiteout is kept only where it hides something of theirs (elsewhere overlayfs would
  // list it as a name that cannot be opened).
  absl::Status Apply(int upper, int dst, int below, const std::string& path, int depth) {
    if (depth > kMaxCopyDepth) {
      return absl::FailedPreconditionError(absl::StrCat("\"", path, "\" is nested deeper than ",
                                                        kMaxCopyDepth, " folders: not copied"));
    }
    ASSIGN_OR_RETURN(std::vector<std::string> names, List(upper, path));
    for (const std::string& name : names) {
      const std::string at = path + "/" + name;
      struct stat st;
      if (fstatat(upper, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) return Changed(at);
        return IoError("stat", at);
      }
      struct stat in_base;
      const bool exists = fstatat(dst, name.c_str(), &in_base, AT_SYMLINK_NOFOLLOW) == 0;
      if (!exists && errno != ENOENT) return IoError("stat the snapshot's", at);
      if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) {
        if (++entries_ > max_entries_) return TooMany(at);
        if (exists) RETURN_IF_ERROR(RemoveTree(dst, name));
        struct stat hidden;
        if (overlay_ && below >= 0 &&
            fstatat(below, name.c_str(), &hidden, AT_SYMLINK_NOFOLLOW) == 0) {
          if (mknodat(dst, name.c_str(), S_IFCHR | 0000, makedev(0, 0)) != 0) {
            return IoError("make whiteout", at);
          }
          ++stats.whiteouts;
        }
        continue;
      }
      if (S_ISDIR(st.st_mode)) {
        const Fd in(openat(upper, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!in.valid()) {
          if (errno == ELOOP || errno == ENOTDIR || errno == ENOENT) return Changed(at);
          return IoError("open folder", at);
        }
        struct stat now;
        if (fstat(in.get(), &now) != 0) return IoError("stat", at);
        if (!SameInode(st, now)) return Changed(at);
        if (!IsOpaque(in.get()) && exists && S_ISDIR(in_base.st_mode)) {
          if (++entries_ > max_entries_) return TooMany(at);
          Fd out(openat(dst, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
          if (!out.valid()) return IoError("open the snapshot's folder", at);
          const Fd under(
              below >= 0 && !IsOpaque(out.get())
                  ? openat(below, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                  : -1);
          RETURN_IF_ERROR(
              Apply(in.get(), out.get(), under.valid() ? under.get() : -1, at, depth + 1));
          RETURN_IF_ERROR(Finish(out, st, at));
          continue;
        }
        if (exists) RETURN_IF_ERROR(RemoveTree(dst, name));
        RETURN_IF_ERROR(Entry(upper, dst, name, at, depth));
        if (overlay_ && exists && !IsOpaque(in.get())) {
          // A folder over the base's non-folder shows nothing of what lies under the base.
          const Fd out(openat(dst, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
          if (!out.valid()) return IoError("open copied folder", at);
          RETURN_IF_ERROR(MarkOpaque(out.get(), at));
        }
        continue;
      }
      if (exists) RETURN_IF_ERROR(RemoveTree(dst, name));
      RETURN_IF_ERROR(Entry(upper, dst, name, at, depth));
    }
    return absl::OkStatus();
  }

  CopyStats stats;

 private:
  absl::Status TooMany(const std::string& path) const {
    return absl::ResourceExhaustedError(absl::StrCat("more than ", max_entries_,
                                                     " files, folders and links to copy (at \"",
                                                     path, "\"): refused"));
  }

  // The names in the folder open at `fd` (not consumed). fdopendir takes the descriptor:
  // it gets its own, opened anew (not a dup, which would share the offset with `fd`).
  static absl::StatusOr<std::vector<std::string>> List(int fd, const std::string& path) {
    const int list_fd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (list_fd < 0) return IoError("open folder", path);
    DIR* dir = fdopendir(list_fd);
    if (dir == nullptr) {
      close(list_fd);
      return IoError("list folder", path);
    }
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* e = readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): own DIR stream
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names.emplace_back(e->d_name);
    }
    const int list_errno = errno;
    closedir(dir);
    if (list_errno != 0) {
      errno = list_errno;
      return IoError("list folder", path);
    }
    return names;
  }

  static bool IsOpaque(int fd) {
    for (const char* x : kOpaqueXattrs) {
      char v[8];
      const ssize_t n = fgetxattr(fd, x, v, sizeof(v));
      if (n == 1 && v[0] == 'y') return true;
    }
    return false;
  }

  // Marks a folder opaque under the names an overlay of this server reads: user.* always,
  // trusted.* too when it runs as root (whose overlays are idmapped ones, which read it).
  static absl::Status MarkOpaque(int fd, const std::string& path) {
    for (const char* x : kOpaqueXattrs) {
      if (absl::string_view(x).substr(0, 8) == "trusted." && geteuid() != 0) continue;
      if (fsetxattr(fd, x, "y", 1, 0) != 0) return IoError(absl::StrCat("set ", x, " on"), path);
    }
    return absl::OkStatus();
  }

  static absl::Status CopyOpaque(int in, int out, const std::string& path) {
    for (const char* x : kOpaqueXattrs) {
      char v[8];
      const ssize_t n = fgetxattr(in, x, v, sizeof(v));
      if (n > 0 && fsetxattr(out, x, v, static_cast<size_t>(n), 0) != 0) {
        return IoError(absl::StrCat("set ", x, " on"), path);
      }
    }
    return absl::OkStatus();
  }

  // A folder's mode and times as `st` gives them, then kept for the sync.
  absl::Status Finish(Fd& out, const struct stat& st, const std::string& path) {
    if (fchmod(out.get(), SafeMode(st.st_mode)) != 0) return IoError("chmod", path);
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    futimens(out.get(), times);
    if (sync_ != nullptr) sync_->Keep(std::move(out));
    return absl::OkStatus();
  }

  absl::Status Charge(int64_t n) {
    if (n <= 0) return absl::OkStatus();
    if (charge_) {
      if (absl::Status s = charge_(n); !s.ok()) return s;
    }
    stats.bytes += n;
    return absl::OkStatus();
  }

  absl::Status Entry(int src, int dst, const std::string& name, const std::string& path,
                     int depth) {
    if (++entries_ > max_entries_) {
      return absl::ResourceExhaustedError(absl::StrCat("more than ", max_entries_,
                                                       " files, folders and links to copy (at \"",
                                                       path, "\"): refused"));
    }
    struct stat st;
    if (fstatat(src, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return Changed(path);
      return IoError("stat", path);
    }
    const mode_t type = st.st_mode & S_IFMT;
    if (type == S_IFDIR) return Dir(src, dst, name, path, st, depth);
    if (type == S_IFREG) return File(src, dst, name, path, st);
    if (type == S_IFLNK) return Link(src, dst, name, path, st);
    if (type == S_IFIFO) {
      const AsOwner as(owner_);
      if (mkfifoat(dst, name.c_str(), SafeMode(st.st_mode) & 0777) != 0) {
        return IoError("make FIFO", path);
      }
      ++stats.fifos;
      return absl::OkStatus();
    }
    if (type == S_IFCHR && overlay_ && st.st_rdev == makedev(0, 0)) {
      if (mknodat(dst, name.c_str(), S_IFCHR | 0000, makedev(0, 0)) != 0) {
        return IoError("make whiteout", path);
      }
      ++stats.whiteouts;
      return absl::OkStatus();
    }
    ++stats.dropped;  // a socket or a device: nothing a snapshot may carry
    return absl::OkStatus();
  }

  absl::Status Dir(int src, int dst, const std::string& name, const std::string& path,
                   const struct stat& st, int depth) {
    const Fd in(openat(src, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!in.valid()) {
      if (errno == ELOOP || errno == ENOTDIR || errno == ENOENT) return Changed(path);
      return IoError("open folder", path);
    }
    struct stat now;
    if (fstat(in.get(), &now) != 0) return IoError("stat", path);
    if (!SameInode(st, now)) return Changed(path);
    {
      const AsOwner as(owner_);
      if (mkdirat(dst, name.c_str(), 0700) != 0) return IoError("make folder", path);
    }
    Fd out(openat(dst, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!out.valid()) return IoError("open copied folder", path);
    ++stats.folders;
    if (overlay_) {
      for (const char* x : kOpaqueXattrs) {
        char v[8];
        const ssize_t n = fgetxattr(in.get(), x, v, sizeof(v));
        if (n > 0 && fsetxattr(out.get(), x, v, static_cast<size_t>(n), 0) != 0) {
          return IoError(absl::StrCat("set ", x, " on"), path);
        }
      }
    }
    if (absl::Status s = Folder(in.get(), out.get(), path, depth + 1); !s.ok()) return s;
    if (fchmod(out.get(), SafeMode(st.st_mode)) != 0) return IoError("chmod", path);
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    futimens(out.get(), times);
    if (sync_ != nullptr) sync_->Keep(std::move(out));
    return absl::OkStatus();
  }

  absl::Status File(int src, int dst, const std::string& name, const std::string& path,
                    const struct stat& st) {
    // O_NONBLOCK and O_NOCTTY: should the entry have become a FIFO or a terminal since the
    // lstat, the open neither hangs nor adopts it (and the inode check refuses it).
    const Fd in(
        openat(src, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    if (!in.valid()) {
      if (errno == ELOOP || errno == ENOENT) return Changed(path);
      return IoError("open", path);
    }
    struct stat now;
    if (fstat(in.get(), &now) != 0) return IoError("stat", path);
    if (!SameInode(st, now)) return Changed(path);
    Fd out;
    {
      const AsOwner as(owner_);
      out.Reset(
          openat(dst, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    }
    if (!out.valid()) return IoError("create copy of", path);
    ++stats.files;
    std::vector<char> buf(std::min<size_t>(kChunk, std::max<off_t>(now.st_size, 1)));
    while (true) {
      const ssize_t n = read(in.get(), buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IoError("read", path);
      if (n == 0) break;
      if (absl::Status s = Charge(n); !s.ok()) return s;
      for (ssize_t done = 0; done < n;) {
        const ssize_t w = write(out.get(), buf.data() + done, static_cast<size_t>(n - done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return IoError("write copy of", path);
        done += w;
      }
    }
    if (fchmod(out.get(), SafeMode(st.st_mode)) != 0) return IoError("chmod", path);
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    futimens(out.get(), times);
    if (sync_ != nullptr) sync_->Keep(std::move(out));
    return absl::OkStatus();
  }

  absl::Status Link(int src, int dst, const std::string& name, const std::string& path,
                    const struct stat& st) {
    std::vector<char> target(static_cast<size_t>(std::max<off_t>(st.st_size, 0)) + 2);
    const ssize_t n = readlinkat(src, name.c_str(), target.data(), target.size());
    if (n < 0) {
      if (errno == EINVAL || errno == ENOENT) return Changed(path);
      return IoError("read link", path);
    }
    if (static_cast<size_t>(n) >= target.size() - 1) return Changed(path);  // grew
    target[static_cast<size_t>(n)] = '\0';
    if (absl::Status s = Charge(n); !s.ok()) return s;
    const AsOwner as(owner_);
    if (symlinkat(target.data(), dst, name.c_str()) != 0) return IoError("make link", path);
    ++stats.links;
    return absl::OkStatus();
  }

  const bool overlay_;
  const CopyCharge& charge_;
  SyncList* const sync_;
  const int64_t max_entries_;
  const int64_t owner_;
  int64_t entries_ = 0;
};

absl::Status RemoveBelow(int dir_fd, const std::string& path, int depth) {
  if (depth > kMaxCopyDepth + 8) {
    return absl::FailedPreconditionError(
        absl::StrCat("\"", path, "\" is nested too deep to remove"));
  }
  const int list_fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (list_fd < 0) return IoError("open folder", path);
  DIR* dir = fdopendir(list_fd);
  if (dir == nullptr) {
    close(list_fd);
    return IoError("list folder", path);
  }
  std::vector<std::pair<std::string, bool>> entries;
  while (struct dirent* e = readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): own DIR stream
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    entries.emplace_back(e->d_name, e->d_type == DT_DIR);
  }
  closedir(dir);
  for (const auto& [name, is_dir] : entries) {
    if (unlinkat(dir_fd, name.c_str(), 0) == 0 || errno == ENOENT) continue;
    if (errno != EISDIR && errno != EPERM) return IoError("remove", path + "/" + name);
    const Fd sub(openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!sub.valid()) return IoError("open folder", path + "/" + name);
    if (absl::Status s = RemoveBelow(sub.get(), path + "/" + name, depth + 1); !s.ok()) return s;
    if (unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      return IoError("remove folder", path + "/" + name);
    }
  }
  return absl::OkStatus();
}

// The new folder `name` in `dst_parent` that a copy of the folder open at `src` (stat'ed
// into `st`) fills.
absl::StatusOr<Fd> MakeTop(int src, int dst_parent, const std::string& name, struct stat* st) {
  if (fstat(src, st) != 0) return IoError("stat", name);
  if (!S_ISDIR(st->st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the source of \"", name, "\" is not a folder"));
  }
  if (mkdirat(dst_parent, name.c_str(), 0700) != 0) return IoError("make folder", name);
  Fd out(openat(dst_parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!out.valid()) return IoError("open folder", name);
  return out;
}

// The filled folder gets its source's mode and is kept for the sync.
absl::Status FinishTop(Fd out, const struct stat& st, const std::string& name, SyncList* sync) {
  if (fchmod(out.get(), SafeMode(st.st_mode)) != 0) return IoError("chmod", name);
  if (sync != nullptr) sync->Keep(std::move(out));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CopyStats> CopyTree(int src, int dst_parent, const std::string& name, bool overlay,
                                   const CopyCharge& charge, SyncList* sync, int64_t max_entries) {
  struct stat st;
  ASSIGN_OR_RETURN(Fd out, MakeTop(src, dst_parent, name, &st));
  Copier copier(overlay, charge, sync, max_entries);
  RETURN_IF_ERROR(copier.Folder(src, out.get(), name, 0));
  RETURN_IF_ERROR(FinishTop(std::move(out), st, name, sync));
  return copier.stats;
}

absl::StatusOr<CopyStats> MergeTree(int base, int upper, int below, int dst_parent,
                                    const std::string& name, bool flat, const CopyCharge& charge,
                                    SyncList* sync, int64_t max_entries) {
  struct stat st;
  ASSIGN_OR_RETURN(Fd out, MakeTop(upper, dst_parent, name, &st));
  Copier copier(/*overlay=*/!flat, charge, sync, max_entries);
  RETURN_IF_ERROR(copier.LinkFolder(base, out.get(), name, 0));
  RETURN_IF_ERROR(copier.Apply(upper, out.get(), flat ? -1 : below, name, 0));
  RETURN_IF_ERROR(FinishTop(std::move(out), st, name, sync));
  return copier.stats;
}

absl::StatusOr<CopyStats> CopyInto(int src, int dst, int64_t owner, int64_t max_entries) {
  const CopyCharge no_charge;  // the Copier keeps a reference: it must outlive it
  Copier copier(/*overlay=*/false, no_charge, nullptr, max_entries, owner);
  if (absl::Status s = copier.Folder(src, dst, ".", 0); !s.ok()) return s;
  return copier.stats;
}

absl::Status RemoveTree(int parent, const std::string& name) {
  if (unlinkat(parent, name.c_str(), 0) == 0 || errno == ENOENT) return absl::OkStatus();
  const Fd sub(openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!sub.valid()) {
    if (errno == ENOENT) return absl::OkStatus();
    return IoError("open folder", name);
  }
  if (absl::Status s = RemoveBelow(sub.get(), name, 0); !s.ok()) return s;
  if (unlinkat(parent, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return IoError("remove folder", name);
  }
  return absl::OkStatus();
}

}  // namespace sbx::runtime::local

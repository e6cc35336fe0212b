#include "src/runtime/snapshot_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "src/common/errno_text.h"
#include "src/runtime/image_root.h"

namespace sbx::runtime::local {
namespace {

// The sandbox's pid 1 inside bwrap sees the workspace here (bwrap_args.cc).
constexpr char kWorkspaceInSandbox[] = "run/sbx/workspace";

absl::Status Errno(const std::string& what) {
  const int err = errno;
  const std::string msg = absl::StrCat(what, ": ", sbx::ErrnoText(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

// `rel` opened as a folder beneath the root of process `pid` (which must still be the one
// that started at `start_time`): RESOLVE_IN_ROOT keeps every step inside that root, and
// `no_symlinks` refuses a link anywhere on the way (a path the sandbox can change).
absl::StatusOr<Fd> OpenInProcessRoot(pid_t pid, uint64_t start_time, const std::string& rel,
                                     bool no_symlinks) {
  const Fd proc(open(absl::StrCat("/proc/", pid).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!proc.valid()) return absl::NotFoundError(absl::StrCat("process ", pid, " is gone"));
  // "root" is the process's root, a link of /proc's own: followed on purpose.
  const Fd root(openat(proc.get(), "root", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return Errno(absl::StrCat("open the root of process ", pid));
  if (StartTime(pid) != start_time) {
    return absl::NotFoundError(absl::StrCat("process ", pid, " is not the sandbox's any more"));
  }
  struct open_how how;
  std::memset(&how, 0, sizeof(how));
  how.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | (no_symlinks ? RESOLVE_NO_SYMLINKS : 0);
  const int fd = static_cast<int>(syscall(SYS_openat2, root.get(), rel.c_str(), &how, sizeof(how)));
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("\"", rel, "\" is missing"));
    return Errno(absl::StrCat("open \"", rel, "\" in the sandbox"));
  }
  return Fd(fd);
}

}  // namespace

absl::Status CheckSnapshotId(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 64;
  for (const char c : id) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot id \"", id, "\" is not 1 to 64 of a-z, 0-9 and '-'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Fd> OpenSnapshotsDir(const std::string& path) {
  if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshots folder \"", path, "\" cannot be made: ", sbx::ErrnoText(errno)));
  }
  Fd dir(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st;
  if (!dir.valid() || fstat(dir.get(), &st) != 0 || st.st_uid != geteuid() ||
      fchmod(dir.get(), 0700) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshots folder \"", path,
                     "\" must be a folder (not a symbolic link) owned by uid ", geteuid()));
  }
  return dir;
}

int SweepPartialSnapshots(int dir) {
  std::vector<std::string> partial;
  const int list_fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (list_fd < 0) return 0;
  DIR* d = fdopendir(list_fd);
  if (d == nullptr) {
    close(list_fd);
    return 0;
  }
  while (struct dirent* e = readdir(d)) {  // NOLINT(concurrency-mt-unsafe): own DIR stream
    if (absl::EndsWith(e->d_name, kPartialSuffix)) partial.emplace_back(e->d_name);
  }
  closedir(d);
  int removed = 0;
  for (const std::string& name : partial) {
    if (absl::Status s = RemoveTree(dir, name); !s.ok()) {
      spdlog::warn("snapshots: cannot remove the interrupted snapshot {}: {}", name,
                   std::string(s.message()));
      continue;
    }
    ++removed;
  }
  return removed;
}

absl::StatusOr<std::vector<std::string>> ListSnapshotIds(int dir) {
  const int list_fd = openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (list_fd < 0) return Errno("open the snapshots folder");
  DIR* d = fdopendir(list_fd);
  if (d == nullptr) {
    close(list_fd);
    return Errno("list the snapshots folder");
  }
  std::vector<std::string> out;
  while (struct dirent* e = readdir(d)) {  // NOLINT(concurrency-mt-unsafe): own DIR stream
    const std::string name = e->d_name;
    if (name == "." || name == ".." || absl::EndsWith(name, kPartialSuffix)) continue;
    if (CheckSnapshotId(name).ok()) out.push_back(name);
  }
  closedir(d);
  return out;
}

absl::StatusOr<CopyStats> CaptureSandbox(const Sandbox& sb, bool isolated, int dir,
                                         const std::string& id, const CopyCharge& charge,
                                         const std::string& base, const std::string& image_rootfs) {
  if (absl::Status s = CheckSnapshotId(id); !s.ok()) return s;
  struct stat st;
  if (fstatat(dir, id.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("snapshot \"", id, "\" exists"));
  }
  const std::string partial = id + kPartialSuffix;
  if (absl::Status s = RemoveTree(dir, partial); !s.ok()) return s;
  if (mkdirat(dir, partial.c_str(), 0700) != 0) return Errno("make " + partial);
  absl::Cleanup remove = [&] {
    if (absl::Status s = RemoveTree(dir, partial); !s.ok()) {
      spdlog::warn("snapshots: cannot remove {}: {}", partial, std::string(s.message()));
    }
  };
  const Fd out(openat(dir, partial.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!out.valid()) return Errno("open " + partial);
  SyncList sync;
  CopyStats total;
  auto add = [&total](const CopyStats& s) {
    total.bytes += s.bytes;
    total.files += s.files;
    total.folders += s.folders;
    total.links += s.links;
    total.fifos += s.fifos;
    total.whiteouts += s.whiteouts;
    total.dropped += s.dropped;
  };
  // The base snapshot's folders, when the sandbox started at one.
  Fd base_root, base_workspace;
  if (!base.empty() && !sb.image_digest.empty()) {
    const Fd b(openat(dir, base.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!b.valid())
      return Errno(absl::StrCat("open snapshot ", base, ", which sandbox ", sb.id, " started at"));
    base_root.Reset(
        openat(b.get(), kSnapshotRootName, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    base_workspace.Reset(
        openat(b.get(), kSnapshotWorkspaceName, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!base_root.valid() || !base_workspace.valid()) {
      return Errno(absl::StrCat("open the files of snapshot ", base));
    }
  }
  // The image's root, under the base: where a whiteout of the sandbox's hides something.
  const Fd image_root(base_root.valid() && !image_rootfs.empty()
                          ? open(image_rootfs.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                          : -1);
  if (base_root.valid() && !image_root.valid()) {
    return Errno(absl::StrCat("open the root of image ", sb.image_digest));
  }
  if (!sb.image_digest.empty()) {
    // The layer is a tmpfs in sbx-rootfs's mount namespace, which bwrap (the top process,
    // exec'd by sbx-rootfs) still has; on kernels whose tmpfs has no user xattrs it lies
    // in the host folder itself (image_root_helper.cc).
    const std::string host = sb.dir.substr(1);
    absl::StatusOr<Fd> upper =
        OpenInProcessRoot(sb.pid, sb.start_time, host + "/layer/upper", /*no_symlinks=*/false);
    if (upper.status().code() == absl::StatusCode::kNotFound) {
      upper = OpenInProcessRoot(sb.pid, sb.start_time, host + "/upper", /*no_symlinks=*/false);
    }
    if (!upper.ok()) {
      return absl::Status(
          upper.status().code(),
          absl::StrCat("sandbox ", sb.id, ": its root's layer: ", upper.status().message()));
    }
    {
      absl::StatusOr<CopyStats> copied =
          base_root.valid() ? MergeTree(base_root.get(), upper->get(), image_root.get(), out.get(),
                                        kSnapshotRootName,
                                        /*flat=*/false, charge, &sync)
                            : CopyTree(upper->get(), out.get(), kSnapshotRootName, /*overlay=*/true,
                                       charge, &sync);
      if (!copied.ok()) return copied.status();
      add(*copied);
    }
  }
  if (base_workspace.valid()) {
    // The workspace's own layer, beside the root's in sbx-rootfs's mount namespace.
    absl::StatusOr<Fd> ws_upper = OpenInProcessRoot(
        sb.pid, sb.start_time, absl::StrCat(sb.dir.substr(1), "/", kWorkspaceUpper),
        /*no_symlinks=*/false);
    if (!ws_upper.ok()) {
      return absl::Status(ws_upper.status().code(),
                          absl::StrCat("sandbox ", sb.id,
                                       ": its workspace's layer: ", ws_upper.status().message()));
    }
    absl::StatusOr<CopyStats> copied =
        MergeTree(base_workspace.get(), ws_upper->get(), -1, out.get(), kSnapshotWorkspaceName,
                  /*flat=*/true, charge, &sync);
    if (!copied.ok()) return copied.status();
    add(*copied);
  } else {
    absl::StatusOr<Fd> workspace =
        isolated ? OpenInProcessRoot(sb.init_pid, sb.init_start_time, kWorkspaceInSandbox,
                                     /*no_symlinks=*/true)
                 : absl::StatusOr<Fd>(
                       Fd(OpenInDir(sb.dir, "workspace", O_RDONLY | O_DIRECTORY | O_CLOEXEC)));
    if (workspace.ok() && !workspace->valid()) workspace = Errno("open the workspace");
    if (!workspace.ok()) {
      return absl::Status(
          workspace.status().code(),
          absl::StrCat("sandbox ", sb.id, ": its workspace: ", workspace.status().message()));
    }
    {
      absl::StatusOr<CopyStats> copied =
          CopyTree(workspace->get(), out.get(), kSnapshotWorkspaceName,
                   /*overlay=*/false, charge, &sync);
      if (!copied.ok()) return copied.status();
      add(*copied);
    }
  }
  if (sync.overflow) {
    if (syncfs(out.get()) != 0) return Errno("sync " + partial);
  } else {
    for (const Fd& fd : sync.fds) {
      if (fsync(fd.get()) != 0) return Errno("sync a file of " + partial);
    }
    if (fsync(out.get()) != 0) return Errno("sync " + partial);
  }
  if (renameat(dir, partial.c_str(), dir, id.c_str()) != 0) return Errno("rename " + partial);
  std::move(remove).Cancel();
  if (fsync(dir) != 0) {
    const absl::Status s = Errno("sync the snapshots folder");
    RemoveTree(dir, id).IgnoreError();  // dropped: the sync error is the one reported
    return s;
  }
  return total;
}

}  // namespace sbx::runtime::local

namespace sbx::runtime::local {

absl::Status RestoreWorkspace(const Sandbox& sb, bool isolated, int dir, const std::string& id,
                              int64_t owner) {
  if (absl::Status s = CheckSnapshotId(id); !s.ok()) return s;
  const Fd snap(openat(dir, id.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!snap.valid()) {
    return absl::NotFoundError(absl::StrCat("snapshot ", id, " has no files on this server"));
  }
  const Fd from(
      openat(snap.get(), kSnapshotWorkspaceName, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!from.valid()) return Errno(absl::StrCat("open the workspace of snapshot ", id));
  // The sandbox is new (only its daemon runs, frozen), but its workspace is still opened
  // as a path the sandbox could change: beneath its root, no link on the way.
  absl::StatusOr<Fd> to =
      isolated ? OpenInProcessRoot(sb.init_pid, sb.init_start_time, kWorkspaceInSandbox,
                                   /*no_symlinks=*/true)
               : absl::StatusOr<Fd>(
                     Fd(OpenInDir(sb.dir, "workspace", O_RDONLY | O_DIRECTORY | O_CLOEXEC)));
  if (to.ok() && !to->valid()) to = Errno("open the workspace");
  if (!to.ok()) {
    return absl::Status(
        to.status().code(),
        absl::StrCat("sandbox ", sb.id, ": its workspace: ", to.status().message()));
  }
  absl::StatusOr<CopyStats> copied = CopyInto(from.get(), to->get(), owner);
  if (!copied.ok()) {
    return absl::Status(copied.status().code(),
                        absl::StrCat("sandbox ", sb.id, ": restoring the workspace of snapshot ",
                                     id, ": ", copied.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace sbx::runtime::local

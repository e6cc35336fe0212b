#include "src/runtime/image_root_helper.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// Kept free of sbx's libraries: it runs once per sandbox start, on the cold path.

namespace sbx::runtime {
namespace {

[[noreturn]] void Die(const std::string& what) {
  const int err = errno;
  // strerror is not thread-safe, but sbx-rootfs is single-threaded (and links nothing of
  // sbx's, not even src/common/errno_text.h's ErrnoText).
  std::fprintf(stderr, "sbx-rootfs: %s%s%s\n", what.c_str(), err != 0 ? ": " : "",
               err != 0 ? std::strerror(err) : "");  // NOLINT(concurrency-mt-unsafe)
  _exit(125);
}

[[noreturn]] void Refuse(const std::string& what) {
  errno = 0;
  Die(what);
}

void WriteFile(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) Die("open " + path);
  if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    Die("write " + path);
  }
  close(fd);
}

void MakeDir(const char* name, mode_t mode) {
  if (mkdir(name, mode) != 0 && errno != EEXIST) Die(std::string("mkdir ") + name);
}

bool ParseIds(const char* text, uid_t* uid, gid_t* gid) {
  char* end = nullptr;
  errno = 0;
  const unsigned long u = std::strtoul(text, &end, 10);
  if (errno != 0 || end == text || *end != ':') return false;
  const char* g_text = end + 1;
  const unsigned long g = std::strtoul(g_text, &end, 10);
  if (errno != 0 || end == g_text || *end != '\0' || u == 0 || g == 0 || u >= 0xffffffffUL ||
      g >= 0xffffffffUL) {
    return false;
  }
  *uid = static_cast<uid_t>(u);
  *gid = static_cast<gid_t>(g);
  return true;
}

// The body of IdmapUserns's child: it only waits to be killed (its user namespace is
// what is wanted). Raw system calls: it shares the parent's memory.
int Idle(void*) {
  for (;;) syscall(SYS_pause);
  return 0;
}

// A user namespace whose uid and gid maps show host uid:gid as 0: the idmapping of the
// image's mount (files owned by root in the cache belong to uid:gid through it). Made by a
// child cloned into a new user namespace (sharing this process's memory: no copy of its
// pages), whose maps this root process writes; the child is killed once the namespace is
// open, and reaped by ReapIdmapChild before the exec (its exit overlaps the mounts).
pid_t g_idmap_child = -1;

int IdmapUserns(uid_t uid, gid_t gid) {
  static char stack[16384] __attribute__((aligned(16)));
  const pid_t pid = clone(Idle, stack + sizeof(stack), CLONE_NEWUSER | CLONE_VM | SIGCHLD, nullptr);
  if (pid < 0) Die("clone a user namespace");
  const std::string proc = "/proc/" + std::to_string(pid);
  WriteFile(proc + "/uid_map", "0 " + std::to_string(uid) + " 1\n");
  WriteFile(proc + "/gid_map", "0 " + std::to_string(gid) + " 1\n");
  const int ns = open((proc + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC);
  if (ns < 0) Die("open the idmap user namespace");
  kill(pid, SIGKILL);
  g_idmap_child = pid;
  return ns;
}

void ReapIdmapChild() {
  if (g_idmap_child < 0) return;
  while (waitpid(g_idmap_child, nullptr, 0) < 0 && errno == EINTR) {
  }
  g_idmap_child = -1;
}

// Mounts the folder `source` at `target`, read-only, nosuid, nodev, idmapped with `userns`
// when it is >= 0. `what` names it in errors.
void MountReadOnly(const std::string& source, const char* target, int userns,
                   const std::string& what) {
  const int tree = open_tree(AT_FDCWD, source.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (tree < 0) Die("open_tree " + what + " " + source);
  struct mount_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  if (userns >= 0) {
    attr.attr_set |= MOUNT_ATTR_IDMAP;
    attr.userns_fd = static_cast<uint64_t>(userns);
  }
  if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) != 0) {
    Die(userns >= 0 ? "idmap the mount of " + what +
                          " (its file system must support idmapped mounts: ext4, xfs, btrfs, "
                          "tmpfs)"
                    : "make the mount of " + what + " read-only");
  }
  if (move_mount(tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) != 0) {
    Die("move_mount " + what);
  }
  close(tree);
}

// The components of an absolute path.
std::vector<std::string> Components(const std::string& path) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < path.size()) {
    const size_t next = path.find('/', at);
    const std::string c =
        path.substr(at, next == std::string::npos ? std::string::npos : next - at);
    if (!c.empty()) out.push_back(c);
    if (next == std::string::npos) break;
    at = next + 1;
  }
  return out;
}

// Walks `path` from the overlay's root. reset: a symbolic link or (before the last
// component, or at it when the runtime mounts a folder there) a non-folder is removed
// from the sandbox's layer, and the walk stops there (bubblewrap makes the rest).
// Otherwise a symbolic link on the way refuses the start.
void CheckTarget(int root, const std::string& path, bool reset) {
  const std::vector<std::string> parts = Components(path);
  if (parts.empty()) return;
  int dir = dup(root);
  if (dir < 0) Die("dup");
  std::string seen;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& c = parts[i];
    if (c == "." || c == "..") Refuse("target \"" + path + "\" is not a normal path");
    seen += "/" + c;
    struct stat st;
    if (fstatat(dir, c.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) break;
      Die("stat " + seen + " in the image");
    }
    const bool last = i + 1 == parts.size();
    if (S_ISLNK(st.st_mode) || (!S_ISDIR(st.st_mode) && (!last || reset))) {
      if (!reset) {
        Refuse("the image has a " +
               std::string(S_ISLNK(st.st_mode) ? "symbolic link" : "non-folder") + " at \"" + seen +
               "\", on the way to \"" + path +
               "\" (a mount target or the working folder): refused, a mount must not follow "
               "the image's links");
      }
      if (unlinkat(dir, c.c_str(), 0) != 0) Die("remove " + seen + " from the sandbox's root");
      break;
    }
    if (last) break;
    const int next = openat(dir, c.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) Die("open " + seen + " in the image");
    close(dir);
    dir = next;
  }
  close(dir);
}

// Where one of the sandbox's own layers (overlayfs's upper and work folders) lives.
struct Layer {
  std::string prefix;  // "<at>/" (the tmpfs, or a plain folder on disk) or "" (the host folder)
  bool tmpfs = false;
};

// A layer of the sandbox's own: a tmpfs of `bytes` at `at`, in this private mount namespace
// (it ends with the sandbox's processes: nothing to remove at delete). Overlayfs checks
// its work folder at every mount (a whiteout, a rename, xattrs), which on the data disk's
// ext4 cost more than the rest of the start, and its deletes are a tree to remove;
// on a tmpfs both are memory operations, charged to the sandbox's memory cgroup as it
// writes (this helper already runs in it). user_xattrs: the overlay will use user.overlay.*
// xattrs (a user namespace's mount), which tmpfs has only since Linux 6.6: without them
// the layer stays on disk in the host folder (`fallback`), as before.
Layer MountLayer(const std::string& at, long long bytes, bool user_xattrs,
                 const std::string& fallback) {
  MakeDir(at.c_str(), 0700);
  const std::string options = "mode=0700,size=" + std::to_string(bytes);
  if (mount("tmpfs", at.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
    Die("mount the sandbox's layer " + at + " (tmpfs " + options + ")");
  }
  if (user_xattrs && setxattr(at.c_str(), "user.sbx", "1", 1, 0) != 0) {
    if (errno != EOPNOTSUPP) Die("set a user xattr on the sandbox's layer " + at);
    if (umount2(at.c_str(), MNT_DETACH) != 0) Die("unmount the sandbox's layer " + at);
    std::fprintf(stderr,
                 "sbx-rootfs: this kernel's tmpfs has no user xattrs (Linux < 6.6): the "
                 "sandbox's layer %s is on disk in its host folder\n",
                 at.c_str());
    return Layer{fallback, false};
  }
  if (user_xattrs) removexattr(at.c_str(), "user.sbx");
  return Layer{at + "/", true};
}

// Makes the upper and work folders of `layer`; the upper one (the merged folder's own
// attributes) with `mode`, owned by uid:gid when `own`.
void MakeUpperAndWork(const Layer& layer, mode_t mode, bool own, uid_t uid, gid_t gid) {
  const std::string upper = layer.prefix + "upper";
  if (mkdir(upper.c_str(), 0755) != 0 && errno != EEXIST) Die("mkdir " + upper);
  const std::string work = layer.prefix + "work";
  if (mkdir(work.c_str(), 0700) != 0 && errno != EEXIST) Die("mkdir " + work);
  if (chmod(upper.c_str(), mode) != 0) Die("chmod " + upper);
  if (own && chown(upper.c_str(), uid, gid) != 0) Die("chown " + upper);
}

// Mounts the overlay of `lowers` (overlayfs's lowerdir: top first, ':'-separated) under
// `layer` at `at`.
void MountOverlay(const std::string& lowers, const Layer& layer, bool user_xattrs, const char* at) {
  std::string options =
      "lowerdir=" + lowers + ",upperdir=" + layer.prefix + "upper,workdir=" + layer.prefix + "work";
  // On disk, volatile: the sandbox's layer dies with it, so the overlay need not sync it.
  if (!layer.tmpfs) options += ",volatile";
  if (user_xattrs) options += ",userxattr";
  if (mount("overlay", at, "overlay", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
    Die("mount the overlay at " + std::string(at) + " (" + options + ")");
  }
}

}  // namespace

int ImageRootHelperMain(int argc, char** argv) {
  std::string lower_image, dir, snapshot;
  long long layer_bytes = 1LL << 30;
  long long workspace_bytes = 0;
  std::vector<std::string> reset_targets, strict_targets;
  bool idmap = false;
  uid_t uid = 0;
  gid_t gid = 0;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (i + 1 >= argc) Refuse("option " + a + " needs a value");
    const char* v = argv[++i];
    if (a == "--lower") {
      lower_image = v;
    } else if (a == "--dir") {
      dir = v;
    } else if (a == "--idmap") {
      if (!ParseIds(v, &uid, &gid)) Refuse("--idmap takes UID:GID of a non-root user");
      idmap = true;
    } else if (a == "--layer_bytes" || a == "--workspace_bytes") {
      char* end = nullptr;
      errno = 0;
      const long long n = std::strtoll(v, &end, 10);
      if (errno != 0 || end == v || *end != '\0' || n <= 0) {
        Refuse(a + " takes a positive number of bytes");
      }
      (a == "--layer_bytes" ? layer_bytes : workspace_bytes) = n;
    } else if (a == "--snapshot") {
      snapshot = v;
    } else if (a == "--reset_target") {
      reset_targets.emplace_back(v);
    } else if (a == "--strict_target") {
      strict_targets.emplace_back(v);
    } else {
      Refuse("unknown option " + a);
    }
  }
  if (lower_image.empty() || lower_image[0] != '/' || dir.empty() || dir[0] != '/' || i >= argc ||
      (!snapshot.empty() && (snapshot[0] != '/' || workspace_bytes <= 0))) {
    Refuse(
        "usage: sbx-rootfs --lower IMAGE_ROOTFS --dir HOST_FOLDER [--idmap UID:GID] "
        "[--layer_bytes N] [--snapshot SNAPSHOT_FOLDER --workspace_bytes N] "
        "[--reset_target PATH]... [--strict_target PATH]... -- BWRAP ARGS...");
  }
  if (chdir(dir.c_str()) != 0) Die("chdir " + dir);
  const uid_t self_uid = geteuid();
  const gid_t self_gid = getegid();
  int userns = -1;
  if (idmap) {
    if (self_uid != 0) Refuse("--idmap needs root");
    userns = IdmapUserns(uid, gid);
    if (unshare(CLONE_NEWNS) != 0) Die("unshare a mount namespace");
  } else {
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
      Die("unshare a user and mount namespace");
    }
    WriteFile("/proc/self/setgroups", "deny\n");
    WriteFile("/proc/self/uid_map", "0 " + std::to_string(self_uid) + " 1\n");
    WriteFile("/proc/self/gid_map", "0 " + std::to_string(self_gid) + " 1\n");
  }
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) Die("make / private");
  MakeDir("lower", 0700);
  MakeDir("root", 0755);
  const Layer layer = MountLayer("layer", layer_bytes, /*user_xattrs=*/!idmap, "");
  MountReadOnly(lower_image, "lower", userns, "the image");
  // A sandbox that starts at a snapshot (a fork, a reset, a member of a snapshot's pool):
  // the snapshot's layer is a read-only layer between the image and the sandbox's own, and
  // its workspace the read-only layer under an overlay of the sandbox's own at "ws", which
  // bubblewrap binds as the workspace. Nothing of the snapshot is copied: the sandbox
  // writes only its own layers, and every sandbox of the snapshot shares its files.
  Layer ws_layer;
  if (!snapshot.empty()) {
    MakeDir("snap", 0700);
    MakeDir("snapws", 0700);
    MakeDir("ws", 0755);
    MountReadOnly(snapshot + "/root", "snap", userns, "the snapshot's layer");
    MountReadOnly(snapshot + "/workspace", "snapws", userns, "the snapshot's workspace");
    ws_layer = MountLayer("wslayer", workspace_bytes, /*user_xattrs=*/!idmap, "wslayer/");
  }
  if (userns >= 0) close(userns);
  // The sandbox's root belongs to the sandbox's user. Run as root, the host folder is
  // searchable by the sandbox's host uid (bubblewrap, run as it, resolves the root's path),
  // so its layer is closed to everyone else (mode 0700); otherwise it takes the image
  // root's mode.
  struct stat lower_st;
  if (stat("lower", &lower_st) != 0) Die("stat the image's root");
  MakeUpperAndWork(layer, idmap ? 0700 : lower_st.st_mode & 07777, idmap, uid, gid);
  const std::string upper = layer.prefix + "upper";
  if (!snapshot.empty()) {
    // The workspace as bubblewrap's tmpfs would make it: mode 0755, the sandbox's.
    MakeUpperAndWork(ws_layer, 0755, idmap, uid, gid);
    MountOverlay("snapws", ws_layer, /*user_xattrs=*/!idmap, "ws");
  }
  // The folders bubblewrap mounts on, made in the sandbox's layer before the overlay
  // exists: a plain mkdir here costs less than one through the overlay, and a folder of
  // the upper layer hides whatever the image has at that path (a link, a file).
  for (const std::string& t : reset_targets) {
    const std::vector<std::string> parts = Components(t);
    if (parts.size() != 1) continue;
    const std::string at = upper + "/" + parts[0];
    if (mkdir(at.c_str(), 0755) != 0 && errno != EEXIST) Die("mkdir " + at);
    if (idmap && chown(at.c_str(), uid, gid) != 0) Die("chown " + at);
  }
  MountOverlay(snapshot.empty() ? "lower" : "snap:lower", layer, /*user_xattrs=*/!idmap, "root");
  const int root = open("root", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (root < 0) Die("open the sandbox's root");
  if (idmap) {
    if (syscall(SYS_setgroups, 0, nullptr) != 0) Die("setgroups");
    if (setresgid(gid, gid, gid) != 0) Die("setresgid");
    if (setresuid(uid, uid, uid) != 0) Die("setresuid");
  }
  // As the sandbox's user: what it changes lands in its own layer.
  for (const std::string& t : reset_targets) CheckTarget(root, t, /*reset=*/true);
  for (const std::string& t : strict_targets) CheckTarget(root, t, /*reset=*/false);
  close(root);
  // No zombie goes on to bubblewrap.
  ReapIdmapChild();
  // The working folder stays the host folder: adoption knows a sandbox's top process by it.
  execv(argv[i], argv + i);
  Die(std::string("exec ") + argv[i]);
}

}  // namespace sbx::runtime

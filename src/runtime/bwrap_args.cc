#include "src/runtime/bwrap_args.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/common/paths.h"
#include "src/common/status_macros.h"

namespace sbx::runtime::local {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kDefaultWorkspaceBytes = int64_t{256} << 20;
constexpr int64_t kDefaultLayerBytes = int64_t{1} << 30;
constexpr char kWorkspaceInside[] = "/run/sbx/workspace";
constexpr char kSandboxdInside[] = "/run/sbx/bin/sbx-sandboxd";
// Files of /etc that hold secrets of the host, masked in every sandbox (besides being
// unreadable to the sandbox's unprivileged uid).
constexpr const char* kEtcSecrets[] = {
    "/etc/shadow",  "/etc/shadow-",     "/etc/gshadow",     "/etc/gshadow-",
    "/etc/sudoers", "/etc/sudoers.d",   "/etc/ssl/private", "/etc/security/opasswd",
    "/etc/ssh",     "/etc/krb5.keytab", "/etc/machine-id",  "/etc/kubernetes",
};

// Masks the host path `host`, seen in the sandbox at `inside`: an empty read-only tmpfs
// over a folder, /dev/null over anything else.
void AppendMask(const std::string& host, const std::string& inside, std::vector<std::string>* a) {
  struct stat st;
  if (lstat(host.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    a->insert(a->end(), {"--tmpfs", inside, "--remount-ro", inside});
  } else {
    a->insert(a->end(), {"--ro-bind", "/dev/null", inside});
  }
}

// The folders of the host every sandbox sees (read-only), where they are folders.
std::vector<std::string> SystemFolders() {
  std::vector<std::string> out;
  for (const char* top : {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}) {
    struct stat st;
    if (lstat(top, &st) == 0 && S_ISDIR(st.st_mode)) out.emplace_back(top);
  }
  return out;
}

// Whether a sandbox's process may search (pass through) the host folder `dir`: with a
// host uid of its own and no groups (own_uids), only the bits for others count; else it
// has sbx's own uid and groups.
bool SandboxMaySearch(const std::string& dir, bool own_uids) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) return false;
  return own_uids ? (st.st_mode & S_IXOTH) != 0 : access(dir.c_str(), X_OK) == 0;
}

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

// The daemon's arguments (after its path).
std::vector<std::string> DaemonArgs(const std::string& id, const std::string& workspace) {
  return {"--listen_fd", std::to_string(kListenFd),
          "--secret_fd", std::to_string(kSecretFd),
          "--ready_fd",  std::to_string(kReadyFd),
          "--id",        id,
          "--workspace", workspace};
}

// The template's mounts, or INVALID_ARGUMENT when one would show the server's files
// (CheckMounts).
absl::StatusOr<std::vector<std::string>> MountArgs(const LocalSpec& spec,
                                                   const std::vector<std::string>& hidden) {
  RETURN_IF_ERROR(CheckMounts(spec, hidden));
  std::vector<std::string> a;
  for (const auto& m : spec.mounts) {
    a.insert(a.end(), {m.read_only ? "--ro-bind" : "--bind", m.source, m.target});
  }
  return a;
}

// SandboxArgv for a sandbox of an image.
absl::StatusOr<std::vector<std::string>> ImageSandboxArgv(
    const std::string& id, const std::string& dir, const LocalSpec& spec,
    const BubblewrapRuntimeOptions& options, const Isolation& iso, const ImageRun& image,
    uid_t host_uid, const std::string& snapshot_dir) {
  if (!iso.isolated) {
    return absl::FailedPreconditionError(
        "a sandbox of an image needs bubblewrap's isolation (this runtime runs plain processes)");
  }
  ASSIGN_OR_RETURN(std::vector<std::string> mounts, MountArgs(spec, iso.hidden));
  std::vector<std::string> strict;
  for (const auto& m : spec.mounts) strict.push_back(m.target);
  if (!image.working_dir.empty()) strict.push_back(image.working_dir);
  const int64_t ws =
      spec.workspace_size_bytes > 0 ? spec.workspace_size_bytes : kDefaultWorkspaceBytes;
  std::vector<std::string> a =
      ImageRootPrefix(options.rootfs_helper_path, image, dir, iso.own_uids, host_uid,
                      spec.layer_size_bytes > 0 ? spec.layer_size_bytes : kDefaultLayerBytes,
                      strict, snapshot_dir, ws);
  for (std::string& x : IsolationArgs(options.bwrap_path, image.uid, image.gid)) {
    a.push_back(std::move(x));
  }
  a.insert(a.end(), {"--info-fd", std::to_string(kInfoFd), "--hostname", id});
  if (!spec.network) a.push_back("--unshare-net");
  // The image's root (sbx-rootfs's overlay), then what the runtime owns.
  a.insert(a.end(), {"--bind", dir + "/root", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs",
                     "/tmp", "--tmpfs", "/run"});
  if (snapshot_dir.empty()) {
    a.insert(a.end(), {"--size", std::to_string(ws), "--tmpfs", kWorkspaceInside});
  } else {
    // sbx-rootfs's overlay of the snapshot's workspace (its own layer a tmpfs of `ws`).
    a.insert(a.end(), {"--bind", WorkspaceMount(dir), kWorkspaceInside});
  }
  a.insert(a.end(), {"--ro-bind-fd", std::to_string(kSandboxdFd), kSandboxdInside});
  if (!iso.daemon_libs.empty()) a.insert(a.end(), {"--ro-bind", iso.daemon_lib_dir, kDaemonLibDir});
  a.insert(a.end(), mounts.begin(), mounts.end());
  for (const auto& [k, v] : image.env) a.insert(a.end(), {"--setenv", k, v});
  for (const auto& [k, v] : spec.env) a.insert(a.end(), {"--setenv", k, v});
  if (!image.working_dir.empty()) a.insert(a.end(), {"--dir", image.working_dir});
  a.insert(a.end(), {"--chdir", image.working_dir.empty() ? kWorkspaceInside : image.working_dir});
  if (!iso.daemon_libs.empty()) {
    // The host's loader runs the daemon with the host's libraries only: not the image's
    // (--inhibit-cache: its ld.so.cache is not read; --library-path: only /run/sbx/lib).
    a.insert(a.end(), {kDaemonLoader, "--inhibit-cache", "--library-path", kDaemonLibDir});
  }
  a.emplace_back(kSandboxdInside);
  for (std::string& x : DaemonArgs(id, kWorkspaceInside)) a.push_back(std::move(x));
  // The daemon shares the sandbox's mount namespace: its "/" is the sandbox's root.
  a.insert(a.end(), {"--sandbox_root", "/"});
  // Commands that name no cwd start in the image's WorkingDir.
  if (!image.working_dir.empty()) a.insert(a.end(), {"--default_cwd", image.working_dir});
  return a;
}

}  // namespace

// The mask moves up to the first folder on the way that the sandbox may not search because
// bubblewrap mounts as the sandbox's user and could not reach further. A mask inside another
// one is dropped: the outer one hides it, and bubblewrap cannot make a mount point in the
// read-only outer mask.
absl::StatusOr<std::vector<std::string>> SystemMasks(const std::vector<std::string>& hidden,
                                                     bool own_uids) {
  const std::vector<std::string> tops = SystemFolders();
  std::vector<std::string> masks;
  for (const char* secret : kEtcSecrets) {
    struct stat st;
    if (lstat(secret, &st) == 0) masks.emplace_back(secret);
  }
  for (const std::string& h : hidden) {
    for (const std::string& top : tops) {
      if (PathIsWithin(top, h)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "\"", h, "\" (one of the server's own files, which no sandbox may see) holds ", top,
            ", which every sandbox needs: keep the server's data dir, key, tokens file, TLS key "
            "and sandbox root out of the system folders' ancestors"));
      }
      if (!PathIsWithin(h, top)) continue;
      struct stat st;
      std::string point = lstat(h.c_str(), &st) == 0 && S_ISDIR(st.st_mode) ? h : Parent(h);
      if (point == top) {
        return absl::FailedPreconditionError(absl::StrCat(
            "\"", h,
            "\" (one of the server's own files, which no sandbox may see) lies directly in ", top,
            ", which every sandbox sees: a mask of the file alone would not survive its "
            "replacement by rename (a tokens reload, a renewed key), and masking ",
            top, " would hide it from the sandboxes. Move it into a folder of its own (e.g. ", top,
            "/sbx/", h.substr(h.rfind('/') + 1), ")"));
      }
      // The shallowest folder below `top` on the way to `point` that the sandbox may not
      // pass through.
      for (size_t at = top.size() + 1; at < point.size(); ++at) {
        if (point[at] != '/') continue;
        const std::string dir = point.substr(0, at);
        if (!SandboxMaySearch(dir, own_uids)) {
          point = dir;
          break;
        }
      }
      masks.push_back(point);
    }
  }
  std::sort(masks.begin(), masks.end());
  masks.erase(std::unique(masks.begin(), masks.end()), masks.end());
  std::vector<std::string> out;
  for (const std::string& m : masks) {
    // Sorted: an enclosing mask comes before what lies in it.
    if (!out.empty() && std::any_of(out.begin(), out.end(),
                                    [&m](const std::string& o) { return PathIsWithin(m, o); })) {
      continue;
    }
    out.push_back(m);
  }
  return out;
}

std::vector<std::string> SystemArgs(const std::vector<std::string>& masks) {
  std::vector<std::string> a;
  for (const char* top : {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}) {
    struct stat st;
    if (lstat(top, &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const fs::path target = fs::read_symlink(top, ec);
      if (!ec) a.insert(a.end(), {"--symlink", target.string(), top});
    } else if (S_ISDIR(st.st_mode)) {
      a.insert(a.end(), {"--ro-bind", top, top});
    }
  }
  for (const std::string& m : masks) AppendMask(m, m, &a);
  for (const char* x : {"--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--dir", "/var",
                        "--tmpfs", "/var/tmp", "--tmpfs", "/run"}) {
    a.emplace_back(x);
  }
  return a;
}

// Template mounts may not show the server's files: no sandbox may see them, and a mask under
// a mount would be one more mount to get right (and would not survive a rename).
absl::Status CheckMounts(const LocalSpec& spec, const std::vector<std::string>& hidden) {
  for (const auto& m : spec.mounts) {
    std::error_code ec;
    const std::string resolved = fs::weakly_canonical(m.source, ec).string();
    for (const std::string& source : {m.source, resolved}) {
      if (source.empty()) continue;
      for (const std::string& h : hidden) {
        if (PathIsWithin(source, h)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mount source \"", m.source, "\" lies in \"", h,
              "\", one of the server's own files (data dir, key, tokens file, TLS key, sandbox "
              "root), which no sandbox may see"));
        }
        if (PathIsWithin(h, source)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mount source \"", m.source, "\" holds \"", h,
              "\", one of the server's own files (data dir, key, tokens file, TLS key, sandbox "
              "root), which no sandbox may see: mount a folder that does not hold it"));
        }
      }
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> IsolationArgs(const std::string& bwrap, uid_t uid, gid_t gid) {
  return {bwrap,
          "--unshare-user",
          "--uid",
          std::to_string(uid),
          "--gid",
          std::to_string(gid),
          "--disable-userns",
          "--unshare-pid",
          "--unshare-ipc",
          "--unshare-uts",
          "--unshare-cgroup-try",
          "--new-session",
          "--cap-drop",
          "ALL",
          "--seccomp",
          std::to_string(kSeccompFd)};
}

absl::StatusOr<std::vector<std::string>> SandboxArgv(const std::string& id, const std::string& dir,
                                                     const LocalSpec& spec,
                                                     const BubblewrapRuntimeOptions& options,
                                                     const Isolation& iso,
                                                     const std::vector<std::string>& system_args,
                                                     const ImageRun* image, uid_t host_uid,
                                                     const std::string& snapshot_dir) {
  if (image != nullptr) {
    return ImageSandboxArgv(id, dir, spec, options, iso, *image, host_uid, snapshot_dir);
  }
  if (!iso.isolated) {
    std::vector<std::string> a = {options.sandboxd_path};
    for (std::string& x : DaemonArgs(id, dir + "/workspace")) a.push_back(std::move(x));
    return a;
  }
  // The isolation options, a root of bubblewrap's own tmpfs holding only the system
  // folders (read-only), fresh /dev, /proc, /tmp and /run, the workspace, the daemon and
  // the template's mounts. No --die-with-parent: the sandbox must outlive sbx (and that
  // option ties bwrap to the thread that forked it).
  std::vector<std::string> a = IsolationArgs(options.bwrap_path);
  a.insert(a.end(), {"--info-fd", std::to_string(kInfoFd), "--hostname", id});
  if (!spec.network) a.push_back("--unshare-net");
  a.insert(a.end(), system_args.begin(), system_args.end());
  const int64_t ws =
      spec.workspace_size_bytes > 0 ? spec.workspace_size_bytes : kDefaultWorkspaceBytes;
  a.insert(a.end(), {"--size", std::to_string(ws), "--tmpfs", kWorkspaceInside});
  a.insert(a.end(), {"--ro-bind-fd", std::to_string(kSandboxdFd), kSandboxdInside});
  ASSIGN_OR_RETURN(std::vector<std::string> mounts, MountArgs(spec, iso.hidden));
  a.insert(a.end(), mounts.begin(), mounts.end());
  a.insert(a.end(), {"--setenv", "HOME", kWorkspaceInside});
  for (const auto& [k, v] : spec.env) a.insert(a.end(), {"--setenv", k, v});
  a.insert(a.end(), {"--chdir", kWorkspaceInside, kSandboxdInside});
  for (std::string& x : DaemonArgs(id, kWorkspaceInside)) a.push_back(std::move(x));
  // The daemon shares the sandbox's mount namespace: its "/" is the sandbox's root.
  a.insert(a.end(), {"--sandbox_root", "/"});
  return a;
}

std::vector<std::string> ProbeArgv(const std::string& bwrap,
                                   const std::vector<std::string>& masks) {
  std::vector<std::string> argv = IsolationArgs(bwrap);
  argv.push_back("--unshare-net");
  for (std::string& x : SystemArgs(masks)) argv.push_back(std::move(x));
  argv.insert(argv.end(), {"--ro-bind-fd", std::to_string(kSandboxdFd), kSandboxdInside,
                           kSandboxdInside, "--version"});
  return argv;
}

}  // namespace sbx::runtime::local

#pragma once
// The local runtime: each sandbox is a bubblewrap (`bwrap`) process tree that treats its
// workload as hostile:
// - its own user namespace: the workload runs as uid 1000 with no capability, mapped to
//   an unprivileged host uid (when sbx runs as root, bwrap itself is started as a host
//   uid of its own per sandbox, from sandbox_uid_base; otherwise as sbx's uid), and it
//   cannot make further user namespaces;
// - its own pid, mount, ipc, uts, cgroup and (unless the template asks for the host's)
//   network namespaces; no_new_privs; a seccomp filter refusing what a workload never
//   needs (mounts, ptrace, keyrings, bpf, perf, kexec, modules, userfaultfd, handles);
// - a minimal root: /usr, /bin, /sbin, /lib* and /etc read-only (secrets of /etc and the
//   operator's hidden_paths masked), fresh /dev, /proc, /tmp, /var/tmp, /run, a private
//   size-limited tmpfs workspace, and the template's mounts; never /root, /home, /var,
//   /srv, the project's folders, the server's data or the sandbox root;
// - a daemon (`sbx-sandboxd`) serving on a unix socket that the runtime binds in the
//   sandbox's host folder, root_dir/<id>/ (mode 0700, outside the sandbox), and hands over
//   as a descriptor; the daemon takes calls only with the sandbox's secret
//   (options.secret_for), which it reads from a pipe.
// Without working bubblewrap and user namespaces Make() fails; plain processes (no
// isolation at all) need allow_unisolated, meant for development only.
//
// Thread-safety: every method may be called from any thread. Create, Delete, Suspend and
// Resume return at once and do the slow work (spawn, wait for the daemon, freeze, kill) on
// the runtime's worker threads, where their callbacks run. `on_gone` runs on the
// runtime's reaper thread.
//
// Suspend freezes every process of a sandbox, keeping its memory: with the sandbox's
// freezer cgroup (cgroup v1, /sys/fs/cgroup/freezer/sbx/<id>) when the machine has one,
// else with SIGSTOP/SIGCONT of each of its processes (logged once at start).
//
// Output: nothing a sandbox writes reaches a host file without a bound. The standard
// output and error of bwrap (held by the sandbox's pid 1) and of the daemon are a FIFO in
// the sandbox's host folder (`output`), which the sandbox's first process holds open for
// reading and writing: a write never fails for want of a reader, and waits once the
// pipe's buffer (64 KiB) is full while no runtime reads it. The runtime drains it into
// `sandboxd.log`, which at 1 MiB becomes `sandboxd.log.1` (replacing the older part): at
// most 2 MiB per sandbox; what is dropped is counted (output_dropped_bytes). A runtime
// that adopts a sandbox opens its FIFO by name and drains it from then on. The FIFO is
// the runtime's (mode 0600): a sandbox whose host uid differs (sbx runs as root) cannot
// even open it through /proc/1/fd.
//
// Lifetime: sandboxes outlive the runtime and the sbx process. Each runs in its own
// session (a Ctrl-C in sbx's terminal does not reach it) and is not tied to sbx by a
// parent-death signal. Once ready, a sandbox's host folder holds a state file (id, pool,
// its top process with that process's start time); nothing in that folder is reachable
// from any sandbox, and it is written without following symbolic links. Make() scans
// root_dir: a sandbox whose top process is still the same process (same start time,
// working in that folder) and whose daemon accepts connections is adopted — watched like
// the runtime's own (its end is reported through `on_gone`), listed by List(), deletable
// and suspendable. Its socket and cgroups are derived from its id, never read from a file.
// Anything else found there (a dead sandbox, a half-created one, a folder without a state
// file, a state file of an older version) is killed and removed with its cgroups. Delete
// (of an own, adopted or suspended sandbox alike) kills the sandbox's pid namespace
// through its pid 1 and whatever its cgroups hold, then removes its folder and cgroups.
// The destructor waits for the runtime's threads; it kills every sandbox when
// `delete_on_exit` is set, and otherwise leaves them running for the next runtime on the
// same root_dir to adopt. Calls still queued when it runs get CANCELLED.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/runtime/runtime.h"

namespace sbx::images {
class Images;
}  // namespace sbx::images

namespace sbx::runtime {

// What a local template asks for; stored as the template's spec, as JSON (see
// EncodeLocalSpec). Mirrors sbx.v1.LocalSpec.
struct LocalSpec {
  struct Mount {
    std::string source;  // host path
    std::string target;  // path in the sandbox
    bool read_only = true;
  };
  // An OCI image reference (sbx::images): the sandbox's root is copy-on-write over it.
  // Empty: the host's system folders, read-only.
  std::string image;
  std::map<std::string, std::string> env;
  std::vector<Mount> mounts;
  bool network = false;
  int64_t memory_limit_bytes = 0;    // 0: no limit
  int64_t pids_limit = 0;            // 0: no limit
  int64_t workspace_size_bytes = 0;  // 0: 256 MiB
  int64_t layer_size_bytes = 0;      // with an image: its own layer (a tmpfs); 0: 1 GiB
  // A snapshot (issue 37) the sandbox starts from: its layer and workspace begin as copies
  // of the snapshot's files. Empty: none.
  std::string snapshot;
};

// JSON encoding of a LocalSpec. Parse errors are INVALID_ARGUMENT naming the field; so are
// mounts that are not normalized absolute paths (no ".", "..", empty components or
// trailing "/") and mount targets on "/" or under the sandbox's own paths (/run/sbx,
// /proc, /dev).
std::string EncodeLocalSpec(const LocalSpec& spec);
[[nodiscard]] absl::StatusOr<LocalSpec> ParseLocalSpec(const std::string& json);

struct BubblewrapRuntimeOptions {
  // Folder for the sandboxes' host folders (sockets, state, logs; one subfolder per
  // sandbox). Created if missing and kept at mode 0700. Keep it short: a unix socket path
  // must fit in 107 bytes.
  std::string root_dir = ".sbx/sandboxes";
  // The daemon binary started in every sandbox.
  std::string sandboxd_path;
  // sbx-rootfs, which gives a sandbox of an image its copy-on-write root
  // (image_root_helper.h). Empty: beside sandboxd_path.
  std::string rootfs_helper_path;
  // The images that templates name (local.image); not owned, must outlive the runtime.
  // Null: a template naming an image fails its creates with FAILED_PRECONDITION.
  images::Images* images = nullptr;
  // bubblewrap. Missing, or unable to make a user namespace: Make() fails (see
  // allow_unisolated).
  std::string bwrap_path = "/usr/bin/bwrap";
  // DEVELOPMENT ONLY: when bubblewrap cannot isolate (or bwrap_path is empty), run
  // sandboxes as plain processes with sbx's own user, files and network. Loudly logged.
  bool allow_unisolated = false;
  // When sbx runs as root, each sandbox gets a host uid (and gid) of its own from
  // [sandbox_uid_base, sandbox_uid_base + sandbox_uid_count): no two running sandboxes
  // share one. Unused when sbx is not root (sandboxes run as sbx's uid).
  uint32_t sandbox_uid_base = 200000;
  uint32_t sandbox_uid_count = 65536;
  // The secret of sandbox `id`, handed to its daemon (which refuses calls without it).
  // Required.
  std::function<std::string(const std::string& id)> secret_for;
  // Host files and folders no sandbox may see (the server's data dir, token files, keys):
  // where they lie in a system folder sandboxes see, each file's folder (a folder itself)
  // is masked, so that a file replaced by rename stays hidden; a file right in /etc (or
  // /usr, /lib*) is refused by Make() with that reason. A template mount whose source
  // holds one or lies in one is refused (CheckSpec). The root dir is always hidden.
  std::vector<std::string> hidden_paths;
  // How long a new sandbox may take until its daemon accepts connections.
  absl::Duration ready_timeout = absl::Seconds(10);
  // Threads that start and delete sandboxes (each start blocks one of them).
  int workers = 4;
  // Called once when a sandbox's process tree ends by itself (not through Delete), for
  // sandboxes this runtime started and those it adopted alike.
  std::function<void(const std::string& id)> on_gone;
  // Whether the destructor kills every sandbox. False: they keep running and the next
  // runtime made on the same root_dir adopts them (sbx-server restarts keep claims).
  bool delete_on_exit = false;
  // Where snapshots' files live (snapshot_files.h): made at mode 0700 if missing; what a
  // crash left half-made there is removed by Make(). Empty: no snapshots (Snapshot answers
  // FAILED_PRECONDITION).
  std::string snapshots_dir;
  // Suspend with the freezer cgroup when the machine has a writable one. False: always
  // SIGSTOP/SIGCONT each process (the fallback; tests use it to exercise that path).
  bool use_freezer = true;

  // INVALID_ARGUMENT naming the bad field.
  [[nodiscard]] absl::Status Validate() const;
};

class BubblewrapRuntime : public Runtime {
 public:
  // Checks the options and the environment (bwrap can make a sandbox as it will for real,
  // user namespace included; the root dir is writable), adopts
  // the live sandboxes of an earlier run under the root dir and cleans up the rest (see
  // Lifetime above), and logs what isolation, limits and suspension are available. One
  // runtime at a time may use a root dir (it holds a lock on root_dir/.lock). Errors:
  // INVALID_ARGUMENT, FAILED_PRECONDITION naming what is missing (with what to install or
  // enable) or the root in use.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<BubblewrapRuntime>> Make(
      BubblewrapRuntimeOptions options);

  ~BubblewrapRuntime() override = default;

  // Whether sandboxes run under bubblewrap (false: plain-process fallback).
  virtual bool isolated() const = 0;
  // Sandboxes currently running (started here or adopted).
  virtual size_t running() const = 0;
  // How many sandboxes of an earlier run Make() adopted.
  virtual size_t adopted() const = 0;
  // OK, or INVALID_ARGUMENT naming the file when a mount of `spec` holds one of the
  // server's files (hidden_paths, the root dir) or lies in one: such a template is refused
  // when it is put, and again at every create.
  [[nodiscard]] virtual absl::Status CheckSpec(const LocalSpec& spec) const = 0;
  // Bytes the sandboxes wrote to their stdout/stderr that their bounded logs did not keep
  // (see "Output" above), since Make().
  virtual uint64_t output_dropped_bytes() const = 0;
};

}  // namespace sbx::runtime

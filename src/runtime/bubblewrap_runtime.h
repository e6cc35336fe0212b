#pragma once
// The local runtime: each sandbox is a bubblewrap (`bwrap`) process tree with its own pid,
// mount, ipc, uts and (unless the template asks for the host's) network namespaces, the
// host filesystem read-only, a private writable workspace (a size-limited tmpfs), running
// `sbx-sandboxd` on a unix socket that sbx connects to. Without bubblewrap it falls back
// to plain processes and says so loudly at start.
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
// Lifetime: sandboxes outlive the runtime and the sbx process. Each runs in its own
// session (a Ctrl-C in sbx's terminal does not reach it) and is not tied to sbx by a
// parent-death signal. Once ready, a sandbox's folder (root_dir/<id>/) holds a state file
// (id, pool, endpoint, its top process with that process's start time, its cgroups).
// Make() scans root_dir: a sandbox whose top process is still the same process (same
// start time) and whose daemon accepts connections is adopted — watched like the
// runtime's own (its end is reported through `on_gone`), listed by List(), deletable and
// suspendable. Anything else found there (a dead sandbox, a half-created one, a folder
// without a state file) is killed and removed with its cgroups. Delete (of an own, adopted
// or suspended sandbox alike) kills the sandbox's pid namespace through its pid 1 and
// whatever its cgroups hold, then removes its folder and cgroups. The destructor waits for
// the runtime's threads; it kills every sandbox when `delete_on_exit` is set, and
// otherwise leaves them running for the next runtime on the same root_dir to adopt. Calls
// still queued when it runs get CANCELLED.

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

namespace sbx::runtime {

// What a local template asks for; stored as the template's spec, as JSON (see
// EncodeLocalSpec). Mirrors sbx.v1.LocalSpec.
struct LocalSpec {
  struct Mount {
    std::string source;  // host path
    std::string target;  // path in the sandbox
    bool read_only = true;
  };
  std::map<std::string, std::string> env;
  std::vector<Mount> mounts;
  bool network = false;
  int64_t memory_limit_bytes = 0;    // 0: no limit
  int64_t pids_limit = 0;            // 0: no limit
  int64_t workspace_size_bytes = 0;  // 0: 256 MiB
};

// JSON encoding of a LocalSpec. Parse errors are INVALID_ARGUMENT naming the field.
std::string EncodeLocalSpec(const LocalSpec& spec);
absl::StatusOr<LocalSpec> ParseLocalSpec(const std::string& json);

struct BubblewrapRuntimeOptions {
  // Folder for the sandboxes' sockets (one subfolder per sandbox). Created if missing.
  // Keep it short: a unix socket path must fit in 107 bytes.
  std::string root_dir = ".sbx/sandboxes";
  // The daemon binary started in every sandbox.
  std::string sandboxd_path;
  // bubblewrap; empty or missing: plain processes (no isolation), with a warning.
  std::string bwrap_path = "/usr/bin/bwrap";
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
  // Suspend with the freezer cgroup when the machine has a writable one. False: always
  // SIGSTOP/SIGCONT each process (the fallback; tests use it to exercise that path).
  bool use_freezer = true;

  // INVALID_ARGUMENT naming the bad field.
  absl::Status Validate() const;
};

class BubblewrapRuntime : public Runtime {
 public:
  // Checks the options and the environment (bwrap runs; the root dir is writable), adopts
  // the live sandboxes of an earlier run under the root dir and cleans up the rest (see
  // Lifetime above), and logs what isolation, limits and suspension are available. One
  // runtime at a time may use a root dir (it holds a lock on root_dir/.lock). Errors:
  // INVALID_ARGUMENT, FAILED_PRECONDITION naming what is missing or the root in use.
  static absl::StatusOr<std::unique_ptr<BubblewrapRuntime>> Make(BubblewrapRuntimeOptions options);

  ~BubblewrapRuntime() override = default;

  // Whether sandboxes run under bubblewrap (false: plain-process fallback).
  virtual bool isolated() const = 0;
  // Sandboxes currently running (started here or adopted).
  virtual size_t running() const = 0;
  // How many sandboxes of an earlier run Make() adopted.
  virtual size_t adopted() const = 0;
};

}  // namespace sbx::runtime

#pragma once
// The local runtime: each sandbox is a bubblewrap (`bwrap`) process tree with its own pid,
// mount, ipc, uts and (unless the template asks for the host's) network namespaces, the
// host filesystem read-only, a private writable workspace (a size-limited tmpfs), running
// `sbx-sandboxd` on a unix socket that sbx connects to. Without bubblewrap it falls back
// to plain processes and says so loudly at start.
//
// Thread-safety: Create and Delete may be called from any thread; they return at once and
// do the slow work (spawn, wait for the daemon) on the runtime's worker threads, where the
// callbacks run. `on_gone` runs on the runtime's reaper thread.
// Lifetime: the destructor kills every sandbox it started and waits for its threads.

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
  // Called once when a sandbox's process tree ends by itself (not through Delete).
  std::function<void(const std::string& id)> on_gone;

  // INVALID_ARGUMENT naming the bad field.
  absl::Status Validate() const;
};

class BubblewrapRuntime : public Runtime {
 public:
  // Checks the options and the environment (bwrap runs; the root dir is writable), kills
  // sandboxes of an earlier run left under the root dir, and logs what isolation and
  // limits are available. Errors: INVALID_ARGUMENT,
  // FAILED_PRECONDITION naming what is missing.
  static absl::StatusOr<std::unique_ptr<BubblewrapRuntime>> Make(BubblewrapRuntimeOptions options);

  ~BubblewrapRuntime() override = default;

  // Whether sandboxes run under bubblewrap (false: plain-process fallback).
  virtual bool isolated() const = 0;
  // Sandboxes currently running.
  virtual size_t running() const = 0;
};

}  // namespace sbx::runtime

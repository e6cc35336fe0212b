#pragma once
// sbx::sandboxd: the daemon that runs inside every sandbox (a bubblewrap jail locally, a
// pod on Kubernetes). It serves sbx.sandboxd.v1.Sandboxd (proto/sbx/sandboxd/v1/
// sandboxd.proto) and grpc.health.v1.Health on a unix socket: it runs commands (Exec),
// takes late-bound configuration from a claim (Configure) and moves files confined to
// its workspace (WriteFile, ReadFile, ListFiles).
//
// Process-wide effects of Start: SIGPIPE is ignored, the standard descriptors 0-2 are
// opened on /dev/null when closed, a reaper thread waits for every child of the process
// (no other code of the process may wait for children), and with reap_orphans the
// process becomes a child subreaper (PR_SET_CHILD_SUBREAPER) so that orphans of commands
// are reaped too.
//
// Thread-safety: Daemon's methods may be called from any thread.
// Lifetime: Start() returns a serving daemon; Shutdown() stops it (idempotent); the
// destructor shuts down with a zero grace period if Shutdown was not called.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sbx::sandboxd {

struct DaemonOptions {
  // Unix socket to serve on (the local runtime); at most 107 bytes. A stale socket file
  // there is removed first; any other kind of file there is an error.
  std::string socket_path;
  // Or TCP "host:port" to serve on (in a pod, where sbx-server reaches it at podIP:port;
  // port 0 picks one, see Daemon::port). Exactly one of socket_path and listen is given.
  // Plaintext and unauthenticated: the pod's network policy must admit only sbx-server.
  std::string listen;
  // The workspace directory: commands start there and every file path is relative to
  // it. Required; must exist.
  std::string workspace;
  // Commands running at once; one more Exec gets RESOURCE_EXHAUSTED. 1 to 1024.
  int max_concurrent_execs = 16;
  // Largest file WriteFile writes and largest range ReadFile reads, in bytes. 1 to 1 GiB.
  // gRPC messages may be this plus 1 MiB.
  int64_t max_file_bytes = 64 << 20;
  // The base environment of every command (Configure and ExecStart.env are merged over
  // it). sbx-sandboxd passes its own environment.
  std::map<std::string, std::string> env;
  // After a command's first process exits, output is read until both pipes close or for
  // this long (background processes may hold them open). 0 to 1 minute.
  absl::Duration output_drain_grace = absl::Milliseconds(500);
  // Become a child subreaper so that orphaned grandchildren are reaped by sandboxd.
  bool reap_orphans = true;
  // Resolve paths with openat2(RESOLVE_BENEATH) when the kernel has it; false forces the
  // component-by-component walk (which refuses every symbolic link).
  bool use_openat2 = true;

  // INVALID_ARGUMENT naming the bad field and value.
  absl::Status Validate() const;
};

class Daemon {
 public:
  // Opens the workspace, binds the socket and starts serving (health SERVING).
  // Errors: INVALID_ARGUMENT for bad options; NOT_FOUND / FAILED_PRECONDITION when the
  // workspace is missing or not a directory, or a non-socket file is at socket_path;
  // UNAVAILABLE when the socket cannot be bound.
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);

  virtual ~Daemon() = default;

  // Health NOT_SERVING, new commands refused, running commands' process groups killed;
  // calls in flight may finish until `grace` has passed, then are cancelled. Removes the
  // socket file. Idempotent.
  virtual void Shutdown(absl::Duration grace) = 0;

  // Number of commands running now.
  virtual int running_execs() const = 0;

  // True when paths are confined with openat2 (false: the component walk).
  virtual bool uses_openat2() const = 0;

  // The TCP port served (with DaemonOptions::listen), 0 on a unix socket.
  virtual int port() const = 0;
};

}  // namespace sbx::sandboxd

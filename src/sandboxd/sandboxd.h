#pragma once
// sbx::sandboxd: the daemon that runs inside every sandbox (a bubblewrap jail locally, a
// pod on Kubernetes). It serves sbx.sandboxd.v1.Sandboxd (proto/sbx/sandboxd/v1/
// sandboxd.proto) and grpc.health.v1.Health: it runs commands (Exec) and processes that
// outlive their call (StartProcess and the other process RPCs: a table of processes with
// tags, bounded replay of their output, PTYs), takes late-bound configuration from a claim
// (Configure) and moves files confined to its workspace (WriteFile, ReadFile, ListFiles).
//
// Only sbx-server may drive it: every Sandboxd call must carry the sandbox's secret in
// the metadata entry `sbx-sandbox-secret` (kSecretMetadata), compared in constant time;
// a call without it, or with another, ends UNAUTHENTICATED before it does anything.
// Health stays open. The local runtime hands the daemon a socket it bound outside the
// sandbox (listen_fd), so no path in the sandbox leads to it.
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
#include "src/common/sandbox_secret.h"

namespace sbx::sandboxd {

// The metadata entry that carries the sandbox's secret.
inline constexpr const char* kSecretMetadata = kSandboxSecretMetadata;

struct DaemonOptions {
  // Unix socket to serve on; at most 107 bytes. A stale socket file there is removed
  // first; any other kind of file there is an error.
  std::string socket_path;
  // Or TCP "host:port" to serve on (in a pod, where sbx-server reaches it at podIP:port;
  // port 0 picks one, see Daemon::port). Plaintext: the secret keeps other callers out,
  // and the pod's network policy should admit only sbx-server.
  std::string listen;
  // Or a listening unix stream socket inherited from the parent (the local runtime binds
  // it in a folder outside the sandbox). Exactly one of socket_path, listen and
  // listen_fd is given. The daemon owns it from Start on (made close-on-exec).
  int listen_fd = -1;
  // The secret every call must carry (see the header comment). Required unless
  // allow_unauthenticated is set.
  std::string secret;
  // Development only: serve without a secret.
  bool allow_unauthenticated = false;
  // The workspace directory: commands start there and every file path is relative to
  // it. Required; must exist.
  std::string workspace;
  // The sandbox's root as its processes see it, where absolute file paths resolve
  // (RESOLVE_IN_ROOT). Inside bubblewrap the daemon shares the sandbox's mount namespace,
  // so the runtime passes "/". Empty: absolute file paths are refused (a daemon running
  // without isolation must not reach the host's files).
  std::string sandbox_root;
  // Where commands that name no cwd start instead of the workspace: an absolute folder
  // (a sandbox image's WorkingDir). Empty: the workspace.
  std::string default_cwd;
  // Commands running at once; one more Exec gets RESOURCE_EXHAUSTED. 1 to 1024.
  int max_concurrent_execs = 16;
  // Ceilings of the process table (StartProcessRequest.limits may only lower them): processes
  // running at once (1 to 4096; also how many ended ones are kept), PTYs open at once
  // (0 to 1024) and bytes all replay rings hold together (64 KiB to 4 GiB).
  int max_processes = 64;
  int max_ptys = 16;
  int64_t max_replay_bytes = int64_t{64} << 20;
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
  [[nodiscard]] absl::Status Validate() const;
};

class Daemon {
 public:
  // Opens the workspace, binds the socket and starts serving (health SERVING).
  // Errors: INVALID_ARGUMENT for bad options; NOT_FOUND / FAILED_PRECONDITION when the
  // workspace is missing or not a directory, or a non-socket file is at socket_path;
  // UNAVAILABLE when the socket cannot be bound.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);

  virtual ~Daemon() = default;

  // Health NOT_SERVING, new commands and processes refused, running commands' and
  // processes' process groups killed;
  // calls in flight may finish until `grace` has passed, then are cancelled. Removes the
  // socket file. Idempotent.
  virtual void Shutdown(absl::Duration grace) = 0;

  // Number of commands running now.
  virtual int running_execs() const = 0;

  // Number of processes (StartProcess) running or starting now.
  virtual int running_processes() const = 0;

  // True when paths are confined with openat2 (false: the component walk).
  virtual bool uses_openat2() const = 0;

  // The TCP port served (with DaemonOptions::listen), 0 on a unix socket.
  virtual int port() const = 0;
};

}  // namespace sbx::sandboxd

// sbx-sandboxd: the daemon inside each sandbox. Parse flags, serve on a unix socket, wait
// for SIGTERM/SIGINT, kill running commands and shut down with a deadline.

#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"
#include "src/common/build_info.h"
#include "src/common/errno_text.h"
#include "src/common/logging.h"
#include "src/common/signals.h"
#include "src/sandboxd/sandboxd.h"

extern char** environ;

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "sbx-sandboxd: error: %s\n", std::string(status.message()).c_str());
  return 2;
}

// The environment variable that may carry the secret (on Kubernetes, where the pod spec
// is the only way in). Taken out of the environment at once: commands never see it.
constexpr char kSecretEnv[] = "SBX_SANDBOXD_SECRET";

// Reads the secret from `fd` to its end and closes it.
absl::Status ReadSecretFd(int fd, std::string* out) {
  char buf[256];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(fd);
      return absl::FailedPreconditionError(
          std::string("cannot read the secret from --secret_fd: ") + sbx::ErrnoText(err));
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
    if (out->size() > 4096) {
      close(fd);
      return absl::InvalidArgumentError("the secret on --secret_fd is longer than 4096 bytes");
    }
  }
  close(fd);
  while (!out->empty() && (out->back() == '\n' || out->back() == '\r')) out->pop_back();
  return absl::OkStatus();
}

std::map<std::string, std::string> OwnEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

}  // namespace

int main(int argc, char** argv) {
  // First of all, block the stop signals in every thread (gRPC's and the command runners'
  // threads inherit this mask), then wait for them synchronously here. Commands get an
  // empty mask when they start.
  const sigset_t stop_signals = sbx::BlockSignals({SIGTERM, SIGINT});
  // Not dumpable: the commands it runs (same uid) can neither ptrace it nor open its
  // /proc files (memory, descriptors, environment), where the secret lives.
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  std::string secret;
  // getenv and unsetenv are not thread-safe, but this is main before any thread starts.
  // NOLINTBEGIN(concurrency-mt-unsafe)
  if (const char* from_env = std::getenv(kSecretEnv); from_env != nullptr) {
    secret = from_env;
    unsetenv(kSecretEnv);
  }
  // NOLINTEND(concurrency-mt-unsafe)

  sbx::sandboxd::DaemonOptions options;
  sbx::LogOptions log_options;
  double shutdown_grace_s = 5;
  int64_t drain_grace_ms = absl::ToInt64Milliseconds(options.output_drain_grace);

  CLI::App app{"sbx-sandboxd: the daemon inside an sbx sandbox (exec, files, health over gRPC)"};
  app.set_version_flag("--version",
                       std::string(sbx::Version()) + " (" + std::string(sbx::GitCommit()) + ")");
  std::string port_file;
  auto* socket = app.add_option("--socket", options.socket_path,
                                "unix socket to serve on (a stale socket file is removed)");
  auto* listen = app.add_option("--listen", options.listen,
                                "or TCP host:port to serve on, e.g. 0.0.0.0:7070 in a pod (plain "
                                "text, no auth: admit only sbx-server to it)");
  auto* listen_fd = app.add_option("--listen_fd", options.listen_fd,
                                   "or serve on this inherited listening unix socket (the local "
                                   "runtime binds it outside the sandbox)");
  socket->excludes(listen);
  socket->excludes(listen_fd);
  listen->excludes(listen_fd);
  int secret_fd = -1;
  app.add_option("--secret_fd", secret_fd,
                 "read the secret every call must carry from this descriptor (to its end); or "
                 "set " +
                     std::string(kSecretEnv));
  int ready_fd = -1;
  app.add_option("--ready_fd", ready_fd, "write one byte to this descriptor once serving");
  std::string sandbox_id;
  app.add_option("--id", sandbox_id, "the sandbox's id (for the logs)");
  app.add_flag("--insecure_no_auth", options.allow_unauthenticated,
               "DEVELOPMENT ONLY: serve without a secret (anyone who reaches the socket can run "
               "commands)");
  app.add_option("--port_file", port_file, "with --listen: write the bound port to this file");
  app.add_option("--default_cwd", options.default_cwd,
                 "absolute folder where commands naming no cwd start (a sandbox image's "
                 "WorkingDir); default: the workspace");
  app.add_option("--sandbox_root", options.sandbox_root,
                 "the sandbox's root as its processes see it (\"/\" inside bubblewrap): absolute "
                 "file paths resolve beneath it; default: absolute file paths are refused");
  app.add_option("--workspace", options.workspace,
                 "workspace directory (must exist); commands and file paths are relative to it")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--max_concurrent_execs", options.max_concurrent_execs,
                 "commands running at once; more get RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--max_processes", options.max_processes,
                 "processes (StartProcess) running at once; more get RESOURCE_EXHAUSTED (the "
                 "server may set a lower limit per call)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--max_ptys", options.max_ptys, "PTY processes running at once")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  app.add_option("--max_replay_bytes", options.max_replay_bytes,
                 "bytes the replay rings of all processes may hold together")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{64} << 10, int64_t{4} << 30));
  app.add_option("--max_file_bytes", options.max_file_bytes,
                 "largest file written or range read, in bytes")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--output_drain_grace_ms", drain_grace_ms,
                 "after a command's first process exits, read its output this long at most")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{60000}));
  app.add_option("--shutdown_grace_seconds", shutdown_grace_s,
                 "on SIGTERM/SIGINT, let calls in flight finish for this long")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--log_level", log_options.level, "trace|debug|info|warn|error|critical|off")
      ->capture_default_str();
  app.add_option("--log_format", log_options.format, "text|json")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (absl::Status s = sbx::InitLogging(log_options); !s.ok()) return Fail(s);
  if (secret_fd >= 0) {
    if (absl::Status s = ReadSecretFd(secret_fd, &secret); !s.ok()) return Fail(s);
  }
  options.secret = std::move(secret);
  options.output_drain_grace = absl::Milliseconds(drain_grace_ms);
  options.env = OwnEnvironment();

  spdlog::info("sbx-sandboxd {} ({}) starting{}", sbx::Version(), sbx::GitCommit(),
               sandbox_id.empty() ? std::string() : " in sandbox " + sandbox_id);
  auto daemon = sbx::sandboxd::Daemon::Start(options);
  if (!daemon.ok()) return Fail(daemon.status());
  if (ready_fd >= 0) {
    const char ready = '1';
    if (write(ready_fd, &ready, 1) != 1) spdlog::warn("cannot write to --ready_fd");
    close(ready_fd);
  }
  if (!port_file.empty()) {
    // Written whole under another name, then renamed: a reader never sees half a number.
    const std::string tmp = port_file + ".tmp";
    std::ofstream out(tmp, std::ios::trunc);
    out << (*daemon)->port() << "\n";
    out.close();
    if (!out || std::rename(tmp.c_str(), port_file.c_str()) != 0) {
      return Fail(absl::InternalError("cannot write port file \"" + port_file + "\""));
    }
  }

  int signal = 0;
  sigwait(&stop_signals, &signal);
  spdlog::info("received {}, shutting down (grace {} s)", signal == SIGTERM ? "SIGTERM" : "SIGINT",
               shutdown_grace_s);
  (*daemon)->Shutdown(absl::Seconds(shutdown_grace_s));
  daemon->reset();
  spdlog::info("sbx-sandboxd stopped");
  return 0;
}

// sbx-server: parse the flags, make the server (server_app.h), serve, wait for SIGTERM or
// SIGINT (SIGHUP reloads the tokens files), shut down with a deadline.

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include <signal.h>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpc/support/log.h"
#include "spdlog/spdlog.h"
#include "src/cmd/server_app.h"
#include "src/cmd/server_flags.h"
#include "src/common/logging.h"
#include "src/common/signals.h"

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "sbx-server: error: %s\n", std::string(status.message()).c_str());
  return 2;
}

// gRPC's own log lines go through spdlog, so that they take --log_format (a JSON log
// stays one object per line).
void LogFromGrpc(gpr_log_func_args* args) {
  const spdlog::level::level_enum level =
      args->severity == GPR_LOG_SEVERITY_ERROR  ? spdlog::level::err
      : args->severity == GPR_LOG_SEVERITY_INFO ? spdlog::level::info
                                                : spdlog::level::debug;
  spdlog::log(level, "grpc: {} ({}:{})", args->message, args->file, args->line);
}

}  // namespace

int main(int argc, char** argv) {
  // First of all, block the stop signals in every thread (gRPC's threads inherit this
  // mask), then wait for them synchronously here: no async-signal-safety concerns.
  const sigset_t stop_signals = sbx::BlockSignals({SIGTERM, SIGINT, SIGHUP});

  sbx::cmd::ServerFlags flags;
  CLI::App cli{"sbx-server: warm-pool sandbox allocator for AI agents (gRPC)"};
  sbx::cmd::AddServerFlags(cli, flags);
  CLI11_PARSE(cli, argc, argv);
  if (absl::Status s = sbx::InitLogging(flags.log); !s.ok()) return Fail(s);
  gpr_set_log_function(LogFromGrpc);

  const double grace_s = flags.shutdown_grace_s;
  auto app = sbx::cmd::ServerApp::Create(std::move(flags));
  if (!app.ok()) return Fail(app.status());
  if (absl::Status s = (*app)->Start(); !s.ok()) return Fail(s);

  int signal = 0;
  while (true) {
    sigwait(&stop_signals, &signal);
    if (signal != SIGHUP) break;
    (*app)->ReloadAuth();
  }
  spdlog::info("received {}, shutting down (grace {} s)", signal == SIGTERM ? "SIGTERM" : "SIGINT",
               grace_s);
  if (absl::Status s = (*app)->Shutdown(absl::Seconds(grace_s)); !s.ok()) return Fail(s);
  spdlog::info("sbx-server stopped");
  return 0;
}

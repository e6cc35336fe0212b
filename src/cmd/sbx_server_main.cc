// sbx-server: parse flags, start the service, wait for SIGTERM/SIGINT, shut down with a
// deadline.

#include <csignal>
#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"
#include "src/common/build_info.h"
#include "src/common/logging.h"
#include "src/server/server.h"

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "sbx-server: error: %s\n", std::string(status.message()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  sbx::server::ServerOptions server_options;
  sbx::LogOptions log_options;
  double shutdown_grace_s = 10;

  CLI::App app{"sbx-server: warm-pool sandbox allocator for AI agents (gRPC)"};
  app.set_version_flag("--version", std::string(sbx::Version()) + " (" +
                                        std::string(sbx::GitCommit()) + ")");
  app.add_option("--listen", server_options.listen, "host:port to serve gRPC on (port 0: any)")
      ->capture_default_str();
  app.add_option("--port_file", server_options.port_file,
                 "write the bound port to this file once serving");
  app.add_option("--max_receive_message_bytes", server_options.max_receive_message_bytes,
                 "largest request accepted")
      ->capture_default_str();
  app.add_option("--shutdown_grace_seconds", shutdown_grace_s,
                 "on SIGTERM/SIGINT, let calls in flight finish for this long")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--log_level", log_options.level, "trace|debug|info|warn|error|critical|off")
      ->capture_default_str();
  app.add_option("--log_format", log_options.format, "text|json")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (absl::Status s = sbx::InitLogging(log_options); !s.ok()) return Fail(s);

  // Block the stop signals in every thread (gRPC's threads inherit this mask), then wait
  // for them synchronously here: no async-signal-safety concerns.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  spdlog::info("sbx-server {} ({}) starting", sbx::Version(), sbx::GitCommit());
  auto server = sbx::server::Server::Start(server_options);
  if (!server.ok()) return Fail(server.status());

  int signal = 0;
  sigwait(&stop_signals, &signal);
  spdlog::info("received {}, shutting down (grace {} s)", signal == SIGTERM ? "SIGTERM" : "SIGINT",
               shutdown_grace_s);
  (*server)->Shutdown(absl::Seconds(shutdown_grace_s));
  spdlog::info("sbx-server stopped");
  return 0;
}

// sbx: the command-line client of sbx-server. Parses the global flags and one subcommand
// (CLI11), runs that subcommand's action and turns its result into the exit code: 0 on
// success (for exec: the remote command's code), 1 for an error from the server or this
// machine, 2 for a usage error. docs/cli.md describes every command.

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "CLI/CLI.hpp"
#include "src/cmd/sbx_cli_commands.h"
#include "src/common/build_info.h"

int main(int argc, char** argv) {
  // Before any other thread exists: the signal mask is inherited by gRPC's threads.
  sbx::cli::SignalRouter signals;
  signals.Start();
  // A closed stdout (`sbx ... | head`) shows up as EPIPE from write, handled there.
  std::signal(SIGPIPE, SIG_IGN);
  // gRPC's own log lines (e.g. a failed TLS handshake) would repeat, less clearly, the error
  // sbx prints; GRPC_VERBOSITY set by the user still wins.
  // setenv and getenv are not thread-safe, but this is main: the only other thread, the
  // signal waiter, calls sigwait alone, and no thread changes the environment later.
  // NOLINTBEGIN(concurrency-mt-unsafe)
  setenv("GRPC_VERBOSITY", "NONE", /*overwrite=*/0);

  sbx::cli::Context ctx;
  ctx.signals = &signals;
  ctx.stderr_tty = isatty(STDERR_FILENO) == 1;
  ctx.stdout_tty = isatty(STDOUT_FILENO) == 1;
  if (const char* s = std::getenv("SBX_SERVER"); s != nullptr && *s != '\0') {
    ctx.client_options.server = s;
  }
  if (const char* t = std::getenv("SBX_TOKEN"); t != nullptr && *t != '\0') {
    ctx.client_options.token = t;
  }
  // NOLINTEND(concurrency-mt-unsafe)
  std::string timeout = "30s";

  CLI::App app{"sbx: claim sandboxes from the warm pools of an sbx-server and work in them.",
               "sbx"};
  // Global flags may also follow the subcommand (`sbx claim py -o json`).
  app.fallthrough();
  // Subcommands are checked after parsing, so that an unknown one is reported by name.
  app.require_subcommand(0, 1);
  app.set_version_flag("--version",
                       std::string("sbx ") + sbx::Version() + " (" + sbx::GitCommit() + ")");
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    return std::string("sbx: error: ") + e.what() + "\nRun with --help for more information.\n";
  });
  app.footer(
      "Environment: SBX_SERVER and SBX_TOKEN give the defaults of --server and --token.\n"
      "Exit codes: 0 success; 1 error (printed as `sbx: error: CODE: message`); 2 usage error; "
      "exec: the command's own code (128+N when killed by signal N, 124 on timeout).");
  app.add_option("-s,--server", ctx.client_options.server, "Server address host:port ($SBX_SERVER)")
      ->capture_default_str();
  app.add_option("--token", ctx.client_options.token,
                 "Bearer token, sent as `authorization: Bearer TOKEN` ($SBX_TOKEN)");
  app.add_option("--token-file", ctx.client_options.token_file,
                 "Read the token from this file's first line (keeps it out of `ps`)");
  app.add_option("-o,--output", ctx.output, "Output format: table (for people) or json (scripts)")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  app.add_option("--timeout", timeout,
                 "Deadline of each call, e.g. 10s (claim adds its --wait, exec its "
                 "--timeout-exec)")
      ->check(sbx::cli::DurationCheck())
      ->capture_default_str();
  app.add_flag("--tls", ctx.client_options.tls, "Use TLS (implied by --ca, --cert, --key)");
  app.add_option("--ca", ctx.client_options.ca_file,
                 "PEM root certificates to verify the server (default: the system's)");
  app.add_option("--cert", ctx.client_options.cert_file,
                 "PEM client certificate chain for mutual TLS (with --key)");
  app.add_option("--key", ctx.client_options.key_file, "PEM private key of --cert");
  app.add_option("--tls-server-name", ctx.client_options.tls_server_name,
                 "Expect this name in the server's certificate instead of the host of --server");

  sbx::cli::Actions actions;
  sbx::cli::AddClaimCommands(app, ctx, actions);
  sbx::cli::AddSandboxCommands(app, ctx, actions);
  sbx::cli::AddProcessCommands(app, ctx, actions);
  sbx::cli::AddAdminCommands(app, ctx, actions);
  sbx::cli::AddWatchCommands(app, ctx, actions);
  sbx::cli::AddPortCommands(app, ctx, actions);
  sbx::cli::AddSnapshotCommands(app, ctx, actions);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; everything else is a usage error.
    return app.exit(e) == 0 ? 0 : 2;
  }
  ctx.client_options.timeout = sbx::cli::ParseDurationFlag(timeout);

  // The deepest subcommand given decides (`sbx pools scale` rather than `sbx pools`).
  const CLI::App* selected = &app;
  while (!selected->get_subcommands().empty()) selected = selected->get_subcommands().front();
  auto action = actions.find(selected);
  if (action == actions.end()) {
    std::string names;
    for (const CLI::App* sub : selected->get_subcommands({})) {
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    std::fprintf(stderr,
                 "sbx: error: %s needs a subcommand: %s\nRun with --help for more information.\n",
                 selected == &app ? "sbx" : ("sbx " + selected->get_name()).c_str(), names.c_str());
    return 2;
  }
  absl::StatusOr<int> result = action->second();
  std::fflush(stdout);
  signals.Stop();
  if (!result.ok()) {
    sbx::cli::PrintError(result.status());
    return sbx::cli::IsUsageError(result.status()) ? 2 : 1;
  }
  return *result;
}

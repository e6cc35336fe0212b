#pragma once
// The E2B front of sbx-server (src/gateway/e2b/e2b.h): its flags and starting it. Off unless
// --e2b_listen is given.

#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "src/common/sandbox_secret.h"
#include "src/gateway/e2b/e2b.h"
#include "src/gateway/gateway.h"
#include "src/server/auth.h"
#include "src/server/server.h"

namespace sbx::cmd {

struct E2bFlags {
  e2b::FrontOptions front;
  double call_timeout_s = 60;
  // Where the bound port is written (tests, port 0).
  std::string port_file;
};

void AddE2bFlags(CLI::App& app, E2bFlags* flags);

// The front and its own authenticator (the tokens its envd calls act with; reload it on
// SIGHUP with the server's), kept together.
struct RunningE2b {
  std::shared_ptr<server::Authenticator> auth;
  std::unique_ptr<e2b::Front> front;
};

// The front, or an empty RunningE2b without --e2b_listen. It takes the tokens file and
// the TLS certificate of the gRPC port from `server_options` (with --tls_cert_file the
// E2B listener serves HTTPS only; client certificates are not asked for: E2B clients
// have none). Port traffic goes to `proxy` (null without --proxy_listen: refused naming
// it). `server` and `proxy` must outlive it. Errors name the flag at fault; the server
// should stop on them.
[[nodiscard]] absl::StatusOr<RunningE2b> StartE2b(const E2bFlags& flags,
                                                  const server::ServerOptions& server_options,
                                                  server::Server& server,
                                                  const SandboxSecrets& secrets,
                                                  gateway::PortProxy* proxy);

}  // namespace sbx::cmd

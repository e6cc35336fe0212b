#pragma once
// The E2B front of sbx-server (src/e2b/e2b.h): its flags and starting it. Off unless
// --e2b_listen is given.

#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "src/common/sandbox_secret.h"
#include "src/e2b/e2b.h"
#include "src/server/server.h"

namespace sbx::cmd {

struct E2bFlags {
  e2b::FrontOptions front;
  double call_timeout_s = 60;
  // Where the bound port is written (tests, port 0).
  std::string port_file;
};

void AddE2bFlags(CLI::App& app, E2bFlags* flags);

// The front, or null without --e2b_listen. `server` must outlive it. Errors name the flag
// at fault; the server should stop on them.
absl::StatusOr<std::unique_ptr<e2b::Front>> StartE2b(const E2bFlags& flags, server::Server& server,
                                                     const SandboxSecrets& secrets);

}  // namespace sbx::cmd

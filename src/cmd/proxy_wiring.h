#pragma once
// The port proxy of sbx-server (src/gateway/gateway.h): its flags and starting it.
// Off unless --proxy_listen is given (scripts/run turns it on at 127.0.0.1:50052).

#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "src/common/sandbox_secret.h"
#include "src/gateway/gateway.h"
#include "src/server/auth.h"
#include "src/server/sandbox_service.h"

namespace sbx::cmd {

struct ProxyFlags {
  gateway::ProxyOptions proxy;
  double header_timeout_s = 10;
  double idle_timeout_s = 900;
  // The URL clients reach the proxy at (GetPortUrl's URLs). Empty: http://<listen address
  // and bound port>.
  std::string public_url;
  // Where the bound port is written (tests, port 0).
  std::string port_file;
};

void AddProxyFlags(CLI::App& app, ProxyFlags* flags);

// The proxy and its own authenticator and tokens, kept together.
struct RunningProxy {
  std::unique_ptr<server::Authenticator> auth;
  std::shared_ptr<const server::PortTokens> tokens;
  std::unique_ptr<gateway::PortProxy> proxy;
};

// The proxy, or an empty RunningProxy without --proxy_listen; fills `urls` for
// GetPortUrl. Errors name the flag at fault; the server should stop on them.
// `counters` (may be null) must outlive the proxy.
[[nodiscard]] absl::StatusOr<RunningProxy> StartProxy(const ProxyFlags& flags,
                                                      const server::AuthOptions& auth,
                                                      const SandboxSecrets& secrets,
                                                      allocator::Allocator* allocator,
                                                      server::PortUrlOptions* urls,
                                                      gateway::ProxyCounters* counters);

// The proxy's metric families (docs/metrics.md, "The port proxy"), read from `counters`
// at scrape time; `counters` must outlive the registry's use of it.
std::shared_ptr<prometheus::Collectable> ProxyCollector(const gateway::ProxyCounters* counters);

}  // namespace sbx::cmd

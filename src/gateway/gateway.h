#pragma once
// sbx::gateway: the HTTP front of sbx-server. Today: the port proxy, which makes a port
// inside a claimed sandbox reachable from outside (HTTP/1.1, WebSocket and other Upgrades,
// raw TCP through HTTP CONNECT), on Boost.Beast (only port_proxy.cc sees Boost).
//
// Addressing (docs/api.md, "Ports"):
//   host form   Host: PORT-CLAIM.DOMAIN           (ProxyOptions::domain; a wildcard DNS name)
//   path form   /_sbx/CLAIM/PORT/rest             (the sandbox sees /rest)
//   CONNECT     CONNECT PORT-CLAIM.DOMAIN:ANY  or  CONNECT CLAIM:PORT
// Who may connect: the claim's tenant (Authorization or Proxy-Authorization "Bearer
// <token>", as the gRPC API; the header is removed before the request goes on), or whoever
// holds a port URL token for exactly this claim and port (src/server/port_token.h; the
// query parameter sbx_token or the header X-Sbx-Token, removed before the request goes
// on). Everything else is answered here and never reaches the sandbox: 401 without or with
// a bad credential, 403 for a token of another claim or port, 404 for a claim the caller
// does not own or that does not exist (the same answer, so that claims of others cannot be
// probed), 409 for a claim that is not active, 429 beyond a connection limit, 400 for
// ambiguous framing (Content-Length with Transfer-Encoding, several Content-Lengths, a
// Transfer-Encoding other than chunked), 431 for a header above the limit, 408 (closed)
// for a header not complete within the header timeout.
//
// One client connection maps to one upstream connection, opened after the first request
// is authorised and never shared, so nothing one client sends can end up in another's
// stream. Every request on a kept-alive connection is parsed and must address the same
// claim and port. Credentials are checked when a connection opens (a WebSocket or CONNECT
// tunnel lives on until it is idle for idle_timeout or either side closes).
//
// Where the relay runs: the local runtime's sandboxes may have no network; their daemon,
// inside the sandbox's network namespace, connects to 127.0.0.1:PORT and passes the
// socket to the proxy (src/common/port_dial.h), which then moves the bytes itself. On
// Kubernetes (a TCP daemon endpoint) the proxy connects to the pod's IP and PORT.
//
// Thread-safety: PortProxy's methods may be called from any thread.
// Lifetime: the allocator, authenticator and tokens must outlive the proxy; Shutdown (or
// the destructor) closes every connection and joins the proxy's thread.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sbx::allocator {
class Allocator;
}  // namespace sbx::allocator
namespace sbx::server {
class Authenticator;
class PortTokens;
}  // namespace sbx::server

namespace sbx::gateway {

struct ProxyOptions {
  // host:port of the listener; port 0 picks one (PortProxy::port). Empty: no proxy.
  std::string listen;
  // The wildcard domain of the host form: "PORT-CLAIM.<domain>". Empty: host form off.
  std::string domain;
  // The whole request header of a connection's first request must arrive within this
  // (slowloris); the dial to the sandbox must be done within it too.
  absl::Duration header_timeout = absl::Seconds(10);
  // A connection with no byte moving either way for this long is closed (also the wait
  // for the next request on a kept-alive connection).
  absl::Duration idle_timeout = absl::Minutes(15);
  // Largest request header (request line and fields), bytes.
  uint32_t max_header_bytes = 16 * 1024;
  // Client connections open at once: to one sandbox, of one tenant, in all.
  int max_connections_per_sandbox = 1024;
  int max_connections_per_tenant = 4096;
  int max_connections = 20000;
  // Bytes per second one client connection may move in each direction (request bodies
  // and tunnel bytes towards the sandbox; responses and tunnel bytes from it), with a
  // burst of one second's worth; the connection is slowed, not closed. 0: no limit.
  int64_t max_bytes_per_second = 0;

  // INVALID_ARGUMENT naming the bad field.
  [[nodiscard]] absl::Status Validate() const;
};

// Why the proxy answered a request itself (never reaching the sandbox), for
// sbx_proxy_refused_total{reason}.
enum class ProxyRefusal : uint8_t {
  kBadRequest = 0,   // 400: malformed, smuggling framings, no port in the path
  kUnauthenticated,  // 401
  kForbidden,        // 403: a URL token of another claim or port
  kNotFound,         // 404: not the caller's claim, or none; no sandbox port named
  kHeaderTimeout,    // 408
  kNotActive,        // 409
  kLimit,            // 429, and connections over --proxy_max_connections at accept
  kHeaderTooLarge,   // 431
  kUnreachable,      // 502: nothing listens, the daemon cannot be reached
  kOther,            // 500
};
inline constexpr int kProxyRefusals = 10;
// "bad_request", "unauthenticated", ... (the label value).
const char* ProxyRefusalName(ProxyRefusal r);

// Plain counters the proxy keeps and the metrics collector reads at scrape time
// (relaxed atomics: each is a gauge or a counter read on its own).
struct ProxyCounters {
  std::atomic<int64_t> open{0};       // client connections open now
  std::atomic<int64_t> accepted{0};   // client connections accepted
  std::atomic<int64_t> forwarded{0};  // connections that reached a sandbox's port
  std::atomic<int64_t> refused[kProxyRefusals] = {};
};

struct ProxyDeps {
  allocator::Allocator* allocator = nullptr;
  const server::Authenticator* auth = nullptr;
  const server::PortTokens* tokens = nullptr;
  // The secret of a sandbox's daemon (src/common/sandbox_secret.h); unset: none.
  std::function<std::string(absl::string_view sandbox_id)> sandbox_secret;
  // Where the proxy counts (must outlive it); null: the proxy keeps its own.
  ProxyCounters* counters = nullptr;
};

// A client connection accepted elsewhere in sbx-server (the E2B front, src/gateway/e2b) whose
// first request is for a port inside a sandbox, given to the proxy with the target and
// tenant that front resolved and authenticated (PortProxy::Adopt). From there on it is
// served as one of the proxy's own: the request is parsed again (framing refusals, header
// limit), the tenant must own the claim (404 otherwise, as for a stranger), the claim must
// be active, the connection limits and timeouts apply, and every later request on the
// connection must be admitted by the adopting front (HandOff::admit_later).
struct HandOff {
  int fd = -1;       // the client's socket (plaintext); the proxy closes it
  std::string read;  // bytes already read from it, from the first request's first byte
  std::string claim_id;
  int port = 0;
  std::string tenant;
  // Header fields (lower-case names) removed from every request: the other front's
  // credentials.
  std::vector<std::string> strip_headers;
  // Whether a later request on the connection (its fields, names lower-case) may go on:
  // for the same target, with a credential of the same tenant (the adopting front's rules).
  // One that may not ends the connection. Required.
  std::function<bool(const std::vector<std::pair<std::string, std::string>>& fields)> admit_later;
};

class PortProxy {
 public:
  // Binds options.listen and starts serving on a thread of its own. Errors:
  // INVALID_ARGUMENT for bad options or deps, UNAVAILABLE when the address cannot be bound.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<PortProxy>> Start(const ProxyOptions& options,
                                                                        ProxyDeps deps);
  virtual ~PortProxy() = default;

  virtual int port() const = 0;
  // Client connections open now.
  virtual int connections() const = 0;
  // Serves a connection accepted elsewhere (HandOff); never blocks. The fd is the proxy's
  // from here on, closed at once when the proxy is over its connection limit or shut down.
  virtual void Adopt(HandOff connection) = 0;
  // Stops listening and closes every connection. Idempotent.
  virtual void Shutdown() = 0;
};

}  // namespace sbx::gateway

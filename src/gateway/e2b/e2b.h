#pragma once
// sbx::e2b: the E2B-compatible front door of sbx-server. Unmodified E2B clients (the `e2b`
// SDK, pointed at sbx by E2B_API_URL / E2B_SANDBOX_URL) get their sandboxes from sbx's
// pools. docs/e2b.md has the table of every endpoint and RPC, served or not, and what
// differs from E2B.
//
// One HTTP/1.1 listener serves E2B's control plane (REST: /sandboxes, /v2/sandboxes, ...).
// Every call is translated onto sbx's public gRPC API through a channel to the server's
// own services (Server::InProcessChannel), carrying the caller's X-API-Key as the sbx
// bearer token, so tenants, quotas, fair share, ownership and metrics apply unchanged:
//
//   create from template T   Claim from pool T (timeout = ttl, metadata = labels,
//                            envVars = late-bound env); sandbox id = claim id
//   get / list               GetClaim / ListClaims (metadata filter = match_labels)
//   kill                     Release
//   timeout                  Renew
//   pause / connect          Suspend / Resume
//
// Each sandbox gets an envd access token ("<tenant>~<FrontDeps::access_token of its id and
// tenant>", an HMAC under the server's key), returned as envdAccessToken; the envd calls
// (E2b-Sandbox-Id, X-Access-Token: processes, files), which carry no API key, are
// authorised by it and made as that tenant (FrontDeps::bearer_of), so sbx checks
// ownership again.
//
// Thread-safety: Front's methods may be called from any thread.
// Lifetime: the channel's server must outlive the front; Shutdown (or the destructor)
// closes every connection.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace sbx::e2b {

struct FrontOptions {
  // host:port of the listener; port 0 picks one (Front::port). Required.
  std::string listen;
  // The sandbox domain answered as `domain` (E2B clients build PORT-ID.<domain> from it).
  // Empty: none (clients then use their E2B_DOMAIN).
  std::string domain;
  // The envd version the front claims to speak. The SDK picks request shapes by it.
  std::string envd_version = "0.5.7";
  // A sandbox's timeout when the create request gives none (E2B's default: 15 s).
  int64_t default_timeout_s = 15;
  // Deadline of the gRPC calls behind control-plane requests (a claim may wait for a warm
  // sandbox within it, as the pool's policy says).
  absl::Duration call_timeout = absl::Seconds(60);
  // HTTP limits (http.h, HttpServerOptions).
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration io_timeout = absl::Minutes(5);
  uint32_t max_header_bytes = 16 * 1024;
  uint64_t max_body_bytes = 1024 * 1024;
  int max_connections = 1024;
  // TLS (PEM files, both or neither): the listener then serves HTTPS only.
  std::string tls_cert_file;
  std::string tls_key_file;

  // INVALID_ARGUMENT naming the bad field.
  [[nodiscard]] absl::Status Validate() const;
};

// A client connection whose request is for a port inside a sandbox (not envd's), handed
// whole to sbx's port proxy (FrontDeps::hand_port) once the front has authenticated it.
struct PortConnection {
  int fd = -1;       // the client's socket (plaintext), now the receiver's to close
  std::string read;  // bytes already read from it: the request's header and what followed
  std::string sandbox_id;
  int port = 0;
  // The tenant the credential (the sandbox's access token, or an API key) proves; the
  // proxy checks that it owns the claim.
  std::string tenant;
  // Header fields (lower-case) removed from every request before it reaches the sandbox:
  // the front's credentials.
  std::vector<std::string> strip_headers;
  // Whether a later request on the connection (its fields, names lower-case) is for the
  // same sandbox and port, with a credential of the same tenant; one that is not ends the
  // connection.
  std::function<bool(const std::vector<std::pair<std::string, std::string>>& fields)> admit_later;
};

struct FrontDeps {
  // A channel to sbx-server's own services (Server::InProcessChannel). Required.
  std::shared_ptr<grpc::Channel> channel;
  // The secret part of the envd access token of a sandbox owned by a tenant: a value only
  // sbx-server can compute (SandboxSecrets::For of a label naming both). Required.
  std::function<std::string(absl::string_view sandbox_id, absl::string_view tenant)> access_token;
  // The bearer value ("Bearer <token>", or "" on a server without auth) with which the
  // front acts for a tenant on envd calls, which carry the access token and no API key;
  // nullopt once the tenant has no token. Required.
  std::function<std::optional<std::string>(absl::string_view tenant)> bearer_of;
  // The tenant of an API key (X-API-Key), nullopt for a key that is not one. Required.
  std::function<std::optional<std::string>(absl::string_view api_key)> tenant_of;
  // Takes port traffic (PortConnection) to the port proxy. Unset: port traffic is answered
  // 409 naming --proxy_listen.
  std::function<void(PortConnection)> hand_port;
};

class Front {
 public:
  // Binds and serves. INVALID_ARGUMENT for bad options or deps, UNAVAILABLE when the
  // address cannot be bound.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Front>> Start(const FrontOptions& options,
                                                                    FrontDeps deps);
  virtual ~Front() = default;
  virtual int port() const = 0;
  // Stops listening and closes every connection. Idempotent.
  virtual void Shutdown() = 0;
};

}  // namespace sbx::e2b

#pragma once
// sbx::server: the gRPC front of sbx. Serves sbx.v1, grpc.health.v1.Health and server
// reflection with the callback API: no handler blocks a server thread.
//
// With an allocator (ServerOptions::allocator), ClaimService, SandboxService and
// AdminService are served over it, authenticated by bearer tokens (auth.h); without one
// they answer UNIMPLEMENTED, or are relayed to the leader (ServerOptions::forward). Optional TLS,
// with client certificates (mTLS) when a client CA is given.
//
// Thread-safety: Server's methods may be called from any thread.
// Lifetime: Start() returns a serving server; Shutdown() stops it (idempotent); the
// destructor shuts down with a zero grace period if Shutdown was not called.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "sbx/v1/admin.pb.h"
#include "src/images/images.h"
#include "src/server/auth.h"
#include "src/server/forward.h"
#include "src/server/image_pools.h"
#include "src/server/metrics.h"
#include "src/server/sandbox_service.h"
#include "src/server/tenant_limits.h"

namespace sbx::allocator {
class Allocator;
class Snapshots;
}  // namespace sbx::allocator

namespace sbx::server {

struct ServerOptions {
  // host:port to listen on; port 0 picks a free port (see Server::port()).
  std::string listen = "127.0.0.1:50051";
  // When set, the bound port is written there (decimal, then a newline) once serving,
  // atomically (write to a temporary file, then rename).
  std::string port_file;
  // Largest request the server accepts; larger ones get RESOURCE_EXHAUSTED from gRPC.
  int max_receive_message_bytes = 4 * 1024 * 1024;
  // Largest response the server sends.
  int max_send_message_bytes = 16 * 1024 * 1024;
  // The engine behind ClaimService and AdminService; not owned, must outlive the server.
  // nullptr: those services answer UNIMPLEMENTED (Ping, health and reflection still work).
  allocator::Allocator* allocator = nullptr;
  // Who may call ClaimService and AdminService. Checked (Validate) only with an allocator:
  // then exactly one of auth.tokens_file and auth.insecure_no_auth must be set.
  AuthOptions auth;
  // Where ClaimService and SandboxService count their calls (metrics.h); not owned, must
  // outlive the server. nullptr: not counted.
  RequestCounters* request_counters = nullptr;
  // Where the tenants' claim rates (tokens file) are kept; not owned, must outlive the
  // server. nullptr: the server keeps its own (then not in metrics).
  TenantLimiter* tenant_limiter = nullptr;
  // Limits of SandboxService (Exec output, concurrent Execs per sandbox).
  SandboxLimits sandbox_limits;
  // TLS: both set → the port serves TLS only (PEM files). With tls_client_ca_file too,
  // clients must present a certificate signed by that CA (mTLS). All empty: plaintext.
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // The secret of a sandbox's daemon (sbx-sandboxd refuses calls without it), sent with
  // every call to it. Unset: calls carry none (daemons started without one).
  std::function<std::string(absl::string_view sandbox_id)> sandbox_secret;
  // A standby replica (leader election): without an allocator and with this set, every
  // sbx.v1 call is relayed to the leader (forward.h; Ping, health and reflection are
  // answered here). With TLS (tls_cert_file), the hop is TLS too: the leader's certificate
  // is checked against tls_client_ca_file, else against tls_cert_file itself (replicas
  // that share one certificate), not against the address (pods are reached by name or IP
  // their certificate need not carry); with mTLS this replica shows its own certificate.
  std::optional<ForwardOptions> forward;
  // Checks a template's runtime-specific parts before PutTemplate stores it (the runtime
  // is available here; a local mount does not show the server's files; ...). Unset: none.
  std::function<absl::Status(const v1::Template&)> check_template;
  // The local runtime's image cache, served by ImageService (admin). Null: ImageService
  // answers FAILED_PRECONDITION. Must outlive the server.
  images::Images* images = nullptr;
  // How claims by image find their pool, and whether this server makes on-demand pools
  // of images (image_pools.h). With on_demand and no `images`, claims of an image no
  // declared pool runs are FAILED_PRECONDITION.
  ImageClaimOptions image_claims;
  // The port proxy's URLs for SandboxService.GetPortUrl (unset tokens: no proxy).
  PortUrlOptions port_urls;
  // Snapshots (issue 37), served as sbx.v1.Snapshots with an allocator; not owned, must
  // outlive the server. Null: those RPCs answer UNIMPLEMENTED (the runtime has none).
  allocator::Snapshots* snapshots = nullptr;
  // Further services served on the same port (the replicas' store replication). A
  // grpc::Service serves one server: give each server its own instances.
  std::vector<std::shared_ptr<grpc::Service>> extra_services;

  // INVALID_ARGUMENT naming the bad field and value.
  [[nodiscard]] absl::Status Validate() const;
};

// The credentials of one replica's calls to another (a standby's relay hop, its store
// replication) when the replicas serve TLS (tls_cert_file set): the other's certificate is
// checked against tls_client_ca_file, else against tls_cert_file itself, not its address;
// with mTLS this replica shows its own certificate. INVALID_ARGUMENT / NOT_FOUND for files
// that cannot be read.
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> HopCredentials(
    const ServerOptions& o);

class Server {
 public:
  // Binds and starts serving. Errors: INVALID_ARGUMENT for bad options or a malformed
  // tokens file (naming file:line), NOT_FOUND / PERMISSION_DENIED when the tokens file
  // cannot be read, UNAVAILABLE when the address cannot be bound, INTERNAL when the port
  // file cannot be written.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);

  virtual ~Server() = default;

  // The bound port (useful with port 0).
  virtual int port() const = 0;

  // A channel to this server's own services that never leaves the process (no socket, no
  // TLS): callers in sbx-server (the E2B front, src/gateway/e2b) use the public API through it,
  // authenticated by the same bearer tokens as any client. Valid until Shutdown.
  virtual std::shared_ptr<grpc::Channel> InProcessChannel() = 0;

  // Reads the tokens file again (e.g. on SIGHUP); on error the old tokens stay in force and
  // the error is returned (INVALID_ARGUMENT naming file:line, NOT_FOUND, ...). OK and a
  // no-op with insecure_no_auth; FAILED_PRECONDITION on a server without an allocator.
  [[nodiscard]] virtual absl::Status ReloadAuth() = 0;

  // Stops accepting calls, lets in-flight calls finish until `grace` has passed, then
  // cancels the rest. Health reports NOT_SERVING from the first moment. Idempotent.
  virtual void Shutdown(absl::Duration grace) = 0;
};

}  // namespace sbx::server

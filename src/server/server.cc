#include "src/server/server.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "spdlog/spdlog.h"
#include "src/allocator/allocator.h"
#include "src/common/status_macros.h"
#include "src/server/admin_service.h"
#include "src/server/auth.h"
#include "src/server/claim_service.h"
#include "src/server/diagnostics_service.h"
#include "src/server/fork_pools.h"
#include "src/server/forward.h"
#include "src/server/image_service.h"
#include "src/server/pending_services.h"
#include "src/server/snapshot_service.h"
#include "src/server/unparsed_request.h"

namespace sbx::server {
namespace {

absl::StatusOr<std::string> ReadPem(const char* what, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(what, " \"", path, "\" cannot be read"));
  }
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (data.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", path, "\" is not PEM (no \"-----BEGIN\" line)"));
  }
  return data;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const ServerOptions& o) {
  if (o.tls_cert_file.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  absl::StatusOr<std::string> cert = ReadPem("tls_cert_file", o.tls_cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem("tls_key_file", o.tls_key_file);
  if (!key.ok()) return key.status();
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!o.tls_client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("tls_client_ca_file", o.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> HopCredentials(const ServerOptions& o) {
  absl::StatusOr<std::string> cert = ReadPem("tls_cert_file", o.tls_cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem("tls_key_file", o.tls_key_file);
  if (!key.ok()) return key.status();
  std::string root = *cert;
  if (!o.tls_client_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("tls_client_ca_file", o.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    root = *ca;
  }
  using grpc::experimental::IdentityKeyCertPair;
  std::vector<IdentityKeyCertPair> identity;
  if (!o.tls_client_ca_file.empty()) identity.push_back(IdentityKeyCertPair{*key, *cert});
  auto provider =
      std::make_shared<grpc::experimental::StaticDataCertificateProvider>(root, identity);
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(provider);
  tls.watch_root_certs();
  if (!identity.empty()) tls.watch_identity_key_cert_pairs();
  // The chain is checked against the root; the name is not (a pod is reached at an IP or
  // a name its certificate need not carry), hence the verifier that adds no check.
  tls.set_verify_server_certs(true);
  tls.set_check_call_host(false);
  tls.set_certificate_verifier(std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::experimental::TlsCredentials(tls);
  if (creds == nullptr) {
    return absl::InvalidArgumentError("TLS credentials for relaying to the leader: rejected");
  }
  return creds;
}

namespace {

// What a server serves; outlives the grpc::Server (destroyed after it).
struct Services {
  std::unique_ptr<Authenticator> auth;       // null without an allocator
  std::unique_ptr<SandboxdClients> daemons;  // null without an allocator
  std::unique_ptr<TenantLimiter> limiter;    // when ServerOptions::tenant_limiter is null
  std::vector<std::unique_ptr<grpc::Service>> services;
  std::vector<std::shared_ptr<grpc::Service>> extra;  // ServerOptions::extra_services
  std::unique_ptr<ForwardingService> forward;         // a standby's relay to the leader
};

class GrpcServer final : public Server {
 public:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port, std::unique_ptr<Services> services,
             allocator::Allocator* allocator)
      : services_(std::move(services)),
        server_(std::move(server)),
        port_(port),
        allocator_(allocator) {}

  ~GrpcServer() override { Shutdown(absl::ZeroDuration()); }

  int port() const override { return port_; }

  std::shared_ptr<grpc::Channel> InProcessChannel() override {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    return server_->InProcessChannel(args);
  }

  absl::Status ReloadAuth() override {
    if (services_->auth == nullptr) {
      return absl::FailedPreconditionError(
          "this server has no allocator and so no authentication to reload");
    }
    absl::Status s = services_->auth->Reload();
    if (s.ok()) spdlog::info("auth: reloaded, {} tokens", services_->auth->size());
    return s;
  }

  void Shutdown(absl::Duration grace) override {
    // Atomic so that concurrent Shutdown calls (signal thread, destructor) run it once;
    // acq_rel orders the shutdown after whatever the winning caller did before.
    if (shut_down_.exchange(true, std::memory_order_acq_rel)) return;
    if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
    // Watch streams never end by themselves: end them now, so that clients see
    // UNAVAILABLE at once instead of a cancel at the end of the grace period.
    if (allocator_ != nullptr) {
      allocator_->CloseWatches(absl::UnavailableError("the server is shutting down"));
    }
    const auto deadline = std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace);
    server_->Shutdown(deadline);
    server_->Wait();
  }

 private:
  // Declared first so that it is destroyed last: the services must outlive server_.
  std::unique_ptr<Services> services_;
  std::unique_ptr<grpc::Server> server_;
  const int port_;
  allocator::Allocator* const allocator_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace

absl::Status ServerOptions::Validate() const {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (listen.empty() || colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(listen).substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address \"", listen, "\" is not host:port with a port from 0 to 65535"));
  }
  if (max_receive_message_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_receive_message_bytes ", max_receive_message_bytes, " is below the minimum of 1024"));
  }
  if (max_send_message_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_send_message_bytes ", max_send_message_bytes, " is below the minimum of 1024"));
  }
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "tls_cert_file and tls_key_file go together: give both or neither");
  }
  if (!tls_client_ca_file.empty() && tls_cert_file.empty()) {
    return absl::InvalidArgumentError(
        "tls_client_ca_file (mTLS) needs tls_cert_file and tls_key_file");
  }
  if (absl::Status s = sandbox_limits.Validate(); !s.ok()) return s;
  if (absl::Status s = image_claims.Validate(); !s.ok()) return s;
  if (forward.has_value()) {
    if (allocator != nullptr) {
      return absl::InvalidArgumentError("a server relays to the leader only without an allocator");
    }
  }
  if (allocator != nullptr) return auth.Validate();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  auto services = std::make_unique<Services>();
  services->services.push_back(std::make_unique<DiagnosticsService>());
  if (options.allocator != nullptr) {
    absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(options.auth);
    if (!auth.ok()) return auth.status();
    services->auth = std::move(*auth);
    if (services->auth->insecure()) {
      spdlog::warn(
          "AUTHENTICATION IS OFF (insecure_no_auth): every caller is tenant \"{}\" with admin "
          "rights. Use this only for a local, single-user server.",
          std::string(kAnonymousTenant));
    } else {
      spdlog::info("auth: {} tokens from \"{}\"", services->auth->size(), options.auth.tokens_file);
    }
    services->daemons = std::make_unique<SandboxdClients>(options.sandbox_secret);
    TenantLimiter* limiter = options.tenant_limiter;
    if (limiter == nullptr) {
      services->limiter = std::make_unique<TenantLimiter>();
      limiter = services->limiter.get();
    }
    // What PutTemplate (and the server's own pools) check: the runtimes' view, and that a
    // template's local.snapshot is a snapshot of its image.
    std::function<absl::Status(const v1::Template&)> check_template =
        [inner = options.check_template,
         snapshots = options.snapshots](const v1::Template& t) -> absl::Status {
      if (inner) RETURN_IF_ERROR(inner(t));
      return CheckTemplateSnapshot(snapshots, t);
    };
    ImageClaimOptions image_claims = options.image_claims;
    if (!image_claims.check_template) image_claims.check_template = check_template;
    auto claims = std::make_unique<ClaimService>(
        options.allocator, services->auth.get(), services->daemons.get(), options.request_counters,
        limiter, ImagePools::Create(options.allocator, options.images, limiter, image_claims));
    ClaimService* claim_service = claims.get();
    services->services.push_back(std::move(claims));
    services->services.push_back(std::make_unique<SandboxService>(
        options.allocator, services->auth.get(), services->daemons.get(), options.sandbox_limits,
        options.request_counters, options.port_urls));
    services->services.push_back(std::make_unique<AdminService>(
        options.allocator, services->auth.get(), check_template, options.images));
    services->services.push_back(
        std::make_unique<ImageService>(options.images, services->auth.get()));
    services->services.push_back(std::make_unique<SnapshotService>(
        options.snapshots, services->auth.get(), services->daemons.get(), options.allocator,
        claim_service, ForkPools::Create(options.allocator, check_template)));
  } else if (options.forward.has_value()) {
    ForwardOptions forward = *options.forward;
    if (!options.tls_cert_file.empty() && forward.credentials == nullptr) {
      absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> hop = HopCredentials(options);
      if (!hop.ok()) return hop.status();
      forward.credentials = *std::move(hop);
    }
    services->forward = std::make_unique<ForwardingService>(std::move(forward));
  } else {
    services->services.push_back(std::make_unique<PendingClaimService>());
    services->services.push_back(std::make_unique<PendingSandboxService>());
    services->services.push_back(std::make_unique<PendingAdminService>());
  }

  grpc::ServerBuilder builder;
  int port = 0;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = Credentials(options);
  if (!credentials.ok()) return credentials.status();
  builder.AddListeningPort(options.listen, *credentials, &port);
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options.max_send_message_bytes);
  services->extra = options.extra_services;
  for (const auto& service : services->services) builder.RegisterService(service.get());
  for (const auto& service : services->extra) builder.RegisterService(service.get());
  if (services->forward != nullptr) builder.RegisterCallbackGenericService(services->forward.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(NewUnparsedRequestInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));

  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on \"", options.listen,
                     "\" (address in use, not local, or not resolvable)"));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  auto result =
      std::make_unique<GrpcServer>(std::move(server), port, std::move(services), options.allocator);
  if (!options.port_file.empty()) {
    if (absl::Status s = WritePortFile(options.port_file, port); !s.ok()) return s;
  }
  spdlog::info("sbx-server serving on port {} (listen \"{}\", {}{})", port, options.listen,
               options.tls_cert_file.empty()        ? "plaintext"
               : options.tls_client_ca_file.empty() ? "TLS"
                                                    : "mTLS: client certificates required",
               options.forward.has_value() ? "; a standby: sbx.v1 calls go to the leader" : "");
  return result;
}

}  // namespace sbx::server

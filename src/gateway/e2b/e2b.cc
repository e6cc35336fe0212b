#include "src/gateway/e2b/e2b.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/gateway/e2b/control_plane.h"
#include "src/gateway/e2b/envd.h"
#include "src/gateway/e2b/http.h"

namespace sbx::e2b {

absl::Status FrontOptions::Validate() const {
  if (listen.empty()) return absl::InvalidArgumentError("the E2B front needs a listen address");
  if (envd_version.empty()) return absl::InvalidArgumentError("envd_version is empty");
  if (default_timeout_s < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("default_timeout_s ", default_timeout_s, " is below 1"));
  }
  if (call_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("call_timeout must be positive");
  }
  return absl::OkStatus();
}

namespace {

class FrontImpl final : public Front {
 public:
  explicit FrontImpl(std::unique_ptr<HttpServer> http) : http_(std::move(http)) {}
  ~FrontImpl() override { Shutdown(); }
  int port() const override { return http_->port(); }
  void Shutdown() override { http_->Shutdown(); }

 private:
  std::unique_ptr<HttpServer> http_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Front>> Front::Start(const FrontOptions& options, FrontDeps deps) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (deps.channel == nullptr) return absl::InvalidArgumentError("the E2B front needs a channel");
  if (!deps.access_token || !deps.bearer_of || !deps.tenant_of) {
    return absl::InvalidArgumentError("the E2B front needs access_token, bearer_of and tenant_of");
  }
  auto control = std::make_shared<ControlPlane>(options, deps);
  auto envd = std::make_shared<Envd>(options, deps);
  HttpServerOptions http;
  http.listen = options.listen;
  http.header_timeout = options.header_timeout;
  http.io_timeout = options.io_timeout;
  http.max_header_bytes = options.max_header_bytes;
  http.max_body_bytes = options.max_body_bytes;
  http.max_connections = options.max_connections;
  http.tls_cert_file = options.tls_cert_file;
  http.tls_key_file = options.tls_key_file;
  // Uploads to a sandbox are read as they arrive (constant memory).
  const std::string domain = options.domain;
  http.stream_body = [domain](const HttpRequest& head) {
    if (head.method != "POST" || head.path != "/files") return false;
    std::optional<SandboxAddress> addr = AddressOf(head, domain);
    return addr.has_value() && addr->port == kEnvdPortNumber;
  };
  // Port traffic is taken whole, before its body, to the port proxy.
  http.hand_off = [domain](const HttpRequest& head) {
    std::optional<SandboxAddress> addr = AddressOf(head, domain);
    return addr.has_value() && addr->port != kEnvdPortNumber;
  };
  auto handler = [control, envd, domain](const HttpRequest& req, HttpResponder& out) {
    // Requests for a sandbox (envd, or a port inside it) carry E2b-Sandbox-Id, or come to
    // PORT-ID.<domain>.
    if (std::optional<SandboxAddress> addr = AddressOf(req, domain); addr.has_value()) {
      return envd->Handle(req, out, *addr);
    }
    control->Handle(req, out);
  };
  auto server = HttpServer::Start(http, std::move(handler));
  if (!server.ok()) return server.status();
  return std::make_unique<FrontImpl>(*std::move(server));
}

}  // namespace sbx::e2b

#include "src/cmd/conversion_wiring.h"

#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "src/common/status_macros.h"
#include "src/k8s/crd_conversion.h"

namespace sbx::cmd {

void AddConversionFlags(CLI::App& app, ConversionFlags* flags) {
  app.add_option("--conversion_webhook_listen", flags->webhook.listen,
                 "host:port of the HTTPS conversion webhook that serves agents.x-k8s.io "
                 "v1alpha1 (empty: none)");
  app.add_option("--conversion_webhook_cert_file", flags->webhook.tls_cert_file,
                 "PEM certificate chain of the conversion webhook (names its Service)");
  app.add_option("--conversion_webhook_key_file", flags->webhook.tls_key_file,
                 "PEM private key of the conversion webhook");
  app.add_option("--conversion_webhook_max_body_bytes", flags->webhook.max_body_bytes,
                 "largest ConversionReview accepted")
      ->capture_default_str();
  app.add_option("--conversion_webhook_max_connections", flags->webhook.max_connections,
                 "connections the conversion webhook serves at once")
      ->capture_default_str();
  app.add_option("--conversion_webhook_service", flags->service,
                 "NAMESPACE/NAME[:PORT] of the webhook's Service: with "
                 "--conversion_webhook_ca_file, the CRDs' spec.conversion is pointed at it at "
                 "start (needs --kubeconfig)");
  app.add_option("--conversion_webhook_ca_file", flags->ca_file,
                 "PEM of the CA that signed the webhook's certificate (the CRDs' caBundle)");
}

namespace {

absl::StatusOr<sbx::k8s::CrdConversionOptions> CrdOptions(const ConversionFlags& flags) {
  sbx::k8s::CrdConversionOptions options;
  std::string service = flags.service;
  size_t colon = service.rfind(':');
  if (colon != std::string::npos) {
    if (!absl::SimpleAtoi(service.substr(colon + 1), &options.service_port)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--conversion_webhook_service \"", flags.service, "\": the port is not a number"));
    }
    service.resize(colon);
  }
  size_t slash = service.find('/');
  if (slash == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--conversion_webhook_service \"", flags.service,
                                                   "\" is not NAMESPACE/NAME[:PORT]"));
  }
  options.service_namespace = service.substr(0, slash);
  options.service_name = service.substr(slash + 1);
  std::ifstream in(flags.ca_file);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--conversion_webhook_ca_file ", flags.ca_file, ": cannot be read"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  options.ca_bundle_pem = text.str();
  if (absl::Status valid = options.Validate(); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(valid.message(), " (--conversion_webhook_service ", flags.service,
                     ", --conversion_webhook_ca_file ", flags.ca_file, ")"));
  }
  return options;
}

}  // namespace

absl::StatusOr<std::unique_ptr<sbx::k8s::ConversionWebhook>> StartConversion(
    const ConversionFlags& flags, sbx::k8s::Client* kube, prometheus::Registry* registry) {
  if (flags.service.empty() != flags.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--conversion_webhook_service and --conversion_webhook_ca_file go together");
  }
  if (!flags.service.empty()) {
    if (flags.webhook.listen.empty()) {
      return absl::InvalidArgumentError(
          "--conversion_webhook_service needs --conversion_webhook_listen (the CRDs would "
          "point at a webhook this server does not run)");
    }
    if (kube == nullptr) {
      return absl::InvalidArgumentError(
          "--conversion_webhook_service needs a cluster: --kubeconfig PATH or --kubeconfig "
          "in-cluster");
    }
  }
  if (flags.webhook.listen.empty()) return std::unique_ptr<sbx::k8s::ConversionWebhook>();
  // Serve first, then point the CRDs at it: the API server may call at once.
  ASSIGN_OR_RETURN(std::unique_ptr<sbx::k8s::ConversionWebhook> webhook,
                   sbx::k8s::ConversionWebhook::Start(flags.webhook, registry));
  if (!flags.service.empty()) {
    ASSIGN_OR_RETURN(sbx::k8s::CrdConversionOptions crds, CrdOptions(flags));
    RETURN_IF_ERROR(sbx::k8s::PointCrdsAtWebhook(*kube, crds));
  }
  return webhook;
}

}  // namespace sbx::cmd

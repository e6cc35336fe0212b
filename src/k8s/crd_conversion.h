#pragma once
// Points the agents.x-k8s.io CRDs' conversion at sbx's conversion webhook
// (src/k8s/conversion_webhook.h): `spec.conversion` of the four CRDs gets strategy Webhook,
// the webhook's Service and the CA that signed its certificate. CRDs are installed from
// static files (a chart's crds/ folder is not templated), so the server that knows its
// Service and CA writes them, as upstream's controller does.
//
// Thread-compatible; blocking calls to the API server.

#include <string>

#include "absl/status/status.h"
#include "src/k8s/client.h"

namespace sbx::k8s {

struct CrdConversionOptions {
  // The webhook's Service.
  std::string service_namespace;
  std::string service_name;
  int service_port = 443;
  std::string path = "/convert";
  // PEM of the CA that signed the webhook's certificate (the CRDs' caBundle).
  std::string ca_bundle_pem;

  // INVALID_ARGUMENT naming what is missing or malformed.
  [[nodiscard]] absl::Status Validate() const;
};

// The names of the CRDs whose v1alpha1 sbx converts.
inline constexpr const char* kConvertedCrds[] = {
    "sandboxes.agents.x-k8s.io", "sandboxclaims.extensions.agents.x-k8s.io",
    "sandboxtemplates.extensions.agents.x-k8s.io", "sandboxwarmpools.extensions.agents.x-k8s.io"};

// The merge patch that sets one CRD's spec.conversion.
Json CrdConversionPatch(const CrdConversionOptions& options);

// Patches each CRD of kConvertedCrds whose spec.conversion differs (one GET each; a
// PATCH only where needed). NOT_FOUND names a CRD that is not installed; other errors are
// the API server's, naming the CRD. Stops at the first error.
[[nodiscard]] absl::Status PointCrdsAtWebhook(Client& client, const CrdConversionOptions& options);

}  // namespace sbx::k8s

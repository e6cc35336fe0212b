#pragma once
// The CRD conversion webhook: an HTTPS server that answers the API server's
// ConversionReviews for the agents.x-k8s.io kinds (POST /convert, src/k8s/conversion.h),
// so that clients may still read and write the deprecated v1alpha1 while v1beta1 is stored.
//
// Stateless: every replica of sbx may serve it, leader or not. TLS only; since the port is
// reachable from inside the cluster, not only by the API server, a request is bounded:
// its body (413 beyond `max_body_bytes`, refused before it is read), its JSON nesting
// (400), the time to send it (30 s) and the connections served at once.
//
// Thread-safety: Start and Stop from one thread; requests are served on the webhook's own
// two threads. Stop (or the destructor) closes the port and drops open connections.

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace prometheus {
class Registry;
}

namespace sbx::k8s {

struct ConversionWebhookOptions {
  // host:port to listen on, e.g. "0.0.0.0:9443" (a fixed port: the Service names it).
  // Required.
  std::string listen;
  // PEM certificate chain and private key; the chain must name the webhook's Service
  // (<name>.<namespace>.svc) and be signed by the CA in the CRDs' caBundle.
  std::string tls_cert_file;
  std::string tls_key_file;
  // The largest request body accepted. The API server sends a list's objects in one review.
  size_t max_body_bytes = size_t{64} << 20;
  // Connections served at once; more wait in the kernel's accept queue.
  int max_connections = 16;

  // INVALID_ARGUMENT naming the option when one is missing or malformed.
  [[nodiscard]] absl::Status Validate() const;
};

class ConversionWebhook {
 public:
  // Serves until Stop. INVALID_ARGUMENT for bad options or unreadable certificate/key
  // files, UNAVAILABLE when the port cannot be opened. `metrics` (may be null) gets
  // sbx_conversion_reviews_total{result} and sbx_conversion_objects_total.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ConversionWebhook>> Start(
      const ConversionWebhookOptions& options, prometheus::Registry* metrics);

  virtual ~ConversionWebhook() = default;
  virtual void Stop() = 0;
};

}  // namespace sbx::k8s

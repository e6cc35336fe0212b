// CRD conversion webhooks called as the Kubernetes API server calls them: a
// ConversionReview POSTed over HTTPS (HTTP/1.1, one connection per call), the server
// certificate checked against the caBundle (or the system roots) for the URL's host or,
// for a service, for NAME.NAMESPACE.svc, and the answer checked as
// apiextensions-apiserver's webhook converter checks it. Error messages are the API
// server's; the transport errors read like Go's net/http ones. Test infrastructure
// only; never linked into sbx.
//
// Thread-safety: the functions are thread-safe (no shared state).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace kube_emulator {

using json = nlohmann::json;

// spec.conversion.webhook.clientConfig of a CRD.
struct WebhookClientConfig {
  std::string url;  // https://HOST[:PORT]/PATH; empty when the service is set
  std::string service_namespace, service_name, service_path;
  int service_port = 443;
  std::string ca_bundle;  // PEM (caBundle decoded); empty = the system roots
};

struct ConversionCall {
  WebhookClientConfig client;
  std::string review_version = "v1";  // ConversionReview version: v1 or v1beta1
  // HOST:PORT the service resolves to ("" = not resolvable: the call fails naming it).
  std::string service_address;
  absl::Duration timeout = absl::Seconds(30);
};

// Sends `objects` (each in a version other than `desired_api_version`) to the webhook in
// one ConversionReview with request uid `uid` and returns the converted objects, with the
// metadata of the originals except labels and annotations, as the API server keeps them.
// On failure the status message is the API server's whole message, e.g.
// `conversion webhook for g/v1, Kind=K failed: Post "https://...": ...`; `in_gvk`
// ("g/v1, Kind=K") is what it names. `list` selects the messages of a list conversion.
absl::StatusOr<std::vector<json>> ConvertWithWebhook(const ConversionCall& call,
                                                     const std::string& uid,
                                                     const std::string& desired_api_version,
                                                     const std::string& in_gvk, bool list,
                                                     const std::vector<json>& objects);

}  // namespace kube_emulator

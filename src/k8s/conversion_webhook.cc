// cpprestsdk's HTTPS listener behind ConversionWebhook: with http_cpprest.cc, the only files
// of sbx that see cpprest, pplx or boost types. Every cpprest exception is caught here and
// becomes an absl::Status or an HTTP error answer.

#include "src/k8s/conversion_webhook.h"

#include <exception>
#include <string>
#include <utility>

// cpprest's U() macro would break fmt's format_as(U()) in spdlog.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/http_listener.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <boost/asio/ssl/context.hpp>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "src/k8s/conversion.h"

namespace sbx::k8s {
namespace {

using web::http::http_request;
using web::http::methods;
using web::http::status_code;
using web::http::status_codes;
using web::http::experimental::listener::http_listener;
using web::http::experimental::listener::http_listener_config;

// TLS 1.2 and later, the server's chain and key; a bad file throws boost::system::system_error.
void ConfigureTls(boost::asio::ssl::context& ctx, const ConversionWebhookOptions& options) {
  ctx.set_options(boost::asio::ssl::context::default_workarounds |
                  boost::asio::ssl::context::no_sslv2 | boost::asio::ssl::context::no_sslv3 |
                  boost::asio::ssl::context::no_tlsv1 | boost::asio::ssl::context::no_tlsv1_1 |
                  boost::asio::ssl::context::single_dh_use);
  ctx.use_certificate_chain_file(options.tls_cert_file);
  ctx.use_private_key_file(options.tls_key_file, boost::asio::ssl::context::pem);
}

struct Metrics {
  prometheus::Counter* success = nullptr;
  prometheus::Counter* failure = nullptr;
  prometheus::Counter* refused = nullptr;
  prometheus::Counter* objects = nullptr;

  explicit Metrics(prometheus::Registry* registry) {
    if (registry == nullptr) return;
    auto& reviews = prometheus::BuildCounter()
                        .Name("sbx_conversion_reviews_total")
                        .Help(
                            "ConversionReviews answered by the CRD conversion webhook, by "
                            "result: success, failure (an object could not be converted) or "
                            "refused (not a ConversionReview, too large, not POST /convert)")
                        .Register(*registry);
    success = &reviews.Add({{"result", "success"}});
    failure = &reviews.Add({{"result", "failure"}});
    refused = &reviews.Add({{"result", "refused"}});
    objects = &prometheus::BuildCounter()
                   .Name("sbx_conversion_objects_total")
                   .Help("Objects converted by the CRD conversion webhook")
                   .Register(*registry)
                   .Add({});
  }
  static void Inc(prometheus::Counter* c, double n = 1) {
    if (c != nullptr) c->Increment(n);
  }
};

class CpprestConversionWebhook final : public ConversionWebhook {
 public:
  CpprestConversionWebhook(const ConversionWebhookOptions& options, const std::string& uri,
                           const http_listener_config& config, prometheus::Registry* registry)
      : options_(options), listener_(uri, config), metrics_(registry) {
    listener_.support([this](http_request request) { Serve(std::move(request)); });
  }

  ~CpprestConversionWebhook() override { Stop(); }

  absl::Status Open() {
    try {
      listener_.open().wait();
      open_ = true;
      return absl::OkStatus();
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("conversion webhook: cannot listen on ", options_.listen, ": ", e.what()));
    }
  }

  void Stop() override {
    if (!open_) return;
    open_ = false;
    try {
      listener_.close().wait();
    } catch (const std::exception& e) {
      spdlog::warn("conversion webhook: closing {}: {}", options_.listen, e.what());
    }
  }

 private:
  void Refuse(http_request& request, status_code code, const std::string& why) {
    Metrics::Inc(metrics_.refused);
    spdlog::debug("conversion webhook: {} {}: {}", request.method(), request.relative_uri().path(),
                  why);
    request.reply(code, why + "\n", "text/plain; charset=utf-8").then([](pplx::task<void> t) {
      try {
        t.get();
      } catch (const std::exception&) {  // the caller went away: nothing to tell
      }
    });
  }

  void Serve(http_request request) {
    if (request.relative_uri().path() != "/convert") {
      return Refuse(request, status_codes::NotFound, "only /convert is served here");
    }
    if (request.method() != methods::POST) {
      return Refuse(request, status_codes::MethodNotAllowed, "/convert takes POST");
    }
    const auto& headers = request.headers();
    if (!headers.has(web::http::header_names::content_length)) {
      return Refuse(request, status_codes::LengthRequired,
                    "a ConversionReview needs a Content-Length");
    }
    if (headers.content_length() > options_.max_body_bytes) {
      return Refuse(request, status_codes::RequestEntityTooLarge,
                    absl::StrCat("the body has ", headers.content_length(), " bytes; at most ",
                                 options_.max_body_bytes, " are accepted"));
    }
    std::string content_type = headers.content_type();
    if (!content_type.empty() && content_type.rfind("application/json", 0) != 0) {
      return Refuse(request, status_codes::UnsupportedMediaType,
                    "a ConversionReview is application/json, not " + content_type);
    }
    request.extract_utf8string(/*ignore_content_type=*/true)
        .then([this, request](pplx::task<std::string> body) mutable {
          std::string text;
          try {
            text = body.get();
          } catch (const std::exception& e) {
            spdlog::debug("conversion webhook: reading a body: {}", e.what());
            return;
          }
          Answer(request, text);
        });
  }

  void Answer(http_request& request, const std::string& body) {
    absl::StatusOr<nlohmann::json> answer = ReviewConversion(body);
    if (!answer.ok()) {
      return Refuse(request, status_codes::BadRequest, std::string(answer.status().message()));
    }
    const nlohmann::json& response = (*answer)["response"];
    if (response["result"]["status"] == "Success") {
      Metrics::Inc(metrics_.success);
      Metrics::Inc(metrics_.objects, static_cast<double>(response["convertedObjects"].size()));
    } else {
      Metrics::Inc(metrics_.failure);
      spdlog::warn("conversion webhook: {}", response["result"]["message"].get<std::string>());
    }
    request.reply(status_codes::OK, answer->dump(), "application/json")
        .then([](pplx::task<void> t) {
          try {
            t.get();
          } catch (const std::exception&) {  // the API server went away
          }
        });
  }

  const ConversionWebhookOptions options_;
  http_listener listener_;
  Metrics metrics_;
  bool open_ = false;
};

}  // namespace

absl::Status ConversionWebhookOptions::Validate() const {
  std::vector<std::string> parts = absl::StrSplit(listen, absl::MaxSplits(':', 1));
  int port = 0;
  if (parts.size() != 2 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("conversion webhook: listen address \"", listen,
                                                   "\" is not host:port with a fixed port"));
  }
  if (tls_cert_file.empty() || tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "conversion webhook: a TLS certificate and key are required (the API server speaks "
        "HTTPS only to webhooks)");
  }
  if (max_body_bytes == 0) {
    return absl::InvalidArgumentError("conversion webhook: max_body_bytes must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ConversionWebhook>> ConversionWebhook::Start(
    const ConversionWebhookOptions& options, prometheus::Registry* metrics) {
  if (absl::Status valid = options.Validate(); !valid.ok()) return valid;
  // Load the files once here so a bad file stops the server at start with its name.
  try {
    boost::asio::ssl::context probe(boost::asio::ssl::context::tls_server);
    ConfigureTls(probe, options);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("conversion webhook: certificate ",
                                                   options.tls_cert_file, " / key ",
                                                   options.tls_key_file, ": ", e.what()));
  }
  http_listener_config config;
  config.set_ssl_context_callback(
      [options](boost::asio::ssl::context& ctx) { ConfigureTls(ctx, options); });
  auto webhook = std::make_unique<CpprestConversionWebhook>(
      options, absl::StrCat("https://", options.listen, "/"), config, metrics);
  if (absl::Status opened = webhook->Open(); !opened.ok()) return opened;
  spdlog::info("conversion webhook: serving https://{}/convert", options.listen);
  return std::unique_ptr<ConversionWebhook>(std::move(webhook));
}

}  // namespace sbx::k8s

// Boost.Beast's HTTP/1.1 over Boost.Asio's TLS behind ConversionWebhook: the only file of
// sbx that sees beast or asio types. cpprestsdk's listener was tried first and buffers a
// whole body even after the answer refused it (a 400 MB body grew the server by 430 MB);
// Beast's parser stops at its body limit. Every error becomes an HTTP answer or a closed
// connection; nothing throws out of here.
//
// One io_context, served by kThreads threads; at most max_connections connections at a
// time (the next is accepted when one ends, so a flood waits in the kernel's backlog
// instead of in our memory); each connection has deadlines for its TLS handshake and for
// reading each request, so a client that stalls loses its connection.

#include "src/k8s/conversion_webhook.h"

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "src/k8s/conversion.h"

namespace sbx::k8s {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

constexpr int kThreads = 2;
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
constexpr auto kRequestTimeout = std::chrono::seconds(30);
constexpr uint32_t kHeaderLimit = 16 * 1024;

// TLS 1.2 and later, the server's chain and key; a bad file throws boost::system::system_error.
void ConfigureTls(asio::ssl::context& ctx, const ConversionWebhookOptions& options) {
  ctx.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                  asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                  asio::ssl::context::no_tlsv1_1 | asio::ssl::context::single_dh_use);
  ctx.use_certificate_chain_file(options.tls_cert_file);
  ctx.use_private_key_file(options.tls_key_file, asio::ssl::context::pem);
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

using Response = http::response<http::string_body>;

// The answer to one request, and whether the connection must close after it.
Response Answer(const http::request<http::string_body>& request, const Metrics& metrics,
                bool* close) {
  auto text = [&](http::status status, std::string body) {
    Metrics::Inc(metrics.refused);
    Response r(status, request.version());
    r.set(http::field::content_type, "text/plain; charset=utf-8");
    r.body() = std::move(body) + "\n";
    return r;
  };
  // The API server adds the call's timeout as a query (/convert?timeout=30s).
  beast::string_view target = request.target();
  if (target.substr(0, target.find('?')) != "/convert") {
    return text(http::status::not_found, "only /convert is served here");
  }
  if (request.method() != http::verb::post) {
    return text(http::status::method_not_allowed, "/convert takes POST");
  }
  auto type = request.find(http::field::content_type);
  if (type != request.end() && !type->value().starts_with("application/json")) {
    return text(
        http::status::unsupported_media_type,
        absl::StrCat("a ConversionReview is application/json, not ", std::string(type->value())));
  }
  absl::StatusOr<nlohmann::json> answer = ReviewConversion(request.body());
  if (!answer.ok()) {
    *close = true;
    return text(http::status::bad_request, std::string(answer.status().message()));
  }
  const nlohmann::json& response = (*answer)["response"];
  if (response["result"]["status"] == "Success") {
    Metrics::Inc(metrics.success);
    Metrics::Inc(metrics.objects, static_cast<double>(response["convertedObjects"].size()));
  } else {
    Metrics::Inc(metrics.failure);
    spdlog::warn("conversion webhook: {}", response["result"]["message"].get<std::string>());
  }
  Response r(http::status::ok, request.version());
  r.set(http::field::content_type, "application/json");
  r.body() = answer->dump();
  return r;
}

class BeastConversionWebhook;

// One TLS connection: handshake, then requests until the client closes, an error, or a
// deadline. Owned by its pending asynchronous operations (shared_from_this).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, asio::ssl::context& tls, BeastConversionWebhook* owner);
  ~Session();
  void Run();

 private:
  void Read();
  void OnRead(beast::error_code ec);
  void Write(Response response, bool close);
  void Close();

  beast::ssl_stream<beast::tcp_stream> stream_;
  BeastConversionWebhook* owner_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Response response_;
};

class BeastConversionWebhook final : public ConversionWebhook {
 public:
  BeastConversionWebhook(const ConversionWebhookOptions& options, prometheus::Registry* registry)
      : options_(options),
        metrics_(registry),
        tls_(asio::ssl::context::tls_server),
        acceptor_(asio::make_strand(io_)) {}

  ~BeastConversionWebhook() override { Stop(); }

  absl::Status Open(const std::string& host, int port) {
    try {
      ConfigureTls(tls_, options_);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("conversion webhook: certificate ",
                                                     options_.tls_cert_file, " / key ",
                                                     options_.tls_key_file, ": ", e.what()));
    }
    beast::error_code ec;
    asio::ip::address address =
        asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("conversion webhook: listen host \"", host, "\" is not an IP address"));
    }
    tcp::endpoint endpoint(address, static_cast<uint16_t>(port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("conversion webhook: cannot listen on ",
                                                 options_.listen, ": ", ec.message()));
    }
    Accept();
    for (int i = 0; i < kThreads; ++i) {
      threads_.emplace_back([this] { io_.run(); });
    }
    return absl::OkStatus();
  }

  void Stop() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (threads_.empty()) return;
    io_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    beast::error_code ignored;
    acceptor_.close(ignored);
  }

  const ConversionWebhookOptions& options() const { return options_; }
  const Metrics& metrics() const { return metrics_; }

  // A session ended: accept the next connection if the limit held one back.
  void Ended() {
    bool resume = false;
    {
      absl::MutexLock lock(&mu_);
      --sessions_;
      resume = waiting_ && !stopping_;
      waiting_ = false;
    }
    if (resume) asio::post(acceptor_.get_executor(), [this] { Accept(); });
  }

 private:
  void Accept() {
    {
      absl::MutexLock lock(&mu_);
      if (sessions_ >= options_.max_connections) {
        waiting_ = true;  // Ended() accepts again
        return;
      }
    }
    acceptor_.async_accept(asio::make_strand(io_),
                           [this](beast::error_code ec, tcp::socket socket) {
                             if (ec == asio::error::operation_aborted) return;
                             if (!ec) {
                               {
                                 absl::MutexLock lock(&mu_);
                                 ++sessions_;
                               }
                               std::make_shared<Session>(std::move(socket), tls_, this)->Run();
                             } else {
                               spdlog::debug("conversion webhook: accept: {}", ec.message());
                             }
                             Accept();
                           });
  }

  // Sessions refer to tls_ and call Ended() (mu_) until io_ is destroyed: both are
  // declared before io_, so destroyed after it; the acceptor goes before io_.
  const ConversionWebhookOptions options_;
  Metrics metrics_;
  asio::ssl::context tls_;
  absl::Mutex mu_;
  int sessions_ ABSL_GUARDED_BY(mu_) = 0;
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::vector<std::thread> threads_;
};

Session::Session(tcp::socket socket, asio::ssl::context& tls, BeastConversionWebhook* owner)
    : stream_(std::move(socket), tls), owner_(owner) {}

Session::~Session() { owner_->Ended(); }

void Session::Run() {
  beast::get_lowest_layer(stream_).expires_after(kHandshakeTimeout);
  stream_.async_handshake(asio::ssl::stream_base::server,
                          [self = shared_from_this()](beast::error_code ec) {
                            if (ec) {
                              spdlog::debug("conversion webhook: TLS handshake: {}", ec.message());
                              return;  // not TLS, or stalled: drop the connection
                            }
                            self->Read();
                          });
}

void Session::Read() {
  parser_.emplace();
  parser_->header_limit(kHeaderLimit);
  parser_->body_limit(owner_->options().max_body_bytes);
  beast::get_lowest_layer(stream_).expires_after(kRequestTimeout);
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
}

void Session::OnRead(beast::error_code ec) {
  if (ec == http::error::end_of_stream) return Close();
  if (ec == http::error::body_limit) {
    Metrics::Inc(owner_->metrics().refused);
    Response r(http::status::payload_too_large, 11);
    r.set(http::field::content_type, "text/plain; charset=utf-8");
    r.body() = absl::StrCat("the body is larger than ", owner_->options().max_body_bytes,
                            " bytes, the most accepted\n");
    return Write(std::move(r), /*close=*/true);
  }
  if (ec) {
    spdlog::debug("conversion webhook: reading a request: {}", ec.message());
    return;  // malformed HTTP, a timeout or a reset: drop the connection
  }
  bool close = !parser_->get().keep_alive();
  Response r = Answer(parser_->get(), owner_->metrics(), &close);
  Write(std::move(r), close);
}

void Session::Write(Response response, bool close) {
  response_ = std::move(response);
  response_.keep_alive(!close);
  response_.prepare_payload();
  beast::get_lowest_layer(stream_).expires_after(kRequestTimeout);
  http::async_write(stream_, response_,
                    [self = shared_from_this(), close](beast::error_code ec, size_t) {
                      if (ec) return;
                      if (close) return self->Close();
                      self->Read();
                    });
}

void Session::Close() {
  beast::get_lowest_layer(stream_).expires_after(kHandshakeTimeout);
  stream_.async_shutdown([self = shared_from_this()](beast::error_code) {});
}

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
  if (max_connections <= 0) {
    return absl::InvalidArgumentError("conversion webhook: max_connections must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ConversionWebhook>> ConversionWebhook::Start(
    const ConversionWebhookOptions& options, prometheus::Registry* metrics) {
  if (absl::Status valid = options.Validate(); !valid.ok()) return valid;
  std::vector<std::string> parts = absl::StrSplit(options.listen, absl::MaxSplits(':', 1));
  int port = 0;
  (void)absl::SimpleAtoi(parts[1], &port);
  auto webhook = std::make_unique<BeastConversionWebhook>(options, metrics);
  if (absl::Status opened = webhook->Open(parts[0], port); !opened.ok()) return opened;
  spdlog::info("conversion webhook: serving https://{}/convert", options.listen);
  return std::unique_ptr<ConversionWebhook>(std::move(webhook));
}

}  // namespace sbx::k8s

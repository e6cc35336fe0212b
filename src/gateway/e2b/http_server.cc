// The Boost.Beast adapter of the E2B front's HTTP server (http.h). The only file of
// src/gateway/e2b that sees Boost.
//
// Each connection runs on a thread of its own with an io_context of its own: every read
// and write is an asynchronous Beast operation with a tcp_stream deadline, run to
// completion on that thread, so timeouts hold and Shutdown can close a connection by
// posting to its io_context.

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "src/gateway/e2b/http.h"

namespace sbx::e2b {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using asio::ip::tcp;
using boost::system::error_code;

std::optional<absl::string_view> HttpRequest::Header(absl::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return absl::string_view(v);
  }
  return std::nullopt;
}

absl::Status HttpServerOptions::Validate() const {
  if (listen.empty() || listen.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address \"", listen, "\" is not host:port"));
  }
  if (header_timeout <= absl::ZeroDuration() || io_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("header_timeout and io_timeout must be positive");
  }
  if (max_header_bytes < 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_header_bytes ", max_header_bytes, " is below 1024"));
  }
  if (tls_cert_file.empty() != tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate file and a key file");
  }
  if (max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_connections ", max_connections, " is below 1"));
  }
  return absl::OkStatus();
}

namespace {

std::chrono::steady_clock::duration Chrono(absl::Duration d) {
  return absl::ToChronoNanoseconds(d);
}

// What the connections share with the server; kept alive by every connection thread.
struct Shared {
  HttpServerOptions options;
  HttpHandler handler;
  absl::Mutex mu;
  // Each open connection's way to close itself from another thread.
  absl::flat_hash_map<int64_t, std::function<void()>> closers ABSL_GUARDED_BY(mu);
  int64_t next_id ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // TLS: the server's certificate and key (options.tls_cert_file); null: plaintext.
  std::unique_ptr<asio::ssl::context> tls;
  // Read by connections() without the lock; relaxed: a gauge.
  std::atomic<int> open{0};
};

class Connection;

// Writes through one connection. `stream_` is used on the connection's thread only.
template <class Stream>
class BeastResponder final : public HttpResponder {
 public:
  BeastResponder(asio::io_context& ioc, Stream& stream, const Shared& shared, bool keep_alive,
                 unsigned version)
      : ioc_(ioc), stream_(stream), shared_(shared), keep_alive_(keep_alive), version_(version) {}

  void Respond(int status, absl::string_view content_type, std::string body,
               const HttpHeaders& extra_headers) override {
    if (state_ != State::kNone) {
      spdlog::error("e2b http: a handler answered twice");
      ok_ = false;
      return;
    }
    state_ = State::kDone;
    http::response<http::string_body> res{static_cast<http::status>(status), version_};
    res.set(http::field::server, "sbx");
    if (!content_type.empty()) res.set(http::field::content_type, std::string(content_type));
    for (const auto& [k, v] : extra_headers) res.set(k, v);
    res.keep_alive(keep_alive_);
    res.body() = std::move(body);
    res.prepare_payload();
    error_code ec;
    beast::get_lowest_layer(stream_).expires_after(Chrono(shared_.options.io_timeout));
    http::async_write(stream_, res, [&](error_code e, size_t) { ec = e; });
    Run(ec);
  }

  bool StartStream(int status, absl::string_view content_type,
                   const HttpHeaders& extra_headers) override {
    if (state_ != State::kNone) {
      ok_ = false;
      return false;
    }
    state_ = State::kStreaming;
    http::response<http::empty_body> res{static_cast<http::status>(status), version_};
    res.set(http::field::server, "sbx");
    if (!content_type.empty()) res.set(http::field::content_type, std::string(content_type));
    for (const auto& [k, v] : extra_headers) res.set(k, v);
    res.keep_alive(keep_alive_);
    res.chunked(true);
    http::response_serializer<http::empty_body> sr{res};
    error_code ec;
    beast::get_lowest_layer(stream_).expires_after(Chrono(shared_.options.io_timeout));
    http::async_write_header(stream_, sr, [&](error_code e, size_t) { ec = e; });
    Run(ec);
    return ok_;
  }

  bool WriteChunk(absl::string_view data) override {
    if (state_ != State::kStreaming || !ok_) return false;
    if (data.empty()) return true;  // an empty chunk would end the body
    error_code ec;
    beast::get_lowest_layer(stream_).expires_after(Chrono(shared_.options.io_timeout));
    asio::async_write(stream_, http::make_chunk(asio::buffer(data.data(), data.size())),
                      [&](error_code e, size_t) { ec = e; });
    Run(ec);
    return ok_;
  }

  void FinishStream() override {
    if (state_ != State::kStreaming) return;
    state_ = State::kDone;
    if (!ok_) return;
    error_code ec;
    beast::get_lowest_layer(stream_).expires_after(Chrono(shared_.options.io_timeout));
    asio::async_write(stream_, http::make_chunk_last(), [&](error_code e, size_t) { ec = e; });
    Run(ec);
  }

  // Whether the connection may carry another request.
  bool reusable() const { return ok_ && keep_alive_ && state_ == State::kDone; }
  bool answered() const { return state_ != State::kNone; }

 private:
  enum class State { kNone, kStreaming, kDone };

  void Run(error_code& ec) {
    // Until the operation's handler runs, the connection counts as broken (a Shutdown
    // that stops the loop first leaves it so).
    ec = asio::error::operation_aborted;
    ioc_.restart();
    ioc_.run();
    if (ec) ok_ = false;
  }

  asio::io_context& ioc_;
  Stream& stream_;
  const Shared& shared_;
  const bool keep_alive_;
  const unsigned version_;
  State state_ = State::kNone;
  bool ok_ = true;
};

// Reads a streamed body through `parser` (a buffer_body parser), on the connection's thread.
template <class Stream>
class BeastBodyReader final : public BodyReader {
 public:
  BeastBodyReader(asio::io_context& ioc, Stream& stream, beast::flat_buffer& buffer,
                  http::request_parser<http::buffer_body>& parser, const Shared& shared)
      : ioc_(ioc), stream_(stream), buffer_(buffer), parser_(parser), shared_(shared) {}

  absl::StatusOr<size_t> Read(char* buf, size_t n) override {
    if (n == 0) return 0;
    while (!parser_.is_done()) {
      parser_.get().body().data = buf;
      parser_.get().body().size = n;
      error_code ec = asio::error::operation_aborted;
      beast::get_lowest_layer(stream_).expires_after(Chrono(shared_.options.io_timeout));
      http::async_read_some(stream_, buffer_, parser_, [&](error_code e, size_t) { ec = e; });
      ioc_.restart();
      ioc_.run();
      if (ec == http::error::need_buffer) ec = {};
      if (ec == http::error::body_limit) {
        return absl::ResourceExhaustedError("the request body is too large");
      }
      if (ec) {
        return absl::UnavailableError(absl::StrCat("reading the request body: ", ec.message()));
      }
      const size_t got = n - parser_.get().body().size;
      if (got > 0) return got;
    }
    return 0;
  }

 private:
  asio::io_context& ioc_;
  Stream& stream_;
  beast::flat_buffer& buffer_;
  http::request_parser<http::buffer_body>& parser_;
  const Shared& shared_;
};

// E2B's error body, for what the server answers itself (bad framing, limits).
template <class Stream>
void SimpleAnswer(BeastResponder<Stream>& r, int status, absl::string_view message) {
  nlohmann::json body;
  body["code"] = status;
  body["message"] = std::string(message);
  r.Respond(status, "application/json", body.dump(), {});
}

template <class Stream>
void Serve(const std::shared_ptr<Shared>& shared, asio::io_context& ioc, Stream& stream,
           tcp::socket::native_handle_type fd, tcp::endpoint::protocol_type protocol) {
  constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;
  beast::tcp_stream& tcp_layer = beast::get_lowest_layer(stream);
  error_code ec;
  tcp_layer.socket().assign(protocol, fd, ec);
  if (ec) {
    ::close(fd);
    shared->open.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  int64_t id;
  {
    absl::MutexLock lock(&shared->mu);
    id = shared->next_id++;
    if (shared->stopping) {
      shared->open.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    shared->closers[id] = [&ioc, &tcp_layer] {
      asio::post(ioc, [&tcp_layer] {
        error_code ignored;
        tcp_layer.socket().shutdown(tcp::socket::shutdown_both, ignored);
        tcp_layer.socket().close(ignored);
      });
    };
  }
  bool serving = true;
  if constexpr (kTls) {
    // The handshake must be done within the header timeout, as a request's header.
    ec = asio::error::operation_aborted;
    tcp_layer.expires_after(Chrono(shared->options.header_timeout));
    stream.async_handshake(asio::ssl::stream_base::server, [&](error_code e) { ec = e; });
    ioc.restart();
    ioc.run();
    serving = !ec;
  }
  beast::flat_buffer buffer;
  // Request after request on the connection; each way out is a break.
  for (;;) {
    if (!serving) break;
    http::request_parser<http::empty_body> head;
    head.header_limit(shared->options.max_header_bytes);
    head.body_limit(std::numeric_limits<uint64_t>::max());  // checked below, per kind
    ec = asio::error::operation_aborted;
    tcp_layer.expires_after(Chrono(shared->options.header_timeout));
    http::async_read_header(stream, buffer, head, [&](error_code e, size_t) { ec = e; });
    ioc.restart();
    ioc.run();
    const unsigned version = ec ? 11 : head.get().version();
    BeastResponder<Stream> responder(ioc, stream, *shared, /*keep_alive=*/false, version);
    if (ec == http::error::header_limit) {
      SimpleAnswer(responder, 431, "the request header is too large");
      break;
    }
    if (ec == http::error::end_of_stream || ec == asio::error::operation_aborted ||
        ec == beast::error::timeout || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::bad_descriptor) {
      break;  // the client is gone, idle too long, or we are shutting down
    }
    if (ec) {
      SimpleAnswer(responder, 400, "malformed HTTP request");
      break;
    }
    HttpRequest req;
    {
      const auto& h = head.get();
      req.method = std::string(h.method_string());
      req.target = std::string(h.target());
      const size_t q = req.target.find('?');
      req.path = req.target.substr(0, q);
      if (q != std::string::npos) req.query = req.target.substr(q + 1);
      for (const auto& f : h) {
        req.headers.emplace_back(absl::AsciiStrToLower(std::string(f.name_string())),
                                 std::string(f.value()));
      }
    }
    // A request the handler may take with its connection (plaintext only: a TLS session
    // cannot be handed on as a socket) is answered, if at all, with the connection closed:
    // its body stays unread.
    const bool handed = !kTls && shared->options.hand_off && shared->options.hand_off(req);
    const bool keep_alive = head.get().keep_alive() && !handed;
    const bool streamed =
        !handed && shared->options.stream_body && shared->options.stream_body(req);
    const uint64_t limit =
        streamed ? shared->options.max_streamed_body_bytes : shared->options.max_body_bytes;
    if (head.content_length() && *head.content_length() > limit) {
      SimpleAnswer(responder, 413, "the request body is too large");
      break;
    }
    std::optional<http::request_parser<http::buffer_body>> body_parser;
    std::optional<BeastBodyReader<Stream>> reader;
    bool taken = false;
    if (handed) {
      req.take_connection = [&]() -> TakenConnection {
        TakenConnection c;
        if constexpr (!kTls) {
          if (taken) return c;
          taken = true;
          std::ostringstream os;
          os << head.get().base();
          c.read = os.str();
          const auto rest = buffer.data();
          c.read.append(static_cast<const char*>(rest.data()), rest.size());
          buffer.consume(buffer.size());
          error_code e;
          c.fd = tcp_layer.socket().release(e);
          if (e) c.fd = -1;
        }
        return c;
      };
    } else if (streamed) {
      body_parser.emplace(std::move(head));
      body_parser->body_limit(limit);
      reader.emplace(ioc, stream, buffer, *body_parser, *shared);
      req.body_reader = &*reader;
    } else {
      http::request_parser<http::string_body> p{std::move(head)};
      p.body_limit(limit);
      ec = asio::error::operation_aborted;
      tcp_layer.expires_after(Chrono(shared->options.io_timeout));
      http::async_read(stream, buffer, p, [&](error_code e, size_t) { ec = e; });
      ioc.restart();
      ioc.run();
      if (ec == http::error::body_limit) {
        SimpleAnswer(responder, 413, "the request body is too large");
        break;
      }
      if (ec) {
        if (ec != beast::error::timeout && ec != asio::error::eof &&
            ec != http::error::end_of_stream && ec != asio::error::operation_aborted &&
            ec != asio::error::connection_reset && ec != asio::error::bad_descriptor) {
          SimpleAnswer(responder, 400, "malformed HTTP request body");
        }
        break;
      }
      req.body = std::move(p.get().body());
    }
    // A streamed body the handler did not read to its end leaves the connection unusable.
    BeastResponder<Stream> answer(ioc, stream, *shared, keep_alive, version);
    try {
      shared->handler(req, answer);
    } catch (const std::exception& e) {
      spdlog::error("e2b http: handler of {} {} threw: {}", req.method, req.path, e.what());
    }
    if (taken) {
      // The connection is the taker's now: neither answered nor closed here.
      {
        absl::MutexLock lock(&shared->mu);
        shared->closers.erase(id);
      }
      shared->open.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    if (!answer.answered()) SimpleAnswer(answer, 500, "no answer");
    answer.FinishStream();
    if (!answer.reusable() || handed) break;
    if (body_parser.has_value() && !body_parser->is_done()) break;
    {
      absl::MutexLock lock(&shared->mu);
      if (shared->stopping) break;
    }
  }
  {
    absl::MutexLock lock(&shared->mu);
    shared->closers.erase(id);
  }
  if constexpr (kTls) {
    // close_notify, briefly: a client that does not answer it is not waited for.
    if (tcp_layer.socket().is_open()) {
      tcp_layer.expires_after(std::chrono::seconds(1));
      stream.async_shutdown([](error_code) {});
      ioc.restart();
      ioc.run();
    }
  }
  error_code ignored;
  tcp_layer.socket().shutdown(tcp::socket::shutdown_send, ignored);
  tcp_layer.socket().close(ignored);
  shared->open.fetch_sub(1, std::memory_order_relaxed);
}

void ServeConnection(std::shared_ptr<Shared> shared, tcp::socket::native_handle_type fd,
                     tcp::endpoint::protocol_type protocol) {
  asio::io_context ioc(1);
  if (shared->tls != nullptr) {
    beast::ssl_stream<beast::tcp_stream> stream(ioc, *shared->tls);
    Serve(shared, ioc, stream, fd, protocol);
  } else {
    beast::tcp_stream stream(ioc);
    Serve(shared, ioc, stream, fd, protocol);
  }
}

class BeastHttpServer final : public HttpServer {
 public:
  BeastHttpServer(std::shared_ptr<Shared> shared) : shared_(std::move(shared)), acceptor_(ioc_) {}

  ~BeastHttpServer() override { Shutdown(); }

  absl::Status Bind() {
    const std::string& listen = shared_->options.listen;
    const size_t colon = listen.rfind(':');
    std::string host = listen.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    int port = 0;
    if (!absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("bad port in \"", listen, "\""));
    }
    error_code ec;
    const auto address = asio::ip::make_address(host.empty() ? "0.0.0.0" : host, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad host \"", host, "\" in \"", listen, "\": ", ec.message()));
    }
    const tcp::endpoint endpoint(address, static_cast<uint16_t>(port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", listen, ": ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    thread_ = std::thread([this] { ioc_.run(); });
    return absl::OkStatus();
  }

  int port() const override { return port_; }
  int connections() const override { return shared_->open.load(std::memory_order_relaxed); }

  void Shutdown() override {
    if (shut_down_.exchange(true)) return;
    asio::post(ioc_, [this] {
      error_code ignored;
      acceptor_.close(ignored);
    });
    if (thread_.joinable()) thread_.join();
    {
      absl::MutexLock lock(&shared_->mu);
      shared_->stopping = true;
      for (auto& [id, close] : shared_->closers) close();
    }
    // Handlers still running finish on their own (their gRPC calls have deadlines); they
    // hold `shared_`, so waiting is a courtesy, bounded.
    const absl::Time deadline = absl::Now() + shared_->options.shutdown_wait;
    while (shared_->open.load(std::memory_order_relaxed) > 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

 private:
  void Accept() {
    acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) {
        if (shared_->open.load(std::memory_order_relaxed) >= shared_->options.max_connections) {
          error_code ignored;
          socket.close(ignored);
        } else {
          error_code e;
          const auto local = socket.local_endpoint(e);
          if (!e) socket.set_option(tcp::no_delay(true), e);
          const auto fd = e ? -1 : socket.release(e);
          if (!e) {
            shared_->open.fetch_add(1, std::memory_order_relaxed);
            std::thread(ServeConnection, shared_, fd, local.protocol()).detach();
          }
        }
      }
      Accept();
    });
  }

  std::shared_ptr<Shared> shared_;
  asio::io_context ioc_{1};
  tcp::acceptor acceptor_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<bool> shut_down_{false};
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (!handler) return absl::InvalidArgumentError("HttpServer needs a handler");
  auto shared = std::make_shared<Shared>();
  shared->options = options;
  shared->handler = std::move(handler);
  if (!options.tls_cert_file.empty()) {
    auto ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    error_code ec;
    ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                         asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                         asio::ssl::context::no_tlsv1_1,
                     ec);
    if (!ec) ctx->use_certificate_chain_file(options.tls_cert_file, ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("cannot use TLS certificate file \"",
                                                     options.tls_cert_file, "\": ", ec.message()));
    }
    ctx->use_private_key_file(options.tls_key_file, asio::ssl::context::pem, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot use TLS key file \"", options.tls_key_file, "\": ", ec.message()));
    }
    shared->tls = std::move(ctx);
  }
  auto server = std::make_unique<BeastHttpServer>(std::move(shared));
  if (absl::Status s = server->Bind(); !s.ok()) return s;
  return server;
}

}  // namespace sbx::e2b

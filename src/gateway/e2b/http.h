#pragma once
// The HTTP/1.1 server under the E2B front (src/gateway/e2b/e2b.h): requests in, answers out, with
// no Boost type in sight (only http_server.cc includes Beast).
//
// Each client connection is served by a thread of its own, which reads a request, calls
// the handler and writes its answer, then waits for the next request on the same
// connection (keep-alive). So a handler may block (it calls sbx's gRPC API synchronously,
// with deadlines) without holding up other connections; the number of connections is
// bounded (HttpServerOptions::max_connections) and so is the number of threads.
//
// Thread-safety: the handler is called concurrently from the connection threads.
// Lifetime: Shutdown (or the destructor) stops accepting, closes every connection and
// waits up to HttpServerOptions::shutdown_wait for handlers still running; the handler
// (and what it holds) is kept alive by the connections that still use it.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sbx::e2b {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// A client connection taken from the server (HttpRequest::take_connection): its socket,
// now the taker's to close, and the bytes the server read from it and did not consume:
// the request's header (as parsed: request line and fields, in order) and whatever
// followed it (a body's start, pipelined requests).
struct TakenConnection {
  int fd = -1;
  std::string read;
};

// A request body read as it arrives (HttpServerOptions::stream_body), at constant memory.
class BodyReader {
 public:
  virtual ~BodyReader() = default;
  // Up to `n` bytes into `buf`; 0 at the end of the body. An error (the client went away,
  // the body is malformed, larger than max_streamed_body_bytes or too slow) means the
  // connection is closed after the answer.
  [[nodiscard]] virtual absl::StatusOr<size_t> Read(char* buf, size_t n) = 0;
};

struct HttpRequest {
  std::string method;   // as sent: "GET", "POST", ...
  std::string target;   // the request target as sent: "/v2/sandboxes?limit=10"
  std::string path;     // target up to '?', not decoded
  std::string query;    // target after '?', not decoded; empty without one
  HttpHeaders headers;  // names lower-cased, in the order sent
  std::string body;
  // Set instead of `body` for the requests HttpServerOptions::stream_body selects; valid
  // during the handler's call. What the handler leaves unread closes the connection.
  BodyReader* body_reader = nullptr;
  // Set for the requests HttpServerOptions::hand_off selects on a plaintext listener (their
  // body is left unread): takes the connection away from the server, which then neither
  // answers nor closes it. Valid during the handler's call, at most once, and only before
  // the handler answers; null on a TLS listener.
  std::function<TakenConnection()> take_connection;

  // The value of the first header named `name` (lower-case), if any.
  std::optional<absl::string_view> Header(absl::string_view name) const;
};

// Where a handler writes its answer: either one Respond, or StartStream, any number of
// WriteChunk and one FinishStream (a chunked response). Anything else is a bug (CHECK).
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  // A whole response with Content-Length.
  virtual void Respond(int status, absl::string_view content_type, std::string body,
                       const HttpHeaders& extra_headers = {}) = 0;
  // A chunked response: the status and headers now, the body in chunks. Each returns false
  // once the client is gone (nothing more reaches it; the handler should stop).
  virtual bool StartStream(int status, absl::string_view content_type,
                           const HttpHeaders& extra_headers = {}) = 0;
  virtual bool WriteChunk(absl::string_view data) = 0;
  virtual void FinishStream() = 0;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

struct HttpServerOptions {
  // host:port; port 0 picks one (HttpServer::port).
  std::string listen;
  // A request's header must arrive within this once its first byte has (slowloris), and a
  // kept-alive connection may wait this long for its next request.
  absl::Duration header_timeout = absl::Seconds(10);
  // A request body, or one write of the answer, may take at most this long.
  absl::Duration io_timeout = absl::Minutes(5);
  uint32_t max_header_bytes = 16 * 1024;
  // Largest request body read whole (413 beyond).
  uint64_t max_body_bytes = 1024 * 1024;
  // Which requests the handler reads as they arrive (HttpRequest::body_reader), judged by
  // the request line and headers (`body` is empty then). Unset: none.
  std::function<bool(const HttpRequest& head)> stream_body;
  // Which requests the handler may take with their connection (HttpRequest::
  // take_connection), judged by the request line and headers; their body is not read.
  // Unset: none. A selected request the handler answers instead closes the connection.
  std::function<bool(const HttpRequest& head)> hand_off;
  // Largest streamed body.
  uint64_t max_streamed_body_bytes = uint64_t{1} << 40;
  // Connections open at once; more are closed at accept.
  int max_connections = 1024;
  // TLS: both set → the listener serves TLS only (PEM files: the certificate chain, the
  // private key); TLS 1.2 or later. Both empty: plaintext.
  std::string tls_cert_file;
  std::string tls_key_file;
  // How long Shutdown waits for handlers that are still running.
  absl::Duration shutdown_wait = absl::Seconds(5);

  // INVALID_ARGUMENT naming the bad field.
  [[nodiscard]] absl::Status Validate() const;
};

class HttpServer {
 public:
  // Binds and serves on threads of its own. INVALID_ARGUMENT for bad options,
  // UNAVAILABLE when the address cannot be bound.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const HttpServerOptions& options, HttpHandler handler);
  virtual ~HttpServer() = default;
  virtual int port() const = 0;
  // Connections open now.
  virtual int connections() const = 0;
  // Idempotent.
  virtual void Shutdown() = 0;
};

}  // namespace sbx::e2b

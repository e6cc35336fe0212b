#pragma once
// HttpTransport: the HTTP(S) connection of the Kubernetes client to one API server. Two
// implementations: the socket transport (http_socket.cc, HTTP/1.1 on sockets and OpenSSL,
// the default) and cpprestsdk's (http_cpprest.cc); no OpenSSL or cpprest type crosses
// this header. Requests are plain data; the transport knows nothing of Kubernetes.
//
// Thread-safety: Send and OpenStream may be called from any number of threads at once.
// Requests share a pool of keep-alive connections; every stream gets a connection of its
// own, so a long watch never holds up a write.
// Lifetime: a transport must outlive the streams it opened.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sbx::k8s {

struct HttpRequest {
  std::string method = "GET";
  // Absolute path with an already-encoded query, e.g. "/api/v1/namespaces/a/pods?limit=5".
  std::string path;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Whole-request deadline (connect, send, headers and body). For streams: connect and
  // headers only; the stream's reads are bounded by `idle_timeout`.
  absl::Duration timeout = absl::Seconds(30);
  // Streams only: a read that sees no byte for this long fails with DEADLINE_EXCEEDED.
  absl::Duration idle_timeout = absl::Minutes(5);
};

struct HttpResponse {
  int status = 0;
  std::string body;
  // Header names in lower case.
  std::vector<std::pair<std::string, std::string>> headers;

  // The value of header `name` (lower case), or "" when absent.
  std::string Header(std::string_view name) const;
};

// A response whose body arrives over time (a watch). Not thread-safe, except Cancel.
class HttpStream {
 public:
  virtual ~HttpStream() = default;
  virtual int status() const = 0;
  // Reads the next line (without its '\n') into *line. Returns false at the end of the
  // body, UNAVAILABLE when the connection broke, DEADLINE_EXCEEDED when it idled past
  // the request's idle_timeout, CANCELLED after Cancel.
  [[nodiscard]] virtual absl::StatusOr<bool> ReadLine(std::string* line) = 0;
  // Reads what is left of the body (for error statuses): the socket transport gives its
  // bytes as sent; cpprest's joins the remaining lines with "\n".
  [[nodiscard]] virtual absl::StatusOr<std::string> ReadAll() = 0;
  // Ends the stream from any thread; a blocked ReadLine returns CANCELLED.
  virtual void Cancel() = 0;
};

struct TransportOptions {
  // "https://host:port" or "http://host:port", no path.
  std::string server;
  // PEM of the CA bundle to trust instead of the system's ("" = system).
  std::string ca_pem;
  bool insecure_skip_tls_verify = false;
  // Client certificate and key (PEM) for mutual TLS; both or neither.
  std::string client_cert_pem;
  std::string client_key_pem;
};

class HttpTransport {
 public:
  virtual ~HttpTransport() = default;
  // Sends one request and reads the whole response. A non-2xx status is a response, not
  // an error; errors are the connection's: UNAVAILABLE (refused, reset, TLS failure),
  // DEADLINE_EXCEEDED (request.timeout passed).
  [[nodiscard]] virtual absl::StatusOr<HttpResponse> Send(const HttpRequest& request) = 0;
  // Sends a request and returns once the response headers are in; the body is read from
  // the stream. Errors as for Send.
  [[nodiscard]] virtual absl::StatusOr<std::unique_ptr<HttpStream>> OpenStream(
      const HttpRequest& request) = 0;
};

// The cpprestsdk transport. INVALID_ARGUMENT when the server URL or a PEM is malformed.
[[nodiscard]] absl::StatusOr<std::unique_ptr<HttpTransport>> NewCpprestTransport(
    const TransportOptions& options);

// The socket transport (http_socket.cc): HTTP/1.1 on sockets driven by the calling thread
// itself (no I/O threads, no hand-offs), TLS through OpenSSL. A pool of idle keep-alive
// connections serves Send; a pooled connection that the server closed is noticed before
// reuse, and a request that fails on a reused connection before any byte of its answer is
// sent again once on a new connection when that cannot do it twice (its bytes were not
// all written, or its method is idempotent). INVALID_ARGUMENT when the server URL or a PEM
// is malformed.
[[nodiscard]] absl::StatusOr<std::unique_ptr<HttpTransport>> NewSocketTransport(
    const TransportOptions& options);

}  // namespace sbx::k8s

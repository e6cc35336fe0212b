// A small HTTP/1.1 server on blocking sockets for the Kubernetes API emulator.
//
// One thread per connection, keep-alive, Content-Length and chunked request
// bodies, chunked responses (for watch streams), optional TLS through OpenSSL
// (HTTP/1.1 only, no h2 in ALPN). Test infrastructure only; never linked into sbx.
//
// Thread-safety: Start() and port() may be called from one thread; the handler
// is called concurrently from the connection threads and must be thread-safe.
// Lifetime: the server lives until process exit (connection threads are detached).
#pragma once

#include <openssl/ssl.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace kube_emulator {

struct HttpRequest {
  std::string method;
  std::string target;                             // raw request target, e.g. /api/v1/pods?watch=1
  std::string path;                               // percent-decoded path without the query
  std::multimap<std::string, std::string> query;  // decoded query parameters
  std::map<std::string, std::string> headers;     // lower-cased names
  std::string body;

  // The first value of query parameter `key`, or "" when absent.
  std::string Query(const std::string& key) const;
  bool HasQuery(const std::string& key) const { return query.count(key) > 0; }
  // The value of header `name` (lower case), or "" when absent.
  std::string Header(const std::string& name) const;
};

// Byte stream of one connection (plain TCP or TLS).
class Connection {
 public:
  virtual ~Connection() = default;
  // Returns bytes read, 0 on EOF, <0 on error.
  virtual long Read(char* buf, size_t len) = 0;
  // Returns false when the peer is gone.
  virtual bool WriteAll(absl::string_view data) = 0;
  virtual int fd() const = 0;
};

// Writes the response for one request. Either Send() once, or StartChunked(),
// WriteChunk()* and EndChunked(); Abort() closes the connection without the end marker.
class HttpResponder {
 public:
  explicit HttpResponder(Connection* conn) : conn_(conn) {}
  using Headers = std::vector<std::pair<std::string, std::string>>;

  bool Send(int code, absl::string_view content_type, absl::string_view body,
            const Headers& extra = {});
  // A header for whatever response follows (e.g. a Warning known before the answer is).
  void AddHeader(std::string name, std::string value) {
    always_.emplace_back(std::move(name), std::move(value));
  }
  bool StartChunked(int code, absl::string_view content_type, const Headers& extra = {});
  bool WriteChunk(absl::string_view data);
  bool EndChunked();
  void Abort() { close_ = true; }
  // Closes the connection without answering (only before Send() or StartChunked()):
  // the request is treated as lost on its way.
  void Drop() {
    close_ = true;
    dropped_ = true;
  }
  // `observer` is called with the status code on the responder's thread just before
  // the head of the response is written (once: Send() or StartChunked()).
  void OnStatus(std::function<void(int code)> observer) { on_status_ = std::move(observer); }
  // True when the peer closed the connection (or sent unexpected bytes) while a
  // stream was being served; checks without blocking.
  bool PeerGone() const;

  bool close_after() const { return close_; }
  bool sent() const { return sent_; }
  bool dropped() const { return dropped_; }

 private:
  void Status(int code) {
    sent_ = true;
    if (on_status_) on_status_(code);
  }

  Connection* conn_;
  Headers always_;
  std::function<void(int)> on_status_;
  bool close_ = false;
  bool sent_ = false;
  bool dropped_ = false;
};

using HttpHandler = std::function<void(const HttpRequest&, HttpResponder&)>;

class HttpServer {
 public:
  explicit HttpServer(HttpHandler handler) : handler_(std::move(handler)) {}
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens on host:port (port 0 picks a free one) and starts the
  // accept thread. With cert_file and key_file non-empty serves TLS. Returns an
  // error when the address cannot be bound or the certificate cannot be loaded.
  absl::Status Start(const std::string& host, int port, const std::string& cert_file,
                     const std::string& key_file);
  int port() const { return port_; }
  bool tls() const { return ssl_ctx_ != nullptr; }

 private:
  void AcceptLoop();
  void Serve(int fd);

  HttpHandler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  SSL_CTX* ssl_ctx_ = nullptr;
};

// Percent-decodes `s` ('+' becomes ' ' when form is true).
std::string UrlDecode(absl::string_view s, bool form);
// HTTP reason phrase for a status code.
const char* ReasonPhrase(int code);

}  // namespace kube_emulator

// The socket transport (src/k8s/http_socket.cc) against scripted HTTP peers on loopback.
// A ScriptedServer accepts connections and runs a test's script on each: the script reads
// requests and writes exact bytes, well-formed or not, then closes, resets, stalls or keeps
// the connection. Plain TCP, and TLS through a server SSL_CTX built here from certificates
// that the openssl CLI makes at run time. Nothing leaves the loopback interface, every wait
// is bounded, and no test asserts how long something took.

#include "src/k8s/http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/k8s/blocked_thread.h"
#include "tests/k8s/temp_dir.h"

namespace sbx::k8s {
namespace {

using ::sbx::k8s::testing::TempDir;
using ::testing::HasSubstr;

// Bounds every request of these tests: a transport that hangs fails the test, not the run.
constexpr absl::Duration kTimeout = absl::Seconds(5);
// Bounds every wait of the scripted server's side.
constexpr absl::Duration kServerWait = absl::Seconds(10);

// ---------------------------------------------------------------------------------------
// ScriptedServer
// ---------------------------------------------------------------------------------------

// One request as the scripted server read it.
struct ScriptedRequest {
  int connection = 0;  // index of the accepted connection it came on: 0, 1, ...
  std::string method;
  std::string target;  // path and query
  std::string version;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;

  // The value of the first header `name` (lower case), or "" when absent.
  std::string Header(absl::string_view name) const {
    for (const auto& [key, value] : headers) {
      if (key == name) return value;
    }
    return "";
  }
  int HeaderCount(absl::string_view name) const {
    return static_cast<int>(std::count_if(headers.begin(), headers.end(),
                                          [name](const auto& h) { return h.first == name; }));
  }
};

class ScriptedServer;

// One accepted connection as a script sees it. Only the thread that runs the script uses
// it; the server may shut its socket down from another thread when it stops, which makes
// every read, write and wait below return at once.
class ScriptedConnection {
 public:
  ScriptedConnection(ScriptedServer* server, int fd, SSL* ssl, int index)
      : server_(server), fd_(fd), ssl_(ssl), index_(index) {}
  ~ScriptedConnection();
  ScriptedConnection(const ScriptedConnection&) = delete;
  ScriptedConnection& operator=(const ScriptedConnection&) = delete;

  // 0 for the first connection the server accepted, 1 for the next, ...
  int index() const { return index_; }

  // Reads one request: its head up to the blank line, then (when `with_body`) as many body
  // bytes as its Content-Length says. nullopt at the end of the stream, on an error, on a
  // malformed head or when nothing complete came within kServerWait. Every request read is
  // also recorded by the server.
  std::optional<ScriptedRequest> ReadRequest(bool with_body = true);
  // Writes all of `bytes`; false when the peer is gone.
  bool Write(absl::string_view bytes);
  // Writes `bytes` one byte per send (the socket has TCP_NODELAY).
  bool WriteByteByByte(absl::string_view bytes);
  // Closes in order: FIN (under TLS a close_notify first).
  void Close();
  // Closes abortively: RST (SO_LINGER 0), under TLS without a close_notify.
  void Reset();
  // Waits until the client closes its end; true when it did within `timeout`. Bytes that
  // arrive meanwhile are kept for ReadRequest.
  bool WaitForPeerClose(absl::Duration timeout = kServerWait);
  // Sleeps for `duration`; false (at once) when the server is stopping.
  bool Sleep(absl::Duration duration);

 private:
  // Reads more bytes onto buffer_: > 0 bytes read, 0 end of stream or error, -1 timeout.
  int Fill(absl::Time deadline);
  void CloseSocket(bool abortive);

  ScriptedServer* const server_;
  int fd_;
  SSL* ssl_;
  const int index_;
  std::string buffer_;  // read, not yet taken by ReadRequest
};

// A loopback HTTP(S) server for tests: listens on a free port of 127.0.0.1 (or ::1) and runs
// `script` on every connection it accepts, each on a thread of its own (so a stalled or
// kept-alive connection never holds up the next, and the pool test can have many).
// Thread-safety: connections(), requests() and url() may be called from any thread while
// scripts run. The destructor stops accepting, shuts every open connection down (so
// blocked scripts return), and joins all threads; anything a script captures must outlive
// the server. SIGPIPE is blocked on the server's threads (a write to a closed peer fails
// with EPIPE there), but not on the test's own threads, so a transport that lets SIGPIPE
// through still kills the test.
class ScriptedServer {
 public:
  using Script = std::function<void(ScriptedConnection&)>;

  // `tls`, when given, makes it an HTTPS server; it is not owned and must outlive it.
  explicit ScriptedServer(Script script, SSL_CTX* tls = nullptr, bool ipv6 = false)
      : script_(std::move(script)), tls_(tls), ipv6_(ipv6) {
    const int family = ipv6 ? AF_INET6 : AF_INET;
    listen_fd_ = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return;
    const int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage address{};
    socklen_t length;
    if (ipv6) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&address);
      a6->sin6_family = AF_INET6;
      a6->sin6_addr = in6addr_loopback;
      length = sizeof(sockaddr_in6);
    } else {
      auto* a4 = reinterpret_cast<sockaddr_in*>(&address);
      a4->sin_family = AF_INET;
      a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      length = sizeof(sockaddr_in);
    }
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::listen(listen_fd_, 128) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      ::close(listen_fd_);
      listen_fd_ = -1;
      return;
    }
    port_ = ntohs(ipv6 ? reinterpret_cast<sockaddr_in6*>(&address)->sin6_port
                       : reinterpret_cast<sockaddr_in*>(&address)->sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }

  ~ScriptedServer() {
    stop_.Notify();
    if (acceptor_.joinable()) acceptor_.join();
    std::vector<std::thread> workers;
    {
      absl::MutexLock lock(&mu_);
      for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
      workers.swap(workers_);
    }
    for (std::thread& worker : workers) worker.join();
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }

  ScriptedServer(const ScriptedServer&) = delete;
  ScriptedServer& operator=(const ScriptedServer&) = delete;

  bool ok() const { return listen_fd_ >= 0; }
  int port() const { return port_; }
  std::string url() const {
    return absl::StrCat(tls_ != nullptr ? "https://" : "http://", ipv6_ ? "[::1]" : "127.0.0.1",
                        ":", port_);
  }
  // Connections accepted so far.
  int connections() const {
    absl::MutexLock lock(&mu_);
    return connections_;
  }
  // Every request the scripts read, in the order they were read.
  std::vector<ScriptedRequest> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  // How many requests for `target` the scripts read.
  int CountRequests(absl::string_view target) const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(std::count_if(requests_.begin(), requests_.end(),
                                          [target](const auto& r) { return r.target == target; }));
  }

 private:
  friend class ScriptedConnection;

  static void BlockSigpipe() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }

  void AcceptLoop() {
    BlockSigpipe();  // inherited by the connection threads started here
    while (!stopping()) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      absl::MutexLock lock(&mu_);
      open_fds_.insert(fd);
      const int index = connections_++;
      workers_.emplace_back([this, fd, index] { Serve(fd, index); });
    }
  }

  void Serve(int fd, int index) {
    SSL* ssl = nullptr;
    if (tls_ != nullptr) {
      ssl = SSL_new(tls_);
      SSL_set_fd(ssl, fd);
      if (SSL_accept(ssl) != 1) {  // e.g. the client did not trust the certificate
        ERR_clear_error();
        SSL_free(ssl);
        CloseFd(fd, /*abortive=*/false);
        return;
      }
    }
    ScriptedConnection connection(this, fd, ssl, index);
    script_(connection);
  }

  void Record(const ScriptedRequest& request) {
    absl::MutexLock lock(&mu_);
    requests_.push_back(request);
  }

  // Closes `fd` under the lock, so that the destructor never shuts down a reused number.
  void CloseFd(int fd, bool abortive) {
    absl::MutexLock lock(&mu_);
    if (abortive) {
      const linger reset{1, 0};
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    }
    open_fds_.erase(fd);
    ::close(fd);
  }

  bool stopping() const { return stop_.HasBeenNotified(); }

  const Script script_;
  SSL_CTX* const tls_;
  const bool ipv6_;
  int listen_fd_ = -1;
  int port_ = 0;
  absl::Notification stop_;
  std::thread acceptor_;
  mutable absl::Mutex mu_;
  int connections_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<int> open_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<ScriptedRequest> requests_ ABSL_GUARDED_BY(mu_);
};

ScriptedConnection::~ScriptedConnection() {
  if (fd_ >= 0) Close();
  if (ssl_ != nullptr) SSL_free(ssl_);
}

int ScriptedConnection::Fill(absl::Time deadline) {
  if (fd_ < 0) return 0;
  while (ssl_ == nullptr || SSL_pending(ssl_) == 0) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return -1;
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready > 0) break;
    if (ready < 0 && errno != EINTR) return 0;
  }
  char bytes[64 * 1024];
  const int n = ssl_ != nullptr ? SSL_read(ssl_, bytes, sizeof(bytes))
                                : static_cast<int>(::recv(fd_, bytes, sizeof(bytes), 0));
  if (n <= 0) {
    ERR_clear_error();
    return 0;
  }
  buffer_.append(bytes, static_cast<size_t>(n));
  return n;
}

std::optional<ScriptedRequest> ScriptedConnection::ReadRequest(bool with_body) {
  const absl::Time deadline = absl::Now() + kServerWait;
  size_t end;
  while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
    if (Fill(deadline) <= 0) return std::nullopt;
  }
  ScriptedRequest request;
  request.connection = index_;
  std::vector<std::string> lines = absl::StrSplit(buffer_.substr(0, end), "\r\n");
  std::vector<std::string> first = absl::StrSplit(lines[0], ' ');
  if (first.size() != 3) return std::nullopt;
  request.method = first[0];
  request.target = first[1];
  request.version = first[2];
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) return std::nullopt;
    request.headers.emplace_back(
        absl::AsciiStrToLower(lines[i].substr(0, colon)),
        std::string(absl::StripAsciiWhitespace(absl::string_view(lines[i]).substr(colon + 1))));
  }
  buffer_.erase(0, end + 4);
  size_t length = 0;
  if (!request.Header("content-length").empty() &&
      !absl::SimpleAtoi(request.Header("content-length"), &length)) {
    return std::nullopt;
  }
  if (with_body) {
    while (buffer_.size() < length) {
      if (Fill(deadline) <= 0) return std::nullopt;
    }
    request.body = buffer_.substr(0, length);
    buffer_.erase(0, length);
  }
  server_->Record(request);
  return request;
}

bool ScriptedConnection::Write(absl::string_view bytes) {
  while (!bytes.empty()) {
    if (fd_ < 0) return false;
    const int chunk = static_cast<int>(std::min<size_t>(bytes.size(), 1 << 20));
    const int n = ssl_ != nullptr
                      ? SSL_write(ssl_, bytes.data(), chunk)
                      : static_cast<int>(::send(fd_, bytes.data(), chunk, MSG_NOSIGNAL));
    if (n <= 0) {
      if (ssl_ == nullptr && n < 0 && errno == EINTR) continue;
      ERR_clear_error();
      return false;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool ScriptedConnection::WriteByteByByte(absl::string_view bytes) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (!Write(bytes.substr(i, 1))) return false;
  }
  return true;
}

void ScriptedConnection::CloseSocket(bool abortive) {
  if (fd_ < 0) return;
  if (ssl_ != nullptr && !abortive) {
    SSL_shutdown(ssl_);  // sends close_notify; does not wait for the client's
    ERR_clear_error();
  }
  server_->CloseFd(fd_, abortive);
  fd_ = -1;
}

void ScriptedConnection::Close() { CloseSocket(/*abortive=*/false); }
void ScriptedConnection::Reset() { CloseSocket(/*abortive=*/true); }

bool ScriptedConnection::WaitForPeerClose(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const int n = Fill(deadline);
    if (n == 0) return true;
    if (n < 0) return false;
  }
}

bool ScriptedConnection::Sleep(absl::Duration duration) {
  return !server_->stop_.WaitForNotificationWithTimeout(duration);
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

// A response with a Content-Length body; `headers` are extra lines, each ending in "\r\n".
std::string Response(int status, absl::string_view reason, absl::string_view body,
                     absl::string_view headers = "") {
  return absl::StrCat("HTTP/1.1 ", status, " ", reason, "\r\nContent-Length: ", body.size(), "\r\n",
                      headers, "\r\n", body);
}

std::string Ok(absl::string_view body, absl::string_view headers = "") {
  return Response(200, "OK", body, headers);
}

// The head of a 200 response with a chunked body, and one chunk.
constexpr absl::string_view kChunkedHead =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
std::string Chunk(absl::string_view data) {
  return absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
}

using Answerer = std::function<std::string(const ScriptedRequest&)>;

// Answers every request left on `conn` with answer(request) until the client closes it.
void AnswerAll(ScriptedConnection& conn, const Answerer& answer) {
  while (std::optional<ScriptedRequest> request = conn.ReadRequest()) {
    if (!conn.Write(answer(*request))) return;
  }
}

// A script that answers every request on every connection with answer(request).
ScriptedServer::Script AnswerEveryRequest(Answerer answer) {
  return [answer = std::move(answer)](ScriptedConnection& conn) { AnswerAll(conn, answer); };
}

// A script that reads one request, writes `bytes` and keeps the connection until the
// client closes it (so that only what the bytes say can end the exchange).
ScriptedServer::Script AnswerOnceAndHold(std::string bytes) {
  return [bytes = std::move(bytes)](ScriptedConnection& conn) {
    if (conn.ReadRequest() && conn.Write(bytes)) conn.WaitForPeerClose();
  };
}

std::unique_ptr<HttpTransport> NewTransport(std::string server, TransportOptions options = {}) {
  options.server = std::move(server);
  absl::StatusOr<std::unique_ptr<HttpTransport>> transport = NewSocketTransport(options);
  EXPECT_TRUE(transport.ok()) << transport.status();
  return transport.ok() ? *std::move(transport) : nullptr;
}

HttpRequest Request(std::string method, std::string path, std::string body = "") {
  HttpRequest request;
  request.method = std::move(method);
  request.path = std::move(path);
  request.body = std::move(body);
  request.timeout = kTimeout;
  return request;
}

// Sends `request` on a new transport to a new server running `script`; returns the status.
absl::Status SendOnce(ScriptedServer::Script script, const HttpRequest& request) {
  ScriptedServer server(std::move(script));
  if (!server.ok()) return absl::InternalError("the scripted server could not listen");
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  if (transport == nullptr) return absl::InternalError("no transport");
  return transport->Send(request).status();
}

// ---------------------------------------------------------------------------------------
// Responses and connection reuse
// ---------------------------------------------------------------------------------------

TEST(HttpSocketTest, ContentLengthBodyAndLowerCaseHeaders) {
  ScriptedServer server(AnswerEveryRequest([](const ScriptedRequest& r) {
    if (r.target == "/missing") {
      return Response(404, "Not Found", R"({"reason":"NotFound"})",
                      "Content-Type: application/json\r\n");
    }
    return Ok(R"({"kind":"Pod"})",
              "Content-Type: application/json\r\nX-Mixed-Case: Value\r\n"
              "AUDIT-ID: abc-123\r\nX-Padded:   padded value  \r\n");
  }));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);

  absl::StatusOr<HttpResponse> response = transport->Send(Request("GET", "/api/v1/pods"));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, R"({"kind":"Pod"})");
  for (const auto& [name, value] : response->headers) {
    EXPECT_EQ(name, absl::AsciiStrToLower(name));
  }
  EXPECT_EQ(response->Header("content-type"), "application/json");
  EXPECT_EQ(response->Header("content-length"), "14");
  EXPECT_EQ(response->Header("x-mixed-case"), "Value");  // values keep their case
  EXPECT_EQ(response->Header("audit-id"), "abc-123");
  EXPECT_EQ(response->Header("x-padded"), "padded value");
  EXPECT_EQ(response->Header("absent"), "");

  // A non-2xx status is a response, not an error.
  absl::StatusOr<HttpResponse> missing = transport->Send(Request("GET", "/missing"));
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(missing->status, 404);
  EXPECT_EQ(missing->body, R"({"reason":"NotFound"})");
  EXPECT_EQ(server.connections(), 1);
}

TEST(HttpSocketTest, ChunkedBodyWithExtensionsAndTrailersThenReuse) {
  ScriptedServer server(AnswerEveryRequest([](const ScriptedRequest& r) -> std::string {
    if (r.target == "/second") return Ok("second");
    return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n"
           "5;ext=1\r\nhello\r\n"
           "6;name=\"quoted value\";flag\r\n world\r\n"
           "A\r\n0123456789\r\n"
           "0;last=yes\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n";
  }));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);

  absl::StatusOr<HttpResponse> chunked = transport->Send(Request("GET", "/chunked"));
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  EXPECT_EQ(chunked->status, 200);
  EXPECT_EQ(chunked->body, "hello world0123456789");
  absl::StatusOr<HttpResponse> second = transport->Send(Request("GET", "/second"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->body, "second");

  // Both on one connection: the trailers were consumed, the connection went back to the pool.
  EXPECT_EQ(server.connections(), 1);
  std::vector<ScriptedRequest> requests = server.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].connection, 0);
  EXPECT_EQ(requests[1].connection, 0);
}

TEST(HttpSocketTest, ResponsesArrivingOneByteAtATime) {
  ScriptedServer server([](ScriptedConnection& conn) {
    while (std::optional<ScriptedRequest> request = conn.ReadRequest()) {
      const std::string answer =
          request->target == "/chunked"
              ? absl::StrCat(kChunkedHead, Chunk("{\"a\":"), Chunk("1}"), "0\r\n\r\n")
              : Ok("by the byte", "X-Header: slow\r\n");
      if (!conn.WriteByteByByte(answer)) return;
    }
  });
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);

  absl::StatusOr<HttpResponse> chunked = transport->Send(Request("GET", "/chunked"));
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  EXPECT_EQ(chunked->body, "{\"a\":1}");
  absl::StatusOr<HttpResponse> plain = transport->Send(Request("GET", "/plain"));
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->body, "by the byte");
  EXPECT_EQ(plain->Header("x-header"), "slow");
  EXPECT_EQ(server.connections(), 1);
}

TEST(HttpSocketTest, LargeBodies) {
  const std::string big(4 << 20, 'x');
  ScriptedServer server(AnswerEveryRequest([&big](const ScriptedRequest& r) {
    if (r.target == "/length") return Ok(big);
    std::string chunked(kChunkedHead);
    for (size_t at = 0; at < big.size(); at += 65536) {
      chunked += Chunk(absl::string_view(big).substr(at, 65536));
    }
    return chunked + "0\r\n\r\n";
  }));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);
  for (const char* path : {"/length", "/chunked"}) {
    SCOPED_TRACE(path);
    absl::StatusOr<HttpResponse> response = transport->Send(Request("GET", path));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->body.size(), big.size());
    EXPECT_TRUE(response->body == big);
  }
  EXPECT_EQ(server.connections(), 1);
}

TEST(HttpSocketTest, BodyDelimitedByCloseThenNewConnection) {
  const std::string body(100000, 'b');
  ScriptedServer server([&body](ScriptedConnection& conn) {
    if (conn.index() == 0) {
      // No Content-Length, not chunked: the body ends where the connection does.
      if (conn.ReadRequest() && conn.Write("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n") &&
          conn.Write(body)) {
        conn.Close();
      }
      return;
    }
    AnswerAll(conn, [](const ScriptedRequest&) { return Ok("second"); });
  });
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);

  absl::StatusOr<HttpResponse> first = transport->Send(Request("GET", "/first"));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->status, 200);
  EXPECT_EQ(first->body.size(), body.size());
  EXPECT_TRUE(first->body == body);
  absl::StatusOr<HttpResponse> second = transport->Send(Request("GET", "/second"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->body, "second");
  EXPECT_EQ(server.connections(), 2);
}

TEST(HttpSocketTest, ConnectionCloseHeaderOpensNewConnection) {
  absl::Notification first_closed_by_client;
  ScriptedServer server([&](ScriptedConnection& conn) {
    if (!conn.ReadRequest()) return;
    // The server keeps its end open: only the client can end the connection.
    if (!conn.Write(Ok(absl::StrCat("conn", conn.index()), "Connection: close\r\n"))) return;
    if (conn.WaitForPeerClose() && conn.index() == 0) first_closed_by_client.Notify();
  });
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);

  absl::StatusOr<HttpResponse> first = transport->Send(Request("GET", "/a"));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->body, "conn0");
  absl::StatusOr<HttpResponse> second = transport->Send(Request("GET", "/b"));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->body, "conn1");
  EXPECT_EQ(server.connections(), 2);
  EXPECT_TRUE(first_closed_by_client.WaitForNotificationWithTimeout(kTimeout))
      << "the client did not close the connection its server asked to close";
}

TEST(HttpSocketTest, HeadAnd204And304CarryNoBody) {
  ScriptedServer server(AnswerEveryRequest([](const ScriptedRequest& r) -> std::string {
    // The Content-Length of a HEAD answer is that of the GET's body, which is not sent.
    if (r.method == "HEAD") return "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n";
    if (r.target == "/no-content") return "HTTP/1.1 204 No Content\r\nX-A: 1\r\n\r\n";
    if (r.target == "/not-modified") {
      return "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\nETag: \"v1\"\r\n\r\n";
    }
    return Ok("after");
  }));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);

  absl::StatusOr<HttpResponse> head = transport->Send(Request("HEAD", "/thing"));
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->body, "");
  EXPECT_EQ(head->Header("content-length"), "10");
  absl::StatusOr<HttpResponse> no_content = transport->Send(Request("GET", "/no-content"));
  ASSERT_TRUE(no_content.ok()) << no_content.status();
  EXPECT_EQ(no_content->status, 204);
  EXPECT_EQ(no_content->body, "");
  EXPECT_EQ(no_content->Header("x-a"), "1");
  absl::StatusOr<HttpResponse> not_modified = transport->Send(Request("GET", "/not-modified"));
  ASSERT_TRUE(not_modified.ok()) << not_modified.status();
  EXPECT_EQ(not_modified->status, 304);
  EXPECT_EQ(not_modified->body, "");
  // Had any of them taken body bytes, this answer would not parse.
  absl::StatusOr<HttpResponse> after = transport->Send(Request("GET", "/after"));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->body, "after");
  EXPECT_EQ(server.connections(), 1);
}

TEST(HttpSocketTest, InterimResponsesAreSkipped) {
  ScriptedServer server(AnswerEveryRequest([](const ScriptedRequest& r) -> std::string {
    if (r.target == "/after") return Ok("after");
    return "HTTP/1.1 100 Continue\r\n\r\n"
           "HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
           "HTTP/1.1 201 Created\r\nContent-Length: 7\r\nX-Final: yes\r\n\r\ncreated";
  }));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);

  absl::StatusOr<HttpResponse> created = transport->Send(Request("POST", "/things", "{}"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->status, 201);
  EXPECT_EQ(created->body, "created");
  EXPECT_EQ(created->Header("x-final"), "yes");
  absl::StatusOr<HttpResponse> after = transport->Send(Request("GET", "/after"));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->body, "after");
  EXPECT_EQ(server.connections(), 1);
}

// ---------------------------------------------------------------------------------------
// Stale pooled connections and the retry rule
// ---------------------------------------------------------------------------------------

TEST(HttpSocketTest, IdleConnectionClosedByServerIsNotReused) {
  for (const bool reset : {false, true}) {
    SCOPED_TRACE(reset ? "closed with RST" : "closed with FIN");
    absl::Notification closed;
    ScriptedServer server([&](ScriptedConnection& conn) {
      if (conn.index() == 0) {
        if (conn.ReadRequest()) conn.Write(Ok("first"));
        reset ? conn.Reset() : conn.Close();  // while idle in the client's pool
        closed.Notify();
        return;
      }
      AnswerAll(conn, [](const ScriptedRequest& r) { return Ok("posted " + r.body); });
    });
    ASSERT_TRUE(server.ok());
    std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
    ASSERT_NE(transport, nullptr);

    absl::StatusOr<HttpResponse> first = transport->Send(Request("GET", "/first"));
    ASSERT_TRUE(first.ok()) << first.status();
    ASSERT_TRUE(closed.WaitForNotificationWithTimeout(kTimeout));
    // For the FIN or RST to reach the client's socket: the socket is inside the transport,
    // so nothing outside shows it arriving. Left as a sleep: it guards against a false
    // failure (a stale connection reused), never makes the test pass without testing.
    absl::SleepFor(absl::Milliseconds(20));
    // A POST written whole is never sent twice, so after a FIN only seeing the close before
    // reuse makes this work. (After an RST the write itself would fail, which also allows
    // one retry; that case is here for the detection path, not as its proof.)
    absl::StatusOr<HttpResponse> post = transport->Send(Request("POST", "/post", "x"));
    ASSERT_TRUE(post.ok()) << post.status();
    EXPECT_EQ(post->body, "posted x");
    EXPECT_EQ(server.connections(), 2);
    EXPECT_EQ(server.CountRequests("/post"), 1);
  }
}

// Connection 0 answers its first request, then reads the whole second one and ends the
// connection without a word; later connections answer "retried".
ScriptedServer::Script DropsTheSecondRequest(bool reset) {
  return [reset](ScriptedConnection& conn) {
    if (conn.index() == 0) {
      if (!conn.ReadRequest() || !conn.Write(Ok("first")) || !conn.ReadRequest()) return;
      reset ? conn.Reset() : conn.Close();
      return;
    }
    AnswerAll(conn, [](const ScriptedRequest&) { return Ok("retried"); });
  };
}

TEST(HttpSocketTest, NonIdempotentRequestOnReusedConnectionIsNotRetried) {
  for (const bool reset : {false, true}) {
    for (const char* method : {"POST", "PATCH"}) {
      SCOPED_TRACE(absl::StrCat(method, reset ? ", reset" : ", closed"));
      ScriptedServer server(DropsTheSecondRequest(reset));
      ASSERT_TRUE(server.ok());
      std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
      ASSERT_NE(transport, nullptr);

      ASSERT_TRUE(transport->Send(Request("GET", "/first")).ok());
      absl::Status status = transport->Send(Request(method, "/second", "{\"once\":1}")).status();
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
      // The server got the request once: it must not be sent again.
      EXPECT_EQ(server.CountRequests("/second"), 1);
      EXPECT_EQ(server.connections(), 1);
    }
  }
}

TEST(HttpSocketTest, IdempotentRequestOnReusedConnectionIsRetriedOnce) {
  for (const bool reset : {false, true}) {
    for (const char* method : {"GET", "PUT", "DELETE"}) {
      SCOPED_TRACE(absl::StrCat(method, reset ? ", reset" : ", closed"));
      ScriptedServer server(DropsTheSecondRequest(reset));
      ASSERT_TRUE(server.ok());
      std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
      ASSERT_NE(transport, nullptr);

      ASSERT_TRUE(transport->Send(Request("GET", "/first")).ok());
      const std::string body = absl::string_view(method) == "PUT" ? "{\"put\":1}" : "";
      absl::StatusOr<HttpResponse> second = transport->Send(Request(method, "/second", body));
      ASSERT_TRUE(second.ok()) << second.status();
      EXPECT_EQ(second->body, "retried");
      EXPECT_EQ(server.CountRequests("/second"), 2);
      EXPECT_EQ(server.connections(), 2);
    }
  }
}

TEST(HttpSocketTest, RequestFailingOnNewConnectionIsNotRetried) {
  // A connection that was never reused: nothing to blame on a stale pool, no second try.
  ScriptedServer server([](ScriptedConnection& conn) {
    if (conn.ReadRequest()) conn.Close();
  });
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);
  absl::Status status = transport->Send(Request("GET", "/x")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ(server.CountRequests("/x"), 1);
}

TEST(HttpSocketTest, RetryGoesToANewConnectionNotAnotherPooledOne) {
  // Connections 0 and 1 each answer one request (together, so that the client needs two
  // connections and pools both), then read the next request and close without answering.
  // Connections from 2 on answer "fresh". The request on the first pooled connection fails
  // after it was written; its one retry belongs on a new connection, not on the other stale
  // pooled one.
  absl::Mutex mu;
  int warm = 0;
  ScriptedServer server([&](ScriptedConnection& conn) {
    if (conn.index() >= 2) {
      AnswerAll(conn, [](const ScriptedRequest&) { return Ok("fresh"); });
      return;
    }
    if (!conn.ReadRequest()) return;
    {
      absl::MutexLock lock(&mu);
      ++warm;
      auto both = [&warm]() { return warm == 2; };
      mu.AwaitWithTimeout(absl::Condition(&both), kServerWait);
    }
    if (!conn.Write(Ok("warm")) || !conn.ReadRequest()) return;
    conn.Close();
  });
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);

  std::vector<std::thread> threads;
  std::atomic<int> warmed{0};
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&] {
      if (transport->Send(Request("GET", "/warm")).ok()) ++warmed;
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_EQ(warmed.load(), 2);
  ASSERT_EQ(server.connections(), 2);

  absl::StatusOr<HttpResponse> response = transport->Send(Request("GET", "/stale"));
  ASSERT_TRUE(response.ok()) << response.status() << " (requests for /stale the server read: "
                             << server.CountRequests("/stale")
                             << ", connections: " << server.connections() << ")";
  EXPECT_EQ(response->body, "fresh");
  EXPECT_EQ(server.CountRequests("/stale"), 2);
}

TEST(HttpSocketTest, PostRetriedWhenItsBytesWereNotAllWritten) {
  // The server reads only the head of the second request and resets the connection, so the
  // client cannot write the whole body (far more than the socket buffers take): it was not
  // all sent, the server cannot have acted on it, and it goes again on a new connection.
  const std::string body(48 << 20, 'p');
  ScriptedServer server([](ScriptedConnection& conn) {
    if (conn.index() == 0) {
      if (!conn.ReadRequest() || !conn.Write(Ok("first"))) return;
      if (conn.ReadRequest(/*with_body=*/false)) conn.Reset();
      return;
    }
    AnswerAll(conn, [](const ScriptedRequest& r) { return Ok(absl::StrCat(r.body.size())); });
  });
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);

  ASSERT_TRUE(transport->Send(Request("GET", "/first")).ok());
  HttpRequest post = Request("POST", "/big", body);
  post.timeout = absl::Seconds(30);
  absl::StatusOr<HttpResponse> response = transport->Send(post);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body, absl::StrCat(body.size()));
  EXPECT_EQ(server.CountRequests("/big"), 2);  // the head on connection 0, all on 1
  EXPECT_EQ(server.connections(), 2);
}

// ---------------------------------------------------------------------------------------
// Broken answers
// ---------------------------------------------------------------------------------------

TEST(HttpSocketTest, MalformedStatusLineIsUnavailable) {
  struct Case {
    std::string bytes;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"HTTP/1.1 abc\r\n\r\n", "status line"},
      {"garbage\r\n\r\n", "status line"},
      {"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n", "status line"},
      {"SSH-2.0-OpenSSH_9.2\r\n\r\n", "status line"},
      {"HTTP/1.1 200 OK\r\nContent-Length: nope\r\n\r\n", "Content-Length"},
      {"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "header line"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.bytes);
    absl::Status status = SendOnce(AnswerOnceAndHold(c.bytes), Request("GET", "/"));
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

TEST(HttpSocketTest, ConnectionClosedWithoutAnswerIsUnavailable) {
  absl::Status status = SendOnce(
      [](ScriptedConnection& conn) {
        if (conn.ReadRequest()) conn.Close();
      },
      Request("GET", "/"));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(), HasSubstr("closed"));
}

TEST(HttpSocketTest, HeaderSectionOver1MiBIsUnavailable) {
  // Header lines (or one endless line) that never end the head: the client must give up
  // at its limit rather than buffer without bound or wait for the deadline.
  for (const bool one_line : {false, true}) {
    SCOPED_TRACE(one_line ? "one endless header line" : "many header lines");
    ScriptedServer::Script script = [one_line](ScriptedConnection& conn) {
      if (!conn.ReadRequest() || !conn.Write("HTTP/1.1 200 OK\r\n")) return;
      const std::string filler(1000, 'a');
      for (int i = 0; i < 4096; ++i) {  // up to 4 MiB, until the client hangs up
        const std::string line =
            one_line ? filler : absl::StrCat("X-Filler-", i, ": ", filler, "\r\n");
        if (!conn.Write(line)) return;
      }
      conn.WaitForPeerClose();
    };
    HttpRequest request = Request("GET", "/");
    request.timeout = absl::Seconds(20);  // the limit, not the deadline, must end it
    absl::Status status = SendOnce(script, request);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr("header"));
  }
}

TEST(HttpSocketTest, InvalidChunkFramingIsUnavailable) {
  const std::vector<std::string> bodies = {
      "zz\r\nhello\r\n0\r\n\r\n",                    // not hex
      "ffffffffffffffffffff\r\nx\r\n0\r\n\r\n",      // overflows 64 bits
      "-1\r\nx\r\n0\r\n\r\n",                        // negative
      "\r\nhello\r\n0\r\n\r\n",                      // empty size
      "5\r\nhelloXX0\r\n\r\n",                       // no CRLF after the chunk data
      std::string(5000, '1') + "\r\nx\r\n0\r\n\r\n"  // an endless size line
  };
  for (const std::string& body : bodies) {
    SCOPED_TRACE(body.substr(0, 40));
    absl::Status status =
        SendOnce(AnswerOnceAndHold(absl::StrCat(kChunkedHead, body)), Request("GET", "/"));
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr("chunk"));
  }
}

TEST(HttpSocketTest, TruncatedBodyIsUnavailable) {
  const std::vector<std::string> answers = {
      "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf.",
      absl::StrCat(kChunkedHead, Chunk("complete"), "8\r\nhalf"),
      absl::StrCat(kChunkedHead, Chunk("no last chunk")),
      "HTTP/1.1 200 OK\r\nContent-Len",
  };
  for (const std::string& answer : answers) {
    SCOPED_TRACE(answer);
    absl::Status status = SendOnce(
        [&answer](ScriptedConnection& conn) {
          if (conn.ReadRequest() && conn.Write(answer)) conn.Close();
        },
        Request("GET", "/"));
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  }
}

// ---------------------------------------------------------------------------------------
// Deadlines and connection failures
// ---------------------------------------------------------------------------------------

TEST(HttpSocketTest, DeadlineCoversTheWholeResponse) {
  // Headers at once, then one body byte every 50 ms, for ever: no single read ever waits
  // long, so only a whole-request deadline can end this.
  ScriptedServer server([](ScriptedConnection& conn) {
    if (!conn.ReadRequest() || !conn.Write("HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")) {
      return;
    }
    while (conn.Sleep(absl::Milliseconds(50)) && conn.Write("x")) {
    }
  });
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);
  HttpRequest request = Request("GET", "/trickle");
  request.timeout = absl::Milliseconds(300);
  absl::Status status = transport->Send(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
}

TEST(HttpSocketTest, DeadlineWhileWaitingForHeaders) {
  for (const bool trickle : {false, true}) {
    SCOPED_TRACE(trickle ? "head trickles in" : "no answer at all");
    ScriptedServer server([trickle](ScriptedConnection& conn) {
      if (!conn.ReadRequest()) return;
      if (!trickle) {
        conn.WaitForPeerClose();
        return;
      }
      conn.Write("HTTP/1.1 200 OK\r\n");
      for (int i = 0; conn.Sleep(absl::Milliseconds(50)); ++i) {
        if (!conn.Write(absl::StrCat("X-", i, ": y\r\n"))) return;
      }
    });
    ASSERT_TRUE(server.ok());
    std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
    ASSERT_NE(transport, nullptr);
    HttpRequest request = Request("GET", "/silent");
    request.timeout = absl::Milliseconds(300);
    absl::Status status = transport->Send(request).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  }
}

TEST(HttpSocketTest, ConnectionRefusedIsUnavailable) {
  // A bound socket that does not listen: connecting to its port is refused, and holding
  // it keeps anyone else from taking the port meanwhile.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  std::unique_ptr<HttpTransport> transport =
      NewTransport(absl::StrCat("http://127.0.0.1:", ntohs(address.sin_port)));
  ASSERT_NE(transport, nullptr);
  absl::Status status = transport->Send(Request("GET", "/")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  absl::Status stream = transport->OpenStream(Request("GET", "/watch")).status();
  EXPECT_EQ(stream.code(), absl::StatusCode::kUnavailable) << stream;
  ::close(fd);
}

// ---------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------

TEST(HttpSocketStreamTest, LinesSpanChunksAndChunksHoldLines) {
  absl::Notification first_line_read;
  std::atomic<bool> waited_in_vain{false};
  ScriptedServer server([&](ScriptedConnection& conn) {
    if (!conn.ReadRequest() || !conn.Write(absl::StrCat(kChunkedHead, Chunk("{\"a\":1}\n")))) {
      return;
    }
    // The rest only once the client read the first line: OpenStream must not wait for it.
    if (!first_line_read.WaitForNotificationWithTimeout(kServerWait)) waited_in_vain = true;
    conn.Write(absl::StrCat(Chunk("{\"b\""), Chunk(":2}\r\n{\"c\":3}\n{\"d\""), Chunk(":4}\n"),
                            Chunk("{\"e\":5}\r\n{\"f\":6}\n{\"g\":7}\r"), Chunk("\n"),
                            "0\r\n\r\n"));
    conn.WaitForPeerClose();
  });
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);

  absl::StatusOr<std::unique_ptr<HttpStream>> stream =
      transport->OpenStream(Request("GET", "/api/v1/pods?watch=1"));
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ((*stream)->status(), 200);
  std::string line;
  absl::StatusOr<bool> more = (*stream)->ReadLine(&line);
  first_line_read.Notify();
  ASSERT_TRUE(more.ok()) << more.status();
  ASSERT_TRUE(*more);
  EXPECT_EQ(line, "{\"a\":1}");

  std::vector<std::string> lines;
  while (true) {
    more = (*stream)->ReadLine(&line);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    lines.push_back(line);
  }
  EXPECT_THAT(lines, ::testing::ElementsAre("{\"b\":2}", "{\"c\":3}", "{\"d\":4}", "{\"e\":5}",
                                            "{\"f\":6}", "{\"g\":7}"));
  EXPECT_FALSE(waited_in_vain) << "OpenStream waited for more than the headers";
  // The end stays the end.
  more = (*stream)->ReadLine(&line);
  ASSERT_TRUE(more.ok()) << more.status();
  EXPECT_FALSE(*more);
}

TEST(HttpSocketStreamTest, ContentLengthBodyReadsAsLines) {
  ScriptedServer server(AnswerOnceAndHold(Ok("one\r\ntwo\nthree\n")));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);
  absl::StatusOr<std::unique_ptr<HttpStream>> stream =
      transport->OpenStream(Request("GET", "/lines"));
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::vector<std::string> lines;
  std::string line;
  while (true) {
    absl::StatusOr<bool> more = (*stream)->ReadLine(&line);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    lines.push_back(line);
  }
  EXPECT_THAT(lines, ::testing::ElementsAre("one", "two", "three"));
}

// Headers and one line, then nothing until the client goes.
ScriptedServer::Script OneLineThenSilence() {
  return AnswerOnceAndHold(absl::StrCat(kChunkedHead, Chunk("first\n")));
}

TEST(HttpSocketStreamTest, IdleStreamIsDeadlineExceeded) {
  ScriptedServer server(OneLineThenSilence());
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);
  HttpRequest request = Request("GET", "/watch");
  request.idle_timeout = absl::Milliseconds(200);
  absl::StatusOr<std::unique_ptr<HttpStream>> stream = transport->OpenStream(request);
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::string line;
  absl::StatusOr<bool> first = (*stream)->ReadLine(&line);
  ASSERT_TRUE(first.ok() && *first) << first.status();
  EXPECT_EQ(line, "first");
  absl::StatusOr<bool> idle = (*stream)->ReadLine(&line);
  EXPECT_EQ(idle.status().code(), absl::StatusCode::kDeadlineExceeded) << idle.status();
}

TEST(HttpSocketStreamTest, CancelFromAnotherThreadEndsABlockedRead) {
  ScriptedServer server(OneLineThenSilence());
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);
  HttpRequest request = Request("GET", "/watch");
  request.idle_timeout = absl::Seconds(10);  // only Cancel can end the read below in time
  absl::StatusOr<std::unique_ptr<HttpStream>> stream = transport->OpenStream(request);
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::string line;
  absl::StatusOr<bool> first = (*stream)->ReadLine(&line);
  ASSERT_TRUE(first.ok() && *first) << first.status();

  // Cancelled once ReadLine is blocked in poll(), so that this is the case tested.
  const pid_t reader = testing::ThreadId();
  std::thread canceller([&stream, reader] {
    EXPECT_TRUE(testing::AwaitBlocked(reader, testing::kPollCalls)) << "ReadLine did not block";
    (*stream)->Cancel();
  });
  absl::StatusOr<bool> cancelled = (*stream)->ReadLine(&line);
  canceller.join();
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
  absl::StatusOr<bool> again = (*stream)->ReadLine(&line);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kCancelled) << again.status();
  (*stream)->Cancel();  // twice is harmless
}

TEST(HttpSocketStreamTest, ErrorStatusGivesItsBodyAsSent) {
  const std::string status_body =
      R"({"kind":"Status","status":"Failure","reason":"Forbidden","code":403})";
  // An API server's error body ends in a newline (Go's json.Encoder); ReadAll "reads what
  // is left of the body", so it comes back byte for byte, also across chunks.
  const std::string chunked_body = "{\"code\":410}\n";
  struct Case {
    std::string answer;
    int status;
    std::string body;
  };
  for (const Case& c : {Case{Response(403, "Forbidden", status_body), 403, status_body},
                        Case{absl::StrCat("HTTP/1.1 410 Gone\r\nTransfer-Encoding: chunked\r\n\r\n",
                                          Chunk("{\"code\""), Chunk(":410}\n"), "0\r\n\r\n"),
                             410, chunked_body}}) {
    SCOPED_TRACE(c.status);
    ScriptedServer server(AnswerOnceAndHold(c.answer));
    ASSERT_TRUE(server.ok());
    std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
    ASSERT_NE(transport, nullptr);
    absl::StatusOr<std::unique_ptr<HttpStream>> stream =
        transport->OpenStream(Request("GET", "/watch"));
    ASSERT_TRUE(stream.ok()) << stream.status();
    EXPECT_EQ((*stream)->status(), c.status);
    absl::StatusOr<std::string> body = (*stream)->ReadAll();
    ASSERT_TRUE(body.ok()) << body.status();
    EXPECT_EQ(*body, c.body);
  }
}

TEST(HttpSocketStreamTest, BrokenMidBodyIsUnavailable) {
  ScriptedServer server([](ScriptedConnection& conn) {
    if (conn.ReadRequest() &&
        conn.Write(absl::StrCat(kChunkedHead, Chunk("first\n"), "10\r\nhalf a chu"))) {
      conn.Close();
    }
  });
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);
  absl::StatusOr<std::unique_ptr<HttpStream>> stream =
      transport->OpenStream(Request("GET", "/watch"));
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::string line;
  absl::StatusOr<bool> first = (*stream)->ReadLine(&line);
  ASSERT_TRUE(first.ok() && *first) << first.status();
  absl::StatusOr<bool> broken = (*stream)->ReadLine(&line);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kUnavailable) << broken.status();
}

TEST(HttpSocketStreamTest, OpenStreamDeadlineCoversTheHeaders) {
  ScriptedServer server([](ScriptedConnection& conn) {
    if (conn.ReadRequest()) conn.WaitForPeerClose();
  });
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);
  HttpRequest request = Request("GET", "/watch");
  request.timeout = absl::Milliseconds(300);
  absl::Status status = transport->OpenStream(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
}

TEST(HttpSocketStreamTest, OpenStreamDoesNotHoldUpSends) {
  ScriptedServer server(AnswerEveryRequest([](const ScriptedRequest& r) {
    return r.target == "/watch" ? absl::StrCat(kChunkedHead, Chunk("event\n")) : Ok("sent");
  }));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);
  absl::StatusOr<std::unique_ptr<HttpStream>> stream =
      transport->OpenStream(Request("GET", "/watch"));
  ASSERT_TRUE(stream.ok()) << stream.status();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<HttpResponse> response = transport->Send(Request("POST", "/write", "{}"));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->body, "sent");
  }
  std::string line;
  absl::StatusOr<bool> event = (*stream)->ReadLine(&line);
  ASSERT_TRUE(event.ok() && *event) << event.status();
  EXPECT_EQ(line, "event");
  EXPECT_EQ(server.connections(), 2);  // the stream's own, and one for the sends
}

// ---------------------------------------------------------------------------------------
// Requests as the server sees them
// ---------------------------------------------------------------------------------------

TEST(HttpSocketTest, RequestAsTheServerSeesIt) {
  ScriptedServer server(AnswerEveryRequest([](const ScriptedRequest&) { return Ok("{}"); }));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);

  HttpRequest post =
      Request("POST", "/api/v1/namespaces/a/pods?limit=5&labelSelector=app%3Dweb", R"({"a":1})");
  post.headers = {
      {"Authorization", "Bearer secret"}, {"Accept", "application/json"}, {"X-Custom", "v1"}};
  ASSERT_TRUE(transport->Send(post).ok());
  HttpRequest patch = Request("PATCH", "/apis/x/v1/things/t", "{}");
  patch.headers = {{"Content-Type", "application/merge-patch+json"}};
  ASSERT_TRUE(transport->Send(patch).ok());
  ASSERT_TRUE(transport->Send(Request("GET", "/version")).ok());

  std::vector<ScriptedRequest> requests = server.requests();
  ASSERT_EQ(requests.size(), 3u);
  const ScriptedRequest& p = requests[0];
  EXPECT_EQ(p.method, "POST");
  EXPECT_EQ(p.target, "/api/v1/namespaces/a/pods?limit=5&labelSelector=app%3Dweb");
  EXPECT_EQ(p.version, "HTTP/1.1");
  EXPECT_EQ(p.Header("host"), absl::StrCat("127.0.0.1:", server.port()));
  EXPECT_EQ(p.HeaderCount("host"), 1);
  EXPECT_EQ(p.Header("authorization"), "Bearer secret");
  EXPECT_EQ(p.Header("accept"), "application/json");
  EXPECT_EQ(p.Header("x-custom"), "v1");
  EXPECT_EQ(p.Header("content-length"), "7");
  EXPECT_EQ(p.Header("content-type"), "application/json");
  EXPECT_EQ(p.body, R"({"a":1})");

  const ScriptedRequest& m = requests[1];
  EXPECT_EQ(m.method, "PATCH");
  EXPECT_EQ(m.Header("content-type"), "application/merge-patch+json");
  EXPECT_EQ(m.HeaderCount("content-type"), 1);
  EXPECT_EQ(m.Header("content-length"), "2");
  EXPECT_EQ(m.body, "{}");

  const ScriptedRequest& g = requests[2];
  EXPECT_EQ(g.method, "GET");
  EXPECT_EQ(g.target, "/version");
  EXPECT_THAT(g.Header("content-length"), ::testing::AnyOf("", "0"));
  EXPECT_EQ(g.HeaderCount("content-type"), 0);
  EXPECT_EQ(g.body, "");
}

TEST(HttpSocketTest, ServerUrlPathIsAPrefixOfEveryRequest) {
  // A kubeconfig server behind a proxy, e.g. https://rancher/k8s/clusters/c-1/.
  ScriptedServer server(AnswerEveryRequest([](const ScriptedRequest&) { return Ok("{}"); }));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url() + "/k8s/clusters/c-1/");
  ASSERT_NE(transport, nullptr);
  ASSERT_TRUE(transport->Send(Request("GET", "/api/v1/pods?limit=1")).ok());
  std::vector<ScriptedRequest> requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].target, "/k8s/clusters/c-1/api/v1/pods?limit=1");
}

TEST(HttpSocketTest, LineBreakInARequestHeaderIsRefused) {
  ScriptedServer server(AnswerEveryRequest([](const ScriptedRequest&) { return Ok("{}"); }));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);
  HttpRequest request = Request("GET", "/");
  request.headers = {{"X-Evil", "a\r\nX-Injected: 1"}};
  absl::Status status = transport->Send(request).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(server.requests().empty());
}

// ---------------------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------------------

TEST(HttpSocketTest, ConcurrentSendsShareThePool) {
  constexpr int kThreads = 16;
  constexpr int kSendsPerThread = 50;
  ScriptedServer server(AnswerEveryRequest([](const ScriptedRequest& r) { return Ok(r.body); }));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);

  absl::Mutex mu;
  int failures = 0;
  int mismatches = 0;
  std::string first_problem;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kSendsPerThread; ++i) {
        const std::string body = absl::StrCat("{\"thread\":", t, ",\"send\":", i, "}");
        absl::StatusOr<HttpResponse> response = transport->Send(Request("POST", "/echo", body));
        if (response.ok() && response->status == 200 && response->body == body) continue;
        absl::MutexLock lock(&mu);
        ++(response.ok() ? mismatches : failures);
        if (first_problem.empty()) {
          first_problem = response.ok() ? absl::StrCat("sent ", body, ", got ", response->body)
                                        : response.status().ToString();
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(failures, 0) << first_problem;
  EXPECT_EQ(mismatches, 0) << first_problem;
  EXPECT_EQ(server.requests().size(), static_cast<size_t>(kThreads * kSendsPerThread));
  EXPECT_GT(server.connections(), 0);
  EXPECT_LE(server.connections(), 2 * kThreads);
}

// ---------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------

struct SslCtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
using SslCtx = std::unique_ptr<SSL_CTX, SslCtxFree>;

// A server context presenting `cert`/`key`; when `client_ca` is given it demands a client
// certificate signed by it.
SslCtx ServerContext(const std::string& cert, const std::string& key,
                     const std::string& client_ca = "") {
  SslCtx ctx(SSL_CTX_new(TLS_server_method()));
  if (ctx == nullptr || SSL_CTX_use_certificate_chain_file(ctx.get(), cert.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx.get(), key.c_str(), SSL_FILETYPE_PEM) != 1) {
    return nullptr;
  }
  if (!client_ca.empty()) {
    if (SSL_CTX_load_verify_locations(ctx.get(), client_ca.c_str(), nullptr) != 1) return nullptr;
    SSL_CTX_set_client_CA_list(ctx.get(), SSL_load_client_CA_file(client_ca.c_str()));
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return ctx;
}

// Certificates made once for the suite with the openssl CLI (as ClientTlsTest does): a CA;
// a server certificate for 127.0.0.1 and localhost; one for example.com only; a client
// certificate; and another CA that signed none of them.
class HttpSocketTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string key = "-newkey rsa:2048 -nodes";
    const std::string sign = "-CA ca.pem -CAkey ca.key -CAcreateserial -days 2";
    const std::string script = absl::StrCat(
        "cd ", dir_->path(), " && (", "openssl req -x509 ", key,
        " -keyout ca.key -out ca.pem -days 2 -subj /CN=test-ca", " && openssl req -x509 ", key,
        " -keyout other-ca.key -out other-ca.pem -days 2 -subj /CN=other-ca", " && openssl req ",
        key, " -keyout server.key -out server.csr -subj /CN=127.0.0.1",
        " && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost' > server.ext",
        " && openssl x509 -req -in server.csr ", sign, " -out server.pem -extfile server.ext",
        " && openssl req ", key, " -keyout wrong.key -out wrong.csr -subj /CN=example.com",
        " && printf 'subjectAltName=DNS:example.com' > wrong.ext",
        " && openssl x509 -req -in wrong.csr ", sign, " -out wrong.pem -extfile wrong.ext",
        " && openssl req ", key, " -keyout client.key -out client.csr -subj /CN=sbx-client",
        " && printf 'extendedKeyUsage=clientAuth' > client.ext",
        " && openssl x509 -req -in client.csr ", sign, " -out client.pem -extfile client.ext",
        ") >/dev/null 2>&1");
    certs_made_ = std::system(script.c_str()) == 0;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(certs_made_) << "openssl could not make certificates"; }

  static std::string File(const std::string& name) { return dir_->path() + "/" + name; }
  static std::string Pem(const std::string& name) { return dir_->Read(name); }
  static TransportOptions Trusting(const std::string& ca_file) {
    TransportOptions options;
    options.ca_pem = Pem(ca_file);
    return options;
  }

  static TempDir* dir_;
  static bool certs_made_;
};

TempDir* HttpSocketTlsTest::dir_ = nullptr;
bool HttpSocketTlsTest::certs_made_ = false;

Answerer EchoTarget() {
  return [](const ScriptedRequest& r) { return Ok(r.target); };
}

TEST_F(HttpSocketTlsTest, TrustedCaWorksAndReusesTheConnection) {
  SslCtx tls = ServerContext(File("server.pem"), File("server.key"));
  ASSERT_NE(tls, nullptr);
  ScriptedServer server(AnswerEveryRequest(EchoTarget()), tls.get());
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url(), Trusting("ca.pem"));
  ASSERT_NE(transport, nullptr);
  for (const char* path : {"/one", "/two"}) {
    absl::StatusOr<HttpResponse> response = transport->Send(Request("GET", path));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->body, path);
  }
  EXPECT_EQ(server.connections(), 1);
}

TEST_F(HttpSocketTlsTest, UnknownCaIsUnavailable) {
  SslCtx tls = ServerContext(File("server.pem"), File("server.key"));
  ASSERT_NE(tls, nullptr);
  ScriptedServer server(AnswerEveryRequest(EchoTarget()), tls.get());
  ASSERT_TRUE(server.ok());
  for (const bool system_roots : {true, false}) {
    SCOPED_TRACE(system_roots ? "system CA bundle" : "another CA");
    std::unique_ptr<HttpTransport> transport =
        NewTransport(server.url(), system_roots ? TransportOptions{} : Trusting("other-ca.pem"));
    ASSERT_NE(transport, nullptr);
    absl::Status status = transport->Send(Request("GET", "/")).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr("certificate"));
  }
  EXPECT_TRUE(server.requests().empty());
}

TEST_F(HttpSocketTlsTest, InsecureSkipVerifyTrustsAnyCertificate) {
  for (const char* cert : {"server", "wrong"}) {
    SCOPED_TRACE(cert);
    SslCtx tls = ServerContext(File(absl::StrCat(cert, ".pem")), File(absl::StrCat(cert, ".key")));
    ASSERT_NE(tls, nullptr);
    ScriptedServer server(AnswerEveryRequest(EchoTarget()), tls.get());
    ASSERT_TRUE(server.ok());
    TransportOptions options;
    options.insecure_skip_tls_verify = true;
    std::unique_ptr<HttpTransport> transport = NewTransport(server.url(), options);
    ASSERT_NE(transport, nullptr);
    absl::StatusOr<HttpResponse> response = transport->Send(Request("GET", "/insecure"));
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->body, "/insecure");
  }
}

TEST_F(HttpSocketTlsTest, CertificateForAnotherNameIsUnavailable) {
  SslCtx tls = ServerContext(File("wrong.pem"), File("wrong.key"));  // example.com only
  ASSERT_NE(tls, nullptr);
  ScriptedServer server(AnswerEveryRequest(EchoTarget()), tls.get());
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url(), Trusting("ca.pem"));
  ASSERT_NE(transport, nullptr);
  absl::Status status = transport->Send(Request("GET", "/")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_TRUE(server.requests().empty());
}

TEST_F(HttpSocketTlsTest, HostNameIsVerifiedToo) {
  // https://localhost: the name is checked against the DNS names of the certificate.
  SslCtx good = ServerContext(File("server.pem"), File("server.key"));
  SslCtx wrong = ServerContext(File("wrong.pem"), File("wrong.key"));
  ASSERT_NE(good, nullptr);
  ASSERT_NE(wrong, nullptr);
  ScriptedServer good_server(AnswerEveryRequest(EchoTarget()), good.get());
  ScriptedServer wrong_server(AnswerEveryRequest(EchoTarget()), wrong.get());
  ASSERT_TRUE(good_server.ok());
  ASSERT_TRUE(wrong_server.ok());
  std::unique_ptr<HttpTransport> transport =
      NewTransport(absl::StrCat("https://localhost:", good_server.port()), Trusting("ca.pem"));
  ASSERT_NE(transport, nullptr);
  absl::StatusOr<HttpResponse> response = transport->Send(Request("GET", "/named"));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body, "/named");
  std::unique_ptr<HttpTransport> mismatched =
      NewTransport(absl::StrCat("https://localhost:", wrong_server.port()), Trusting("ca.pem"));
  ASSERT_NE(mismatched, nullptr);
  absl::Status status = mismatched->Send(Request("GET", "/named")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

TEST_F(HttpSocketTlsTest, MalformedPemIsInvalidArgument) {
  const std::vector<std::pair<std::string, TransportOptions>> cases = [] {
    std::vector<std::pair<std::string, TransportOptions>> all;
    TransportOptions o;
    o.ca_pem = "not a pem";
    all.emplace_back("ca not a pem", o);
    o.ca_pem = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n";
    all.emplace_back("ca with a bad certificate", o);
    o = {};
    o.client_cert_pem = Pem("client.pem");
    all.emplace_back("client certificate without key", o);
    o.client_key_pem = "not a key";
    all.emplace_back("client key not a pem", o);
    o.client_cert_pem = "not a certificate";
    o.client_key_pem = Pem("client.key");
    all.emplace_back("client certificate not a pem", o);
    return all;
  }();
  for (const auto& [name, options] : cases) {
    SCOPED_TRACE(name);
    TransportOptions with_server = options;
    with_server.server = "https://127.0.0.1:6443";
    absl::Status status = NewSocketTransport(with_server).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  }
}

TEST_F(HttpSocketTlsTest, ClientCertificate) {
  SslCtx tls = ServerContext(File("server.pem"), File("server.key"), File("ca.pem"));
  ASSERT_NE(tls, nullptr);
  ScriptedServer server(AnswerEveryRequest(EchoTarget()), tls.get());
  ASSERT_TRUE(server.ok());

  TransportOptions with_cert = Trusting("ca.pem");
  with_cert.client_cert_pem = Pem("client.pem");
  with_cert.client_key_pem = Pem("client.key");
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url(), with_cert);
  ASSERT_NE(transport, nullptr);
  absl::StatusOr<HttpResponse> response = transport->Send(Request("GET", "/mtls"));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body, "/mtls");

  std::unique_ptr<HttpTransport> anonymous = NewTransport(server.url(), Trusting("ca.pem"));
  ASSERT_NE(anonymous, nullptr);
  absl::Status status = anonymous->Send(Request("GET", "/anonymous")).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_EQ(server.CountRequests("/anonymous"), 0);
}

TEST_F(HttpSocketTlsTest, IdleConnectionClosedByServerIsNotReused) {
  SslCtx tls = ServerContext(File("server.pem"), File("server.key"));
  ASSERT_NE(tls, nullptr);
  absl::Notification closed;
  ScriptedServer server(
      [&](ScriptedConnection& conn) {
        if (conn.index() == 0) {
          if (conn.ReadRequest()) conn.Write(Ok("first"));
          conn.Close();  // close_notify, then FIN
          closed.Notify();
          return;
        }
        AnswerAll(conn, [](const ScriptedRequest& r) { return Ok("posted " + r.body); });
      },
      tls.get());
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url(), Trusting("ca.pem"));
  ASSERT_NE(transport, nullptr);
  ASSERT_TRUE(transport->Send(Request("GET", "/first")).ok());
  ASSERT_TRUE(closed.WaitForNotificationWithTimeout(kTimeout));
  // For the close to reach the client's socket (inside the transport, so no marker shows
  // it): a sleep that guards against a false failure, never a vacuous pass.
  absl::SleepFor(absl::Milliseconds(20));
  absl::StatusOr<HttpResponse> post = transport->Send(Request("POST", "/post", "x"));
  ASSERT_TRUE(post.ok()) << post.status();
  EXPECT_EQ(post->body, "posted x");
  EXPECT_EQ(server.CountRequests("/post"), 1);
}

TEST_F(HttpSocketTlsTest, StreamLinesAndCancel) {
  SslCtx tls = ServerContext(File("server.pem"), File("server.key"));
  ASSERT_NE(tls, nullptr);
  ScriptedServer server(
      AnswerOnceAndHold(absl::StrCat(kChunkedHead, Chunk("{\"a\":1}\n{\"b\""), Chunk(":2}\r\n"))),
      tls.get());
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url(), Trusting("ca.pem"));
  ASSERT_NE(transport, nullptr);
  HttpRequest request = Request("GET", "/watch");
  request.idle_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<HttpStream>> stream = transport->OpenStream(request);
  ASSERT_TRUE(stream.ok()) << stream.status();
  std::string line;
  for (const char* expected : {"{\"a\":1}", "{\"b\":2}"}) {
    absl::StatusOr<bool> more = (*stream)->ReadLine(&line);
    ASSERT_TRUE(more.ok() && *more) << more.status();
    EXPECT_EQ(line, expected);
  }
  const pid_t reader = testing::ThreadId();
  std::thread canceller([&stream, reader] {
    EXPECT_TRUE(testing::AwaitBlocked(reader, testing::kPollCalls)) << "ReadLine did not block";
    (*stream)->Cancel();
  });
  absl::StatusOr<bool> cancelled = (*stream)->ReadLine(&line);
  canceller.join();
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kCancelled) << cancelled.status();
}

// ---------------------------------------------------------------------------------------
// Server URLs
// ---------------------------------------------------------------------------------------

TEST(HttpSocketUrlTest, BadServerUrlsAreInvalidArgument) {
  for (const char* url : {"ftp://x", "http://", "https://host:notaport", "http://host:99999", "",
                          "127.0.0.1:6443", "http://host:", "http://[::1", "http://::1:6443"}) {
    SCOPED_TRACE(url);
    TransportOptions options;
    options.server = url;
    absl::Status status = NewSocketTransport(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  }
}

TEST(HttpSocketUrlTest, HostNameIsResolved) {
  ScriptedServer server(AnswerEveryRequest(EchoTarget()));
  ASSERT_TRUE(server.ok());
  std::unique_ptr<HttpTransport> transport =
      NewTransport(absl::StrCat("http://localhost:", server.port()));
  ASSERT_NE(transport, nullptr);
  absl::StatusOr<HttpResponse> response = transport->Send(Request("GET", "/by-name"));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body, "/by-name");
  std::vector<ScriptedRequest> requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].Header("host"), absl::StrCat("localhost:", server.port()));
}

TEST(HttpSocketUrlTest, Ipv6Loopback) {
  const int probe = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) GTEST_SKIP() << "no IPv6 sockets here";
  ::close(probe);
  ScriptedServer server(AnswerEveryRequest(EchoTarget()), nullptr, /*ipv6=*/true);
  if (!server.ok()) GTEST_SKIP() << "cannot listen on [::1]";
  ASSERT_EQ(server.url(), absl::StrCat("http://[::1]:", server.port()));
  std::unique_ptr<HttpTransport> transport = NewTransport(server.url());
  ASSERT_NE(transport, nullptr);
  absl::StatusOr<HttpResponse> response = transport->Send(Request("GET", "/six"));
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->body, "/six");
  std::vector<ScriptedRequest> requests = server.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].Header("host"), absl::StrCat("[::1]:", server.port()));
}

}  // namespace
}  // namespace sbx::k8s

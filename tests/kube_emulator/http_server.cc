#include "tests/kube_emulator/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kube_emulator {
namespace {

constexpr size_t kMaxHeaderBytes = 1 << 20;
constexpr size_t kMaxBodyBytes = 64 << 20;

class PlainConnection : public Connection {
 public:
  explicit PlainConnection(int fd) : fd_(fd) {}
  ~PlainConnection() override { ::close(fd_); }
  long Read(char* buf, size_t len) override {
    while (true) {
      long n = ::recv(fd_, buf, len, 0);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }
  bool WriteAll(absl::string_view data) override {
    while (!data.empty()) {
      long n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  int fd() const override { return fd_; }

 private:
  int fd_;
};

class TlsConnection : public Connection {
 public:
  TlsConnection(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  ~TlsConnection() override {
    SSL_shutdown(ssl_);
    SSL_free(ssl_);
    ::close(fd_);
  }
  long Read(char* buf, size_t len) override {
    int n = SSL_read(ssl_, buf, static_cast<int>(len));
    if (n > 0) return n;
    int err = SSL_get_error(ssl_, n);
    return err == SSL_ERROR_ZERO_RETURN ? 0 : -1;
  }
  bool WriteAll(absl::string_view data) override {
    while (!data.empty()) {
      int n = SSL_write(ssl_, data.data(), static_cast<int>(data.size()));
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  int fd() const override { return fd_; }

 private:
  int fd_;
  SSL* ssl_;
};

// Buffered reader over a Connection.
class Reader {
 public:
  explicit Reader(Connection* c) : conn_(c) {}
  // Reads until "\r\n\r\n"; returns false on EOF/error/oversize.
  bool ReadHead(std::string* head) {
    while (true) {
      size_t pos = buf_.find("\r\n\r\n");
      if (pos != std::string::npos) {
        *head = buf_.substr(0, pos);
        buf_.erase(0, pos + 4);
        return true;
      }
      if (buf_.size() > kMaxHeaderBytes || !Fill()) return false;
    }
  }
  bool ReadLine(std::string* line) {
    while (true) {
      size_t pos = buf_.find("\r\n");
      if (pos != std::string::npos) {
        *line = buf_.substr(0, pos);
        buf_.erase(0, pos + 2);
        return true;
      }
      if (buf_.size() > kMaxHeaderBytes || !Fill()) return false;
    }
  }
  bool ReadN(size_t n, std::string* out) {
    while (buf_.size() < n) {
      if (!Fill()) return false;
    }
    out->append(buf_, 0, n);
    buf_.erase(0, n);
    return true;
  }

 private:
  bool Fill() {
    char tmp[16384];
    long n = conn_->Read(tmp, sizeof(tmp));
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  Connection* conn_;
  std::string buf_;
};

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Parses one request from the reader; returns false when the connection should close.
bool ReadRequest(Reader& reader, Connection* conn, HttpRequest* req, int* bad_code) {
  std::string head;
  if (!reader.ReadHead(&head)) return false;
  std::vector<std::string> lines = absl::StrSplit(head, "\r\n");
  if (lines.empty()) return false;
  std::vector<std::string> parts = absl::StrSplit(lines[0], ' ', absl::SkipEmpty());
  if (parts.size() != 3) {
    *bad_code = 400;
    return true;
  }
  req->method = parts[0];
  req->target = parts[1];
  for (size_t i = 1; i < lines.size(); ++i) {
    size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    auto [it, inserted] = req->headers.emplace(name, value);
    if (!inserted) it->second += "," + value;
  }
  size_t q = req->target.find('?');
  req->path = UrlDecode(req->target.substr(0, q), false);
  if (q != std::string::npos) {
    for (absl::string_view kv : absl::StrSplit(req->target.substr(q + 1), '&', absl::SkipEmpty())) {
      size_t eq = kv.find('=');
      std::string k = UrlDecode(kv.substr(0, eq), true);
      std::string v = eq == absl::string_view::npos ? "" : UrlDecode(kv.substr(eq + 1), true);
      req->query.emplace(k, v);
    }
  }
  if (absl::AsciiStrToLower(req->Header("expect")) == "100-continue") {
    conn->WriteAll("HTTP/1.1 100 Continue\r\n\r\n");
  }
  std::string te = absl::AsciiStrToLower(req->Header("transfer-encoding"));
  if (te.find("chunked") != std::string::npos) {
    while (true) {
      std::string line;
      if (!reader.ReadLine(&line)) return false;
      size_t semi = line.find(';');
      std::string hex(absl::StripAsciiWhitespace(line.substr(0, semi)));
      size_t size = 0;
      for (char c : hex) {
        int v = HexValue(c);
        if (v < 0) return false;
        size = size * 16 + static_cast<size_t>(v);
        if (size > kMaxBodyBytes) return false;
      }
      if (size == 0) {
        // Trailers until an empty line.
        while (reader.ReadLine(&line) && !line.empty()) {
        }
        break;
      }
      if (!reader.ReadN(size, &req->body) || !reader.ReadLine(&line)) return false;
      if (req->body.size() > kMaxBodyBytes) return false;
    }
  } else {
    std::string cl = req->Header("content-length");
    if (!cl.empty()) {
      size_t len = 0;
      if (!absl::SimpleAtoi(cl, &len) || len > kMaxBodyBytes) {
        *bad_code = 400;
        return true;
      }
      if (!reader.ReadN(len, &req->body)) return false;
    }
  }
  return true;
}

}  // namespace

std::string HttpRequest::Query(const std::string& key) const {
  auto it = query.find(key);
  return it == query.end() ? "" : it->second;
}

std::string HttpRequest::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? "" : it->second;
}

std::string UrlDecode(absl::string_view s, bool form) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else if (form && s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

const char* ReasonPhrase(int code) {
  switch (code) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 406:
      return "Not Acceptable";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Unknown";
  }
}

bool HttpResponder::Send(int code, absl::string_view content_type, absl::string_view body,
                         const Headers& extra) {
  Status(code);
  std::string out = absl::StrCat(
      "HTTP/1.1 ", code, " ", ReasonPhrase(code), "\r\n", "Content-Type: ", content_type, "\r\n",
      "Content-Length: ", body.size(), "\r\n", "Cache-Control: no-cache, private\r\n");
  for (const auto& [k, v] : always_) absl::StrAppend(&out, k, ": ", v, "\r\n");
  for (const auto& [k, v] : extra) absl::StrAppend(&out, k, ": ", v, "\r\n");
  if (close_) out += "Connection: close\r\n";
  out += "\r\n";
  out.append(body.data(), body.size());
  if (!conn_->WriteAll(out)) {
    close_ = true;
    return false;
  }
  return true;
}

bool HttpResponder::StartChunked(int code, absl::string_view content_type, const Headers& extra) {
  Status(code);
  std::string out = absl::StrCat(
      "HTTP/1.1 ", code, " ", ReasonPhrase(code), "\r\n", "Content-Type: ", content_type, "\r\n",
      "Transfer-Encoding: chunked\r\n", "Cache-Control: no-cache, private\r\n");
  for (const auto& [k, v] : always_) absl::StrAppend(&out, k, ": ", v, "\r\n");
  for (const auto& [k, v] : extra) absl::StrAppend(&out, k, ": ", v, "\r\n");
  out += "\r\n";
  if (!conn_->WriteAll(out)) {
    close_ = true;
    return false;
  }
  return true;
}

bool HttpResponder::WriteChunk(absl::string_view data) {
  if (data.empty()) return true;
  char size[32];
  snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string out = absl::StrCat(size, data, "\r\n");
  if (!conn_->WriteAll(out)) {
    close_ = true;
    return false;
  }
  return true;
}

bool HttpResponder::EndChunked() {
  if (!conn_->WriteAll("0\r\n\r\n")) {
    close_ = true;
    return false;
  }
  return true;
}

bool HttpResponder::PeerGone() const {
  struct pollfd p = {conn_->fd(), POLLIN, 0};
  int n = ::poll(&p, 1, 0);
  if (n <= 0) return false;
  // During a stream the client sends nothing; readable means EOF, a TLS
  // close_notify or garbage, all of which end the stream.
  return (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

HttpServer::~HttpServer() {
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
}

absl::Status HttpServer::Start(const std::string& host, int port, const std::string& cert_file,
                               const std::string& key_file) {
  if (!cert_file.empty() || !key_file.empty()) {
    if (cert_file.empty() || key_file.empty()) {
      return absl::InvalidArgumentError("--tls_cert_file and --tls_key_file go together");
    }
    ssl_ctx_ = SSL_CTX_new(TLS_server_method());
    if (SSL_CTX_use_certificate_chain_file(ssl_ctx_, cert_file.c_str()) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("cannot load certificate ", cert_file));
    }
    if (SSL_CTX_use_PrivateKey_file(ssl_ctx_, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("cannot load private key ", key_file));
    }
    // Select http/1.1 when the client offers ALPN; never h2.
    SSL_CTX_set_alpn_select_cb(
        ssl_ctx_,
        [](SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
           unsigned int inlen, void*) -> int {
          static const unsigned char kHttp11[] = "\x08http/1.1";
          unsigned char* sel = nullptr;
          if (SSL_select_next_proto(&sel, outlen, kHttp11, sizeof(kHttp11) - 1, in, inlen) ==
              OPENSSL_NPN_NEGOTIATED) {
            *out = sel;
            return SSL_TLSEXT_ERR_OK;
          }
          return SSL_TLSEXT_ERR_NOACK;
        },
        nullptr);
  }
  struct addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  struct addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve listen host ", host, ": ", gai_strerror(rc)));
  }
  int fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 512) != 0) {
    int err = errno;
    freeaddrinfo(res);
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", host, ":", port, ": ", strerror(err)));
  }
  freeaddrinfo(res);
  struct sockaddr_storage ss = {};
  socklen_t sl = sizeof(ss);
  getsockname(fd, reinterpret_cast<struct sockaddr*>(&ss), &sl);
  port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                   : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  listen_fd_ = fd;
  std::thread([this] { AcceptLoop(); }).detach();
  return absl::OkStatus();
}

void HttpServer::AcceptLoop() {
  while (true) {
    int fd = ::accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE) {
        if (errno == EMFILE) usleep(10000);
        continue;
      }
      return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    // A client that stops reading (e.g. a stuck watcher) frees its thread after a minute.
    struct timeval send_timeout = {60, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    std::thread([this, fd] { Serve(fd); }).detach();
  }
}

void HttpServer::Serve(int fd) {
  std::unique_ptr<Connection> conn;
  if (ssl_ctx_ != nullptr) {
    SSL* ssl = SSL_new(ssl_ctx_);
    SSL_set_fd(ssl, fd);
    if (SSL_accept(ssl) != 1) {
      SSL_free(ssl);
      ::close(fd);
      return;
    }
    conn = std::make_unique<TlsConnection>(fd, ssl);
  } else {
    conn = std::make_unique<PlainConnection>(fd);
  }
  Reader reader(conn.get());
  while (true) {
    HttpRequest req;
    int bad_code = 0;
    if (!ReadRequest(reader, conn.get(), &req, &bad_code)) return;
    HttpResponder resp(conn.get());
    if (bad_code != 0) {
      resp.Abort();
      resp.Send(bad_code, "text/plain", "bad request\n");
      return;
    }
    if (absl::AsciiStrToLower(req.Header("connection")) == "close") resp.Abort();
    handler_(req, resp);
    if (!resp.sent() && !resp.dropped()) resp.Send(500, "text/plain", "no response\n");
    if (resp.close_after()) return;
  }
}

}  // namespace kube_emulator

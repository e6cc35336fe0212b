// The socket transport: HTTP/1.1 on non-blocking sockets driven by the calling thread, TLS
// through OpenSSL. The only file of sbx that sees OpenSSL.
//
// Why not cpprest: there every request crosses threads (the caller posts it, an I/O thread
// writes and reads, a pool thread runs the continuation, the caller is woken), which cost
// the refill path a third of sbx's CPU in context switches. Here the thread that sends a
// request writes it, waits in poll() for the answer and parses it; nothing else runs.
//
// Deadlines are whole-request: connect, TLS handshake, writing and reading all wait in
// poll() with what is left of the request's timeout (a stream's body reads use its idle
// timeout per read instead). One exception: resolving the server's name (getaddrinfo)
// blocks outside the deadline; it happens only when a connection is opened, which the pool
// makes rare. Signals: writes use send(MSG_NOSIGNAL), also under TLS (a
// BIO of our own), so a closed peer never raises SIGPIPE.

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "src/common/errno_text.h"
#include "src/common/status_macros.h"
#include "src/k8s/http.h"
#include "src/k8s/http_lines.h"

namespace sbx::k8s {
namespace {

// Bounds on what a server may send: a header section, one line of chunk framing, a body.
constexpr size_t kMaxHeaderBytes = size_t{1} << 20;
constexpr size_t kMaxChunkLineBytes = 4096;
constexpr size_t kMaxBodyBytes = size_t{1} << 30;
// Idle keep-alive connections kept for Send; more are closed when returned.
constexpr size_t kMaxIdleConnections = 128;
// Bytes asked of the kernel per read.
constexpr size_t kReadSize = size_t{64} << 10;

std::string OpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no detail from OpenSSL" : out;
}

// The server URL, taken apart.
struct Endpoint {
  bool tls = false;
  std::string host;         // without brackets
  std::string port;         // digits
  std::string host_header;  // as the Host header wants it
  std::string base_path;    // "" or "/prefix" without a trailing slash
  bool host_is_ip = false;
};

absl::StatusOr<Endpoint> ParseServer(const std::string& server) {
  auto bad = [&server](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("k8s server \"", server, "\": ", why));
  };
  Endpoint e;
  absl::string_view rest = server;
  if (absl::ConsumePrefix(&rest, "https://")) {
    e.tls = true;
  } else if (!absl::ConsumePrefix(&rest, "http://")) {
    return bad("scheme must be http or https");
  }
  const size_t slash = rest.find_first_of("/?#");
  absl::string_view authority = rest.substr(0, slash);
  if (slash != absl::string_view::npos) {
    absl::string_view path = rest.substr(slash);
    if (path[0] != '/') return bad("a query or fragment is not allowed");
    while (!path.empty() && path.back() == '/') path.remove_suffix(1);
    e.base_path = std::string(path);
  }
  if (absl::StrContains(authority, '@')) return bad("user information is not allowed");
  absl::string_view port;
  if (absl::ConsumePrefix(&authority, "[")) {
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) return bad("unclosed [ in the host");
    e.host = std::string(authority.substr(0, close));
    absl::string_view after = authority.substr(close + 1);
    if (!after.empty() && !absl::ConsumePrefix(&after, ":")) return bad("junk after ]");
    port = after;
    e.host_is_ip = true;
  } else {
    const size_t colon = authority.rfind(':');
    e.host = std::string(authority.substr(0, colon));
    if (colon != absl::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) return bad("empty port");
    }
  }
  if (e.host.empty()) return bad("no host");
  if (!e.host_is_ip && absl::StrContains(e.host, ':')) {
    return bad("more than one ':' (an IPv6 address goes in [ ])");
  }
  for (char c : e.host) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_' && c != ':' && c != '%') {
      return bad(absl::StrCat("invalid character '", std::string(1, c), "' in the host"));
    }
  }
  int port_number = e.tls ? 443 : 80;
  if (!port.empty()) {
    if (!std::all_of(port.begin(), port.end(), absl::ascii_isdigit) ||
        !absl::SimpleAtoi(port, &port_number) || port_number < 1 || port_number > 65535) {
      return bad(absl::StrCat("port \"", port, "\" is not a number in 1..65535"));
    }
  }
  e.port = absl::StrCat(port_number);
  if (!e.host_is_ip) {
    in_addr v4;
    e.host_is_ip = inet_pton(AF_INET, e.host.c_str(), &v4) == 1;
  } else {
    in6_addr v6;
    if (inet_pton(AF_INET6, e.host.c_str(), &v6) != 1) return bad("not an IPv6 address in [ ]");
  }
  const bool bracket = e.host.find(':') != std::string::npos;
  e.host_header = bracket ? absl::StrCat("[", e.host, "]") : e.host;
  if (!port.empty()) absl::StrAppend(&e.host_header, ":", e.port);
  return e;
}

// --- TLS context ------------------------------------------------------------------------

struct SslCtxDeleter {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxDeleter>;

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};

std::unique_ptr<BIO, BioDeleter> MemBio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

absl::StatusOr<SslCtxPtr> NewSslContext(const TransportOptions& options) {
  ERR_clear_error();
  SslCtxPtr ctx(SSL_CTX_new(TLS_client_method()));
  if (ctx == nullptr) return absl::InternalError("TLS context: " + OpenSslErrors());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  // HTTP/1.1 is what this transport speaks; a server that offers h2 must also offer it.
  static constexpr unsigned char kAlpn[] = "\x08http/1.1";
  SSL_CTX_set_alpn_protos(ctx.get(), kAlpn, sizeof(kAlpn) - 1);
  if (!options.ca_pem.empty()) {
    auto bio = MemBio(options.ca_pem);
    X509_STORE* store = SSL_CTX_get_cert_store(ctx.get());
    int added = 0;
    while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
      X509_STORE_add_cert(store, cert);
      X509_free(cert);
      ++added;
    }
    ERR_clear_error();  // the end of the PEM reads as an error
    if (added == 0) return absl::InvalidArgumentError("CA bundle: no PEM certificate in it");
  } else if (SSL_CTX_set_default_verify_paths(ctx.get()) != 1) {
    return absl::InternalError("TLS context: system CA bundle: " + OpenSslErrors());
  }
  SSL_CTX_set_verify(ctx.get(),
                     options.insecure_skip_tls_verify ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, nullptr);
  if (!options.client_cert_pem.empty()) {
    auto bio = MemBio(options.client_cert_pem);
    X509* leaf = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
    if (leaf == nullptr || SSL_CTX_use_certificate(ctx.get(), leaf) != 1) {
      X509_free(leaf);
      return absl::InvalidArgumentError("client certificate: " + OpenSslErrors());
    }
    X509_free(leaf);
    while (X509* extra = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
      SSL_CTX_add0_chain_cert(ctx.get(), extra);  // takes ownership
    }
    ERR_clear_error();
    auto key_bio = MemBio(options.client_key_pem);
    EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
    if (key == nullptr || SSL_CTX_use_PrivateKey(ctx.get(), key) != 1) {
      EVP_PKEY_free(key);
      return absl::InvalidArgumentError("client key: " + OpenSslErrors());
    }
    EVP_PKEY_free(key);
    if (SSL_CTX_check_private_key(ctx.get()) != 1) {
      return absl::InvalidArgumentError("client key does not match the client certificate");
    }
  }
  return ctx;
}

// --- One connection ---------------------------------------------------------------------

// What the socket BIO below reads and writes through, and what it saw.
struct SocketState {
  int fd = -1;
  bool eof = false;  // a read returned 0 bytes
  int error = 0;     // errno of the last failed read or write
};

// A BIO on a non-blocking socket that writes with MSG_NOSIGNAL (OpenSSL's own socket BIO
// uses write(), which raises SIGPIPE on a closed peer).
int BioWrite(BIO* bio, const char* data, int len) {
  auto* s = static_cast<SocketState*>(BIO_get_data(bio));
  BIO_clear_retry_flags(bio);
  const ssize_t n = ::send(s->fd, data, static_cast<size_t>(len), MSG_NOSIGNAL);
  if (n >= 0) return static_cast<int>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
    BIO_set_retry_write(bio);
  } else {
    s->error = errno;
  }
  return -1;
}

int BioRead(BIO* bio, char* data, int len) {
  auto* s = static_cast<SocketState*>(BIO_get_data(bio));
  BIO_clear_retry_flags(bio);
  const ssize_t n = ::recv(s->fd, data, static_cast<size_t>(len), 0);
  if (n > 0) return static_cast<int>(n);
  if (n == 0) {
    s->eof = true;
    return 0;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
    BIO_set_retry_read(bio);
  } else {
    s->error = errno;
  }
  return -1;
}

long BioCtrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

int BioCreate(BIO* bio) {
  BIO_set_init(bio, 1);
  return 1;
}

BIO_METHOD* SocketBioMethod() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "sbx socket");
    BIO_meth_set_write(m, BioWrite);
    BIO_meth_set_read(m, BioRead);
    BIO_meth_set_ctrl(m, BioCtrl);
    BIO_meth_set_create(m, BioCreate);
    return m;
  }();
  return method;
}

int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 1 << 30));
}

// Bytes read from a connection and not yet consumed. Unlike a std::string it does not
// zero the space a read may fill (64 KiB per read, mostly unused by small answers).
class ReadBuffer {
 public:
  absl::string_view unread() const {
    return absl::string_view(data_.get() + begin_, end_ - begin_);
  }
  void Consume(size_t n) {
    begin_ += n;
    if (begin_ == end_) begin_ = end_ = 0;
  }
  // Room for `n` more bytes after the unread ones; Added(k) then keeps k of them.
  char* Space(size_t n) {
    if (capacity_ - end_ < n) {
      const size_t used = end_ - begin_;
      if (capacity_ - used >= n) {
        std::memmove(data_.get(), data_.get() + begin_, used);
      } else {
        const size_t grown = std::max(capacity_ * 2, used + n);
        std::unique_ptr<char[]> bigger(new char[grown]);
        if (used > 0) std::memcpy(bigger.get(), data_.get() + begin_, used);
        data_ = std::move(bigger);
        capacity_ = grown;
      }
      begin_ = 0;
      end_ = used;
    }
    return data_.get() + end_;
  }
  void Added(size_t n) { end_ += n; }

 private:
  std::unique_ptr<char[]> data_;
  size_t capacity_ = 0;
  size_t begin_ = 0;  // unread bytes are [begin_, end_)
  size_t end_ = 0;
};

// One TCP (and maybe TLS) connection with its read buffer. Used by one thread at a time;
// only Shutdown may be called from another.
class Connection {
 public:
  explicit Connection(int fd) { state_.fd = fd; }
  ~Connection() {
    if (ssl_ != nullptr) SSL_free(ssl_);  // frees the BIO too
    if (state_.fd >= 0) ::close(state_.fd);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects to the first address of `e` that answers, within `deadline`.
  static absl::StatusOr<std::unique_ptr<Connection>> Open(const Endpoint& e, SSL_CTX* ctx,
                                                          bool verify, absl::Time deadline) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const int rc = getaddrinfo(e.host.c_str(), e.port.c_str(), &hints, &found);
    if (rc != 0) {
      return absl::UnavailableError(absl::StrCat("resolve ", e.host, ": ", gai_strerror(rc)));
    }
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, freeaddrinfo);
    absl::Status last = absl::UnavailableError("no address");
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      const int fd =
          ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last = absl::UnavailableError(absl::StrCat("socket: ", sbx::ErrnoText(errno)));
        continue;
      }
      auto conn = std::make_unique<Connection>(fd);
      absl::Status connected = conn->Connect(a->ai_addr, a->ai_addrlen, deadline);
      if (connected.ok() && e.tls) connected = conn->Handshake(e, ctx, verify, deadline);
      if (connected.ok()) return conn;
      last = connected;
      if (absl::IsDeadlineExceeded(last)) break;
    }
    return absl::Status(last.code(),
                        absl::StrCat("connect to ", e.host_header, ": ", last.message()));
  }

  bool reused() const { return reused_; }
  void set_reused() { reused_ = true; }
  // True once a byte of an answer arrived on this connection (for the retry rule).
  bool answered() const { return answered_; }
  // True when the whole request was handed to the kernel.
  bool wrote_all() const { return wrote_all_; }
  // True when the peer went away (EOF or reset) rather than sending something wrong.
  bool peer_gone() const {
    return state_.eof || state_.error == ECONNRESET || state_.error == EPIPE;
  }

  // Wakes any thread blocked on this connection; its reads then fail (streams' Cancel).
  void Shutdown() { ::shutdown(state_.fd, SHUT_RDWR); }

  // For pooled connections: false when the server closed it, or sent something unasked
  // (nothing may arrive between answers on HTTP/1.1).
  bool StillIdle() {
    if (!unread().empty()) return false;
    pollfd p{state_.fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, 0);
    if (ready == 0) return true;
    if (ready < 0 || ssl_ == nullptr) return false;
    // Under TLS the bytes may be a post-handshake message (a TLS 1.3 session ticket),
    // which OpenSSL consumes without returning data.
    char byte;
    ERR_clear_error();
    const int n = SSL_read(ssl_, &byte, 1);
    const bool alive = n <= 0 && SSL_get_error(ssl_, n) == SSL_ERROR_WANT_READ;
    ERR_clear_error();
    return alive;
  }

  absl::Status WriteAll(absl::string_view data, absl::Time deadline) {
    wrote_all_ = false;
    answered_ = false;
    while (!data.empty()) {
      ssize_t n;
      if (ssl_ != nullptr) {
        ERR_clear_error();
        const int w =
            SSL_write(ssl_, data.data(), static_cast<int>(std::min<size_t>(data.size(), 1 << 30)));
        if (w <= 0) {
          RETURN_IF_ERROR(AfterSslError(w, deadline, "write"));
          continue;
        }
        n = w;
      } else {
        n = ::send(state_.fd, data.data(), data.size(), MSG_NOSIGNAL);
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) {
            state_.error = errno;
            return Broken("write");
          }
          RETURN_IF_ERROR(Wait(POLLOUT, deadline, "write"));
          continue;
        }
      }
      data.remove_prefix(static_cast<size_t>(n));
    }
    wrote_all_ = true;
    return absl::OkStatus();
  }

  // Reads at least one more byte onto the buffer. Returns false at EOF.
  absl::StatusOr<bool> Fill(absl::Time deadline) {
    char* const into = in_.Space(kReadSize);
    while (true) {
      ssize_t n;
      if (ssl_ != nullptr) {
        ERR_clear_error();
        const int r = SSL_read(ssl_, into, static_cast<int>(kReadSize));
        if (r <= 0) {
          const int err = SSL_get_error(ssl_, r);
          if (err == SSL_ERROR_ZERO_RETURN) {
            n = 0;
          } else {
            absl::Status waited = AfterSslError(r, deadline, "read");
            if (!waited.ok()) {
              // A peer that closed without close_notify is an EOF for HTTP, which frames
              // its bodies itself.
              if (state_.eof && state_.error == 0) return false;
              return waited;
            }
            continue;
          }
        } else {
          n = r;
        }
      } else {
        n = ::recv(state_.fd, into, kReadSize, 0);
        if (n < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) {
            RETURN_IF_ERROR(Wait(POLLIN, deadline, "read"));
            continue;
          }
          state_.error = errno;
          return Broken("read");
        }
      }
      if (n == 0) state_.eof = true;
      in_.Added(static_cast<size_t>(n));
      if (n > 0) answered_ = true;
      return n > 0;
    }
  }

  // The unread bytes, and consuming them.
  absl::string_view unread() const { return in_.unread(); }
  void Consume(size_t n) { in_.Consume(n); }

 private:
  absl::Status Connect(const sockaddr* address, socklen_t length, absl::Time deadline) {
    int one = 1;
    setsockopt(state_.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (::connect(state_.fd, address, length) != 0) {
      if (errno != EINPROGRESS) return absl::UnavailableError(sbx::ErrnoText(errno));
      RETURN_IF_ERROR(Wait(POLLOUT, deadline, "connect"));
      int error = 0;
      socklen_t size = sizeof(error);
      getsockopt(state_.fd, SOL_SOCKET, SO_ERROR, &error, &size);
      if (error != 0) return absl::UnavailableError(sbx::ErrnoText(error));
    }
    return absl::OkStatus();
  }

  absl::Status Handshake(const Endpoint& e, SSL_CTX* ctx, bool verify, absl::Time deadline) {
    ERR_clear_error();
    ssl_ = SSL_new(ctx);
    if (ssl_ == nullptr) return absl::InternalError("TLS: " + OpenSslErrors());
    BIO* bio = BIO_new(SocketBioMethod());
    if (bio == nullptr) return absl::InternalError("TLS: " + OpenSslErrors());
    BIO_set_data(bio, &state_);
    SSL_set_bio(ssl_, bio, bio);
    if (!e.host_is_ip) SSL_set_tlsext_host_name(ssl_, e.host.c_str());
    if (verify) {
      const int set = e.host_is_ip
                          ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), e.host.c_str())
                          : SSL_set1_host(ssl_, e.host.c_str());
      if (set != 1) return absl::InternalError("TLS: cannot set the name to verify");
    }
    SSL_set_connect_state(ssl_);
    while (true) {
      ERR_clear_error();
      const int rc = SSL_do_handshake(ssl_);
      if (rc == 1) return absl::OkStatus();
      const int err = SSL_get_error(ssl_, rc);
      if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        RETURN_IF_ERROR(
            Wait(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline, "TLS handshake"));
        continue;
      }
      const long verified = SSL_get_verify_result(ssl_);
      if (verified != X509_V_OK) {
        return absl::UnavailableError(absl::StrCat("TLS handshake: certificate not trusted: ",
                                                   X509_verify_cert_error_string(verified)));
      }
      if (state_.eof || state_.error != 0) return Broken("TLS handshake");
      return absl::UnavailableError("TLS handshake: " + OpenSslErrors());
    }
  }

  // After SSL_read/SSL_write returned `rc` <= 0: waits when OpenSSL wants the socket,
  // or says what broke.
  absl::Status AfterSslError(int rc, absl::Time deadline, absl::string_view doing) {
    const int err = SSL_get_error(ssl_, rc);
    if (err == SSL_ERROR_WANT_READ) return Wait(POLLIN, deadline, doing);
    if (err == SSL_ERROR_WANT_WRITE) return Wait(POLLOUT, deadline, doing);
    if (err == SSL_ERROR_ZERO_RETURN || state_.eof || state_.error != 0) return Broken(doing);
    return absl::UnavailableError(absl::StrCat(doing, ": TLS: ", OpenSslErrors()));
  }

  absl::Status Wait(short events, absl::Time deadline, absl::string_view doing) {
    while (true) {
      pollfd p{state_.fd, events, 0};
      const int ready = ::poll(&p, 1, PollTimeoutMs(deadline));
      if (ready > 0) return absl::OkStatus();  // errors show in the next read or write
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) return absl::UnavailableError(absl::StrCat("poll: ", sbx::ErrnoText(errno)));
      return absl::DeadlineExceededError(absl::StrCat(doing, ": timed out"));
    }
  }

  absl::Status Broken(absl::string_view doing) const {
    if (state_.error != 0) {
      return absl::UnavailableError(absl::StrCat(doing, ": ", sbx::ErrnoText(state_.error)));
    }
    return absl::UnavailableError(absl::StrCat(doing, ": connection closed by the server"));
  }

  SocketState state_;
  SSL* ssl_ = nullptr;
  bool reused_ = false;  // it came from the pool
  bool wrote_all_ = false;
  bool answered_ = false;
  ReadBuffer in_;
};

// --- HTTP/1.1 framing -------------------------------------------------------------------

// How the body of a response is delimited.
enum class Framing { kNone, kLength, kChunked, kUntilClose };

struct Head {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  Framing framing = Framing::kNone;
  uint64_t length = 0;      // kLength
  bool keep_alive = false;  // the connection may serve another request afterwards
};

absl::StatusOr<Head> ParseHead(absl::string_view text, bool head_request) {
  // text: the status line and header lines, each ending in "\r\n", without the blank line.
  std::vector<absl::string_view> lines = absl::StrSplit(text, "\r\n");
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) return absl::UnavailableError("empty response head");
  absl::string_view status_line = lines[0];
  Head head;
  bool http10 = false;
  if (absl::ConsumePrefix(&status_line, "HTTP/1.1 ")) {
  } else if (absl::ConsumePrefix(&status_line, "HTTP/1.0 ")) {
    http10 = true;
  } else {
    return absl::UnavailableError(
        absl::StrCat("malformed status line \"", lines[0].substr(0, 100), "\" (not HTTP/1.x)"));
  }
  if (status_line.size() < 3 ||
      !std::all_of(status_line.begin(), status_line.begin() + 3, absl::ascii_isdigit) ||
      (status_line.size() > 3 && status_line[3] != ' ')) {
    return absl::UnavailableError(
        absl::StrCat("malformed status line \"", lines[0].substr(0, 100), "\" (no status code)"));
  }
  head.status = (status_line[0] - '0') * 100 + (status_line[1] - '0') * 10 + (status_line[2] - '0');
  bool chunked = false;
  bool has_transfer_encoding = false;
  bool has_length = false;
  bool close = http10;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos || colon == 0 || lines[i][0] == ' ' ||
        lines[i][0] == '\t') {
      return absl::UnavailableError(
          absl::StrCat("malformed header line \"", lines[i].substr(0, 100), "\""));
    }
    std::string name = absl::AsciiStrToLower(lines[i].substr(0, colon));
    std::string value(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    if (name == "content-length") {
      uint64_t n = 0;
      if (!std::all_of(value.begin(), value.end(), absl::ascii_isdigit) || value.empty() ||
          !absl::SimpleAtoi(value, &n) || (has_length && n != head.length)) {
        return absl::UnavailableError(absl::StrCat("bad Content-Length \"", value, "\""));
      }
      head.length = n;
      has_length = true;
    } else if (name == "transfer-encoding") {
      has_transfer_encoding = true;
      std::vector<absl::string_view> codings = absl::StrSplit(value, ',');
      chunked = absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(codings.back()), "chunked");
    } else if (name == "connection") {
      for (absl::string_view token : absl::StrSplit(value, ',')) {
        token = absl::StripAsciiWhitespace(token);
        if (absl::EqualsIgnoreCase(token, "close")) close = true;
        if (http10 && absl::EqualsIgnoreCase(token, "keep-alive")) close = false;
      }
    }
    head.headers.emplace_back(std::move(name), std::move(value));
  }
  if (head_request || head.status / 100 == 1 || head.status == 204 || head.status == 304) {
    head.framing = Framing::kNone;
  } else if (has_transfer_encoding) {
    head.framing = chunked ? Framing::kChunked : Framing::kUntilClose;
  } else if (has_length) {
    head.framing = head.length == 0 ? Framing::kNone : Framing::kLength;
    if (head.length > kMaxBodyBytes) {
      return absl::UnavailableError(absl::StrCat("body of ", head.length, " bytes is too large"));
    }
  } else {
    head.framing = Framing::kUntilClose;
  }
  head.keep_alive = !close && head.framing != Framing::kUntilClose;
  return head;
}

// Reads a response's head (skipping interim 1xx answers) from `conn`.
absl::StatusOr<Head> ReadHead(Connection& conn, bool head_request, absl::Time deadline) {
  while (true) {
    size_t searched = 0;
    size_t end;
    while ((end = conn.unread().find("\r\n\r\n", searched)) == absl::string_view::npos) {
      if (conn.unread().size() > kMaxHeaderBytes) {
        return absl::UnavailableError("response header section is over 1 MiB");
      }
      searched = conn.unread().size() < 3 ? 0 : conn.unread().size() - 3;
      ASSIGN_OR_RETURN(bool more, conn.Fill(deadline));
      if (!more) {
        return conn.unread().empty()
                   ? absl::UnavailableError("connection closed by the server before an answer")
                   : absl::UnavailableError("connection closed by the server within the headers");
      }
    }
    if (end > kMaxHeaderBytes)
      return absl::UnavailableError("response header section is over 1 MiB");
    absl::StatusOr<Head> head = ParseHead(conn.unread().substr(0, end + 2), head_request);
    conn.Consume(end + 4);
    if (!head.ok()) return head.status();
    if (head->status == 101) {
      return absl::UnavailableError("the server switched protocols (101), which was not asked");
    }
    if (head->status / 100 != 1) return head;
  }
}

// Decodes a response body from a connection as it arrives.
class BodyReader {
 public:
  BodyReader(Connection* conn, const Head& head)
      : conn_(conn), framing_(head.framing), left_(head.length) {
    done_ = framing_ == Framing::kNone;
  }

  // Appends the next decoded bytes (at least one, unless the body ended) to *out.
  // Returns false when the body has ended.
  absl::StatusOr<bool> Next(std::string* out, absl::Time deadline) {
    while (!done_) {
      switch (framing_) {
        case Framing::kNone:
          done_ = true;
          break;
        case Framing::kLength:
        case Framing::kUntilClose: {
          if (conn_->unread().empty()) {
            ASSIGN_OR_RETURN(bool more, conn_->Fill(deadline));
            if (!more) {
              if (framing_ == Framing::kUntilClose) {
                done_ = true;
                break;
              }
              return absl::UnavailableError(absl::StrCat("connection closed by the server with ",
                                                         left_, " bytes of the body unread"));
            }
          }
          size_t n = conn_->unread().size();
          if (framing_ == Framing::kLength) n = static_cast<size_t>(std::min<uint64_t>(n, left_));
          RETURN_IF_ERROR(Take(out, n));
          if (framing_ == Framing::kLength) {
            left_ -= n;
            done_ = left_ == 0;
          }
          return true;
        }
        case Framing::kChunked: {
          if (left_ == 0) {
            ASSIGN_OR_RETURN(std::string line, Line(deadline));
            if (after_chunk_) {
              if (!line.empty()) return absl::UnavailableError("chunk not followed by CRLF");
              after_chunk_ = false;
              continue;
            }
            if (in_trailers_) {
              if (line.empty()) done_ = true;
              continue;
            }
            absl::string_view size = line;
            size = size.substr(0, size.find(';'));
            size = absl::StripAsciiWhitespace(size);
            uint64_t n = 0;
            if (size.empty() || size.size() > 15 ||
                !std::all_of(size.begin(), size.end(), absl::ascii_isxdigit) ||
                !absl::SimpleHexAtoi(size, &n)) {
              return absl::UnavailableError(
                  absl::StrCat("bad chunk size line \"", line.substr(0, 40), "\""));
            }
            if (n == 0) {
              in_trailers_ = true;
            } else {
              left_ = n;
            }
            continue;
          }
          if (conn_->unread().empty()) {
            ASSIGN_OR_RETURN(bool more, conn_->Fill(deadline));
            if (!more) return absl::UnavailableError("connection closed by the server in a chunk");
          }
          const size_t n = static_cast<size_t>(std::min<uint64_t>(conn_->unread().size(), left_));
          RETURN_IF_ERROR(Take(out, n));
          left_ -= n;
          after_chunk_ = left_ == 0;
          return true;
        }
      }
    }
    return false;
  }

 private:
  absl::Status Take(std::string* out, size_t n) {
    total_ += n;
    if (total_ > kMaxBodyBytes) return absl::UnavailableError("response body is over 1 GiB");
    out->append(conn_->unread().data(), n);
    conn_->Consume(n);
    return absl::OkStatus();
  }

  // One line of chunk framing, without its CRLF.
  absl::StatusOr<std::string> Line(absl::Time deadline) {
    size_t end;
    while ((end = conn_->unread().find("\r\n")) == absl::string_view::npos) {
      if (conn_->unread().size() > kMaxChunkLineBytes) {
        return absl::UnavailableError("chunk framing line is too long");
      }
      ASSIGN_OR_RETURN(bool more, conn_->Fill(deadline));
      if (!more) return absl::UnavailableError("connection closed by the server in the body");
    }
    std::string line(conn_->unread().substr(0, end));
    conn_->Consume(end + 2);
    return line;
  }

  Connection* conn_;
  Framing framing_;
  uint64_t left_;  // kLength: body bytes left; kChunked: bytes left of this chunk
  uint64_t total_ = 0;
  bool done_ = false;
  bool after_chunk_ = false;  // kChunked: the CRLF after a chunk's data is next
  bool in_trailers_ = false;  // kChunked: the last chunk was seen, trailers follow
};

bool IdempotentMethod(absl::string_view method) {
  return method == "GET" || method == "HEAD" || method == "PUT" || method == "DELETE" ||
         method == "OPTIONS";
}

// `status` with the request it belongs to in front of its message.
absl::Status Prefixed(const std::string& what_for, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(what_for, ": ", status.message()));
}

class SocketStream final : public HttpStream {
 public:
  SocketStream(std::unique_ptr<Connection> conn, const Head& head, absl::Duration idle_timeout,
               std::string what_for)
      : conn_(std::move(conn)),
        status_(head.status),
        body_(conn_.get(), head),
        idle_timeout_(idle_timeout),
        what_for_(std::move(what_for)) {}

  int status() const override { return status_; }

  absl::StatusOr<bool> ReadLine(std::string* line) override {
    while (true) {
      if (cancelled_.load(std::memory_order_acquire)) return Cancelled();
      if (lines_.TakeLine(line)) return true;
      absl::StatusOr<bool> more = body_.Next(lines_.buffer(), absl::Now() + idle_timeout_);
      if (cancelled_.load(std::memory_order_acquire)) return Cancelled();
      if (!more.ok()) {
        return Prefixed(what_for_, more.status());
      }
      if (!*more) return lines_.TakeRest(line);
    }
  }

  // The body's bytes as sent, from where ReadLine left off.
  absl::StatusOr<std::string> ReadAll() override {
    std::string all = lines_.TakeAll();
    while (true) {
      if (cancelled_.load(std::memory_order_acquire)) return Cancelled();
      absl::StatusOr<bool> more = body_.Next(&all, absl::Now() + idle_timeout_);
      if (cancelled_.load(std::memory_order_acquire)) return Cancelled();
      if (!more.ok()) {
        return Prefixed(what_for_, more.status());
      }
      if (!*more) return all;
    }
  }

  void Cancel() override {
    if (cancelled_.exchange(true, std::memory_order_acq_rel)) return;
    conn_->Shutdown();
  }

 private:
  absl::Status Cancelled() const {
    return absl::CancelledError(absl::StrCat(what_for_, ": cancelled"));
  }

  std::unique_ptr<Connection> conn_;
  const int status_;
  BodyReader body_;
  const absl::Duration idle_timeout_;
  const std::string what_for_;
  LineSplitter lines_;  // decoded body bytes not yet returned as lines
  std::atomic<bool> cancelled_{false};
};

class SocketTransport final : public HttpTransport {
 public:
  SocketTransport(TransportOptions options, Endpoint endpoint, SslCtxPtr ssl)
      : options_(std::move(options)), endpoint_(std::move(endpoint)), ssl_(std::move(ssl)) {}

  absl::StatusOr<HttpResponse> Send(const HttpRequest& request) override {
    const std::string what_for = WhatFor(request);
    const absl::Time deadline = absl::Now() + request.timeout;
    absl::StatusOr<std::string> wire = Wire(request);
    if (!wire.ok()) return Prefixed(what_for, wire.status());
    const bool head_request = request.method == "HEAD";
    for (int attempt = 0;; ++attempt) {
      // The retry takes a new connection: the other pooled ones are likely stale too (a
      // server or balancer tends to drop its idle connections together).
      std::unique_ptr<Connection> conn = attempt == 0 ? TakeIdle() : nullptr;
      if (conn == nullptr) {
        absl::StatusOr<std::unique_ptr<Connection>> opened = Open(deadline);
        if (!opened.ok()) return Prefixed(what_for, opened.status());
        conn = *std::move(opened);
      }
      absl::StatusOr<HttpResponse> response = Exchange(conn, *wire, head_request, deadline);
      if (response.ok()) return response;
      // A reused connection the server closed as the request went out: the request can
      // go again on a new connection when that cannot make it happen twice.
      const bool again = attempt == 0 && conn->reused() && !conn->answered() && conn->peer_gone() &&
                         !absl::IsDeadlineExceeded(response.status()) &&
                         (!conn->wrote_all() || IdempotentMethod(request.method));
      if (!again) return Prefixed(what_for, response.status());
    }
  }

  absl::StatusOr<std::unique_ptr<HttpStream>> OpenStream(const HttpRequest& request) override {
    const std::string what_for = WhatFor(request);
    const absl::Time deadline = absl::Now() + request.timeout;
    absl::StatusOr<std::string> wire = Wire(request);
    if (!wire.ok()) return Prefixed(what_for, wire.status());
    // A stream keeps its connection to itself, so it gets a new one.
    absl::StatusOr<std::unique_ptr<Connection>> conn = Open(deadline);
    if (!conn.ok()) return Prefixed(what_for, conn.status());
    absl::Status sent = (*conn)->WriteAll(*wire, deadline);
    if (!sent.ok()) return Prefixed(what_for, sent);
    absl::StatusOr<Head> head = ReadHead(**conn, request.method == "HEAD", deadline);
    if (!head.ok()) return Prefixed(what_for, head.status());
    return std::unique_ptr<HttpStream>(
        std::make_unique<SocketStream>(*std::move(conn), *head, request.idle_timeout, what_for));
  }

 private:
  // Sends `wire` on `conn` and reads the answer; `conn` goes back to the pool when it may
  // serve another request, and stays with the caller (for the retry rule) on failure.
  absl::StatusOr<HttpResponse> Exchange(std::unique_ptr<Connection>& conn, const std::string& wire,
                                        bool head_request, absl::Time deadline) {
    RETURN_IF_ERROR(conn->WriteAll(wire, deadline));
    ASSIGN_OR_RETURN(Head head, ReadHead(*conn, head_request, deadline));
    HttpResponse response;
    response.status = head.status;
    response.headers = std::move(head.headers);
    BodyReader body(conn.get(), head);
    if (head.framing == Framing::kLength) response.body.reserve(head.length);
    while (true) {
      ASSIGN_OR_RETURN(bool more, body.Next(&response.body, deadline));
      if (!more) break;
    }
    if (head.keep_alive) PutIdle(std::move(conn));
    return response;
  }

  absl::StatusOr<std::unique_ptr<Connection>> Open(absl::Time deadline) {
    return Connection::Open(endpoint_, ssl_.get(), !options_.insecure_skip_tls_verify, deadline);
  }

  std::unique_ptr<Connection> TakeIdle() {
    while (true) {
      std::unique_ptr<Connection> conn;
      {
        absl::MutexLock lock(&mu_);
        if (idle_.empty()) return nullptr;
        conn = std::move(idle_.back());
        idle_.pop_back();
      }
      if (conn->StillIdle()) return conn;
    }
  }

  // Keeps `conn` for a later request, or closes it when the pool is full.
  void PutIdle(std::unique_ptr<Connection> conn) ABSL_LOCKS_EXCLUDED(mu_) {
    conn->set_reused();
    absl::MutexLock lock(&mu_);
    if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(conn));
  }

  std::string WhatFor(const HttpRequest& request) const {
    return absl::StrCat(request.method, " ", options_.server, request.path);
  }

  absl::StatusOr<std::string> Wire(const HttpRequest& request) const {
    auto bad_text = [](absl::string_view text) {
      return std::any_of(text.begin(), text.end(),
                         [](char c) { return c == '\r' || c == '\n' || c == '\0'; });
    };
    if (request.path.empty() || request.path[0] != '/' || bad_text(request.path) ||
        absl::StrContains(request.path, ' ')) {
      return absl::InvalidArgumentError(
          absl::StrCat("request path \"", request.path, "\" must start with / and hold no space"));
    }
    if (request.method.empty() ||
        !std::all_of(request.method.begin(), request.method.end(), absl::ascii_isupper)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request method \"", request.method, "\" is not an upper-case token"));
    }
    std::string wire;
    wire.reserve(256 + request.path.size() + request.body.size());
    absl::StrAppend(&wire, request.method, " ", endpoint_.base_path, request.path,
                    " HTTP/1.1\r\nHost: ", endpoint_.host_header, "\r\n");
    bool has_content_type = false;
    for (const auto& [name, value] : request.headers) {
      if (name.empty() || bad_text(name) || bad_text(value) || absl::StrContains(name, ':')) {
        return absl::InvalidArgumentError(
            absl::StrCat("request header \"", name, "\" has a line break or a bad name"));
      }
      if (absl::EqualsIgnoreCase(name, "content-length") || absl::EqualsIgnoreCase(name, "host")) {
        continue;  // written here
      }
      has_content_type = has_content_type || absl::EqualsIgnoreCase(name, "content-type");
      absl::StrAppend(&wire, name, ": ", value, "\r\n");
    }
    const bool carries_body = !request.body.empty() || request.method == "POST" ||
                              request.method == "PUT" || request.method == "PATCH";
    if (!request.body.empty() && !has_content_type) {
      wire += "Content-Type: application/json\r\n";
    }
    if (carries_body) absl::StrAppend(&wire, "Content-Length: ", request.body.size(), "\r\n");
    wire += "\r\n";
    wire += request.body;
    return wire;
  }

  const TransportOptions options_;
  const Endpoint endpoint_;
  const SslCtxPtr ssl_;  // null for http
  absl::Mutex mu_;
  // Idle keep-alive connections, the most recently used last.
  std::vector<std::unique_ptr<Connection>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpTransport>> NewSocketTransport(const TransportOptions& options) {
  ASSIGN_OR_RETURN(Endpoint endpoint, ParseServer(options.server));
  if (options.client_cert_pem.empty() != options.client_key_pem.empty()) {
    return absl::InvalidArgumentError(
        "k8s client certificate and key must be given together (one of them is missing)");
  }
  SslCtxPtr ssl;
  // PEMs are checked at start even for an http server, so a mistake shows at once.
  if (endpoint.tls || !options.ca_pem.empty() || !options.client_cert_pem.empty()) {
    absl::StatusOr<SslCtxPtr> made = NewSslContext(options);
    if (!made.ok()) {
      return absl::Status(made.status().code(), absl::StrCat("k8s server \"", options.server,
                                                             "\": ", made.status().message()));
    }
    ssl = *std::move(made);
  }
  return std::unique_ptr<HttpTransport>(
      std::make_unique<SocketTransport>(options, std::move(endpoint), std::move(ssl)));
}

}  // namespace sbx::k8s

// The port proxy on Boost.Beast over Asio: the only file of src/gateway that sees Boost.
//
// One thread runs an io_context; every client connection is a Session (shared_ptr kept
// alive by its pending handlers). A session reads each request's header with Beast's
// parser (header limit, header timeout), checks framing and addressing, authorises the
// first request, dials the sandbox (port_dial.h through the daemon, or TCP to the pod),
// then forwards requests with Beast's serializer (bodies in 16 KiB pieces, chunked bodies
// re-chunked) and moves response bytes back unparsed. An Upgrade or CONNECT turns the
// connection into a tunnel: the parser and buffers are freed and both directions become
// pumps that wait for readability without a buffer (the proxy's one scratch buffer serves
// whichever socket is ready), so an idle tunnel costs two sockets, a timer and the
// session object, not buffers. Bytes a destination cannot take at once are kept in a
// buffer of that session until written (then freed), which also slows the source.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "src/allocator/allocator.h"
#include "src/common/port_dial.h"
#include "src/gateway/gateway.h"
#include "src/server/auth.h"
#include "src/server/port_token.h"

namespace sbx::gateway {

absl::Status ProxyOptions::Validate() const {
  if (header_timeout <= absl::ZeroDuration() || header_timeout > absl::Minutes(5)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "proxy header_timeout ", absl::FormatDuration(header_timeout), " is not in (0, 5m]"));
  }
  if (idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "proxy idle_timeout ", absl::FormatDuration(idle_timeout), " is not positive"));
  }
  if (max_header_bytes < 1024 || max_header_bytes > 1024 * 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("proxy max_header_bytes ", max_header_bytes, " is not in [1024, 1048576]"));
  }
  if (max_connections < 1 || max_connections_per_sandbox < 1 || max_connections_per_tenant < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("proxy connection limits must be at least 1 (max_connections ",
                     max_connections, ", per sandbox ", max_connections_per_sandbox,
                     ", per tenant ", max_connections_per_tenant, ")"));
  }
  if (max_bytes_per_second < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("proxy max_bytes_per_second ", max_bytes_per_second, " is negative"));
  }
  if (absl::StrContains(domain, "/") || absl::StartsWith(domain, ".")) {
    return absl::InvalidArgumentError(
        absl::StrCat("proxy domain \"", domain, "\" is not a DNS name (e.g. sbx.example.com)"));
  }
  return absl::OkStatus();
}

const char* ProxyRefusalName(ProxyRefusal r) {
  switch (r) {
    case ProxyRefusal::kBadRequest:
      return "bad_request";
    case ProxyRefusal::kUnauthenticated:
      return "unauthenticated";
    case ProxyRefusal::kForbidden:
      return "forbidden";
    case ProxyRefusal::kNotFound:
      return "not_found";
    case ProxyRefusal::kHeaderTimeout:
      return "header_timeout";
    case ProxyRefusal::kNotActive:
      return "not_active";
    case ProxyRefusal::kLimit:
      return "limit";
    case ProxyRefusal::kHeaderTooLarge:
      return "header_too_large";
    case ProxyRefusal::kUnreachable:
      return "unreachable";
    case ProxyRefusal::kOther:
      return "other";
  }
  return "other";
}

namespace {

ProxyRefusal RefusalOf(int code) {
  switch (code) {
    case 400:
      return ProxyRefusal::kBadRequest;
    case 401:
      return ProxyRefusal::kUnauthenticated;
    case 403:
      return ProxyRefusal::kForbidden;
    case 404:
      return ProxyRefusal::kNotFound;
    case 408:
      return ProxyRefusal::kHeaderTimeout;
    case 409:
      return ProxyRefusal::kNotActive;
    case 429:
      return ProxyRefusal::kLimit;
    case 431:
      return ProxyRefusal::kHeaderTooLarge;
    case 502:
      return ProxyRefusal::kUnreachable;
    default:
      return ProxyRefusal::kOther;
  }
}

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

constexpr size_t kPumpBytes = 256 * 1024;
constexpr int kMovesPerWake = 16;
constexpr size_t kSpliceBytes = 1 << 20;
constexpr std::chrono::seconds kLinger{1};
constexpr size_t kBodyPieceBytes = 16 * 1024;

struct Target {
  std::string claim_id;
  int port = 0;
  bool operator==(const Target&) const = default;
};

int HttpCode(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kFailedPrecondition:
      return 409;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return 502;
    default:
      return 500;
  }
}

bool ParsePort(absl::string_view s, int* port) {
  return !s.empty() && s.size() <= 5 && std::all_of(s.begin(), s.end(), absl::ascii_isdigit) &&
         absl::SimpleAtoi(s, port) && *port >= 1 && *port <= 65535;
}

// "PORT-CLAIM" of the host form.
absl::StatusOr<Target> FromLabel(absl::string_view label) {
  const size_t dash = label.find('-');
  Target t;
  if (dash == absl::string_view::npos || !ParsePort(label.substr(0, dash), &t.port) ||
      dash + 1 == label.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("host label \"", label, "\" is not PORT-CLAIM (e.g. 8000-my-claim)"));
  }
  t.claim_id = std::string(label.substr(dash + 1));
  return t;
}

// The claim label of `host` when it is "<label>.<domain>" (case-insensitive), else "".
std::string LabelOf(absl::string_view host, absl::string_view domain) {
  if (domain.empty()) return "";
  std::string h = absl::AsciiStrToLower(host);
  const std::string suffix = absl::StrCat(".", absl::AsciiStrToLower(domain));
  if (!absl::EndsWith(h, suffix)) return "";
  h.resize(h.size() - suffix.size());
  if (h.empty() || absl::StrContains(h, ".")) return "";
  return h;
}

absl::string_view StripPort(absl::string_view host) {
  const size_t colon = host.rfind(':');
  if (colon == absl::string_view::npos || host.find(']') != absl::string_view::npos) return host;
  return host.substr(0, colon);
}

// Where a request goes, and the target the sandbox should see (path form: without the
// prefix). INVALID_ARGUMENT / NOT_FOUND naming what is missing or wrong.
absl::StatusOr<Target> Address(const http::request<http::buffer_body>& req,
                               absl::string_view domain, std::string* new_target) {
  const absl::string_view target(req.target().data(), req.target().size());
  *new_target = std::string(target);
  if (req.method() == http::verb::connect) {
    const absl::string_view host = StripPort(target);
    if (std::string label = LabelOf(host, domain); !label.empty()) return FromLabel(label);
    const size_t colon = target.rfind(':');
    Target t;
    if (colon == absl::string_view::npos || !ParsePort(target.substr(colon + 1), &t.port) ||
        colon == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CONNECT target \"", target, "\" is neither PORT-CLAIM.", domain, ":N nor CLAIM:PORT"));
    }
    t.claim_id = std::string(target.substr(0, colon));
    return t;
  }
  constexpr absl::string_view kPrefix = "/_sbx/";
  if (absl::StartsWith(target, kPrefix)) {
    absl::string_view rest = target.substr(kPrefix.size());
    const size_t slash = rest.find('/');
    Target t;
    if (slash == absl::string_view::npos || slash == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("path \"", target, "\" is not /_sbx/CLAIM/PORT/..."));
    }
    t.claim_id = std::string(rest.substr(0, slash));
    rest = rest.substr(slash + 1);
    const size_t end = rest.find_first_of("/?");
    if (!ParsePort(rest.substr(0, end), &t.port)) {
      return absl::InvalidArgumentError(
          absl::StrCat("path \"", target, "\" names no port 1-65535 after the claim"));
    }
    const absl::string_view tail = end == absl::string_view::npos ? "" : rest.substr(end);
    *new_target = absl::StartsWith(tail, "/") ? std::string(tail) : absl::StrCat("/", tail);
    return t;
  }
  const auto host_it = req.find(http::field::host);
  if (host_it != req.end()) {
    const absl::string_view host(host_it->value().data(), host_it->value().size());
    if (std::string label = LabelOf(StripPort(host), domain); !label.empty()) {
      return FromLabel(label);
    }
  }
  return absl::NotFoundError(
      absl::StrCat("the request names no sandbox port: use the host PORT-CLAIM.",
                   domain.empty() ? "<domain> (not configured here)" : std::string(domain),
                   " or the path /_sbx/CLAIM/PORT/..."));
}

// Removes every sbx_token=... from the query of `target`; returns the last one's value.
std::string TakeQueryToken(std::string* target) {
  const size_t q = target->find('?');
  if (q == std::string::npos) return "";
  std::vector<std::string> kept;
  std::string token;
  for (absl::string_view p : absl::StrSplit(absl::string_view(*target).substr(q + 1), '&')) {
    if (absl::StartsWith(p, "sbx_token=")) {
      token = std::string(p.substr(10));
    } else {
      kept.emplace_back(p);
    }
  }
  target->resize(q);
  if (!kept.empty()) absl::StrAppend(target, "?", absl::StrJoin(kept, "&"));
  return token;
}

class ProxyImpl;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(ProxyImpl* proxy, tcp::socket client);
  ~Session();
  // `handoff`: a connection adopted from another front (PortProxy::Adopt); its bytes
  // already read are parsed first.
  void Start(std::optional<HandOff> handoff = std::nullopt);

 private:
  void ArmTimer();
  void OnTimer();
  void Touch() { last_active_ = Clock::now(); }
  void ReadHeader();
  void OnHeader(error_code ec);
  absl::StatusOr<std::string> Authorize(const Target& t, std::string* new_target);
  // Address of a request on an adopted connection: the target it was handed with; a
  // later request must be admitted (HandOff::admit_later).
  absl::StatusOr<Target> HandOffAddress(std::string* new_target);
  // Removes HandOff::strip_headers from the request.
  void StripHandOffHeaders();
  void Dial(const store::ClaimRecord& claim);
  void DialDaemon(const std::string& path, const std::string& sandbox_id);
  void OnDaemonAnswer();
  void OnUpstream();
  void Forward();
  void BodyStep();
  void OnBodyWritten(error_code ec);
  void RequestDone();
  void EnterTunnel();
  // Moves bytes from `from` to `to` as they come (see the file comment). `down`: from the
  // sandbox to the client.
  void Pump(bool down);
  // Pump's work once `from` is readable.
  void Move(bool down);
  // Move for a bulk transfer: splice(2) through a pipe of the session (made by OpenPipe,
  // false when none can be made).
  void Splice(bool down);
  bool OpenPipe(bool down);
  // The per-connection rate limit (ProxyOptions::max_bytes_per_second), per direction: the
  // bytes `down` may move now (SIZE_MAX without a limit), what moved, and, when nothing may
  // move, a wait for the bucket before `then` (true when waiting).
  size_t Allowance(bool down);
  void Spend(bool down, size_t n);
  bool Throttle(bool down, std::function<void()> then);
  // The source of one direction read EOF.
  void SourceEnded(bool down);
  void Reply(int code, const std::string& message, bool linger = true);
  void Linger();
  void DrainClient();
  void Fail(const absl::Status& s) {
    Reply(HttpCode(s), s.message().empty() ? "" : std::string(s.message()));
  }
  void Close();
  // Closed, or answering by itself (a dial or header read that completes now is dropped).
  bool Gone() const { return closed_ || replying_; }

  ProxyImpl* const proxy_;
  tcp::socket client_;
  tcp::socket upstream_;
  std::optional<asio::local::stream_protocol::socket> dial_;
  asio::steady_timer timer_;
  Clock::time_point last_active_;
  Clock::time_point header_deadline_;
  bool in_header_ = true;  // waiting for a request header (or the dial): header deadline
  bool closed_ = false;
  bool lingering_ = false;
  bool replying_ = false;  // an answer of our own is on its way: nothing else may start  //
                           // answered; draining the client until it closes (kLinger)
  bool pinned_ = false;    // upstream open for target_
  bool tunnel_ = false;
  bool up_done_ = false, down_done_ = false;  // half-closes in a tunnel
  Target target_;
  std::string new_target_;
  std::optional<HandOff> handoff_;   // set for an adopted connection
  std::string sandbox_id_, tenant_;  // set once counted against the limits
  bool counted_ = false;
  std::optional<beast::flat_buffer> inbuf_;
  std::optional<http::request_parser<http::buffer_body>> parser_;
  std::optional<http::request_serializer<http::buffer_body>> serializer_;
  std::unique_ptr<char[]> body_piece_;
  std::string out_;               // a reply, a dial request, CONNECT's 200
  std::vector<char> pending_[2];  // [down]: bytes the destination has not taken yet
  struct Pipe {
    int r = -1, w = -1;
    size_t held = 0;  // bytes in it
  };
  Pipe pipes_[2];  // [down]: only for bulk transfers
  struct Bucket {
    double tokens = -1;  // bytes that may move now; < 0 until first used (then full)
    Clock::time_point at;
    std::optional<asio::steady_timer> wait;  // made only when a connection is slowed
  };
  Bucket buckets_[2];  // [down], with a rate limit only
};

class ProxyImpl final : public PortProxy {
 public:
  ProxyImpl(ProxyOptions options, ProxyDeps deps)
      : options_(std::move(options)), deps_(std::move(deps)), acceptor_(io_) {
    counters_ = deps_.counters != nullptr ? deps_.counters : &own_counters_;
  }
  ~ProxyImpl() override { Shutdown(); }

  absl::Status Bind() {
    const size_t colon = options_.listen.rfind(':');
    int port = 0;
    if (colon == std::string::npos ||
        !absl::SimpleAtoi(absl::string_view(options_.listen).substr(colon + 1), &port) ||
        port < 0 || port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("proxy listen \"", options_.listen, "\" is not host:port"));
    }
    std::string host = options_.listen.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    if (host.empty()) host = "0.0.0.0";
    error_code ec;
    const asio::ip::address addr = asio::ip::make_address(host, ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("proxy listen \"", options_.listen, "\": \"",
                                                     host, "\" is not an IP address"));
    }
    const tcp::endpoint ep(addr, static_cast<uint16_t>(port));
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("cannot listen on \"", options_.listen,
                                                 "\" for the port proxy: ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    thread_ = std::thread([this] { io_.run(); });
    spdlog::info("port proxy listening on {} (port {}){}", options_.listen, port_,
                 options_.domain.empty() ? "" : absl::StrCat(", host form *.", options_.domain));
    return absl::OkStatus();
  }

  int port() const override { return port_; }
  int connections() const override {
    return static_cast<int>(counters_->open.load(std::memory_order_relaxed));
  }

  void Adopt(HandOff connection) override {
    // Owns the fd until a session does: a handler the io_context destroys unrun (the proxy
    // shutting down) closes it.
    auto owned = std::make_shared<HandOff>(std::move(connection));
    std::shared_ptr<int> fd(new int(owned->fd), [](int* p) {
      if (*p >= 0) ::close(*p);
      delete p;
    });
    asio::post(io_, [this, owned, fd] {
      counters_->accepted.fetch_add(1, std::memory_order_relaxed);
      if (counters_->open.load(std::memory_order_relaxed) >= options_.max_connections) {
        counters_->refused[static_cast<int>(ProxyRefusal::kLimit)].fetch_add(
            1, std::memory_order_relaxed);
        return;  // closed with `fd`
      }
      int domain = 0;
      socklen_t len = sizeof(domain);
      if (::getsockopt(*fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0 ||
          (domain != AF_INET && domain != AF_INET6)) {
        return;
      }
      tcp::socket socket(io_);
      error_code ec;
      socket.assign(domain == AF_INET ? tcp::v4() : tcp::v6(), *fd, ec);
      if (ec) return;
      *fd = -1;  // the socket's now
      socket.non_blocking(false, ec);
      std::make_shared<Session>(this, std::move(socket))->Start(std::move(*owned));
    });
  }
  ProxyCounters& counters() { return *counters_; }

  void Shutdown() override {
    if (!thread_.joinable()) return;
    asio::post(io_, [this] {
      error_code ec;
      acceptor_.close(ec);
    });
    io_.stop();
    thread_.join();
  }

  // Counts a connection against the sandbox's and the tenant's limits;
  // RESOURCE_EXHAUSTED naming the limit.
  absl::Status Acquire(const std::string& sandbox, const std::string& tenant)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    const auto s = per_sandbox_.find(sandbox);
    const auto t = per_tenant_.find(tenant);
    const int in_sandbox = s == per_sandbox_.end() ? 0 : s->second;
    const int of_tenant = t == per_tenant_.end() ? 0 : t->second;
    if (in_sandbox >= options_.max_connections_per_sandbox) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "sandbox \"", sandbox, "\" has ", in_sandbox, " proxied connections open; at most ",
          options_.max_connections_per_sandbox, " (--proxy_max_connections_per_sandbox)"));
    }
    if (of_tenant >= options_.max_connections_per_tenant) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant \"", tenant, "\" has ", of_tenant, " proxied connections open; at most ",
          options_.max_connections_per_tenant, " (--proxy_max_connections_per_tenant)"));
    }
    ++per_sandbox_[sandbox];
    ++per_tenant_[tenant];
    return absl::OkStatus();
  }
  void Release(const std::string& sandbox, const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (auto it = per_sandbox_.find(sandbox); it != per_sandbox_.end() && --it->second <= 0) {
      per_sandbox_.erase(it);
    }
    if (auto it = per_tenant_.find(tenant); it != per_tenant_.end() && --it->second <= 0) {
      per_tenant_.erase(it);
    }
  }

  const ProxyOptions& options() const { return options_; }
  // The pumps' scratch buffer: one, since one thread runs every session (not a
  // thread_local: that would put it in every thread's static TLS, gRPC's and civetweb's
  // small-stack threads included).
  char* scratch() { return scratch_.get(); }
  const ProxyDeps& deps() const { return deps_; }
  asio::io_context& io() { return io_; }

 private:
  void Accept() {
    acceptor_.async_accept([this](error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) {
        counters_->accepted.fetch_add(1, std::memory_order_relaxed);
        if (counters_->open.load(std::memory_order_relaxed) >= options_.max_connections) {
          counters_->refused[static_cast<int>(ProxyRefusal::kLimit)].fetch_add(
              1, std::memory_order_relaxed);
          error_code ignored;
          socket.close(ignored);  // over the total: refused before reading anything
        } else {
          std::make_shared<Session>(this, std::move(socket))->Start();
        }
      }
      Accept();
    });
  }

  const ProxyOptions options_;
  const ProxyDeps deps_;
  ProxyCounters own_counters_;
  ProxyCounters* counters_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> per_sandbox_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> per_tenant_ ABSL_GUARDED_BY(mu_);
  int port_ = 0;
  const std::unique_ptr<char[]> scratch_ = std::make_unique<char[]>(kPumpBytes);
  // Declared after what sessions use: destroyed first, with the sessions its handlers hold.
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  std::thread thread_;
};

Session::Session(ProxyImpl* proxy, tcp::socket client)
    : proxy_(proxy), client_(std::move(client)), upstream_(proxy->io()), timer_(proxy->io()) {
  proxy_->counters().open.fetch_add(1, std::memory_order_relaxed);
}

Session::~Session() {
  for (Pipe& p : pipes_) {
    if (p.r >= 0) ::close(p.r);
    if (p.w >= 0) ::close(p.w);
  }
  if (counted_) proxy_->Release(sandbox_id_, tenant_);
  proxy_->counters().open.fetch_sub(1, std::memory_order_relaxed);
}

void Session::Start(std::optional<HandOff> handoff) {
  error_code ec;
  client_.set_option(tcp::no_delay(true), ec);
  Touch();
  header_deadline_ = Clock::now() + absl::ToChronoNanoseconds(proxy_->options().header_timeout);
  inbuf_.emplace();
  if (handoff.has_value()) {
    handoff_ = std::move(handoff);
    const std::string& read = handoff_->read;
    if (!read.empty()) {
      const auto room = inbuf_->prepare(read.size());
      std::memcpy(room.data(), read.data(), read.size());
      inbuf_->commit(read.size());
    }
    handoff_->read = std::string();
  }
  ArmTimer();
  ReadHeader();
}

void Session::ArmTimer() {
  timer_.expires_at(in_header_
                        ? header_deadline_
                        : last_active_ + absl::ToChronoNanoseconds(proxy_->options().idle_timeout));
  timer_.async_wait([self = shared_from_this()](error_code ec) {
    if (ec != asio::error::operation_aborted) self->OnTimer();
  });
}

void Session::OnTimer() {
  if (closed_) return;
  if (lingering_) return Close();
  const Clock::time_point idle =
      last_active_ + absl::ToChronoNanoseconds(proxy_->options().idle_timeout);
  // Waiting for the next request on a kept-alive connection, the previous response may
  // still be flowing (a slow client, a rate limit): idle only once nothing has moved for
  // the idle timeout, whatever the time since that request ended.
  const Clock::time_point deadline = !in_header_ ? idle
                                     : pinned_   ? std::max(header_deadline_, idle)
                                                 : header_deadline_;
  if (Clock::now() < deadline) return ArmTimer();
  if (in_header_ && !pinned_) {
    // Slowloris, or a dial that did not finish: nothing reached the sandbox.
    // The header read is still pending: no lingering (a slow client may see a reset).
    return Reply(408, "the request header did not arrive within the header timeout",
                 /*linger=*/false);
  }
  Close();
}

void Session::ReadHeader() {
  parser_.emplace();
  parser_->header_limit(proxy_->options().max_header_bytes);
  parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
  http::async_read_header(
      client_, *inbuf_, *parser_,
      [self = shared_from_this()](error_code ec, size_t) { self->OnHeader(ec); });
}

void Session::OnHeader(error_code ec) {
  if (Gone()) return;
  if (ec) {
    if (ec == http::error::header_limit) {
      return Reply(431, absl::StrCat("the request header is larger than ",
                                     proxy_->options().max_header_bytes, " bytes"));
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
      return Close();
    }
    // Beast refuses, among others, a second Content-Length and Content-Length together
    // with chunked (bad_content_length / bad_transfer_encoding).
    return Reply(400, absl::StrCat("malformed request: ", ec.message()));
  }
  Touch();
  http::request<http::buffer_body>& req = parser_->get();
  // Framing the sandbox's server could read otherwise than this parser (request
  // smuggling): refused whether or not Beast caught it.
  const size_t lengths = req.count(http::field::content_length);
  const size_t encodings = req.count(http::field::transfer_encoding);
  if (lengths > 1) return Reply(400, "several Content-Length fields");
  if (lengths > 0 && encodings > 0) {
    return Reply(400, "both Content-Length and Transfer-Encoding");
  }
  if (encodings > 1 || (encodings == 1 && !parser_->chunked())) {
    return Reply(400, "a Transfer-Encoding other than a single \"chunked\"");
  }
  std::string new_target;
  absl::StatusOr<Target> t = handoff_.has_value()
                                 ? HandOffAddress(&new_target)
                                 : Address(req, proxy_->options().domain, &new_target);
  if (!t.ok()) return pinned_ ? Close() : Fail(t.status());
  if (pinned_) {
    // A kept-alive connection stays with its claim and port; credentials are stripped as
    // on the first request.
    if (!(*t == target_)) return Close();
    if (handoff_.has_value()) StripHandOffHeaders();
    TakeQueryToken(&new_target);
    req.erase("X-Sbx-Token");
    req.erase(http::field::proxy_authorization);
    const auto auth = req.find(http::field::authorization);
    if (auth != req.end() && proxy_->deps().auth->Authenticate(std::string(auth->value())).ok()) {
      req.erase(http::field::authorization);
    }
    new_target_ = std::move(new_target);
    in_header_ = false;
    ArmTimer();
    return Forward();
  }
  absl::StatusOr<std::string> owner = Authorize(*t, &new_target);
  if (!owner.ok()) return Fail(owner.status());
  absl::StatusOr<store::ClaimRecord> claim =
      proxy_->deps().allocator->GetClaim(*owner, t->claim_id);
  if (!claim.ok()) {
    return Fail(absl::NotFoundError(absl::StrCat("claim \"", t->claim_id, "\" not found")));
  }
  if (claim->state != store::ClaimState::kActive || claim->suspended) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "claim \"", t->claim_id, "\" is ", claim->suspended ? "suspended" : "not active")));
  }
  if (absl::Status s = proxy_->Acquire(claim->sandbox_id, *owner); !s.ok()) return Fail(s);
  counted_ = true;
  sandbox_id_ = claim->sandbox_id;
  tenant_ = *owner;
  target_ = *t;
  new_target_ = std::move(new_target);
  Dial(*claim);
}

absl::StatusOr<Target> Session::HandOffAddress(std::string* new_target) {
  const http::request<http::buffer_body>& req = parser_->get();
  *new_target = std::string(req.target());
  const Target handed{handoff_->claim_id, handoff_->port};
  if (!pinned_) return handed;
  std::vector<std::pair<std::string, std::string>> fields;
  for (const auto& f : req) {
    fields.emplace_back(absl::AsciiStrToLower(std::string(f.name_string())),
                        std::string(f.value()));
  }
  if (!handoff_->admit_later || !handoff_->admit_later(fields)) {
    return absl::PermissionDeniedError(
        "a later request on the connection is for another target or caller");
  }
  return handed;
}

void Session::StripHandOffHeaders() {
  http::request<http::buffer_body>& req = parser_->get();
  for (const std::string& name : handoff_->strip_headers) req.erase(name);
}

absl::StatusOr<std::string> Session::Authorize(const Target& t, std::string* new_target) {
  http::request<http::buffer_body>& req = parser_->get();
  if (handoff_.has_value()) {
    // Authenticated by the front that accepted the connection; ownership is checked next.
    StripHandOffHeaders();
    return handoff_->tenant;
  }
  std::string url_token = TakeQueryToken(new_target);
  if (auto it = req.find("X-Sbx-Token"); it != req.end()) {
    if (url_token.empty()) url_token = std::string(it->value());
    req.erase("X-Sbx-Token");
  }
  const server::Authenticator& auth = *proxy_->deps().auth;
  std::optional<absl::Status> bearer_error;
  for (http::field f : {http::field::proxy_authorization, http::field::authorization}) {
    const auto it = req.find(f);
    if (it == req.end()) continue;
    const std::string value(it->value());
    absl::StatusOr<server::Caller> caller = auth.Authenticate(value);
    if (caller.ok()) {
      req.erase(f);  // the tenant's token never reaches the sandbox
      return caller->tenant;
    }
    if (f == http::field::proxy_authorization) req.erase(f);
    bearer_error = caller.status();
  }
  if (!url_token.empty()) {
    absl::StatusOr<server::PortGrant> grant = proxy_->deps().tokens->Verify(url_token, absl::Now());
    if (!grant.ok()) return grant.status();
    if (grant->claim_id != t.claim_id || grant->port != t.port) {
      return absl::PermissionDeniedError(
          absl::StrCat("the port URL token is for another claim or port, not claim \"", t.claim_id,
                       "\" port ", t.port));
    }
    return grant->owner;
  }
  if (auth.insecure()) return std::string(server::kAnonymousTenant);
  if (bearer_error.has_value()) return *bearer_error;
  return absl::UnauthenticatedError(
      "no credential: send Authorization: Bearer <tenant token>, or a port URL token "
      "(?sbx_token= or X-Sbx-Token; SandboxService.GetPortUrl, `sbx url`)");
}

void Session::Dial(const store::ClaimRecord& claim) {
  const std::string& ep = claim.endpoint;
  if (absl::StartsWith(ep, "unix:")) return DialDaemon(ep.substr(5), claim.sandbox_id);
  const size_t colon = ep.rfind(':');
  error_code ec;
  asio::ip::address addr;
  if (colon != std::string::npos && !absl::StartsWith(ep, "instant:")) {
    std::string host = ep.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
    addr = asio::ip::make_address(host, ec);
  }
  if (colon == std::string::npos || absl::StartsWith(ep, "instant:") || ec) {
    return Fail(absl::FailedPreconditionError(
        absl::StrCat("the sandbox of claim \"", claim.id,
                     "\" has no endpoint a port can be reached at (\"", ep, "\")")));
  }
  // Kubernetes: the daemon's address is the pod's; the port is on the same IP.
  upstream_.async_connect(
      tcp::endpoint(addr, static_cast<uint16_t>(target_.port)),
      [self = shared_from_this()](error_code ec) {
        if (self->Gone()) return;
        if (ec) {
          return self->Fail(absl::UnavailableError(absl::StrCat(
              "cannot connect to port ", self->target_.port, " of the sandbox: ", ec.message())));
        }
        self->OnUpstream();
      });
}

void Session::DialDaemon(const std::string& path, const std::string& sandbox_id) {
  const auto& secret_of = proxy_->deps().sandbox_secret;
  out_ =
      EncodePortDial(secret_of ? secret_of(sandbox_id) : "", static_cast<uint16_t>(target_.port));
  dial_.emplace(proxy_->io());
  dial_->async_connect(
      asio::local::stream_protocol::endpoint(path), [self = shared_from_this()](error_code ec) {
        if (self->Gone()) return;
        if (ec) {
          return self->Fail(absl::UnavailableError(
              absl::StrCat("the sandbox's daemon cannot be reached: ", ec.message())));
        }
        asio::async_write(*self->dial_, asio::buffer(self->out_), [self](error_code ec, size_t) {
          if (self->Gone()) return;
          if (ec) {
            return self->Fail(absl::UnavailableError(
                absl::StrCat("the sandbox's daemon cannot be reached: ", ec.message())));
          }
          self->dial_->async_wait(asio::socket_base::wait_read, [self](error_code ec) {
            if (self->Gone()) return;
            if (ec) return self->Close();
            self->OnDaemonAnswer();
          });
        });
      });
}

void Session::OnDaemonAnswer() {
  char buf[3 + kMaxPortDialMessageBytes];
  iovec iov{buf, sizeof(buf)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = ::recvmsg(dial_->native_handle(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  int fd = -1;
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS &&
        cm->cmsg_len == CMSG_LEN(sizeof(int))) {
      std::memcpy(&fd, CMSG_DATA(cm), sizeof(int));
    }
  }
  error_code ignored;
  dial_->close(ignored);
  dial_.reset();
  if (n <= 0 || buf[0] != static_cast<char>(kPortDialOk) || fd < 0) {
    if (fd >= 0) ::close(fd);
    std::string why = "the daemon closed the connection";
    if (n >= 3 && buf[0] == static_cast<char>(kPortDialError)) {
      const size_t len = (static_cast<uint8_t>(buf[1]) << 8) | static_cast<uint8_t>(buf[2]);
      why = std::string(buf + 3, std::min<size_t>(len, static_cast<size_t>(n) - 3));
    }
    return Fail(absl::UnavailableError(
        absl::StrCat("port ", target_.port, " of the sandbox cannot be reached: ", why)));
  }
  // The daemon lives in a hostile sandbox: take only a TCP stream socket from it.
  int domain = 0, type = 0;
  socklen_t len = sizeof(int);
  const bool inet = ::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 &&
                    (domain == AF_INET || domain == AF_INET6);
  len = sizeof(int);
  if (!inet || ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) {
    ::close(fd);
    return Fail(
        absl::UnavailableError("the sandbox's daemon passed something else than a TCP socket"));
  }
  error_code ec;
  upstream_.assign(domain == AF_INET ? tcp::v4() : tcp::v6(), fd, ec);
  if (ec) {
    ::close(fd);
    return Fail(absl::InternalError(ec.message()));
  }
  OnUpstream();
}

void Session::OnUpstream() {
  pinned_ = true;
  proxy_->counters().forwarded.fetch_add(1, std::memory_order_relaxed);
  in_header_ = false;
  error_code ec;
  upstream_.set_option(tcp::no_delay(true), ec);
  // The pumps read and write without blocking; Asio's own operations work either way.
  upstream_.non_blocking(true, ec);
  client_.non_blocking(true, ec);
  Touch();
  ArmTimer();
  if (parser_->get().method() == http::verb::connect) {
    out_ = "HTTP/1.1 200 Connection Established\r\n\r\n";
    asio::async_write(client_, asio::buffer(out_),
                      [self = shared_from_this()](error_code ec, size_t) {
                        if (self->closed_) return;
                        if (ec) return self->Close();
                        self->out_.clear();
                        self->out_.shrink_to_fit();
                        self->EnterTunnel();
                        self->Pump(true);
                      });
    return;
  }
  Pump(true);
  Forward();
}

void Session::Forward() {
  http::request<http::buffer_body>& req = parser_->get();
  req.target(new_target_);
  serializer_.emplace(req);
  if (parser_->upgrade()) {
    // Upgrade requests carry no body: the header, then a tunnel.
    req.body().data = nullptr;
    req.body().size = 0;
    req.body().more = false;
    return http::async_write(upstream_, *serializer_,
                             [self = shared_from_this()](error_code ec, size_t) {
                               if (self->closed_) return;
                               if (ec && ec != http::error::need_buffer) return self->Close();
                               self->EnterTunnel();
                             });
  }
  if (!body_piece_) body_piece_ = std::make_unique<char[]>(kBodyPieceBytes);
  BodyStep();
}

// One step of Beast's relay: read a piece of the body (if any is left), write it.
void Session::BodyStep() {
  http::request<http::buffer_body>& req = parser_->get();
  if (parser_->is_done()) {
    req.body().data = nullptr;
    req.body().size = 0;
    req.body().more = false;
    return http::async_write(
        upstream_, *serializer_,
        [self = shared_from_this()](error_code ec, size_t) { self->OnBodyWritten(ec); });
  }
  if (Throttle(false, [self = shared_from_this()] { self->BodyStep(); })) return;
  const size_t piece = std::min(kBodyPieceBytes, Allowance(false));
  req.body().data = body_piece_.get();
  req.body().size = piece;
  http::async_read(client_, *inbuf_, *parser_,
                   [self = shared_from_this(), piece](error_code ec, size_t) {
                     if (self->closed_) return;
                     if (ec == http::error::need_buffer) ec = {};
                     if (ec) return self->Close();
                     self->Touch();
                     http::request<http::buffer_body>& req = self->parser_->get();
                     req.body().size = piece - req.body().size;
                     self->Spend(false, req.body().size);
                     req.body().data = self->body_piece_.get();
                     req.body().more = !self->parser_->is_done();
                     http::async_write(self->upstream_, *self->serializer_,
                                       [self](error_code ec, size_t) { self->OnBodyWritten(ec); });
                   });
}

void Session::OnBodyWritten(error_code ec) {
  if (closed_) return;
  if (ec == http::error::need_buffer) ec = {};
  if (ec) return Close();
  Touch();
  if (!serializer_->is_done()) return BodyStep();
  RequestDone();
}

void Session::RequestDone() {
  const bool keep_alive = parser_->get().keep_alive();
  serializer_.reset();
  parser_.reset();
  if (!keep_alive) {
    // No more requests: the response ends the connection, or the client leaving does (an
    // upstream that ignores "Connection: close" must not hold the session until it is
    // idle). Bytes after such a request end it too.
    client_.async_wait(tcp::socket::wait_read,
                       [self = shared_from_this()](error_code) { self->Close(); });
    return;
  }
  // The next request on this connection: as long as the connection may stay idle.
  in_header_ = true;
  header_deadline_ = Clock::now() + absl::ToChronoNanoseconds(proxy_->options().idle_timeout);
  ArmTimer();
  ReadHeader();
}

void Session::EnterTunnel() {
  tunnel_ = true;
  serializer_.reset();
  parser_.reset();
  body_piece_.reset();
  // What the client sent after the header already (a WebSocket's first frames).
  std::vector<char>& up = pending_[0];
  if (inbuf_ && inbuf_->size() > 0) {
    const auto data = inbuf_->data();
    up.assign(static_cast<const char*>(data.data()),
              static_cast<const char*>(data.data()) + data.size());
  }
  inbuf_.reset();
  if (up.empty()) return Pump(false);
  asio::async_write(upstream_, asio::buffer(up),
                    [self = shared_from_this()](error_code ec, size_t) {
                      if (self->closed_) return;
                      if (ec) return self->Close();
                      self->pending_[0] = {};
                      self->Pump(false);
                    });
}

size_t Session::Allowance(bool down) {
  const int64_t rate = proxy_->options().max_bytes_per_second;
  if (rate <= 0) return SIZE_MAX;
  Bucket& b = buckets_[down ? 1 : 0];
  const auto now = Clock::now();
  const double burst = static_cast<double>(rate);
  if (b.tokens < 0) {
    b.tokens = burst;
  } else {
    b.tokens = std::min(burst, b.tokens + std::chrono::duration<double>(now - b.at).count() *
                                              static_cast<double>(rate));
  }
  b.at = now;
  return b.tokens < 1 ? 0 : static_cast<size_t>(b.tokens);
}

void Session::Spend(bool down, size_t n) {
  if (proxy_->options().max_bytes_per_second <= 0) return;
  buckets_[down ? 1 : 0].tokens -= static_cast<double>(n);
}

bool Session::Throttle(bool down, std::function<void()> then) {
  if (Allowance(down) > 0) return false;
  Bucket& b = buckets_[down ? 1 : 0];
  const double rate = static_cast<double>(proxy_->options().max_bytes_per_second);
  // Until one whole byte's worth (at least a millisecond: no busy loop at high rates).
  const double seconds = std::max((1 - b.tokens) / rate, 0.001);
  if (!b.wait) b.wait.emplace(proxy_->io());
  b.wait->expires_after(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
  b.wait->async_wait([self = shared_from_this(), then = std::move(then)](error_code ec) {
    if (self->closed_ || ec) return;
    self->Touch();  // slowed by us, not idle
    then();
  });
  return true;
}

void Session::Pump(bool down) {
  if (Throttle(down, [self = shared_from_this(), down] { self->Pump(down); })) return;
  tcp::socket& from = down ? upstream_ : client_;
  from.async_wait(tcp::socket::wait_read, [self = shared_from_this(), down](error_code ec) {
    if (self->closed_) return;
    if (ec) return self->Close();
    self->Move(down);
  });
}

void Session::Move(bool down) {
  if (pipes_[down ? 1 : 0].r >= 0) return Splice(down);
  char* const scratch = proxy_->scratch();
  tcp::socket& from = down ? upstream_ : client_;
  tcp::socket& to = down ? client_ : upstream_;
  // Several reads per wake-up while the source has more (a download), so that a busy
  // stream does not pay a poll per piece; bounded so that one stream cannot hold the thread.
  for (int round = 0; round < kMovesPerWake; ++round) {
    const size_t want = std::min(kPumpBytes, Allowance(down));
    if (want == 0) break;  // Pump waits for the rate limit
    error_code ec;
    const size_t n = from.read_some(asio::buffer(scratch, want), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) break;
    if (ec == asio::error::eof) return SourceEnded(down);
    if (ec) return Close();
    Touch();
    Spend(down, n);
    size_t written = to.write_some(asio::buffer(scratch, n), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) {
      written = 0;
    } else if (ec) {
      return Close();
    }
    if (written < n) {
      std::vector<char>& rest = pending_[down ? 1 : 0];
      rest.assign(scratch + written, scratch + n);
      asio::async_write(to, asio::buffer(rest),
                        [self = shared_from_this(), down](error_code ec, size_t) {
                          if (self->closed_) return;
                          if (ec) return self->Close();
                          self->Touch();
                          self->pending_[down ? 1 : 0] = {};
                          self->Pump(down);
                        });
      return;
    }
    if (n < want) break;  // the source is most likely empty now
    // A bulk transfer: from here on the kernel moves its pages (splice), without copies.
    if (OpenPipe(down)) return Splice(down);
  }
  Pump(down);
}

void Session::SourceEnded(bool down) {
  if (!tunnel_) return Close();  // the response ended the connection
  error_code ignored;
  (down ? client_ : upstream_).shutdown(tcp::socket::shutdown_send, ignored);
  (down ? down_done_ : up_done_) = true;
  if (down_done_ && up_done_) Close();
}

bool Session::OpenPipe(bool down) {
  Pipe& p = pipes_[down ? 1 : 0];
  if (p.r >= 0) return true;
  int fds[2];
  if (::pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return false;  // copying still works
  ::fcntl(fds[1], F_SETPIPE_SZ, static_cast<int>(kSpliceBytes));
  p.r = fds[0];
  p.w = fds[1];
  return true;
}

void Session::Splice(bool down) {
  Pipe& p = pipes_[down ? 1 : 0];
  const int in = (down ? upstream_ : client_).native_handle();
  tcp::socket& to = down ? client_ : upstream_;
  for (int round = 0; round < kMovesPerWake; ++round) {
    if (p.held == 0) {
      const size_t want = std::min(kSpliceBytes, Allowance(down));
      if (want == 0) break;  // Pump waits for the rate limit
      const ssize_t n =
          ::splice(in, nullptr, p.w, nullptr, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n == 0) return SourceEnded(down);
      if (n < 0) return Close();
      p.held = static_cast<size_t>(n);
      Touch();
      Spend(down, p.held);
    }
    while (p.held > 0) {
      const ssize_t m = ::splice(p.r, nullptr, to.native_handle(), nullptr, p.held,
                                 SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (m < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        // The destination is full: the bytes wait in the pipe (bounded by its size), and
        // the source is not read until they are gone.
        to.async_wait(tcp::socket::wait_write, [self = shared_from_this(), down](error_code ec) {
          if (self->closed_) return;
          if (ec) return self->Close();
          self->Splice(down);
        });
        return;
      }
      if (m <= 0) return Close();
      p.held -= static_cast<size_t>(m);
    }
  }
  Pump(down);
}

void Session::Reply(int code, const std::string& message, bool linger) {
  if (Gone()) return;
  if (pinned_) return Close();  // bytes of the sandbox may already be on their way
  replying_ = true;
  if (dial_) {
    error_code ignored;
    dial_->close(ignored);
  }
  proxy_->counters().refused[static_cast<int>(RefusalOf(code))].fetch_add(
      1, std::memory_order_relaxed);
  http::response<http::string_body> res{static_cast<http::status>(code), 11};
  res.set(http::field::server, "sbx");
  res.set(http::field::content_type, "text/plain; charset=utf-8");
  res.set(http::field::connection, "close");
  if (code == 401) res.set(http::field::www_authenticate, "Bearer");
  res.body() = message + "\n";
  res.prepare_payload();
  std::ostringstream os;
  os << res;
  out_ = os.str();
  parser_.reset();
  asio::async_write(client_, asio::buffer(out_),
                    [self = shared_from_this(), linger](error_code ec, size_t) {
                      error_code ignored;
                      self->client_.shutdown(tcp::socket::shutdown_send, ignored);
                      if (ec || !linger) return self->Close();
                      self->Linger();
                    });
}

// After an answer of our own the client may still be sending (a body we refused): closing
// now would reset the connection and could destroy the answer before the client read it.
// So read and discard until the client closes, for at most kLinger.
void Session::Linger() {
  lingering_ = true;
  in_header_ = true;
  header_deadline_ = Clock::now() + kLinger;
  ArmTimer();
  error_code ignored;
  client_.non_blocking(true, ignored);
  DrainClient();
}

void Session::DrainClient() {
  client_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
    if (self->closed_) return;
    if (ec) return self->Close();
    while (true) {
      error_code e;
      const size_t n =
          self->client_.read_some(asio::buffer(self->proxy_->scratch(), kPumpBytes), e);
      if (e == asio::error::would_block || e == asio::error::try_again) {
        return self->DrainClient();
      }
      if (e || n == 0) return self->Close();
    }
  });
}

void Session::Close() {
  if (closed_) return;
  closed_ = true;
  error_code ignored;
  client_.close(ignored);
  upstream_.close(ignored);
  if (dial_) dial_->close(ignored);
  timer_.cancel();
  for (Bucket& b : buckets_) {
    if (b.wait) b.wait->cancel();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<PortProxy>> PortProxy::Start(const ProxyOptions& options,
                                                            ProxyDeps deps) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (deps.allocator == nullptr || deps.auth == nullptr || deps.tokens == nullptr) {
    return absl::InvalidArgumentError(
        "the port proxy needs an allocator, an authenticator and tokens");
  }
  auto proxy = std::make_unique<ProxyImpl>(options, std::move(deps));
  if (absl::Status s = proxy->Bind(); !s.ok()) return s;
  return proxy;
}

}  // namespace sbx::gateway

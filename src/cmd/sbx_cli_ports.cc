// `sbx url`: a signed URL of a port inside a claimed sandbox (SandboxService.GetPortUrl,
// through sbx-server's port proxy). `sbx port-forward`: a local port whose connections
// go to a port inside the sandbox, each through the proxy as a CONNECT tunnel under a
// fresh URL token.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "src/cmd/sbx_cli_commands.h"
#include "src/common/errno_text.h"

namespace sbx::cli {
namespace {

struct UrlArgs {
  std::string id;
  int port = 0;
  std::string ttl;
  bool host_form = false;
};

absl::StatusOr<int> RunUrl(Context& ctx, const UrlArgs& a) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::GetPortUrlRequest req;
  req.set_claim_id(a.id);
  req.set_port(a.port);
  if (!a.ttl.empty()) ToProto(ParseDurationFlag(a.ttl), req.mutable_ttl());
  v1::GetPortUrlResponse resp;
  absl::Status status = client.Call(
      [&](grpc::ClientContext* c) { return client.sandboxes().GetPortUrl(c, req, &resp); });
  if (!status.ok()) return status;
  if (ctx.json()) {
    PrintJson(resp);
    return 0;
  }
  if (a.host_form && resp.host_url().empty()) {
    return absl::FailedPreconditionError(
        "no host-form URL: the proxy has no --proxy_domain, or the claim id is not a DNS label");
  }
  std::printf("%s\n", (a.host_form ? resp.host_url() : resp.url()).c_str());
  return 0;
}

struct ForwardArgs {
  std::string id;
  std::string ports;  // LOCAL:REMOTE
  std::string address = "127.0.0.1";
};

// Connects to host:port (numeric or a name); -1 with errno set on failure.
int Dial(const std::string& host, const std::string& port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd >= 0) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

// Moves bytes both ways until both sides have closed (half-closes passed on).
void Pipe(int a, int b) {
  char buf[64 * 1024];
  bool open[2] = {true, true};  // a->b, b->a
  while (open[0] || open[1]) {
    pollfd p[2] = {{a, static_cast<short>(open[0] ? POLLIN : 0), 0},
                   {b, static_cast<short>(open[1] ? POLLIN : 0), 0}};
    if (::poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (int i = 0; i < 2; ++i) {
      if (!open[i] || p[i].revents == 0) continue;
      const int from = i == 0 ? a : b, to = i == 0 ? b : a;
      const ssize_t n = ::read(from, buf, sizeof(buf));
      if (n <= 0) {
        open[i] = false;
        ::shutdown(to, SHUT_WR);
        continue;
      }
      for (ssize_t done = 0; done < n;) {
        const ssize_t w = ::send(to, buf + done, n - done, MSG_NOSIGNAL);
        if (w <= 0) return;
        done += w;
      }
    }
  }
}

// One local connection: a fresh URL token, a CONNECT through the proxy, then bytes.
void Forward(Client* client, std::string id, int remote, int local_fd) {
  v1::GetPortUrlRequest req;
  req.set_claim_id(id);
  req.set_port(remote);
  req.mutable_ttl()->set_seconds(600);
  v1::GetPortUrlResponse resp;
  absl::Status status = client->Call(
      [&](grpc::ClientContext* c) { return client->sandboxes().GetPortUrl(c, req, &resp); });
  auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "sbx port-forward: %s\n", why.c_str());
    ::close(local_fd);
  };
  if (!status.ok()) return fail(status.ToString());
  // http://HOST:PORT/_sbx/...
  absl::string_view url = resp.url();
  if (!absl::ConsumePrefix(&url, "http://")) {
    return fail(absl::StrCat("the proxy's URL ", resp.url(),
                             " is not plain http://; port-forward cannot tunnel through it"));
  }
  const std::string authority(url.substr(0, url.find('/')));
  const size_t colon = authority.rfind(':');
  std::string host = authority.substr(0, colon);
  const std::string port = colon == std::string::npos ? "80" : authority.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  const int up = Dial(host, port);
  if (up < 0) return fail(absl::StrCat("cannot connect to the proxy at ", authority));
  const std::string connect =
      absl::StrCat("CONNECT ", id, ":", remote, " HTTP/1.1\r\nHost: ", id, ":", remote,
                   "\r\nX-Sbx-Token: ", resp.token(), "\r\n\r\n");
  ::send(up, connect.data(), connect.size(), MSG_NOSIGNAL);
  // The answer's header, byte by byte so that nothing of the tunnel is read with it.
  std::string head;
  char c;
  while (head.size() < 16384 && !absl::EndsWith(head, "\r\n\r\n") && ::read(up, &c, 1) == 1) {
    head.push_back(c);
  }
  if (!absl::StartsWith(head, "HTTP/1.1 200")) {
    ::close(up);
    return fail(absl::StrCat("the proxy refused: ", head.substr(0, head.find("\r\n\r\n"))));
  }
  Pipe(local_fd, up);
  ::close(up);
  ::close(local_fd);
}

absl::StatusOr<int> RunPortForward(Context& ctx, const ForwardArgs& a) {
  std::vector<std::string> parts = absl::StrSplit(a.ports, ':');
  int local = 0, remote = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &local) ||
      !absl::SimpleAtoi(parts[1], &remote) || local < 0 || local > 65535 || remote < 1 ||
      remote > 65535) {
    return UsageError(
        absl::StrCat("\"", a.ports, "\" is not LOCAL:REMOTE (LOCAL 0: any free port)"));
  }
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client* const client = *connected;  // the context keeps it for the whole run
  // Fails early (no proxy, not the caller's claim) instead of on the first connection.
  {
    v1::GetPortUrlRequest req;
    req.set_claim_id(a.id);
    req.set_port(remote);
    v1::GetPortUrlResponse resp;
    absl::Status s = client->Call(
        [&](grpc::ClientContext* c) { return client->sandboxes().GetPortUrl(c, req, &resp); });
    if (!s.ok()) return s;
  }
  const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(local));
  const int one = 1;
  ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::inet_pton(AF_INET, a.address.c_str(), &addr.sin_addr) != 1 ||
      ::bind(ls, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(ls, 128) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", a.address, ":", local, ": ", sbx::ErrnoText(errno)));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(ls, reinterpret_cast<sockaddr*>(&addr), &len);
  std::printf("Forwarding from %s:%d -> %s:%d\n", a.address.c_str(), ntohs(addr.sin_port),
              a.id.c_str(), remote);
  std::fflush(stdout);
  while (true) {
    const int fd = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return absl::UnavailableError(absl::StrCat("accept: ", sbx::ErrnoText(errno)));
    }
    std::thread([client, id = a.id, remote, fd] { Forward(client, id, remote, fd); }).detach();
  }
}

}  // namespace

void AddPortCommands(CLI::App& app, Context& ctx, Actions& actions) {
  auto a = std::make_shared<UrlArgs>();
  CLI::App* sub = app.add_subcommand(
      "url",
      "Print a signed URL at which PORT inside a claimed sandbox is reachable through the "
      "server's port proxy, by whoever holds it, until it expires (sbx-server --proxy_listen)");
  sub->add_option("id", a->id, "Claim id")->required();
  sub->add_option("port", a->port, "TCP port inside the sandbox")
      ->required()
      ->check(CLI::Range(1, 65535));
  sub->add_option("--ttl", a->ttl, "How long the URL works, e.g. 10m (default 1h, at most 168h)")
      ->check(DurationCheck());
  sub->add_flag("--host", a->host_form,
                "The host form PORT-CLAIM.DOMAIN (needs the proxy's --proxy_domain)");
  actions[sub] = [&ctx, a] { return RunUrl(ctx, *a); };

  auto f = std::make_shared<ForwardArgs>();
  CLI::App* fwd = app.add_subcommand(
      "port-forward",
      "Forward a local port to a port inside a claimed sandbox, through the server's port "
      "proxy (each connection a CONNECT tunnel): sbx port-forward ID LOCAL:REMOTE. Runs until "
      "interrupted.");
  fwd->add_option("id", f->id, "Claim id")->required();
  fwd->add_option("ports", f->ports, "LOCAL:REMOTE (LOCAL 0: any free port, printed)")->required();
  fwd->add_option("--address", f->address, "Local address to listen on (IPv4)")
      ->capture_default_str();
  actions[fwd] = [&ctx, f] { return RunPortForward(ctx, *f); };
}

}  // namespace sbx::cli

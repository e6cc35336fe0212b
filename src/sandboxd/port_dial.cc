#include "src/sandboxd/port_dial.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "src/common/errno_text.h"
#include "src/common/port_dial.h"
#include "src/sandboxd/unique_fd.h"

namespace sbx::sandboxd {
namespace {

int RemainingMs(absl::Time deadline) {
  const absl::Duration left = deadline - absl::Now();
  return left <= absl::ZeroDuration() ? 0 : static_cast<int>(absl::ToInt64Milliseconds(left)) + 1;
}

// Reads exactly n bytes before `deadline`; false on EOF, error or timeout.
bool ReadFull(int fd, char* out, size_t n, absl::Time deadline) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, out + got, n - got, MSG_DONTWAIT);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return false;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    pollfd p{fd, POLLIN, 0};
    const int ms = RemainingMs(deadline);
    if (ms == 0 || ::poll(&p, 1, ms) <= 0) return false;
  }
  return true;
}

void Answer(int fd, const std::string& message) {
  std::string out(1, static_cast<char>(kPortDialError));
  const std::string m = message.substr(0, kMaxPortDialMessageBytes);
  out.push_back(static_cast<char>(m.size() >> 8));
  out.push_back(static_cast<char>(m.size() & 0xff));
  out += m;
  [[maybe_unused]] ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

bool SecretMatches(const std::string& want, const std::string& given) {
  unsigned char diff = given.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) {
    diff |= static_cast<unsigned char>(want[i]) ^
            static_cast<unsigned char>(i < given.size() ? given[i] : 0);
  }
  return diff == 0;
}

}  // namespace

void ServePortDial(int conn_fd, const std::string& secret, absl::Duration timeout) {
  const UniqueFd conn(conn_fd);
  const absl::Time deadline = absl::Now() + timeout;
  char head[kPortDialMagic.size() + 2];
  if (!ReadFull(conn.get(), head, sizeof(head), deadline) ||
      absl::string_view(head, kPortDialMagic.size()) != kPortDialMagic) {
    spdlog::warn("port dial: malformed or incomplete request; connection closed");
    return;
  }
  const size_t secret_len = (static_cast<uint8_t>(head[kPortDialMagic.size()]) << 8) |
                            static_cast<uint8_t>(head[kPortDialMagic.size() + 1]);
  if (secret_len > kMaxPortDialSecretBytes) {
    Answer(conn.get(), absl::StrCat("secret of ", secret_len, " bytes is too long"));
    return;
  }
  std::string given(secret_len + 2, '\0');
  if (!ReadFull(conn.get(), given.data(), given.size(), deadline)) {
    spdlog::warn("port dial: incomplete request; connection closed");
    return;
  }
  const uint16_t port = static_cast<uint16_t>((static_cast<uint8_t>(given[secret_len]) << 8) |
                                              static_cast<uint8_t>(given[secret_len + 1]));
  given.resize(secret_len);
  if (!secret.empty() && !SecretMatches(secret, given)) {
    spdlog::warn("port dial refused: wrong sandbox secret");
    Answer(conn.get(), "wrong sandbox secret");
    return;
  }
  if (port == 0) {
    Answer(conn.get(), "port 0 cannot be dialled");
    return;
  }
  const UniqueFd up(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (up.get() < 0) {
    Answer(conn.get(), absl::StrCat("socket: ", sbx::ErrnoText(errno)));
    return;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = ::connect(up.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  if (rc != 0 && errno == EINPROGRESS) {
    pollfd p{up.get(), POLLOUT, 0};
    const int ms = RemainingMs(deadline);
    if (ms == 0 || ::poll(&p, 1, ms) <= 0) {
      Answer(conn.get(), absl::StrCat("connecting to 127.0.0.1:", port, " timed out"));
      return;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(up.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    errno = err;
    rc = err == 0 ? 0 : -1;
  }
  if (rc != 0) {
    Answer(conn.get(), absl::StrCat("connecting to 127.0.0.1:", port,
                                    " in the sandbox: ", sbx::ErrnoText(errno)));
    return;
  }
  const int one = 1;
  ::setsockopt(up.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  char ok = static_cast<char>(kPortDialOk);
  iovec iov{&ok, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  const int sent_fd = up.get();
  std::memcpy(CMSG_DATA(cm), &sent_fd, sizeof(int));
  if (::sendmsg(conn.get(), &msg, MSG_NOSIGNAL) != 1) {
    spdlog::warn("port dial: passing the socket of port {} failed: {}", port,
                 sbx::ErrnoText(errno));
  }
}

}  // namespace sbx::sandboxd

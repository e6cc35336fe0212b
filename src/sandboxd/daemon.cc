#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"
#include "src/common/errno_text.h"
#include "src/common/port_dial.h"
#include "src/sandboxd/child_reaper.h"
#include "src/sandboxd/exec.h"
#include "src/sandboxd/port_dial.h"
#include "src/sandboxd/process_table.h"
#include "src/sandboxd/sandboxd.h"
#include "src/sandboxd/service.h"
#include "src/sandboxd/workspace.h"

namespace sbx::sandboxd {
namespace {

// sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
constexpr size_t kMaxSocketPathBytes = 107;
constexpr int64_t kMaxMaxFileBytes = int64_t{1} << 30;
constexpr int kMessageSlackBytes = 1 << 20;

// Serves an inherited listening socket: gRPC 1.51 cannot listen on a descriptor, so this
// thread accepts and hands each connection to the server (AddInsecureChannelFromFd). A
// connection's first byte tells gRPC (its preface, 'P') from a port dial ('S',
// src/common/port_dial.h), which this thread serves itself (bounded in time; only
// sbx-server can reach the socket).
class Acceptor {
 public:
  Acceptor(int listen_fd, grpc::Server* server, std::string secret)
      : listen_fd_(listen_fd),
        stop_fd_(::eventfd(0, EFD_CLOEXEC)),
        server_(server),
        secret_(std::move(secret)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Acceptor() { Stop(); }

  // Stops accepting (connections already handed over stay with the server). Idempotent.
  void Stop() {
    if (!thread_.joinable()) return;
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(stop_fd_.get(), &one, sizeof(one));
    thread_.join();
    for (const Pending& p : pending_) ::close(p.fd);
    pending_.clear();
  }

 private:
  // An accepted connection whose first byte has not come yet.
  struct Pending {
    int fd;
    absl::Time deadline;
  };
  static constexpr size_t kMaxPending = 256;
  static constexpr absl::Duration kSniffTimeout = absl::Seconds(5);
  static constexpr absl::Duration kDialTimeout = absl::Seconds(2);

  // Hands `fd` to gRPC or serves it as a port dial, by its first byte; false while it has
  // none yet.
  bool Dispatch(int fd) {
    char first = 0;
    const ssize_t n = ::recv(fd, &first, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    if (n == 1 && first == kPortDialMagic[0]) {
      ServePortDial(fd, secret_, kDialTimeout);
    } else if (n <= 0) {
      ::close(fd);  // gone before saying anything
    } else {
      grpc::AddInsecureChannelFromFd(server_, fd);
    }
    return true;
  }

  void Run() {
    std::vector<pollfd> fds;
    while (true) {
      fds.assign({{listen_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}});
      absl::Time next = absl::InfiniteFuture();
      for (const Pending& p : pending_) {
        fds.push_back({p.fd, POLLIN, 0});
        next = std::min(next, p.deadline);
      }
      const int ms = next == absl::InfiniteFuture()
                         ? -1
                         : static_cast<int>(std::max<int64_t>(
                               0, absl::ToInt64Milliseconds(next - absl::Now()) + 1));
      if (::poll(fds.data(), fds.size(), ms) < 0) {
        if (errno == EINTR) continue;
        spdlog::error("accept loop: poll: {}", sbx::ErrnoText(errno));
        return;
      }
      if (fds[1].revents != 0) return;
      // Pending connections first (their slots in fds match pending_ as it was).
      const absl::Time now = absl::Now();
      std::vector<Pending> still;
      for (size_t i = 0; i < pending_.size(); ++i) {
        const Pending& p = pending_[i];
        if (fds[i + 2].revents != 0 && Dispatch(p.fd)) continue;
        if (now >= p.deadline) {
          grpc::AddInsecureChannelFromFd(server_, p.fd);  // as before sniffing existed
          continue;
        }
        still.push_back(p);
      }
      pending_ = std::move(still);
      if (fds[0].revents == 0) continue;
      const int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
        spdlog::error("accept: {}", sbx::ErrnoText(errno));
        // EMFILE and the like: do not spin.
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      if (Dispatch(fd)) continue;
      if (pending_.size() >= kMaxPending) {
        grpc::AddInsecureChannelFromFd(server_, fd);
        continue;
      }
      pending_.push_back({fd, absl::Now() + kSniffTimeout});
    }
  }

  const UniqueFd listen_fd_;
  const UniqueFd stop_fd_;
  grpc::Server* const server_;
  const std::string secret_;
  std::vector<Pending> pending_;  // only the accept thread touches it (and Stop after join)
  std::thread thread_;
};

class DaemonImpl final : public Daemon {
 public:
  DaemonImpl(std::string socket_path, int port, std::unique_ptr<Workspace> workspace,
             std::unique_ptr<ExecManager> execs, std::unique_ptr<ProcessTable> processes,
             std::unique_ptr<SandboxdService> service, std::unique_ptr<grpc::Server> server,
             int listen_fd, std::string secret)
      : socket_path_(std::move(socket_path)),
        port_(port),
        workspace_(std::move(workspace)),
        execs_(std::move(execs)),
        processes_(std::move(processes)),
        service_(std::move(service)),
        server_(std::move(server)) {
    if (listen_fd >= 0)
      acceptor_ = std::make_unique<Acceptor>(listen_fd, server_.get(), std::move(secret));
  }

  ~DaemonImpl() override { Shutdown(absl::ZeroDuration()); }

  void Shutdown(absl::Duration grace) override {
    // Atomic so that concurrent Shutdown calls (signal thread, destructor) run it once;
    // acq_rel orders the shutdown after whatever the winning caller did before.
    if (shut_down_.exchange(true, std::memory_order_acq_rel)) return;
    spdlog::info("sandboxd shutting down: killing {} running command(s) and {} process(es)",
                 execs_->running(), processes_->running());
    if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
    if (acceptor_ != nullptr) acceptor_->Stop();
    execs_->KillAll();
    // Killed processes end their streams and waits with their exit.
    processes_->KillAll();
    server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace));
    server_->Wait();
    execs_->JoinAll();
    processes_->JoinAll();
    struct stat st;
    if (!socket_path_.empty() && ::lstat(socket_path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      ::unlink(socket_path_.c_str());
    }
  }

  int running_execs() const override { return execs_->running(); }
  int running_processes() const override { return processes_->running(); }
  bool uses_openat2() const override { return workspace_->uses_openat2(); }
  int port() const override { return port_; }

 private:
  const std::string socket_path_;
  const int port_;
  // Destroyed in reverse order: the server first (no more calls), then the service, then
  // the process table and the exec manager (they join their threads), then the workspace.
  std::unique_ptr<Workspace> workspace_;
  std::unique_ptr<ExecManager> execs_;
  std::unique_ptr<ProcessTable> processes_;
  std::unique_ptr<SandboxdService> service_;
  std::unique_ptr<grpc::Server> server_;
  // With listen_fd: accepts connections for server_ (stopped before it shuts down).
  std::unique_ptr<Acceptor> acceptor_;
  std::atomic<bool> shut_down_{false};
};

// A command's pipes must never become descriptors 0-2 of sandboxd, or dup2 in the child
// would clobber them; make sure the three are taken.
void EnsureStandardDescriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int null_fd = ::open("/dev/null", O_RDWR);
      if (null_fd >= 0 && null_fd != fd) {
        ::dup2(null_fd, fd);
        ::close(null_fd);
      }
    }
  }
}

}  // namespace

absl::Status DaemonOptions::Validate() const {
  if (int{!socket_path.empty()} + int{!listen.empty()} + int{listen_fd >= 0} != 1) {
    return absl::InvalidArgumentError(
        "exactly one of socket_path, listen and listen_fd is required");
  }
  if (secret.empty() && !allow_unauthenticated) {
    return absl::InvalidArgumentError(
        "no secret: the daemon serves only callers that present the sandbox's secret (give "
        "one, or allow_unauthenticated for development)");
  }
  if (!default_cwd.empty() && default_cwd[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("default_cwd \"", default_cwd, "\" is not an absolute path"));
  }
  if (!secret.empty() && secret.size() < 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("the secret is ", secret.size(), " bytes long; at least 16 are required"));
  }
  if (!listen.empty() && listen.rfind(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("listen \"", listen, "\" is not host:port"));
  }
  if (socket_path.size() > kMaxSocketPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat("socket_path \"", socket_path, "\" is ",
                                                   socket_path.size(), " bytes long; the limit is ",
                                                   kMaxSocketPathBytes));
  }
  if (workspace.empty()) return absl::InvalidArgumentError("workspace is required");
  if (max_concurrent_execs < 1 || max_concurrent_execs > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_concurrent_execs ", max_concurrent_execs, " is outside 1..1024"));
  }
  if (max_processes < 1 || max_processes > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_processes ", max_processes, " is outside 1..4096"));
  }
  if (max_ptys < 0 || max_ptys > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("max_ptys ", max_ptys, " is outside 0..1024"));
  }
  if (max_replay_bytes < (64 << 10) || max_replay_bytes > (int64_t{4} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_replay_bytes ", max_replay_bytes, " is outside 65536..4294967296"));
  }
  if (max_file_bytes < 1 || max_file_bytes > kMaxMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_file_bytes ", max_file_bytes, " is outside 1..", kMaxMaxFileBytes));
  }
  if (output_drain_grace < absl::ZeroDuration() || output_drain_grace > absl::Minutes(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output_drain_grace ", absl::FormatDuration(output_drain_grace), " is outside 0..1m"));
  }
  for (const auto& [name, value] : env) {
    if (name.empty() || name.find('=') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("env name \"", name, "\" is invalid"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  EnsureStandardDescriptors();
  // Writing to a pipe whose reader (a command) has gone must give EPIPE, not kill us.
  ::signal(SIGPIPE, SIG_IGN);

  auto workspace = Workspace::Open(options.workspace, options.max_file_bytes, options.use_openat2,
                                   options.sandbox_root);
  if (!workspace.ok()) return workspace.status();

  struct stat st;
  if (!options.socket_path.empty() && ::lstat(options.socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "socket_path \"", options.socket_path, "\" exists and is not a socket; not removing it"));
    }
    if (::unlink(options.socket_path.c_str()) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot remove stale socket \"", options.socket_path, "\": ", sbx::ErrnoText(errno)));
    }
  }
  if (options.reap_orphans && ::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    spdlog::warn("cannot become a child subreaper ({}); orphans of commands are not reaped",
                 sbx::ErrnoText(errno));
  }
  ChildReaper::Get();

  auto execs = std::make_unique<ExecManager>(workspace->get(), options.max_concurrent_execs,
                                             options.output_drain_grace);
  if (options.listen_fd >= 0) {
    int type = 0;
    socklen_t len = sizeof(type);
    if (::getsockopt(options.listen_fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
        type != SOCK_STREAM) {
      return absl::FailedPreconditionError(absl::StrCat(
          "listen_fd ", options.listen_fd, " is not a stream socket: ", sbx::ErrnoText(errno)));
    }
    ::fcntl(options.listen_fd, F_SETFD, FD_CLOEXEC);
  }
  ProcessLimits process_limits;
  process_limits.max_processes = options.max_processes;
  process_limits.max_ptys = options.max_ptys;
  process_limits.max_replay_bytes = options.max_replay_bytes;
  auto processes =
      std::make_unique<ProcessTable>(workspace->get(), process_limits, options.output_drain_grace);
  auto service =
      std::make_unique<SandboxdService>(workspace->get(), execs.get(), processes.get(), options.env,
                                        options.secret, options.default_cwd);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  std::string address;
  if (options.listen_fd >= 0) {
    address = absl::StrCat("descriptor ", options.listen_fd);
  } else {
    address = options.listen.empty() ? absl::StrCat("unix:", options.socket_path) : options.listen;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                             options.listen.empty() ? nullptr : &port);
  }
  const int message_limit = static_cast<int>(options.max_file_bytes) + kMessageSlackBytes;
  builder.SetMaxReceiveMessageSize(message_limit);
  builder.SetMaxSendMessageSize(message_limit);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || (!options.listen.empty() && port == 0)) {
    return absl::UnavailableError(absl::StrCat("cannot listen on \"", address, "\""));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  spdlog::info("sandboxd serving on {}{} (workspace \"{}\", paths confined with {}, {})", address,
               port != 0 ? absl::StrCat(" (port ", port, ")") : std::string(), options.workspace,
               (*workspace)->uses_openat2() ? "openat2(RESOLVE_BENEATH)" : "an O_NOFOLLOW walk",
               options.secret.empty() ? "NO AUTHENTICATION" : "calls need the sandbox's secret");
  return std::unique_ptr<Daemon>(new DaemonImpl(
      options.socket_path, port, std::move(*workspace), std::move(execs), std::move(processes),
      std::move(service), std::move(server), options.listen_fd, options.secret));
}

}  // namespace sbx::sandboxd

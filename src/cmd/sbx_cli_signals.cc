#include "src/cmd/sbx_cli_signals.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace sbx::cli {

void SignalRouter::Start() {
  sigemptyset(&set_);
  sigaddset(&set_, SIGINT);
  sigaddset(&set_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set_, nullptr);
  signal_fd_ = signalfd(-1, &set_, SFD_CLOEXEC);
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
  if (signal_fd_ < 0 || stop_fd_ < 0) {
    // Without the descriptors, the signals keep their default action (the process dies of
    // them); only the forwarding of exec and the clean end of watch are lost.
    pthread_sigmask(SIG_UNBLOCK, &set_, nullptr);
    return;
  }
  thread_ = std::thread([this] { Run(); });
}

void SignalRouter::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  while (write(stop_fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
  thread_.join();
  close(signal_fd_);
  close(stop_fd_);
}

void SignalRouter::SetHandler(std::function<void(int)> handler) {
  absl::MutexLock lock(&mu_);
  handler_ = std::move(handler);
}

void SignalRouter::Run() {
  while (true) {
    pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) continue;  // EINTR
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    signalfd_siginfo info;
    if (read(signal_fd_, &info, sizeof info) != static_cast<ssize_t>(sizeof info)) continue;
    const int sig = static_cast<int>(info.ssi_signo);
    {
      absl::MutexLock lock(&mu_);
      if (handler_) {
        handler_(sig);
        continue;
      }
    }
    // No handler: die of the signal, so that the shell sees what happened. A progress
    // line may be half drawn on a terminal; end it first.
    if (isatty(STDERR_FILENO)) {
      (void)!write(STDERR_FILENO, "\n", 1);
    }
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    raise(sig);
    _exit(128 + sig);  // not reached
  }
}

}  // namespace sbx::cli

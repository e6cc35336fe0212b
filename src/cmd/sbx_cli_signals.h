#pragma once
// SIGINT and SIGTERM for the `sbx` command-line client. They are blocked in every thread
// and received synchronously (signalfd) by one thread, which hands each to the handler the running
// command installed (exec forwards it to the remote process, watch ends its stream).
// Without a handler the process dies of the signal, as if it had not been blocked.
//
// Thread-safety: SetHandler and ClearHandler may be called from any thread. The handler
// runs on the signal thread with an internal lock held, so ClearHandler returns only once
// no call of the old handler is running; a handler must be quick, must not block and must
// not call SetHandler/ClearHandler.
// Lifetime: Start before any other thread exists (threads inherit the signal mask); Stop
// before main returns.

#include <csignal>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace sbx::cli {

class SignalRouter {
 public:
  SignalRouter() = default;
  ~SignalRouter() { Stop(); }
  SignalRouter(const SignalRouter&) = delete;
  SignalRouter& operator=(const SignalRouter&) = delete;

  // Blocks SIGINT and SIGTERM in the calling thread and starts the receiving thread.
  void Start();
  // Wakes and joins the receiving thread at once; signals stay blocked from then on.
  void Stop();

  void SetHandler(std::function<void(int)> handler) ABSL_LOCKS_EXCLUDED(mu_);
  void ClearHandler() ABSL_LOCKS_EXCLUDED(mu_) { SetHandler(nullptr); }

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  sigset_t set_;
  int signal_fd_ = -1;  // signalfd for set_
  int stop_fd_ = -1;    // eventfd written by Stop
  absl::Mutex mu_;
  std::function<void(int)> handler_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace sbx::cli

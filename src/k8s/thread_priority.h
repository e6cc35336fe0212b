#pragma once
// Background priority for the Kubernetes side of sbx: informers, reconcile workers and API
// writes are background work that must not take CPU from gRPC claims when the machine is
// busy (a claim's answer needs no API request). With the default socket transport the API
// requests run on these threads too; with `--kube_http cpprest` cpprest's own I/O threads
// keep the normal priority (they are started by the library; see docs/benchmarks.md).

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "src/common/clock.h"

namespace sbx::k8s {

// Nice value of background threads (0 = normal, 19 = lowest).
inline constexpr int kBackgroundNice = 10;

// Lowers the calling thread's CPU priority to kBackgroundNice. Threads it creates
// afterwards inherit it. Best effort: a failure leaves the priority as it was.
inline void LowerThreadPriority() {
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kBackgroundNice);
}

// A thread named `name` (at most 15 characters) at background priority, running `body`.
inline std::thread BackgroundThread(const char* name, std::function<void()> body) {
  return std::thread([name, body = std::move(body)] {
    pthread_setname_np(pthread_self(), name);
    LowerThreadPriority();
    body();
  });
}

// A background thread that calls `pass` every `every` of `clock` (the first one period
// after the start) until Stop: the resync of a controller. It waits on the injected
// clock, so a test moves a FakeClock past SleepingUntil() and waits for passes() to grow
// instead of sleeping through a period; a Stop wakes the wait at once.
//
// Thread-safety: passes() and SleepingUntil() from any thread; Stop from one.
// Lifetime: Stop (or the destructor) joins the thread; `clock` must outlive it.
class PeriodicPass {
 public:
  PeriodicPass(const char* name, absl::Duration every, const Clock& clock,
               std::function<void()> pass)
      : every_(every), clock_(clock), pass_(std::move(pass)) {
    thread_ = BackgroundThread(name, [this] { Run(); });
  }
  ~PeriodicPass() { Stop(); }
  PeriodicPass(const PeriodicPass&) = delete;
  PeriodicPass& operator=(const PeriodicPass&) = delete;

  void Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  // Passes completed.
  int64_t passes() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return passes_;
  }
  // When the next pass is due while the thread waits for it; InfinitePast while a pass
  // runs (or before the first wait).
  absl::Time SleepingUntil() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return sleeping_until_;
  }

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    while (!stopping_) {
      sleeping_until_ = clock_.Now() + every_;
      clock_.AwaitUntil(mu_, &stopping_, sleeping_until_);
      sleeping_until_ = absl::InfinitePast();
      if (stopping_) break;
      mu_.Unlock();  // the pass takes other locks and may do I/O
      pass_();
      mu_.Lock();
      ++passes_;
    }
  }

  const absl::Duration every_;
  const Clock& clock_;
  const std::function<void()> pass_;
  std::thread thread_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t passes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time sleeping_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace sbx::k8s

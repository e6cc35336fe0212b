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
#include <functional>
#include <thread>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

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

// A background thread that calls `pass` every `every` until `stopping` is set (looked at
// a hundred times per period, so that a stop is quick).
inline std::thread PeriodicThread(const char* name, const std::atomic<bool>* stopping,
                                  absl::Duration every, std::function<void()> pass) {
  return BackgroundThread(name, [stopping, every, pass = std::move(pass)] {
    while (!stopping->load(std::memory_order_acquire)) {
      for (int i = 0; i < 100 && !stopping->load(std::memory_order_acquire); ++i) {
        absl::SleepFor(every / 100);
      }
      if (!stopping->load(std::memory_order_acquire)) pass();
    }
  });
}

}  // namespace sbx::k8s

#pragma once
// Background priority for the Kubernetes side of sbx: informers, reconcile workers, API
// writes and the HTTP client's I/O threads are background work that must not take CPU
// from gRPC claims when the machine is busy (a claim's answer needs no API request).

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace sbx::k8s {

// Nice value of background threads (0 = normal, 19 = lowest).
inline constexpr int kBackgroundNice = 10;

// Lowers the calling thread's CPU priority to kBackgroundNice. Threads it creates
// afterwards inherit it. Best effort: a failure leaves the priority as it was.
inline void LowerThreadPriority() {
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kBackgroundNice);
}

}  // namespace sbx::k8s

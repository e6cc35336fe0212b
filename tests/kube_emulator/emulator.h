// The Kubernetes API server emulator: an in-memory object store served over
// the Kubernetes REST API (JSON only) with watch, discovery, CRDs, patches,
// subresources, finalizers, owner-reference garbage collection, a fake
// scheduler/kubelet and fault injection. Test and benchmark infrastructure for
// sbx; never linked into sbx.
//
// Thread-safety: Handle() is called concurrently from connection threads. All
// objects, watch history and watchers are guarded by one mutex; each watcher has
// its own queue so that slow watch clients never block writers.
// Lifetime: one Emulator per process; its background thread runs until exit.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "tests/kube_emulator/http_server.h"

namespace kube_emulator {

struct EmulatorOptions {
  int latency_ms = 0;                 // added before answering each API request
  std::map<int, double> error_rates;  // code -> probability (429, 500, 503, 409, 410)
  int retry_after_seconds = 1;        // Retry-After on 429s
  int qps_limit = 0;                  // 0 = unlimited
  double watch_drop_rate = 0;         // per delivered watch event
  int bookmark_interval_ms = 1000;    // for allowWatchBookmarks=true
  int64_t watch_history = 100000;     // events kept for watch resume
  int pod_ready_delay_ms = 50;        // scheduled -> Running/Ready
  // Every pod's IP when set (tests that reach a daemon "in the pod" on loopback);
  // otherwise 10.244.x.y, one per pod.
  std::string pod_ip;
  int nodes = 3;           // fake nodes pods are bound to
  uint64_t seed = 0;       // 0 = random
  std::string token_file;  // bearer token file; empty = no auth
  // CRD conversion webhooks given as a service: "NAMESPACE/NAME" -> "HOST:PORT" the
  // service is reached at (its certificate is still checked for NAME.NAMESPACE.svc).
  std::map<std::string, std::string> service_addresses;
  int conversion_webhook_timeout_ms = 30000;  // the API server's 30 s
  // Requests held at once by the hold_user_agents fault (one-sided partition); more are
  // answered 503. Each holds its connection's thread.
  int max_held_requests = 1000;

  // INVALID_ARGUMENT naming the bad knob.
  absl::Status Validate() const;
};

class EmulatorImpl;

class Emulator {
 public:
  explicit Emulator(const EmulatorOptions& options);
  ~Emulator();
  Emulator(const Emulator&) = delete;
  Emulator& operator=(const Emulator&) = delete;

  // Answers one HTTP request (API, discovery or /emulator/* admin). An API request
  // from a client cut off by the hold_user_agents fault blocks the calling connection
  // thread until it is healed or the client closes (then it is dropped unanswered).
  void Handle(const HttpRequest& request, HttpResponder& responder);

 private:
  std::unique_ptr<EmulatorImpl> impl_;
};

}  // namespace kube_emulator

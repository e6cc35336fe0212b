#pragma once
// sbx-loadgen's engine: drives one workload (Ping, Claim, Claim+Release, Claim+Exec)
// against an sbx server, open loop (fixed arrival rate) or closed loop (fixed number in
// flight), over several gRPC channels, and measures throughput and latency.
//
// Open loop: arrivals are scheduled from the start time alone (i / rate, or Poisson), never
// from completions, and each operation's latency is measured from its INTENDED send time.
// When the client falls behind (a slow server, a busy core), the delay shows up in the
// latencies instead of silently lowering the rate (no coordinated omission).
// Closed loop: `concurrency` operations are kept in flight; each completion starts the
// next one; latency is measured from the actual send.
//
// Calls use the gRPC callback API: no thread per request; completions run on gRPC's
// threads. Latencies are stored exactly (histogram.h).
//
// Thread-safety: a LoadClient runs one workload at a time (Run is not reentrant).
// Lifetime: Run returns only after every call it started, including unmeasured
// clean-up Releases, has completed.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/loadgen/histogram.h"

namespace sbx::loadgen {

enum class Workload {
  // sbx.v1.DiagnosticsService/Ping with an empty payload: the cost of an RPC.
  kPing,
  // ClaimService/Claim, measured alone; the claim is then released outside the measured
  // time (so the pool does not drain), without holding up the next operation.
  kClaim,
  // Claim, then Release of that claim, measured together as one operation.
  kClaimRelease,
  // Claim, then SandboxService/Exec of `true` in the claimed sandbox until its exit
  // message and OK status, measured together; then Release, unmeasured.
  kClaimExec,
};

// "ping", "claim", "claim-release", "claim-exec".
const char* WorkloadName(Workload w);
// INVALID_ARGUMENT naming the value when it is none of the names above.
absl::StatusOr<Workload> ParseWorkload(const std::string& name);

enum class Arrival {
  // Evenly spaced sends, 1/rate apart.
  kUniform,
  // Exponentially distributed gaps with mean 1/rate (a Poisson process).
  kPoisson,
};

struct LoadOptions {
  // host:port of the sbx server.
  std::string server = "127.0.0.1:50051";
  Workload workload = Workload::kPing;
  // Pool claimed from (claim workloads).
  std::string pool = "default";
  // ClaimRequest.empty_pool_policy: 0 (the pool's default) or a sbx.v1.EmptyPoolPolicy.
  int empty_pool_policy = 0;
  // Exactly one of rate (open loop, operations started per second) and concurrency
  // (closed loop, operations in flight) is positive.
  double rate = 0;
  int concurrency = 0;
  Arrival arrival = Arrival::kUniform;
  // Number of gRPC channels (each its own TCP connection); operations go round robin.
  int connections = 1;
  // Measured phase: stops at whichever comes first of `duration` (0: no limit) and
  // `requests` measured operations started (0: no limit). Both 0: 10 s.
  absl::Duration duration = absl::ZeroDuration();
  int64_t requests = 0;
  // Operations started in the first `warmup` are run but not counted.
  absl::Duration warmup = absl::Seconds(1);
  // Sent as `authorization: Bearer <token>` when not empty.
  std::string token;
  // Open loop: at most this many operations in flight; the scheduler waits beyond it
  // (the wait counts in the latencies, since they start at the intended time).
  int max_in_flight = 20000;
  // Deadline of every RPC.
  absl::Duration rpc_timeout = absl::Seconds(10);
  // How long to wait for each channel to connect before giving up.
  absl::Duration connect_timeout = absl::Seconds(5);
  // Claim workload: true releases each claim after it is measured; false keeps it (the
  // pool drains and is refilled, and nothing is released during the run).
  bool release_claims = true;
  // Also report the measured phase second by second (RunResult::timeline).
  bool timeline = false;
  // Seeds Poisson arrivals. (Claim ids start with a random prefix per process, mixed from
  // the seed and the time, so that runs against one server never reuse an id.)
  uint64_t seed = 1;

  // INVALID_ARGUMENT naming the bad field and value.
  absl::Status Validate() const;
  bool open_loop() const { return rate > 0; }
};

// Failures of one kind: the RPC that failed, its gRPC status code name (or, for an Exec
// that ran but did not exit 0, "exit_code=N" / "signal=N"), how many, and one message.
struct ErrorCount {
  std::string rpc;
  std::string code;
  uint64_t count = 0;
  std::string example;
};

// One second of the measured phase, by the operations' (intended) start time.
struct TimelineSecond {
  int64_t second = 0;
  uint64_t ok = 0;
  uint64_t failed = 0;
  // Of the successful operations; 0 when there were none.
  double p50_us = 0;
  double p99_us = 0;
  double max_us = 0;
};

struct RunResult {
  Workload workload = Workload::kPing;
  // Measured operations: started, succeeded, failed.
  uint64_t started = 0;
  uint64_t ok = 0;
  uint64_t failed = 0;
  // Warm-up operations (not in the numbers above or below).
  uint64_t warmup_ok = 0;
  uint64_t warmup_failed = 0;
  // From the start of the measured phase to its end (or the last measured completion,
  // whichever is later).
  double elapsed_s = 0;
  // Successful measured operations per second of elapsed_s.
  double throughput = 0;
  // Measured operations started per second of elapsed_s (open loop: the achieved rate).
  double started_per_s = 0;
  // Latency of successful measured operations.
  LatencySummary latency;
  // Measured failures by (rpc, code), most frequent first.
  std::vector<ErrorCount> errors;
  // Open loop: how late the scheduler actually sent (already part of the latencies).
  LatencySummary send_lag;
  // Times the open-loop scheduler waited because max_in_flight operations were out.
  uint64_t throttled = 0;
  // Unmeasured Releases after Claim / Claim+Exec, and their failures (warm-up included).
  uint64_t cleanup_releases = 0;
  std::vector<ErrorCount> cleanup_errors;
  // With LoadOptions::timeline: every second of the measured phase, in order.
  std::vector<TimelineSecond> timeline;
};

class LoadClient {
 public:
  // Opens options.connections channels (each with distinct channel args and a local
  // subchannel pool, so gRPC does not share one connection) and waits until each is
  // connected. UNAVAILABLE naming the server when one does not connect within
  // connect_timeout; INVALID_ARGUMENT from Validate.
  static absl::StatusOr<std::unique_ptr<LoadClient>> Connect(const LoadOptions& options);

  virtual ~LoadClient() = default;

  // Runs `workload` with the options' mode, rate/concurrency, warm-up and length, and
  // returns the numbers. Errors of individual operations are counted, not returned.
  virtual RunResult Run(Workload workload) = 0;
};

}  // namespace sbx::loadgen

#pragma once
// Request ids of the claim methods (Claim, ClaimBatch, Release). Each call gets one: the
// client's `x-request-id` metadata when it is sane (1-128 printable ASCII characters, no
// spaces), a generated one otherwise. It is sent back as `x-request-id` initial metadata
// and appears as the request_id field of the log lines about the call.
//
// Thread-safety: RequestId may be called from any thread.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "src/server/metrics.h"

namespace sbx::server {

inline constexpr char kRequestIdKey[] = "x-request-id";

// A new id: "<16 hex digits random per process>-<hex counter>", unique within the process
// and, with overwhelming probability, across processes.
std::string NewRequestId();

// The call's request id (see above); adds it to the call's initial metadata. Call once,
// in the handler, before the call finishes.
std::string RequestId(grpc::CallbackServerContext* ctx);

// One claim-method call's bookkeeping at its end: counts it in `counters` (may be null)
// and logs it (debug; warn for INTERNAL, UNKNOWN, DATA_LOSS and UNAVAILABLE) with its
// request id. `what` says what the call was about ("pool \"py\"", "claim \"c1\"").
struct CallRecord {
  RequestCounters* counters = nullptr;
  CountedMethod method = CountedMethod::kClaim;
  std::string request_id;
  std::string what;

  void Done(const absl::Status& status) const;
};

}  // namespace sbx::server

#pragma once
// sbx.v1.DiagnosticsService: Ping, the baseline RPC that touches no state.

#include "sbx/v1/diagnostics.grpc.pb.h"

namespace sbx::server {

class DiagnosticsService final : public sbx::v1::DiagnosticsService::CallbackService {
 public:
  // Largest Ping payload accepted (the proto documents it).
  static constexpr size_t kMaxPayloadBytes = 1 << 20;

  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* context,
                                 const sbx::v1::PingRequest* request,
                                 sbx::v1::PingResponse* response) override;
};

}  // namespace sbx::server

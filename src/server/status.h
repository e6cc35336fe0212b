#pragma once
// The one mapping from absl::Status (used inside sbx) to grpc::Status (on the wire).
// The numeric codes of the two are the same canonical codes; this keeps the message.

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace sbx::server {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace sbx::server

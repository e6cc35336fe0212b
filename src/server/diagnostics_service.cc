#include "src/server/diagnostics_service.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/common/build_info.h"

namespace sbx::server {

grpc::ServerUnaryReactor* DiagnosticsService::Ping(grpc::CallbackServerContext* context,
                                                   const sbx::v1::PingRequest* request,
                                                   sbx::v1::PingResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (request->payload().size() > kMaxPayloadBytes) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 absl::StrCat("ping payload is ", request->payload().size(),
                                              " bytes; the limit is ", kMaxPayloadBytes)));
    return reactor;
  }
  response->set_payload(request->payload());
  const absl::Duration since_epoch = absl::Now() - absl::UnixEpoch();
  const int64_t seconds = absl::ToInt64Seconds(since_epoch);
  response->mutable_server_time()->set_seconds(seconds);
  response->mutable_server_time()->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(since_epoch - absl::Seconds(seconds))));
  response->set_server_version(std::string(Version()));
  response->set_server_commit(std::string(GitCommit()));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace sbx::server

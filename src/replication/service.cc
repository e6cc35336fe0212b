#include "src/replication/service.h"

#include <openssl/crypto.h>

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace sbx::replication {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// Constant-time comparison of the presented token with ours.
bool TokenMatches(const grpc::ServerContext& context, const std::string& token) {
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return false;
  const std::string presented(it->second.data(), it->second.size());
  const std::string expected = "Bearer " + token;
  return presented.size() == expected.size() &&
         CRYPTO_memcmp(presented.data(), expected.data(), expected.size()) == 0;
}

}  // namespace

ReplicationService::ReplicationService(std::string token,
                                       std::function<std::shared_ptr<ReplicationHub>()> hub)
    : token_(std::move(token)), hub_(std::move(hub)) {}

grpc::Status ReplicationService::Follow(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::LeaderMessage, v1::FollowerMessage>* stream) {
  if (token_.empty() || !TokenMatches(*context, token_)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "store replication needs the replicas' replication token");
  }
  std::shared_ptr<ReplicationHub> hub = hub_();
  if (hub == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this replica does not lead; follow the Lease holder");
  }
  v1::FollowerMessage hello;
  if (!stream->Read(&hello) || !hello.has_hello() || hello.hello().identity().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a follower's first message is Hello with its identity");
  }
  const std::string identity = hello.hello().identity();
  absl::StatusOr<std::shared_ptr<ReplicationHub::Feed>> feed = hub->Attach(identity);
  if (!feed.ok()) return ToGrpc(feed.status());
  // Acknowledgements, read on their own thread while this one writes.
  std::thread reader([&] {
    v1::FollowerMessage m;
    while (stream->Read(&m)) {
      if (!m.has_ack()) {
        hub->Detach(**feed, absl::InvalidArgumentError("a follower sends only Acks after Hello"));
        return;
      }
      if (!hub->Ack(**feed, m.ack().ticket()).ok()) return;
    }
    hub->Detach(**feed, absl::UnavailableError("the standby's stream ended"));
  });
  absl::Status why;
  while (!context->IsCancelled()) {
    absl::Status dropped;
    std::optional<v1::LeaderMessage> next = hub->Next(**feed, absl::Milliseconds(200), &dropped);
    if (!dropped.ok()) {
      why = dropped;
      break;
    }
    if (next.has_value() && !stream->Write(*next)) {
      why = absl::UnavailableError("writing to the standby failed");
      break;
    }
  }
  if (why.ok()) why = absl::CancelledError("the standby's stream was cancelled");
  hub->Detach(**feed, why);
  context->TryCancel();  // ends the reader's Read
  reader.join();
  spdlog::info("replication: stream of standby \"{}\" ended: {}", identity, why.ToString());
  return ToGrpc(why);
}

}  // namespace sbx::replication

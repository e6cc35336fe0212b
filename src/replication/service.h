#pragma once
// ReplicationService: the gRPC face of the leader's ReplicationHub (proto
// sbx/replication/v1). Every replica serves it; only the leader has a hub to attach to
// (a standby answers FAILED_PRECONDITION). Callers must carry the replicas' shared
// replication token ("authorization: Bearer <token>", ReplicationToken below): the stream
// holds every claim of every tenant, so nobody else may follow it.
//
// Thread-safety: gRPC calls Follow from its threads; one call holds two (it reads the
// standby's acknowledgements on a second thread).

#include <functional>
#include <memory>
#include <string>

#include "sbx/replication/v1/replication.grpc.pb.h"
#include "src/replication/hub.h"

namespace sbx::replication {

// The token the replicas show each other is SandboxSecrets::For(kReplicationTokenLabel):
// HMAC-SHA256 of this label under their shared sandbox key, so it needs no secret of its
// own. The space keeps it apart from every sandbox's secret (no sandbox id has one), so
// no sandbox's daemon ever learns it.
inline constexpr char kReplicationTokenLabel[] = "sbx replication token";

class ReplicationService final : public v1::Replication::Service {
 public:
  // `hub` gives this replica's hub while it leads, else null. `token` must not be empty.
  ReplicationService(std::string token, std::function<std::shared_ptr<ReplicationHub>()> hub);

  grpc::Status Follow(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::LeaderMessage, v1::FollowerMessage>* stream) override;

 private:
  const std::string token_;
  const std::function<std::shared_ptr<ReplicationHub>()> hub_;
};

}  // namespace sbx::replication

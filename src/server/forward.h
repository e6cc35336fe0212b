#pragma once
// Forwarding: how a standby replica answers the sbx.v1 API. With leader election
// (docs/operations.md) only the leader has the pools and the claims; a standby serves its
// port with a generic gRPC service that relays every call it does not serve itself
// (Diagnostics.Ping, health and reflection stay local) to the leader, as it is: the
// request and response messages as bytes, the client's metadata (its bearer token, request
// id, ...), its deadline and cancellation, and the leader's initial and trailing metadata
// and status (the retry hints of RESOURCE_EXHAUSTED) back. Unary and streaming calls
// alike (one bidi relay for all four kinds). The leader authenticates and authorizes; the
// standby decides nothing.
//
// A relayed call carries `sbx-forwarded-by: <identity>`; a call that already carries it
// is never relayed again (the replicas' views of the leader disagree for a moment during a
// failover), it answers UNAVAILABLE, as does a call while no leader's address is known.
// Clients retry UNAVAILABLE with the same claim id, which the leader answers once.
//
// Thread-safety: the service may be used by any number of calls at once; leader_address
// is called once per call, from gRPC's threads.
// Lifetime: the service must outlive the grpc::Server it is registered with.

#include <functional>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"

namespace sbx::server {

// The metadata key that marks a relayed call.
inline constexpr char kForwardedByMetadata[] = "sbx-forwarded-by";

struct ForwardOptions {
  // The leader's gRPC address ("host:port"); "" while unknown.
  std::function<std::string()> leader_address;
  // This replica's name, sent in sbx-forwarded-by.
  std::string identity;
  // Of the hop to the leader; null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

class ForwardingService final : public grpc::CallbackGenericService {
 public:
  explicit ForwardingService(ForwardOptions options) : options_(std::move(options)) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

 private:
  // A channel to `address`, kept while the leader stays the same.
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  const ForwardOptions options_;
  absl::Mutex mu_;
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::server

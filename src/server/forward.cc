#include "src/server/forward.h"

#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/generic/generic_stub.h"

namespace sbx::server {
namespace {

// Metadata that gRPC makes itself for each hop (or that carries the status): never
// copied from one side of the relay to the other.
bool HopByHop(grpc::string_ref key) {
  const absl::string_view k(key.data(), key.size());
  return k.empty() || k[0] == ':' || absl::StartsWith(k, "grpc-") || k == "te" ||
         k == "content-type" || k == "user-agent" || k == "host";
}

// Adds the entries of `from` that are not hop-by-hop, through `add(key, value)`.
template <typename Add>
void CopyMetadata(const std::multimap<grpc::string_ref, grpc::string_ref>& from, Add add) {
  for (const auto& [key, value] : from) {
    if (HopByHop(key)) continue;
    add(std::string(key.data(), key.size()), std::string(value.data(), value.size()));
  }
}

// One relayed call: the server side (Down, the client's call to this replica) and the
// client side (Up, this replica's call to the leader). Messages flow one at a time each
// way: a request is read from the client only once the previous one was written to the
// leader, and a response read from the leader only once the previous one was written to
// the client, so each direction has one buffer and at most one operation in flight.
//
// Up holds two holds (gRPC's rule for operations started outside Up's own reactions):
// one for the request flow, released when the client has sent its last message (or
// writes to the leader fail, or the leader has ended the call), one for the response
// flow, released when the leader's messages end (or the client is gone). Up's OnDone, and
// with it the status, comes once both are released; the client's call is then finished
// with the leader's status and trailing metadata. Decisions are made under the mutex and
// the gRPC operations started after it is released (a reaction may run inline).
class Relay {
 public:
  Relay(grpc::GenericCallbackServerContext* ctx, std::shared_ptr<grpc::Channel> channel,
        const std::string& identity)
      : down_(this), up_(this), ctx_(ctx) {
    CopyMetadata(ctx->client_metadata(),
                 [this](std::string k, std::string v) { up_ctx_.AddMetadata(k, v); });
    up_ctx_.AddMetadata(kForwardedByMetadata, identity);
    up_ctx_.set_deadline(ctx->deadline());
    grpc::GenericStub stub(std::move(channel));
    stub.PrepareBidiStreamingCall(&up_ctx_, ctx->method(), grpc::StubOptions(), &up_);
    up_.AddMultipleHolds(2);
    up_.StartRead(&up_in_);
    up_.StartCall();
    down_.StartRead(&down_in_);
  }

  // A call that is answered here, without the leader.
  static grpc::ServerGenericBidiReactor* Refuse(grpc::Status status) {
    class Refused : public grpc::ServerGenericBidiReactor {
     public:
      explicit Refused(grpc::Status status) { Finish(std::move(status)); }
      void OnDone() override { delete this; }
    };
    return new Refused(std::move(status));
  }

  grpc::ServerGenericBidiReactor* reactor() { return &down_; }

 private:
  class Down : public grpc::ServerGenericBidiReactor {
   public:
    explicit Down(Relay* r) : r_(r) {}
    void OnReadDone(bool ok) override { r_->ClientRead(ok); }
    void OnWriteDone(bool ok) override { r_->ClientWritten(ok); }
    void OnCancel() override { r_->up_ctx_.TryCancel(); }
    void OnDone() override { r_->Unref(); }

   private:
    Relay* const r_;
  };
  class Up : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Up(Relay* r) : r_(r) {}
    void OnReadInitialMetadataDone(bool ok) override { r_->LeaderMetadata(ok); }
    void OnReadDone(bool ok) override { r_->LeaderRead(ok); }
    void OnWriteDone(bool ok) override { r_->LeaderWritten(ok); }
    void OnDone(const grpc::Status& s) override { r_->LeaderDone(s); }

   private:
    Relay* const r_;
  };

  // A request message from the client (or its end).
  void ClientRead(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      if (!request_hold_) return;  // the request flow is over
      if (ok) {
        leader_write_pending_ = true;
      } else {
        request_hold_ = false;
      }
    }
    if (ok) return up_.StartWrite(&down_in_);
    up_.StartWritesDone();
    up_.RemoveHold();
  }

  // The leader took a request message.
  void LeaderWritten(bool ok) {
    bool read_next = false;
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      leader_write_pending_ = false;
      if (!ok || responses_ended_) {
        release = request_hold_;
        request_hold_ = false;
      } else {
        read_next = !finished_;
      }
    }
    if (read_next) down_.StartRead(&down_in_);
    if (release) up_.RemoveHold();
  }

  // Copies the leader's initial metadata to the client's call, once, before anything is
  // sent to the client (it goes with the first message or the status). Reactions of one
  // call may run at once on different threads, so whichever comes first does it.
  void CopyInitialMetadataLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (metadata_copied_) return;
    metadata_copied_ = true;
    CopyMetadata(up_ctx_.GetServerInitialMetadata(),
                 [this](std::string k, std::string v) { ctx_->AddInitialMetadata(k, v); });
  }

  void LeaderMetadata(bool ok) {
    absl::MutexLock lock(&mu_);
    if (ok && !finished_) CopyInitialMetadataLocked();
  }

  // A response message from the leader (or their end).
  void LeaderRead(bool ok) {
    bool write = false;
    bool release_request = false;
    {
      absl::MutexLock lock(&mu_);
      if (ok && !finished_) {
        CopyInitialMetadataLocked();
        ++client_writes_;
        write = true;
      } else {
        responses_ended_ = true;
        if (!leader_write_pending_ && request_hold_) {
          request_hold_ = false;
          release_request = true;
        }
      }
    }
    if (write) {
      down_.StartWrite(&up_in_);
      return;
    }
    up_.RemoveHold();  // the response flow
    if (release_request) up_.RemoveHold();
  }

  // The client took a response message.
  void ClientWritten(bool ok) {
    bool read_next = false;
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      --client_writes_;
      // A finish waiting for this write: the leader's call is over (both flows released).
      if (pending_finish_) {
        finish = std::exchange(pending_finish_, std::nullopt);
      } else {
        read_next = ok;
      }
    }
    if (finish) return down_.Finish(std::move(*finish));
    if (read_next) return up_.StartRead(&up_in_);
    // The client is gone: end the leader's call and the response flow.
    up_ctx_.TryCancel();
    up_.RemoveHold();
  }

  void LeaderDone(const grpc::Status& status) {
    bool finish_now = false;
    {
      absl::MutexLock lock(&mu_);
      if (!finished_) CopyInitialMetadataLocked();
      CopyMetadata(up_ctx_.GetServerTrailingMetadata(),
                   [this](std::string k, std::string v) { ctx_->AddTrailingMetadata(k, v); });
      if (!finished_) {
        finished_ = true;
        if (client_writes_ > 0) {
          pending_finish_ = status;
        } else {
          finish_now = true;
        }
      }
    }
    if (finish_now) down_.Finish(status);
    Unref();
  }

  void Unref() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  Down down_;
  Up up_;
  grpc::GenericCallbackServerContext* const ctx_;
  grpc::ClientContext up_ctx_;
  grpc::ByteBuffer down_in_;  // the request message in flight
  grpc::ByteBuffer up_in_;    // the response message in flight

  absl::Mutex mu_;
  int refs_ ABSL_GUARDED_BY(mu_) = 2;  // Down's OnDone and Up's OnDone
  bool request_hold_ ABSL_GUARDED_BY(mu_) = true;
  bool leader_write_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool responses_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool metadata_copied_ ABSL_GUARDED_BY(mu_) = false;
  int client_writes_ ABSL_GUARDED_BY(mu_) = 0;  // messages in flight (0 or 1)
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> pending_finish_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<grpc::Channel> ForwardingService::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  if (channel_ == nullptr || address_ != address) {
    grpc::ChannelArguments args;
    // The leader applies its own limits; the hop adds none.
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    channel_ = grpc::CreateCustomChannel(
        address,
        options_.credentials != nullptr ? options_.credentials : grpc::InsecureChannelCredentials(),
        args);
    address_ = address;
  }
  return channel_;
}

grpc::ServerGenericBidiReactor* ForwardingService::CreateReactor(
    grpc::GenericCallbackServerContext* ctx) {
  const auto& metadata = ctx->client_metadata();
  if (auto it = metadata.find(kForwardedByMetadata); it != metadata.end()) {
    return Relay::Refuse(grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("sbx-server \"", options_.identity,
                     "\" is a standby and the call was relayed to it already by \"",
                     std::string(it->second.data(), it->second.size()),
                     "\": the replicas disagree on the leader during a failover; retry")));
  }
  const std::string leader = options_.leader_address ? options_.leader_address() : "";
  if (leader.empty()) {
    return Relay::Refuse(
        grpc::Status(grpc::StatusCode::UNAVAILABLE,
                     absl::StrCat("sbx-server \"", options_.identity,
                                  "\" is a standby and knows no leader to relay ", ctx->method(),
                                  " to (an election is under way); retry")));
  }
  auto* relay = new Relay(ctx, ChannelTo(leader), options_.identity);
  return relay->reactor();
}

}  // namespace sbx::server

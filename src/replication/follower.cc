#include "src/replication/follower.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "sbx/replication/v1/replication.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace sbx::replication {

Follower::Follower(FollowerOptions options) : options_(std::move(options)) {}

Follower::~Follower() { Stop(); }

void Follower::Start() {
  thread_ = std::thread([this] { Run(); });
}

void Follower::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

FollowerStats Follower::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Follower::Run() {
  std::string last_error;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    const std::string address = options_.leader_address();
    if (!address.empty()) {
      absl::Status ended = FollowOnce(address);
      {
        absl::MutexLock lock(&mu_);
        stats_.following = false;
        if (stopping_) return;
      }
      // Logged once per distinct reason: a leader that refuses keeps refusing.
      if (ended.ToString() != last_error) {
        spdlog::warn("replication: following the leader at {} ended: {}; retrying", address,
                     ended.ToString());
        last_error = ended.ToString();
      }
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.retry_period);
  }
}

absl::Status Follower::FollowOnce(const std::string& address) {
  auto channel = grpc::CreateChannel(
      address, options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials());
  auto stub = v1::Replication::NewStub(channel);
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + options_.token);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::CancelledError("stopping");
    context_ = &context;
  }
  auto stream = stub->Follow(&context);
  absl::Status why;
  store::Replicable& store = *options_.store;
  store::ReplicaMarker marker;
  bool started = false;
  v1::FollowerMessage hello;
  hello.mutable_hello()->set_identity(options_.identity);
  if (stream->Write(hello)) {
    v1::LeaderMessage m;
    std::vector<std::pair<std::string, std::string>> entries;
    auto ack = [&](uint64_t ticket) {
      v1::FollowerMessage a;
      a.mutable_ack()->set_ticket(ticket);
      if (!stream->Write(a)) return false;
      absl::MutexLock lock(&mu_);
      stats_.acked = ticket;
      return true;
    };
    while (why.ok() && stream->Read(&m)) {
      switch (m.kind_case()) {
        case v1::LeaderMessage::kStart:
          marker = {m.start().leader(), m.start().term(), options_.identity, false};
          why = store.BeginLoad(marker);
          started = why.ok();
          if (started) {
            spdlog::info("replication: loading a snapshot from leader \"{}\" (term {}) at {}",
                         marker.leader, marker.term, address);
          }
          break;
        case v1::LeaderMessage::kChunk: {
          const v1::Chunk& c = m.chunk();
          if (!started || c.keys_size() != c.values_size()) {
            why = absl::InvalidArgumentError("malformed snapshot chunk from the leader");
            break;
          }
          entries.clear();
          for (int i = 0; i < c.keys_size(); ++i) entries.emplace_back(c.keys(i), c.values(i));
          why = store.LoadEntries(entries);
          break;
        }
        case v1::LeaderMessage::kSnapshotEnd:
          if (!started) {
            why = absl::InvalidArgumentError("snapshot end before its start");
            break;
          }
          marker.complete = true;
          why = store.WriteMarker(marker);
          if (why.ok()) {
            {
              absl::MutexLock lock(&mu_);
              stats_.following = true;
              stats_.leader = marker.leader;
              ++stats_.loads;
            }
            spdlog::info("replication: following leader \"{}\" (snapshot at group {})",
                         marker.leader, m.snapshot_end().ticket());
            if (!ack(m.snapshot_end().ticket())) why = absl::UnavailableError("sending an Ack");
          }
          break;
        case v1::LeaderMessage::kGroup:
          if (!marker.complete) {
            why = absl::InvalidArgumentError("a group before the snapshot's end");
            break;
          }
          why = store.ApplyGroup(m.group().data());
          if (why.ok() && !ack(m.group().ticket())) why = absl::UnavailableError("sending an Ack");
          break;
        default:
          why = absl::InvalidArgumentError("unknown message from the leader");
      }
    }
  }
  if (!why.ok()) context.TryCancel();
  grpc::Status finished = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
  }
  if (!why.ok()) return why;
  return absl::Status(static_cast<absl::StatusCode>(finished.error_code()),
                      absl::StrCat("the leader ended the stream: ", finished.error_message()));
}

}  // namespace sbx::replication

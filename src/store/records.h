#pragma once
// The records sbx keeps durable: templates, pools, sandboxes, claims and the claim
// revision mark. Plain structs; their on-disk encoding is the implementation's business
// (see rocksdb_store.cc).
//
// The store is the truth for ownership (which claim holds which sandbox) and for pool
// and template definitions; the runtime is the truth for which sandboxes exist.

#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sbx::store {

// What a claim does when its pool has no warm sandbox.
enum class EmptyPoolPolicy : uint8_t {
  kWait = 1,  // queue FIFO until a sandbox is ready or the claim's deadline passes
  kCold = 2,  // ask the runtime to create one now and wait for it
  kFail = 3,  // RESOURCE_EXHAUSTED at once, with a retry hint
};

enum class LaunchType : uint8_t {
  kWarm = 1,  // taken from the pool's ready set
  kCold = 2,  // created for this claim
};

enum class ClaimState : uint8_t {
  kActive = 1,    // holds its sandbox
  kReleased = 2,  // ended by Release; kept for the idempotency window, then deleted
  kExpired = 3,   // ended because its TTL passed; kept like kReleased
  kLost = 4,      // its sandbox disappeared (runtime said so, or it was gone after restart)
};

struct TemplateRecord {
  std::string name;
  // Which runtime runs it: "local" or "kubernetes".
  std::string runtime;
  // Runtime-specific specification, serialized by the server; opaque to store and allocator.
  std::string spec;
  // Bumped by every update of the template.
  uint64_t generation = 0;
};

// How a pool's warm target is chosen (src/allocator/demand.h).
enum class PoolSizing : uint8_t {
  kStatic = 0,  // min_warm plus the claims waiting, capped by max_warm
  kDemand = 1,  // from the measured demand, between min_warm and max_warm
};

struct PoolRecord {
  std::string name;
  std::string template_name;
  // Floor and ceiling of warm sandboxes; the scheduler's target stays between them.
  int32_t min_warm = 0;
  int32_t max_warm = 0;
  EmptyPoolPolicy empty_pool_policy = EmptyPoolPolicy::kWait;
  // Default for claims that give no deadline of their own (kWait and kCold).
  absl::Duration default_wait = absl::Seconds(30);
  // Claim TTL when the claim gives none; ZeroDuration() means claims never expire.
  absl::Duration default_ttl = absl::ZeroDuration();
  // Upper bound on a claim's TTL (ZeroDuration(): no bound).
  absl::Duration max_ttl = absl::ZeroDuration();
  // Name of the selection policy ("fifo").
  std::string selection_policy = "fifo";
  PoolSizing sizing = PoolSizing::kStatic;
  uint64_t generation = 0;
};

struct SandboxRecord {
  std::string id;
  std::string pool;
  // How the server reaches the sandbox: a unix socket path, or "ip:port" of a pod.
  std::string endpoint;
  // Where it runs (node name on Kubernetes; empty for the local runtime).
  std::string node;
  absl::Time created = absl::UnixEpoch();
  // The labels of `node` when the runtime reported the sandbox (Kubernetes: the Node's).
  // Last, so that positional initializers of the fields above keep working.
  std::map<std::string, std::string> node_labels = {};
};

// The store key of a claim. Claim ids are scoped by their owner (tenant): two tenants may
// use the same idempotency key. Owners contain no '/' (see ValidateKey).
inline std::string ClaimKey(absl::string_view owner, absl::string_view id) {
  return absl::StrCat(owner, "/", id);
}

struct ClaimRecord {
  // The client's idempotency key, or a generated id; unique per owner.
  std::string id;
  // Tenant that owns the claim.
  std::string owner;
  std::string pool;
  std::string sandbox_id;
  // Copied from the sandbox so that a claim can be answered without the sandbox record.
  std::string endpoint;
  std::map<std::string, std::string> labels;
  LaunchType launch_type = LaunchType::kWarm;
  ClaimState state = ClaimState::kActive;
  absl::Time created = absl::UnixEpoch();
  // InfiniteFuture() when the claim has no TTL.
  absl::Time expires = absl::InfiniteFuture();
  // When the claim left kActive; UnixEpoch() while active.
  absl::Time ended = absl::UnixEpoch();
  // Revision of the claim's last change, in the allocator's single increasing sequence of
  // claim changes (written with the change itself). 0 in records from before revisions.
  uint64_t revision = 0;
  // Whether the claim's sandbox is suspended (frozen by the runtime).
  bool suspended = false;
  // For a member of a ClaimBatch (id "<batch_id>#<i>"): the count the batch asked for, so
  // that a reuse of the batch id with another count is recognised, also after a restart
  // and also when a BEST_EFFORT batch got fewer. 0 for a claim made alone, and in records
  // from before batch counts were stored.
  int32_t batch_count = 0;
  // The late-bound env of the claim (sbx.v1.SandboxConfig.env), given to its sandbox again
  // when it starts anew (Snapshots.Reset), also after a restart. Empty: none. Never answered
  // to clients (it may hold secrets).
  std::map<std::string, std::string> env;
};

// The claim revision mark: at least the revision of every claim change whose record is no
// longer in the store (a deleted claim's deletion). The allocator writes it in the same
// batch as each deletion, so that after a restart max(mark, revisions of the stored
// claims) is at least every revision it ever acknowledged. One per store; 0 when never
// written.
struct RevisionRecord {
  uint64_t revision = 0;
};
// The key of the one RevisionRecord (Mutation::key).
inline constexpr absl::string_view kRevisionRecordKey = "revision";

// A snapshot of a sandbox's file system (issue 37): its files live under the server's
// data dir (snapshots/<id>/), this record says whose they are and where they came from.
// Ids are unique across owners (generated by the server), so the key is the id alone.
struct SnapshotRecord {
  std::string id;
  // Tenant that made it; the only one that may see or use it.
  std::string owner;
  // The caller's name for it (not unique), and its labels.
  std::string name;
  std::map<std::string, std::string> labels;
  // The claim it was taken from (for the record; the claim may have ended since).
  std::string source_claim;
  // What it lies on: the image digest of the sandbox's root ("sha256:..."), or empty for a
  // sandbox of the host's root (then only its workspace is in the snapshot).
  std::string parent_image_digest;
  // The image reference the template named, so that a sandbox can start from it again.
  std::string parent_image;
  // The snapshot the sandbox itself started from (empty: none).
  std::string parent_snapshot;
  // Bytes of its files (regular file contents and link targets), what the quota counts.
  int64_t size_bytes = 0;
  absl::Time created = absl::UnixEpoch();
  // The template the source sandbox was started from, as stored when the snapshot was
  // taken (TemplateRecord's name, runtime and opaque spec): what a fork of it starts as.
  // Empty in snapshots taken before forks existed.
  std::string template_name;
  std::string template_runtime;
  std::string template_spec;
};

}  // namespace sbx::store

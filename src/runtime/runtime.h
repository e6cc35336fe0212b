#pragma once
// sbx::runtime: the interface through which sbx makes sandboxes exist. Implementations:
// the local runtime (bubblewrap + sbx-sandboxd) and the Kubernetes runtime (pods).
// The allocator uses it only for COLD claims; refills and clean-up go through the
// reconciler, which also uses this interface.
//
// Thread-safety: every method may be called from any thread; callbacks run on a thread
// of the runtime's choosing and must not block.
// Lifetime: the runtime must outlive its users; pending callbacks run (with CANCELLED)
// before the runtime is destroyed.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sbx::runtime {

// What to create: a sandbox of `pool` from its template.
struct CreateRequest {
  std::string pool;
  std::string template_name;
  // The template's runtime-specific spec, as stored (serialized by the server).
  std::string template_spec;
  // Labels to attach (Kubernetes labels; recorded by the local runtime).
  std::map<std::string, std::string> labels;
};

// A sandbox that exists and is ready to be claimed.
struct SandboxInfo {
  std::string id;
  std::string pool;
  // How sbx reaches the sandbox's daemon: a unix socket path or "ip:port".
  std::string endpoint;
  // Node it runs on (empty for the local runtime).
  std::string node;
  // Frozen by Suspend (reported by List).
  bool suspended = false;
  // Whether it can serve now (reported by List). A sandbox that exists but is not ready
  // (the Kubernetes runtime: its Sandbox not Ready, or no pod IP) is still listed.
  bool ready = true;
  // The labels of `node`, where the runtime knows them (Kubernetes: the Node object's,
  // such as topology.kubernetes.io/zone); the spread and pack policies match a claim's
  // node preference against them.
  std::map<std::string, std::string> node_labels = {};
  // The uid of the claim that holds it in the runtime's own records, where the runtime
  // keeps one (Kubernetes: a SandboxClaim's, label agents.x-k8s.io/claim-uid); such a
  // sandbox is bound outside sbx's store and is never deleted as unknown at start.
  std::string held_by_claim = {};
};

using CreateCallback = absl::AnyInvocable<void(absl::StatusOr<SandboxInfo>) &&>;
using DoneCallback = absl::AnyInvocable<void(absl::Status) &&>;
using DeleteCallback = DoneCallback;
// Resume's answer: where the sandbox is reached now (id, endpoint and node filled in; an
// empty endpoint means where it was).
using ResumeCallback = absl::AnyInvocable<void(absl::StatusOr<SandboxInfo>) &&>;

// What Runtime::Snapshot captured.
struct SnapshotCapture {
  // Bytes of its files (file contents and link targets): what was charged.
  int64_t bytes = 0;
  // The digest of the image the sandbox's root lies on; empty for a sandbox of the host's
  // root (then only its workspace was captured).
  std::string image_digest;
  // Sockets and device nodes left out (a snapshot never carries them).
  int64_t dropped = 0;
};
using SnapshotCallback = absl::AnyInvocable<void(absl::StatusOr<SnapshotCapture>) &&>;
// Called with the bytes a snapshot is about to copy; a non-OK status stops it with that
// status (a quota). May be called from the runtime's threads; must not block.
using SnapshotCharge = std::function<absl::Status(int64_t bytes)>;

// The answer of runtimes that have no snapshots.
[[nodiscard]] inline absl::Status NoSnapshots() {
  return absl::UnimplementedError(
      "this runtime has no snapshots: Snapshot, Fork and Reset work with the local runtime "
      "(sbx-server --runtime local); on Kubernetes, claims, suspend/resume, exec and files "
      "work (docs/kubernetes.md says what a snapshot backend there would need)");
}

class Runtime {
 public:
  virtual ~Runtime() = default;

  // Starts creating a sandbox; `done` runs once it is ready (or failed). Errors:
  // INVALID_ARGUMENT for a spec the runtime cannot run, UNAVAILABLE / RESOURCE_EXHAUSTED
  // for transient trouble.
  virtual void Create(CreateRequest request, CreateCallback done) = 0;

  // Deletes sandbox `id` and everything in it. NOT_FOUND if it does not exist (callers
  // treat that as done).
  virtual void Delete(std::string id, DeleteCallback done) = 0;

  // Suspends sandbox `id`. The local runtime freezes every process, keeping their memory
  // (freezer cgroup, or SIGSTOP); the Kubernetes runtime stops its pod and keeps its
  // volumes (the Sandbox's operatingMode: Suspended). Idempotent. NOT_FOUND for an
  // unknown id, UNIMPLEMENTED when the runtime cannot suspend.
  virtual void Suspend(std::string id, DoneCallback done) = 0;
  // Brings a suspended sandbox back and answers once it can serve, with where it is
  // reached now: the local runtime thaws it in place (same endpoint); the Kubernetes
  // runtime makes a new pod, whose IP (and node) are new. Idempotent: on a running
  // sandbox it answers where it runs. NOT_FOUND for an unknown id.
  virtual void Resume(std::string id, ResumeCallback done) = 0;

  // The sandboxes that exist now, including those a previous run of sbx left running
  // (which the runtime has adopted: it watches them and reports their end like its own).
  // Called once at start to reconcile with the store: sbx deletes the ones it does not
  // know and marks claims whose sandbox is missing as lost, so a sandbox is left out only
  // when the runtime knows it is gone; when it cannot tell, List fails (UNAVAILABLE)
  // instead. `suspended` reports whether each one is frozen now, `ready` whether it can
  // serve now (warm ones that cannot are retired; claimed ones are kept).
  [[nodiscard]] virtual absl::StatusOr<std::vector<SandboxInfo>> List() = 0;

  // --- Snapshots (issue 37) ---
  // Captures the file system of sandbox `sandbox_id` (its root's own layer and its
  // workspace) as snapshot `snapshot_id`: the sandbox is frozen for the copy and thawed
  // after it (left frozen when it was suspended before), also on failure. The snapshot's
  // files are whole and synced when `done` gets OK; on any failure none are left. Errors:
  // NOT_FOUND (no such sandbox), ALREADY_EXISTS (the snapshot id), the charge's status,
  // RESOURCE_EXHAUSTED (disk full), FAILED_PRECONDITION (a tree it refuses to copy),
  // UNIMPLEMENTED (this runtime has no snapshots).
  virtual void Snapshot(std::string sandbox_id, std::string snapshot_id, SnapshotCharge charge,
                        SnapshotCallback done) {
    std::move(done)(NoSnapshots());
  }
  // Removes snapshot `snapshot_id`'s files; OK when there are none.
  [[nodiscard]] virtual absl::Status DeleteSnapshot(const std::string& snapshot_id) {
    return NoSnapshots();
  }
  // Rewinds sandbox `sandbox_id` to snapshot `snapshot_id` (issue 37): every process of
  // the sandbox is killed and it starts again under the same id and endpoint, its root's own
  // layer and its workspace filled with the snapshot's. `image_digest` is the image the
  // snapshot was taken on (empty: the host's root); a sandbox of another image is refused.
  // The sandbox runs afterwards (not suspended). Errors: NOT_FOUND (no such sandbox, or the
  // snapshot has no files), FAILED_PRECONDITION (another image, naming both; a sandbox this
  // runtime adopted from an earlier run), UNIMPLEMENTED. When the new start fails after the
  // old processes were killed, the sandbox is gone (reported as gone) and the error says
  // why.
  virtual void Reset(std::string sandbox_id, std::string snapshot_id, std::string image_digest,
                     DoneCallback done) {
    std::move(done)(NoSnapshots());
  }
  // The snapshots whose files exist (whole ones: a snapshot interrupted by a crash is
  // removed when the runtime starts, never listed). Empty for runtimes without snapshots.
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::string>> ListSnapshots() {
    return std::vector<std::string>{};
  }
};

}  // namespace sbx::runtime

#pragma once
// ForkPools: the pools that serve Snapshots.Fork (issue 37). A snapshot's forks come from
// its fork pool, made by the first Fork of the snapshot: a template and a pool both named
// PoolName(snapshot id), "fork-" and the id's 16 characters, in the default namespace, or
// in the owner's first namespace when its token confines it elsewhere. The template is the
// snapshot's source template (SnapshotRecord::template_*, a local spec) with
// LocalSpec.snapshot set to the snapshot; the pool keeps none warm (min_warm 0), creates
// forks for the claims that wait (max_warm kMaxForkWarm, policy COLD) and waits
// kForkWait by default. The first Fork that finds the pool missing writes both (through
// the allocator, as AdminService does); Forks racing it share those writes (single
// flight). An existing template or pool of that name is used when its template names the
// snapshot, else FAILED_PRECONDITION.
//
// A fork pool is never claimed from by name (ClaimService refuses names of its shape with
// NOT_FOUND, whether or not it exists): only through Fork, which checks that the caller
// owns the snapshot, so no other tenant of the namespace reaches the snapshot's files.
//
// Retire removes a snapshot's fork pool and its template (DeleteSnapshot does it first);
// the allocator refuses while forks of it are claimed (FAILED_PRECONDITION).
//
// Thread-safety: every method may be called from any thread; callbacks run on the calling
// thread or an allocator (store committer) thread, never under a lock of this class.
// Lifetime: held by a shared_ptr; the allocator's callbacks keep it alive while its
// writes are in flight. The Allocator must outlive it.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "sbx/v1/admin.pb.h"
#include "src/allocator/allocator.h"
#include "src/allocator/snapshots.h"
#include "src/server/auth.h"

namespace sbx::server {

// How many forks of one snapshot the fork pool creates at a time for waiting claims (the
// most one Fork may ask for is the allocator's max batch, 1000 by default).
inline constexpr int32_t kMaxForkWarm = 1000;
// How long a Fork waits for its forks unless it says otherwise.
inline constexpr absl::Duration kForkWait = absl::Minutes(5);

// A template's local.snapshot (admin.proto): OK without one; else NOT_FOUND when no such
// snapshot exists (whoever owns it), FAILED_PRECONDITION when `snapshots` is null (no
// snapshots on this server) or the snapshot was taken on another image than the
// template's `image` (the references, as written) or on the host's root while the
// template names an image (or the other way round).
[[nodiscard]] absl::Status CheckTemplateSnapshot(const allocator::Snapshots* snapshots,
                                                 const v1::Template& t);

class ForkPools : public std::enable_shared_from_this<ForkPools> {
 public:
  using Callback = absl::AnyInvocable<void(absl::StatusOr<std::string>) &&>;
  using StatusCallback = absl::AnyInvocable<void(absl::Status) &&>;
  // What the runtimes say of a template before it is stored (as PutTemplate asks).
  using TemplateCheck = std::function<absl::Status(const v1::Template&)>;

  static std::shared_ptr<ForkPools> Create(allocator::Allocator* allocator, TemplateCheck check);

  // "fork-" and the snapshot id without its "sn-".
  static std::string PoolName(absl::string_view snapshot_id);
  // Whether `name` (without namespace) has the shape of a fork pool's name.
  static bool IsForkName(absl::string_view name);
  // The snapshot id of fork pool `name` (canonical or not); empty when it is none.
  static std::string SnapshotOf(absl::string_view name);

  // The canonical name of the fork pool of `snapshot` (owned by `caller`: checked by the
  // caller), made first when missing. Errors: FAILED_PRECONDITION (the snapshot has no
  // recorded template, or not a local one; a pool or template of the name that is not
  // the snapshot's), the template check's and the allocator's errors.
  void Resolve(const Caller& caller, const store::SnapshotRecord& snapshot, Callback done)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Removes the fork pool of `snapshot_id` and its template, wherever they are; OK when
  // there is none. FAILED_PRECONDITION (from the allocator) while forks are claimed.
  void Retire(const std::string& snapshot_id, StatusCallback done);

 private:
  ForkPools(allocator::Allocator* allocator, TemplateCheck check)
      : allocator_(allocator), check_(std::move(check)) {}

  // OK when template `name` is missing or names `snapshot_id`.
  [[nodiscard]] absl::Status CheckOwn(const std::string& name,
                                      const std::string& snapshot_id) const;
  void Make(const std::string& name, const store::SnapshotRecord& snapshot);
  void MakePool(const std::string& name);
  // Deletes the pools (or templates) `names`, one after the other; stops at an error.
  void DeleteAll(std::vector<std::string> names, bool pools, StatusCallback done);
  void Finish(const std::string& name, const absl::Status& result) ABSL_LOCKS_EXCLUDED(mu_);

  allocator::Allocator* const allocator_;
  const TemplateCheck check_;

  absl::Mutex mu_;
  // Forks waiting for the writes of a fork pool, by its name (the single flight).
  absl::flat_hash_map<std::string, std::vector<StatusCallback>> flights_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::server

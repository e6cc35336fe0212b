#pragma once
// PoolWrites: the server's own pools (ImagePools' on-demand pools of images, ForkPools'
// pools of snapshots) are a template and a pool of one name, written through the
// allocator by the first claim that needs them while claims racing it wait for those
// writes and share their result (a single flight per name).
//
// Thread-safety: every method may be called from any thread; callbacks run on the calling
// thread or the allocator's (store committer) thread, never under this class's lock.
// Lifetime: held by a shared_ptr; the allocator's callbacks keep it alive while writes are
// in flight. The Allocator must outlive it.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "src/allocator/allocator.h"

namespace sbx::server {

class PoolWrites : public std::enable_shared_from_this<PoolWrites> {
 public:
  using Done = absl::AnyInvocable<void(absl::Status) &&>;

  // `what` names the kind in errors ("on-demand pool", "fork pool").
  static std::shared_ptr<PoolWrites> Create(allocator::Allocator* allocator, std::string what);

  // Joins the flight of `name` with `done`; true for the first to join, which must then
  // call Write or Finish for `name`.
  [[nodiscard]] bool Join(const std::string& name, Done done) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes template `t` (none: it exists already) and then pool `p` unless a pool of its
  // name exists, and finishes the flight of p.name with the result.
  void Write(std::optional<store::TemplateRecord> t, store::PoolRecord p);
  // Answers every `done` of the flight of `name` with `result` (an error names the pool).
  void Finish(const std::string& name, const absl::Status& result) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  PoolWrites(allocator::Allocator* allocator, std::string what)
      : allocator_(allocator), what_(std::move(what)) {}
  void WritePool(store::PoolRecord p);

  allocator::Allocator* const allocator_;
  const std::string what_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<Done>> flights_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::server

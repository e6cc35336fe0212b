#include "src/runtime/bubblewrap_runtime.h"

// The runtime itself: its table of sandboxes, its worker and reaper threads, and Make().
// The rest lives in rooms of their own (each header says what it owns): proc.h (the
// kernel's view of processes), local_sandbox.h (a sandbox's record and shared names),
// cgroups.h (limits and the freezer), state_file.h, seccomp_filter.h, bwrap_args.h (the
// command line and the server files' masks), spawn.h (starting a sandbox, host uids),
// reaper.h (ends, output and the kill), adoption.h (what a new runtime finds) and
// probe.h (what isolation the machine gives).

#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "src/common/ids.h"
#include "src/common/paths.h"
#include "src/common/status_macros.h"
#include "src/images/images.h"
#include "src/runtime/adoption.h"
#include "src/runtime/bwrap_args.h"
#include "src/runtime/cgroups.h"
#include "src/runtime/image_root.h"
#include "src/runtime/local_sandbox.h"
#include "src/runtime/probe.h"
#include "src/runtime/proc.h"
#include "src/runtime/reaper.h"
#include "src/runtime/snapshot_files.h"
#include "src/runtime/spawn.h"
#include "src/runtime/state_file.h"

namespace sbx::runtime {
namespace {

namespace fs = std::filesystem;
using local::Cgroups;
using local::Fd;
using local::Isolation;
using local::Sandbox;
using local::SandboxPtr;

class BubblewrapRuntimeImpl final : public BubblewrapRuntime {
 public:
  BubblewrapRuntimeImpl(BubblewrapRuntimeOptions options, std::string root, Fd lock,
                        Isolation isolation, Cgroups cgroups, std::vector<SandboxPtr> adopted,
                        Fd snapshots)
      : options_(std::move(options)),
        root_(std::move(root)),
        lock_(std::move(lock)),
        snapshots_(std::move(snapshots)),
        snapshots_path_(options_.snapshots_dir.empty()
                            ? std::string()
                            : fs::absolute(options_.snapshots_dir).lexically_normal().string()),
        iso_(std::move(isolation)),
        isolated_(iso_.isolated),
        cgroups_(std::move(cgroups)),
        system_args_(local::SystemArgs(iso_.masks)),
        uids_(options_.sandbox_uid_base, options_.sandbox_uid_count, iso_.own_uids),
        adopted_(adopted.size()),
        wake_fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    {
      absl::MutexLock lock(&mu_);
      for (SandboxPtr& sb : adopted) {
        uids_.Hold(sb->host_uid);
        if (!sb->image_digest.empty() &&
            (options_.images == nullptr || !options_.images->Hold(sb->image_digest))) {
          spdlog::warn(
              "sandbox {}: its image {} is not in the image cache (it runs on; the "
              "cache may evict the image's files under it)",
              sb->id, sb->image_digest);
        }
        // Its snapshot's files are kept while it runs (whether or not the snapshot's
        // record still exists: the server's start removes the files of a snapshot without
        // one, which waits for the sandboxes that share them).
        if (!sb->snapshot.empty()) ++snapshot_users_[sb->snapshot];
        running_.emplace(sb->id, std::move(sb));
      }
    }
    for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { Work(); });
    reaper_ = std::thread([this] { Reap(); });
  }

  ~BubblewrapRuntimeImpl() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    WakeReaper();
    for (auto& t : workers_) t.join();
    reaper_.join();
    // Tasks never started get CANCELLED.
    std::deque<Task> left;
    {
      absl::MutexLock lock(&mu_);
      left.swap(tasks_);
    }
    for (Task& t : left) std::move(t)(/*cancelled=*/true);
    absl::flat_hash_map<std::string, SandboxPtr> all;
    {
      absl::MutexLock lock(&mu_);
      all.swap(running_);
    }
    if (!options_.delete_on_exit) {
      // Detach: the sandboxes keep running for the next runtime on this root.
      if (!all.empty()) {
        spdlog::info("local runtime: leaving {} sandboxes running under {}", all.size(), root_);
      }
      return;
    }
    for (auto& [id, sb] : all) {
      absl::MutexLock lock(&sb->op_mu);
      sb->ended = true;
      local::KillSandbox(*sb);
      ReleaseHolds(*sb);
    }
  }

  bool isolated() const override { return isolated_; }
  // Set once by Make() before the runtime is shared.
  void set_daemon_libs_status(absl::Status s) { daemon_libs_ = std::move(s); }
  size_t running() const override {
    absl::MutexLock lock(&mu_);
    return running_.size();
  }
  size_t adopted() const override { return adopted_; }
  absl::Status CheckSpec(const LocalSpec& spec) const override {
    RETURN_IF_ERROR(local::CheckMounts(spec, iso_.hidden));
    if (!spec.image.empty()) {
      if (options_.images == nullptr) return NoImages(spec.image);
      if (!isolated_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "image \"", spec.image,
            "\": a sandbox of an image needs bubblewrap's isolation, and this server runs "
            "plain processes"));
      }
      RETURN_IF_ERROR(options_.images->CheckReference(spec.image));
    }
    return absl::OkStatus();
  }
  uint64_t output_dropped_bytes() const override {
    return output_dropped_.load(std::memory_order_relaxed);
  }

  void Create(CreateRequest request, CreateCallback done) override {
    Enqueue([this, request = std::move(request), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      std::move(done)(Start(request));
    });
  }

  void Delete(std::string id, DeleteCallback done) override {
    Enqueue([this, id = std::move(id), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      SandboxPtr sb;
      {
        absl::MutexLock lock(&mu_);
        auto idle = [this, &id]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !resetting_.contains(id); };
        mu_.Await(absl::Condition(&idle));
        auto it = running_.find(id);
        if (it == running_.end()) return std::move(done)(NotHere(id));
        sb = std::move(it->second);
        running_.erase(it);
      }
      WakeReaper();
      {
        absl::MutexLock lock(&sb->op_mu);
        sb->ended = true;
        local::KillSandbox(*sb);
      }
      uids_.GiveBack(sb->host_uid);
      ReleaseHolds(*sb);
      std::move(done)(absl::OkStatus());
    });
  }

  void Suspend(std::string id, DoneCallback done) override {
    Enqueue([this, id = std::move(id), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      std::move(done)(SetSuspended(id, true));
    });
  }

  void Resume(std::string id, ResumeCallback done) override {
    Enqueue([this, id = std::move(id), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      if (absl::Status s = SetSuspended(id, false); !s.ok()) return std::move(done)(s);
      std::move(done)(Running(id));  // thawed in place: where it was
    });
  }

  void Snapshot(std::string sandbox_id, std::string snapshot_id, SnapshotCharge charge,
                SnapshotCallback done) override {
    Enqueue([this, sandbox_id = std::move(sandbox_id), snapshot_id = std::move(snapshot_id),
             charge = std::move(charge), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      std::move(done)(Capture(sandbox_id, snapshot_id, charge));
    });
  }

  void Reset(std::string sandbox_id, std::string snapshot_id, std::string image_digest,
             DoneCallback done) override {
    Enqueue([this, sandbox_id = std::move(sandbox_id), snapshot_id = std::move(snapshot_id),
             image_digest = std::move(image_digest),
             done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      std::move(done)(ResetTo(sandbox_id, snapshot_id, image_digest));
    });
  }

  // The snapshot's files are removed now, or, while sandboxes started at it share them,
  // when the last of those ends (ReleaseSnapshot); no sandbox starts at it from now on.
  absl::Status DeleteSnapshot(const std::string& snapshot_id) override {
    if (!snapshots_.valid()) return NoSnapshotsDir();
    RETURN_IF_ERROR(local::CheckSnapshotId(snapshot_id));
    {
      absl::MutexLock lock(&mu_);
      if (!deleted_snapshots_.insert(snapshot_id).second) return absl::OkStatus();
      if (auto it = snapshot_users_.find(snapshot_id); it != snapshot_users_.end()) {
        spdlog::info("snapshot {}: its files are removed when the {} sandboxes sharing them end",
                     snapshot_id, it->second);
        return absl::OkStatus();
      }
    }
    absl::Status s = local::RemoveTree(snapshots_.get(), snapshot_id);
    absl::MutexLock lock(&mu_);
    deleted_snapshots_.erase(snapshot_id);
    return s;
  }

  absl::StatusOr<std::vector<std::string>> ListSnapshots() override {
    if (!snapshots_.valid()) return std::vector<std::string>{};
    ASSIGN_OR_RETURN(std::vector<std::string> ids, local::ListSnapshotIds(snapshots_.get()));
    absl::MutexLock lock(&mu_);
    std::erase_if(ids, [this](const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return deleted_snapshots_.contains(id);
    });
    return ids;
  }

  absl::StatusOr<std::vector<SandboxInfo>> List() override {
    std::vector<SandboxInfo> out;
    absl::MutexLock lock(&mu_);
    out.reserve(running_.size());
    for (const auto& [id, sb] : running_) {
      SandboxInfo info;
      info.id = id;
      info.pool = sb->pool;
      info.endpoint = sb->endpoint;
      info.suspended = sb->suspended.load(std::memory_order_relaxed);
      out.push_back(std::move(info));
    }
    return out;
  }

 private:
  using Task = absl::AnyInvocable<void(bool cancelled) &&>;

  static absl::Status NoImages(const std::string& ref) {
    return absl::FailedPreconditionError(absl::StrCat(
        "image \"", ref, "\": this server has no image cache (start it with --image_cache_bytes)"));
  }

  // Gives back what a sandbox held: its image in the cache, its snapshot's files.
  void ReleaseHolds(const Sandbox& sb) {
    if (!sb.image_digest.empty() && options_.images != nullptr) {
      options_.images->Release(sb.image_digest);
    }
    ReleaseSnapshot(sb.snapshot);
  }

  // Holds snapshot `id`'s files for a sandbox about to start at it: NOT_FOUND when it has
  // none here or is being deleted.
  absl::Status AcquireSnapshot(const std::string& id) {
    RETURN_IF_ERROR(CheckSnapshotFiles(id));
    absl::MutexLock lock(&mu_);
    if (deleted_snapshots_.contains(id)) {
      return absl::NotFoundError(absl::StrCat("snapshot ", id, " is being deleted"));
    }
    ++snapshot_users_[id];
    return absl::OkStatus();
  }

  // Gives back a hold of AcquireSnapshot (or of an adopted sandbox); the last one of a
  // deleted snapshot removes its files.
  void ReleaseSnapshot(const std::string& id) {
    if (id.empty()) return;
    {
      absl::MutexLock lock(&mu_);
      auto it = snapshot_users_.find(id);
      if (it == snapshot_users_.end()) return;
      if (--it->second > 0) return;
      snapshot_users_.erase(it);
      if (!deleted_snapshots_.contains(id)) return;
    }
    if (absl::Status s = local::RemoveTree(snapshots_.get(), id); !s.ok()) {
      spdlog::warn("snapshot {}: cannot remove its files: {}", id, std::string(s.message()));
    } else {
      spdlog::info("snapshot {}: its last sandbox ended: files removed", id);
    }
    absl::MutexLock lock(&mu_);
    deleted_snapshots_.erase(id);
  }

  // The absolute path of snapshot `id`'s folder (sbx-rootfs's --snapshot).
  std::string SnapshotPath(const std::string& id) const {
    return absl::StrCat(snapshots_path_, "/", id);
  }

  // The image's ImageRun, held in the cache for the sandbox (Release when it ends).
  absl::StatusOr<local::ImageRun> AcquireImage(const std::string& ref) {
    if (options_.images == nullptr) return NoImages(ref);
    if (!daemon_libs_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "image \"", ref, "\": the daemon cannot run in an image: ", daemon_libs_.message()));
    }
    ASSIGN_OR_RETURN(images::Image image, options_.images->Acquire(ref));
    {
      absl::MutexLock lock(&mu_);
      if (auto it = image_runs_.find(image.digest); it != image_runs_.end()) return it->second;
    }
    absl::StatusOr<local::ImageRun> run = local::ResolveImageRun(
        image.digest, image.rootfs, image.config.env, image.config.user, image.config.working_dir);
    if (!run.ok()) {
      options_.images->Release(image.digest);
      return absl::Status(run.status().code(),
                          absl::StrCat("image \"", ref, "\": ", run.status().message()));
    }
    absl::MutexLock lock(&mu_);
    image_runs_.emplace(image.digest, *run);
    return run;
  }

  // Sandbox `id` from the table, once no reset of it is under way; null when it is not
  // there.
  SandboxPtr Find(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto idle = [this, &id]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !resetting_.contains(id); };
    mu_.Await(absl::Condition(&idle));
    auto it = running_.find(id);
    return it == running_.end() ? nullptr : it->second;
  }

  static absl::Status NotHere(const std::string& id) {
    return absl::NotFoundError(absl::StrCat("sandbox \"", id, "\" is not running here"));
  }

  void Enqueue(Task t) {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(t));
  }

  void Work() {
    while (true) {
      Task t;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !tasks_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (stopping_) return;
        t = std::move(tasks_.front());
        tasks_.pop_front();
      }
      std::move(t)(false);
    }
  }

  void WakeReaper() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = write(wake_fd_.get(), &one, sizeof(one));
  }

  // Where running sandbox `id` is reached, or NOT_FOUND.
  absl::StatusOr<SandboxInfo> Running(const std::string& id) {
    absl::MutexLock lock(&mu_);
    auto it = running_.find(id);
    if (it == running_.end()) return NotHere(id);
    SandboxInfo info;
    info.id = id;
    info.pool = it->second->pool;
    info.endpoint = it->second->endpoint;
    return info;
  }

  // The ImageRun of the image `sb` runs (its template's spec: `spec`): the one resolved at
  // its start or, for a sandbox adopted from an earlier run (its image held in the cache
  // since the adoption but not resolved here yet), by its template's reference, which must
  // still name the same digest (the reference taken here is given back: the sandbox keeps
  // the one it holds).
  absl::StatusOr<local::ImageRun> ImageRunOf(const Sandbox& sb, const LocalSpec& spec) {
    {
      absl::MutexLock lock(&mu_);
      if (auto it = image_runs_.find(sb.image_digest); it != image_runs_.end()) return it->second;
    }
    if (spec.image.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("sandbox ", sb.id, ": its image ", sb.image_digest, " is not known"));
    }
    absl::StatusOr<local::ImageRun> run = AcquireImage(spec.image);
    if (!run.ok()) {
      return absl::Status(run.status().code(),
                          absl::StrCat("sandbox ", sb.id, ": ", run.status().message()));
    }
    options_.images->Release(run->digest);
    if (run->digest != sb.image_digest) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sandbox ", sb.id, " runs image ", sb.image_digest, " and its template's image \"",
          spec.image, "\" is ", run->digest, " now: it cannot be started again as it was"));
    }
    return run;
  }

  static absl::Status NoSnapshotsDir() {
    return absl::FailedPreconditionError(
        "this local runtime has no snapshots folder (BubblewrapRuntimeOptions::snapshots_dir)");
  }

  // Freezes `sb` (its op_mu held) for the copy unless it is suspended already, copies its
  // files, and thaws it again whatever happened.
  absl::StatusOr<SnapshotCapture> Capture(const std::string& id, const std::string& snapshot_id,
                                          const SnapshotCharge& charge) {
    if (!snapshots_.valid()) return NoSnapshotsDir();
    SandboxPtr sb = Find(id);
    if (sb == nullptr) return NotHere(id);
    // A sandbox that started at a snapshot: the new one is that snapshot's files with the
    // sandbox's layers over them, whose whiteouts are checked against its image's root.
    std::string image_rootfs;
    if (!sb->snapshot.empty()) {
      LocalSpec spec;
      if (!sb->template_spec.empty()) {
        ASSIGN_OR_RETURN(spec, ParseLocalSpec(sb->template_spec));
      }
      ASSIGN_OR_RETURN(local::ImageRun run, ImageRunOf(*sb, spec));
      image_rootfs = run.rootfs;
    }
    absl::MutexLock lock(&sb->op_mu);
    if (sb->ended) return NotHere(id);
    const bool was_suspended = sb->suspended.load(std::memory_order_relaxed);
    if (!was_suspended) RETURN_IF_ERROR(Freeze(*sb));
    const absl::Time start = absl::Now();
    absl::StatusOr<local::CopyStats> copied = local::CaptureSandbox(
        *sb, isolated_, snapshots_.get(), snapshot_id, charge, sb->snapshot, image_rootfs);
    // Thawed whatever happened (a sandbox the caller suspended stays frozen).
    if (!was_suspended) Thaw(*sb);
    if (!copied.ok()) return copied.status();
    const local::CopyStats& stats = *copied;
    spdlog::info(
        "sandbox {}: snapshot {} taken in {}: {} bytes, {} files, {} folders, {} links, {} "
        "FIFOs, {} whiteouts, {} sockets/devices left out",
        id, snapshot_id, absl::FormatDuration(absl::Now() - start), stats.bytes, stats.files,
        stats.folders, stats.links, stats.fifos, stats.whiteouts, stats.dropped);
    SnapshotCapture out;
    out.bytes = stats.bytes;
    out.image_digest = sb->image_digest;
    out.dropped = stats.dropped;
    return out;
  }

  // Reset (issue 37). The old processes are killed and a new sandbox is started under
  // the same id, host folder and socket path: overlayfs does not allow its upper layer to
  // change under a mounted overlay, and the sandbox's root is that overlay, so the sandbox
  // starts again at the snapshot, as a fork does: for an image sandbox, sbx-rootfs shares
  // the snapshot's layer and workspace read-only under new layers of its own (nothing
  // copied); the workspace of a host-root sandbox, a tmpfs of its own, is filled from the
  // server while the new sandbox is frozen, before anything but its daemon has run. While
  // this runs the id is in resetting_: the reaper does not see the old processes' end as
  // the sandbox's, and Delete, Suspend, Resume and Snapshot wait for the reset to finish.
  absl::Status ResetTo(const std::string& id, const std::string& snapshot_id,
                       const std::string& image_digest) {
    if (!snapshots_.valid()) return NoSnapshotsDir();
    RETURN_IF_ERROR(local::CheckSnapshotId(snapshot_id));
    SandboxPtr old = Find(id);
    if (old == nullptr) return NotHere(id);
    if (old->image_digest != image_digest) {
      return absl::FailedPreconditionError(
          absl::StrCat("snapshot ", snapshot_id, " was taken on ",
                       image_digest.empty() ? std::string("the host's root")
                                            : absl::StrCat("image ", image_digest),
                       " and sandbox ", id, " runs on ",
                       old->image_digest.empty() ? std::string("the host's root")
                                                 : absl::StrCat("image ", old->image_digest),
                       ": a sandbox is reset only to a snapshot of its own image"));
    }
    if (!old->has_template) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sandbox ", id,
          " was adopted from an earlier run of the server, which did not keep its template: "
          "it cannot be reset (claim a new sandbox)"));
    }
    RETURN_IF_ERROR(CheckSnapshotFiles(snapshot_id));
    LocalSpec spec;
    if (!old->template_spec.empty()) {
      ASSIGN_OR_RETURN(spec, ParseLocalSpec(old->template_spec));
    }
    std::optional<local::ImageRun> image;
    if (!old->image_digest.empty()) {
      ASSIGN_OR_RETURN(image, ImageRunOf(*old, spec));
    }
    auto sb = std::make_shared<Sandbox>();
    sb->id = id;
    sb->pool = old->pool;
    sb->dir = old->dir;
    sb->child = true;
    sb->template_name = old->template_name;
    sb->template_spec = old->template_spec;
    sb->has_template = true;
    sb->host_uid = old->host_uid;
    sb->image_digest = old->image_digest;
    ASSIGN_OR_RETURN(std::vector<std::string> argv,
                     local::SandboxArgv(id, sb->dir, spec, options_, iso_, system_args_,
                                        image ? &*image : nullptr, sb->host_uid,
                                        image ? SnapshotPath(snapshot_id) : std::string()));
    if (image) {
      RETURN_IF_ERROR(AcquireSnapshot(snapshot_id));
      sb->snapshot = snapshot_id;
    }
    {
      absl::MutexLock old_lock(&old->op_mu);
      if (old->ended) {
        ReleaseSnapshot(sb->snapshot);
        return NotHere(id);
      }
      {
        absl::ReleasableMutexLock lock(&mu_);
        auto it = running_.find(id);
        if (it == running_.end() || it->second != old) {
          lock.Release();
          ReleaseSnapshot(sb->snapshot);
          return NotHere(id);
        }
        running_.erase(it);
        resetting_.insert(id);
      }
      WakeReaper();
      old->ended = true;
      local::KillSandbox(*old);
    }
    ReleaseSnapshot(old->snapshot);  // what the old sandbox shared (the new one holds its own)
    absl::Status s =
        local::SpawnSandbox(*sb, spec, argv, options_, iso_, cgroups_, &output_dropped_);
    if (s.ok() && !image) {
      absl::MutexLock lock(&sb->op_mu);
      s = FillWorkspace(*sb, snapshot_id);
      if (!s.ok()) {
        sb->ended = true;
        local::KillSandbox(*sb);
      }
    }
    {
      absl::MutexLock lock(&mu_);
      resetting_.erase(id);
      if (s.ok()) running_.emplace(id, sb);
    }
    WakeReaper();
    if (!s.ok()) {
      spdlog::error("sandbox {}: reset to snapshot {} failed, the sandbox is gone: {}", id,
                    snapshot_id, std::string(s.message()));
      uids_.GiveBack(sb->host_uid);
      ReleaseHolds(*sb);
      if (options_.on_gone) options_.on_gone(id);
      return absl::Status(s.code(),
                          absl::StrCat("sandbox ", id, ": reset to snapshot ", snapshot_id,
                                       " failed and the sandbox is gone: ", s.message()));
    }
    spdlog::info("sandbox {} reset to snapshot {}", id, snapshot_id);
    return absl::OkStatus();
  }

  // NOT_FOUND unless snapshot `snapshot_id` has files here; FAILED_PRECONDITION without a
  // snapshots folder.
  absl::Status CheckSnapshotFiles(const std::string& snapshot_id) const {
    if (!snapshots_.valid()) return NoSnapshotsDir();
    RETURN_IF_ERROR(local::CheckSnapshotId(snapshot_id));
    const Fd snap(openat(snapshots_.get(), snapshot_id.c_str(),
                         O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!snap.valid()) {
      return absl::NotFoundError(
          absl::StrCat("snapshot ", snapshot_id, " has no files on this server"));
    }
    return absl::OkStatus();
  }

  // Fills the workspace of `sb`, just started, with snapshot `snapshot_id`'s, frozen so
  // that nothing but its daemon has run before.
  absl::Status FillWorkspace(Sandbox& sb, const std::string& snapshot_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(sb.op_mu) {
    RETURN_IF_ERROR(Freeze(sb));
    absl::Status s = local::RestoreWorkspace(sb, isolated_, snapshots_.get(), snapshot_id,
                                             iso_.own_uids ? int64_t{sb.host_uid} : int64_t{-1});
    Thaw(sb);
    return s;
  }

  static absl::Status Freeze(Sandbox& sb) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sb.op_mu) {
    absl::Status s;
    if (!sb.freezer.empty()) {
      s = local::SetFreezer(sb, "FROZEN");
      if (!s.ok()) local::SetFreezer(sb, "THAWED").IgnoreError();  // all or nothing
    } else {
      s = local::StopAll(sb);
      if (!s.ok()) local::ContinueAll(sb);
    }
    return s;
  }

  static void Thaw(Sandbox& sb) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sb.op_mu) {
    if (!sb.freezer.empty()) {
      if (absl::Status s = local::SetFreezer(sb, "THAWED"); !s.ok()) {
        spdlog::error("sandbox {}: cannot thaw it: {}", sb.id, std::string(s.message()));
      }
    } else {
      local::ContinueAll(sb);
    }
  }

  absl::Status SetSuspended(const std::string& id, bool suspend) {
    SandboxPtr sb = Find(id);
    if (sb == nullptr) return NotHere(id);
    absl::MutexLock lock(&sb->op_mu);
    if (sb->ended) return NotHere(id);
    if (sb->suspended.load(std::memory_order_relaxed) == suspend) return absl::OkStatus();
    absl::Status s;
    if (!sb->freezer.empty()) {
      s = local::SetFreezer(*sb, suspend ? "FROZEN" : "THAWED");
      if (!s.ok() && suspend) local::SetFreezer(*sb, "THAWED").IgnoreError();  // all or nothing
    } else if (suspend) {
      s = local::StopAll(*sb);
      if (!s.ok()) local::ContinueAll(*sb);
    } else {
      local::ContinueAll(*sb);
    }
    if (!s.ok()) return s;
    sb->suspended.store(suspend, std::memory_order_relaxed);
    // A later runtime reads it back when it adopts the sandbox.
    if (!local::WriteState(*sb)) spdlog::warn("sandbox {}: cannot rewrite its state file", id);
    spdlog::debug("sandbox {} {}", id, suspend ? "suspended" : "resumed");
    return absl::OkStatus();
  }

  absl::StatusOr<SandboxInfo> Start(const CreateRequest& request) {
    LocalSpec spec;
    if (!request.template_spec.empty()) {
      absl::StatusOr<LocalSpec> parsed = ParseLocalSpec(request.template_spec);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("template \"", request.template_name, "\": ", parsed.status().message()));
      }
      spec = std::move(*parsed);
    }
    auto sb = std::make_shared<Sandbox>();
    sb->id = absl::StrCat(local::kIdPrefix, IdGenerator::Random().Next().substr(0, 16));
    sb->pool = request.pool;
    sb->dir = absl::StrCat(root_, "/", sb->id);
    sb->child = true;
    sb->template_name = request.template_name;
    sb->template_spec = request.template_spec;
    sb->has_template = true;
    const std::string& id = sb->id;
    std::optional<local::ImageRun> image;
    if (!spec.image.empty()) {
      absl::StatusOr<local::ImageRun> run = AcquireImage(spec.image);
      if (!run.ok()) {
        return absl::Status(run.status().code(), absl::StrCat("template \"", request.template_name,
                                                              "\": ", run.status().message()));
      }
      image = std::move(*run);
      sb->image_digest = image->digest;
    }
    absl::Cleanup release = [&] { ReleaseHolds(*sb); };
    if (!spec.snapshot.empty()) {
      // An image sandbox shares the snapshot's files while it lives (held); a host-root
      // one gets a copy of its workspace.
      if (absl::Status s =
              image ? AcquireSnapshot(spec.snapshot) : CheckSnapshotFiles(spec.snapshot);
          !s.ok()) {
        return absl::Status(
            s.code(), absl::StrCat("template \"", request.template_name, "\": ", s.message()));
      }
      if (image) sb->snapshot = spec.snapshot;
    }
    sb->host_uid = geteuid();
    if (iso_.own_uids) {
      ASSIGN_OR_RETURN(sb->host_uid, uids_.Take());
    }
    absl::StatusOr<std::vector<std::string>> argv = local::SandboxArgv(
        id, sb->dir, spec, options_, iso_, system_args_, image ? &*image : nullptr, sb->host_uid,
        sb->snapshot.empty() ? std::string() : SnapshotPath(sb->snapshot));
    if (!argv.ok()) {
      uids_.GiveBack(sb->host_uid);
      return absl::Status(argv.status().code(), absl::StrCat("template \"", request.template_name,
                                                             "\": ", argv.status().message()));
    }
    if (absl::Status s =
            local::SpawnSandbox(*sb, spec, *argv, options_, iso_, cgroups_, &output_dropped_);
        !s.ok()) {
      uids_.GiveBack(sb->host_uid);
      return s;
    }
    if (!spec.snapshot.empty() && !image) {
      absl::MutexLock lock(&sb->op_mu);
      if (absl::Status s = FillWorkspace(*sb, spec.snapshot); !s.ok()) {
        sb->ended = true;
        local::KillSandbox(*sb);
        uids_.GiveBack(sb->host_uid);
        return absl::Status(
            s.code(), absl::StrCat("template \"", request.template_name, "\": ", s.message()));
      }
    }
    std::move(release).Cancel();
    SandboxInfo out;
    out.id = id;
    out.pool = request.pool;
    out.endpoint = sb->endpoint;
    {
      absl::MutexLock lock(&mu_);
      running_.emplace(id, std::move(sb));
    }
    WakeReaper();
    return out;
  }

  // Notices sandboxes whose top process ended by itself (local::WaitForEnds, which also
  // drains their output), woken by wake_fd_ when the table changes.
  void Reap() {
    while (true) {
      std::vector<SandboxPtr> all;
      {
        absl::MutexLock lock(&mu_);
        if (stopping_) return;
        all.reserve(running_.size());
        for (const auto& [id, sb] : running_) all.push_back(sb);
      }
      for (SandboxPtr& sb : local::WaitForEnds(all, wake_fd_.get(), &output_dropped_)) {
        {
          absl::MutexLock lock(&mu_);
          auto it = running_.find(sb->id);
          if (it == running_.end() || it->second != sb) continue;  // being deleted
          running_.erase(it);
        }
        local::DrainOutput(*sb, &output_dropped_);  // its last words, for the log line below
        absl::MutexLock lock(&sb->op_mu);
        sb->ended = true;
        const int status = local::ReapIfChild(*sb, /*block=*/false);
        spdlog::warn("sandbox {} ended by itself ({})", sb->id,
                     status >= 0 ? local::DescribeExit(status) : std::string("not our child"));
        local::KillSandbox(*sb);
        uids_.GiveBack(sb->host_uid);
        ReleaseHolds(*sb);
        if (options_.on_gone) options_.on_gone(sb->id);
      }
    }
  }

  const BubblewrapRuntimeOptions options_;
  const std::string root_;  // options_.root_dir, absolute
  // Held (flock) while the runtime exists.
  const Fd lock_;
  // The snapshots folder (options_.snapshots_dir), or invalid without one, and its
  // absolute path (for sbx-rootfs's --snapshot).
  const Fd snapshots_;
  const std::string snapshots_path_;
  const Isolation iso_;
  const bool isolated_;
  const Cgroups cgroups_;
  // SystemArgs(): the same for every sandbox.
  const std::vector<std::string> system_args_;
  // The host uids of running sandboxes and of those being made (own_uids only).
  local::UidPool uids_;
  const size_t adopted_;
  // Tells the reaper that the table changed or that the runtime stops.
  const Fd wake_fd_;
  // Bytes of sandboxes' output not kept in their logs (DrainOutput). Atomic: added to by
  // the reaper and the workers, read by metrics; relaxed, a statistic.
  std::atomic<uint64_t> output_dropped_{0};
  std::vector<std::thread> workers_;
  std::thread reaper_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, SandboxPtr> running_ ABSL_GUARDED_BY(mu_);
  // Sandboxes being reset (ResetTo): out of running_ until their new start is done.
  absl::flat_hash_set<std::string> resetting_ ABSL_GUARDED_BY(mu_);
  // What each image gives its sandboxes, by digest (an image's files never change).
  absl::flat_hash_map<std::string, local::ImageRun> image_runs_ ABSL_GUARDED_BY(mu_);
  // Whether the daemon's libraries were found (image sandboxes need them).
  absl::Status daemon_libs_;
  // How many sandboxes (running, being started or reset) share each snapshot's files, and
  // the snapshots deleted (or being deleted) whose files wait for them.
  absl::flat_hash_map<std::string, int> snapshot_users_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> deleted_snapshots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::string EncodeLocalSpec(const LocalSpec& spec) {
  nlohmann::json j;
  if (!spec.image.empty()) j["image"] = spec.image;
  j["env"] = spec.env;
  j["mounts"] = nlohmann::json::array();
  for (const auto& m : spec.mounts) {
    j["mounts"].push_back({{"source", m.source}, {"target", m.target}, {"read_only", m.read_only}});
  }
  j["network"] = spec.network;
  j["memory_limit_bytes"] = spec.memory_limit_bytes;
  j["pids_limit"] = spec.pids_limit;
  j["workspace_size_bytes"] = spec.workspace_size_bytes;
  j["layer_size_bytes"] = spec.layer_size_bytes;
  if (!spec.snapshot.empty()) j["snapshot"] = spec.snapshot;
  return j.dump();
}

absl::StatusOr<LocalSpec> ParseLocalSpec(const std::string& json) {
  // nlohmann throws on bad input; the exception stops here and becomes a Status.
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    if (!j.is_object()) return absl::InvalidArgumentError("local spec is not a JSON object");
    LocalSpec s;
    s.image = j.value("image", std::string());
    if (j.contains("env")) s.env = j.at("env").get<std::map<std::string, std::string>>();
    if (j.contains("mounts")) {
      for (const auto& m : j.at("mounts")) {
        LocalSpec::Mount mount;
        mount.source = m.at("source").get<std::string>();
        mount.target = m.at("target").get<std::string>();
        mount.read_only = m.value("read_only", true);
        RETURN_IF_ERROR(CheckNormalAbsolutePath("mount source", mount.source));
        RETURN_IF_ERROR(CheckSandboxMountTarget("mount target", mount.target));
        s.mounts.push_back(std::move(mount));
      }
    }
    s.network = j.value("network", false);
    s.memory_limit_bytes = j.value("memory_limit_bytes", int64_t{0});
    s.pids_limit = j.value("pids_limit", int64_t{0});
    s.workspace_size_bytes = j.value("workspace_size_bytes", int64_t{0});
    s.layer_size_bytes = j.value("layer_size_bytes", int64_t{0});
    s.snapshot = j.value("snapshot", std::string());
    if (!s.snapshot.empty()) RETURN_IF_ERROR(local::CheckSnapshotId(s.snapshot));
    if (s.memory_limit_bytes < 0 || s.pids_limit < 0 || s.workspace_size_bytes < 0 ||
        s.layer_size_bytes < 0) {
      return absl::InvalidArgumentError("local spec limits must not be negative");
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("local spec: ", e.what()));
  }
}

absl::Status BubblewrapRuntimeOptions::Validate() const {
  if (root_dir.empty()) return absl::InvalidArgumentError("runtime root_dir is empty");
  if (sandboxd_path.empty() || sandboxd_path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("sandboxd_path \"", sandboxd_path, "\" must be an absolute path"));
  }
  if (workers < 1) return absl::InvalidArgumentError(absl::StrCat("workers ", workers, " < 1"));
  if (ready_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ready_timeout must be positive");
  }
  if (!secret_for) {
    return absl::InvalidArgumentError("secret_for is required (the sandboxes' daemon secrets)");
  }
  if (sandbox_uid_base == 0 || sandbox_uid_count == 0 ||
      uint64_t{sandbox_uid_base} + sandbox_uid_count > uint64_t{1} << 32) {
    return absl::InvalidArgumentError(absl::StrCat("sandbox uids ", sandbox_uid_base, " + ",
                                                   sandbox_uid_count,
                                                   " are not a range of "
                                                   "non-root uids"));
  }
  for (const std::string& h : hidden_paths) {
    if (h.empty() || h[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("hidden path \"", h, "\" must be an absolute path"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BubblewrapRuntime>> BubblewrapRuntime::Make(
    BubblewrapRuntimeOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (access(options.sandboxd_path.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sandboxd \"", options.sandboxd_path, "\" is not an executable file"));
  }
  std::error_code ec;
  fs::create_directories(options.root_dir, ec);
  if (ec || access(options.root_dir.c_str(), W_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("runtime root \"", options.root_dir, "\" is not a writable folder"));
  }
  const std::string longest =
      (fs::absolute(options.root_dir) / "lb-0123456789abcdef" / "sandboxd.sock").string();
  if (longest.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("runtime root \"", options.root_dir, "\" is too long for unix socket paths (",
                     longest.size(), " of at most ", sizeof(sockaddr_un::sun_path) - 1, " bytes)"));
  }
  std::string root = fs::absolute(options.root_dir).lexically_normal().string();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (options.rootfs_helper_path.empty()) {
    options.rootfs_helper_path =
        (fs::path(options.sandboxd_path).parent_path() / "sbx-rootfs").string();
  }
  ASSIGN_OR_RETURN(Isolation iso, local::FindIsolation(options, root));
  absl::Status daemon_libs;
  if (iso.isolated && options.images != nullptr) {
    if (access(options.rootfs_helper_path.c_str(), X_OK) != 0) {
      daemon_libs = absl::FailedPreconditionError(absl::StrCat(
          "sbx-rootfs \"", options.rootfs_helper_path, "\" is not an executable file"));
    } else if (auto libs = local::DaemonLibraries(options.sandboxd_path); libs.ok()) {
      iso.daemon_libs = *std::move(libs);
      iso.daemon_lib_dir = absl::StrCat(root, "/", local::kDaemonLibFolder);
    } else {
      daemon_libs = libs.status();
    }
  }
  // Only sbx may enter the root and the sandboxes' host folders; with images and host uids
  // of their own, others may pass through the root (not list it) to the host folders of
  // image sandboxes (0711 too, see SpawnSandbox), whose files are each sbx's alone.
  struct stat root_st;
  if (lstat(root.c_str(), &root_st) != 0 || !S_ISDIR(root_st.st_mode) ||
      root_st.st_uid != geteuid() ||
      chmod(root.c_str(), iso.own_uids && options.images != nullptr ? 0711 : 0700) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("runtime root \"", root,
                     "\" must be a folder (not a symbolic link) owned by uid ", geteuid()));
  }
  // One runtime per root: a second one would adopt, or clean up as half-made, the
  // sandboxes the first is starting.
  Fd lock(local::OpenInDir(root, ".lock", O_RDWR | O_CREAT, 0600));
  if (!lock.valid() || flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "runtime root \"", root, "\" is in use by another runtime (", root, "/.lock is locked)"));
  }
  // The daemon's libraries for image sandboxes, copied under the lock (a second runtime
  // on this root would otherwise replace them while this one's sandboxes start).
  if (daemon_libs.ok() && !iso.daemon_lib_dir.empty()) {
    daemon_libs = local::MakeDaemonLibDir(iso.daemon_lib_dir, iso.daemon_libs);
  }
  if (!daemon_libs.ok()) {
    spdlog::warn("local runtime: sandboxes of images cannot start: {}",
                 std::string(daemon_libs.message()));
  }
  Cgroups cgroups = Cgroups::Detect(options.use_freezer);
  spdlog::info("local runtime: root \"{}\", {}, memory limits {}, pids limits {}, suspend with {}",
               root,
               !iso.isolated ? "NO isolation"
               : iso.own_uids
                   ? absl::StrCat("bubblewrap isolation (user namespace, seccomp; host uids from ",
                                  options.sandbox_uid_base, ")")
                   : absl::StrCat("bubblewrap isolation (user namespace, seccomp; host uid ",
                                  geteuid(), ", sbx's own)"),
               cgroups.memory.empty() ? "unavailable" : "cgroup v1",
               cgroups.pids.empty() ? "unavailable" : "cgroup v1",
               cgroups.freezer.empty() ? "SIGSTOP/SIGCONT (no writable freezer cgroup)"
                                       : "the freezer cgroup");
  Fd snapshots;
  if (!options.snapshots_dir.empty()) {
    ASSIGN_OR_RETURN(snapshots, local::OpenSnapshotsDir(options.snapshots_dir));
    if (const int swept = local::SweepPartialSnapshots(snapshots.get()); swept > 0) {
      spdlog::info("local runtime: removed {} snapshots a crash left half-made in \"{}\"", swept,
                   options.snapshots_dir);
    }
  }
  std::vector<SandboxPtr> adopted = local::AdoptOrCleanUp(root, cgroups);
  local::PruneEmptyCgroups(cgroups);
  auto runtime = std::make_unique<BubblewrapRuntimeImpl>(
      std::move(options), std::move(root), std::move(lock), std::move(iso), std::move(cgroups),
      std::move(adopted), std::move(snapshots));
  runtime->set_daemon_libs_status(std::move(daemon_libs));
  return std::unique_ptr<BubblewrapRuntime>(std::move(runtime));
}

}  // namespace sbx::runtime

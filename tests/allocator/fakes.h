#pragma once
// Test doubles for the allocator's neighbours: a reconciler that records what it is told
// (and can refill pools from a thread of its own), and a runtime whose creations the test
// completes by hand.

#include <atomic>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "src/allocator/allocator.h"
#include "src/allocator/reconciler.h"
#include "src/runtime/runtime.h"

namespace sbx::allocator::testing {

class RecordingReconciler : public Reconciler {
 public:
  void PoolBelowTarget(const std::string& pool) override {
    absl::MutexLock lock(&mu_);
    ++below_target_[pool];
  }
  void RetireSandbox(const store::SandboxRecord& sandbox) override {
    absl::MutexLock lock(&mu_);
    retired_.push_back(sandbox.id);
  }
  int below_target(const std::string& pool) const {
    absl::MutexLock lock(&mu_);
    auto it = below_target_.find(pool);
    return it == below_target_.end() ? 0 : it->second;
  }
  std::vector<std::string> retired() const {
    absl::MutexLock lock(&mu_);
    return retired_;
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, int> below_target_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> retired_ ABSL_GUARDED_BY(mu_);
};

// Keeps pools topped up to their floor from its own thread, like a real reconciler with
// an instant runtime. Sandbox ids are "<prefix><n>" with n counting from 1.
class RefillingReconciler : public Reconciler {
 public:
  explicit RefillingReconciler(std::string prefix) : prefix_(std::move(prefix)) {}
  ~RefillingReconciler() override { Stop(); }

  void Start(Allocator* allocator) {
    allocator_ = allocator;
    thread_ = std::thread([this] { Loop(); });
  }
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  void PoolBelowTarget(const std::string& pool) override {
    absl::MutexLock lock(&mu_);
    pending_[pool] = true;
  }
  void RetireSandbox(const store::SandboxRecord&) override {
    retired_.fetch_add(1, std::memory_order_relaxed);
  }
  uint64_t created() const { return next_.load() - 1; }
  uint64_t retired() const { return retired_.load(); }

 private:
  void Loop() {
    while (true) {
      std::map<std::string, bool> work;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !pending_.empty(); };
        mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(20));
        if (stop_) return;
        work.swap(pending_);
      }
      for (const auto& [pool, _] : work) {
        auto st = allocator_->GetPoolStatus(pool);
        if (!st.ok()) continue;
        for (int64_t i = st->warm; i < st->target; ++i) {
          runtime::SandboxInfo info;
          info.id = absl::StrCat(prefix_, next_.fetch_add(1));
          info.pool = pool;
          info.endpoint = absl::StrCat("unix:/tmp/", info.id);
          (void)allocator_->AddSandbox(info);
        }
      }
    }
  }

  const std::string prefix_;
  Allocator* allocator_ = nullptr;
  std::thread thread_;
  // Counters read by the test after the run; relaxed is enough (joined before reading).
  std::atomic<uint64_t> next_{1};
  std::atomic<uint64_t> retired_{0};
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, bool> pending_ ABSL_GUARDED_BY(mu_);
};

// A runtime whose Create calls wait until the test completes them.
class ManualRuntime : public runtime::Runtime {
 public:
  void Create(runtime::CreateRequest request, runtime::CreateCallback done) override {
    absl::MutexLock lock(&mu_);
    creates_.push_back({std::move(request), std::move(done)});
  }
  void Delete(std::string id, runtime::DeleteCallback done) override {
    {
      absl::MutexLock lock(&mu_);
      deleted_.push_back(id);
    }
    std::move(done)(absl::OkStatus());
  }
  // Suspend and Resume answer at once: with the error set by FailNextFreeze, else OK;
  // Resume with no endpoint (where it was), or the one set by MoveOnResume.
  void Suspend(std::string id, runtime::DoneCallback done) override {
    std::move(done)(Freeze(absl::StrCat("suspend ", id)));
  }
  void Resume(std::string id, runtime::ResumeCallback done) override {
    if (absl::Status s = Freeze(absl::StrCat("resume ", id)); !s.ok()) return std::move(done)(s);
    runtime::SandboxInfo info;
    info.id = id;
    info.endpoint.clear();
    {
      absl::MutexLock lock(&mu_);
      if (auto it = moved_.find(id); it != moved_.end()) info = it->second;
    }
    std::move(done)(std::move(info));
  }
  // Resume answers that sandbox `id` is reached at `endpoint` on `node` from now on (as
  // the Kubernetes runtime's new pod is).
  void MoveOnResume(const std::string& id, const std::string& endpoint, const std::string& node) {
    runtime::SandboxInfo info;
    info.id = id;
    info.endpoint = endpoint;
    info.node = node;
    absl::MutexLock lock(&mu_);
    moved_[id] = std::move(info);
  }
  // The next Suspend or Resume fails with `error`.
  void FailNextFreeze(absl::Status error) {
    absl::MutexLock lock(&mu_);
    freeze_error_ = std::move(error);
  }
  // "suspend <id>" / "resume <id>" per call, in order.
  std::vector<std::string> freezes() const {
    absl::MutexLock lock(&mu_);
    return freezes_;
  }
  absl::StatusOr<std::vector<runtime::SandboxInfo>> List() override {
    return std::vector<runtime::SandboxInfo>{};
  }
  std::vector<std::string> deleted() const {
    absl::MutexLock lock(&mu_);
    return deleted_;
  }
  size_t pending_creates() const {
    absl::MutexLock lock(&mu_);
    return creates_.size();
  }
  // Completes the oldest Create with a sandbox named `id` (or with `error`).
  void CompleteCreate(const std::string& id, absl::Status error = absl::OkStatus()) {
    Pending p;
    {
      absl::MutexLock lock(&mu_);
      p = std::move(creates_.front());
      creates_.pop_front();
    }
    if (!error.ok()) return std::move(p.done)(error);
    runtime::SandboxInfo info;
    info.id = id;
    info.pool = p.request.pool;
    info.endpoint = absl::StrCat("unix:/tmp/", id);
    std::move(p.done)(info);
  }

 private:
  struct Pending {
    runtime::CreateRequest request;
    runtime::CreateCallback done;
  };
  absl::Status Freeze(std::string call) {
    absl::MutexLock lock(&mu_);
    freezes_.push_back(std::move(call));
    return std::exchange(freeze_error_, absl::OkStatus());
  }
  mutable absl::Mutex mu_;
  std::deque<Pending> creates_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> deleted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> freezes_ ABSL_GUARDED_BY(mu_);
  absl::Status freeze_error_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, runtime::SandboxInfo> moved_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::allocator::testing

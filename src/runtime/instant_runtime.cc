#include "src/runtime/instant_runtime.h"

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "src/common/ids.h"

namespace sbx::runtime {
namespace {

class InstantRuntime final : public Runtime {
 public:
  void Create(CreateRequest request, CreateCallback done) override {
    SandboxInfo info;
    info.id = absl::StrCat("inst-", prefix_, "-", next_.fetch_add(1, std::memory_order_relaxed));
    info.pool = std::move(request.pool);
    info.endpoint = absl::StrCat("instant:", info.id);
    {
      absl::MutexLock lock(&mu_);
      live_[info.id] = info;
    }
    std::move(done)(std::move(info));
  }

  void Delete(std::string id, DeleteCallback done) override {
    bool found;
    {
      absl::MutexLock lock(&mu_);
      found = live_.erase(id) > 0;
    }
    std::move(done)(found ? absl::OkStatus() : Unknown(id));
  }

  void Suspend(std::string id, DoneCallback done) override { SetSuspended(id, true, done); }
  void Resume(std::string id, ResumeCallback done) override {
    DoneCallback then = [this, id, done = std::move(done)](absl::Status s) mutable {
      if (!s.ok()) return std::move(done)(s);
      absl::MutexLock lock(&mu_);
      auto it = live_.find(id);
      if (it == live_.end()) return std::move(done)(Unknown(id));
      std::move(done)(it->second);
    };
    SetSuspended(id, false, then);
  }

  absl::StatusOr<std::vector<SandboxInfo>> List() override {
    absl::MutexLock lock(&mu_);
    std::vector<SandboxInfo> out;
    out.reserve(live_.size());
    for (const auto& [id, info] : live_) out.push_back(info);
    return out;
  }

 private:
  static absl::Status Unknown(const std::string& id) {
    return absl::NotFoundError(absl::StrCat("sandbox \"", id, "\" does not exist"));
  }

  void SetSuspended(const std::string& id, bool suspended, DoneCallback& done) {
    absl::Status result = absl::OkStatus();
    {
      absl::MutexLock lock(&mu_);
      auto it = live_.find(id);
      if (it == live_.end()) {
        result = Unknown(id);
      } else {
        it->second.suspended = suspended;
      }
    }
    std::move(done)(result);
  }

  // Ids are unique across restarts of the server: a random prefix per runtime.
  const std::string prefix_ = IdGenerator::Random().Next().substr(0, 8);
  std::atomic<uint64_t> next_{1};
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, SandboxInfo> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Runtime> NewInstantRuntime() { return std::make_unique<InstantRuntime>(); }

}  // namespace sbx::runtime

// The threads that run one job each in the daemon (a command of Exec, a background
// process) and their bookkeeping: a thread per job, marked finished by the job's own last
// call, joined at a later start (ReapFinished) or at shutdown (KillAll, then JoinAll).
// ExecManager and ProcessTable each own one; their own limits and tables stay theirs.
#ifndef SBX_SANDBOXD_RUNNER_THREADS_H_
#define SBX_SANDBOXD_RUNNER_THREADS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace sbx::sandboxd {

// `Job` has Kill(): what KillAll calls for each job that has not finished.
template <typename Job>
class RunnerThreads {
 public:
  RunnerThreads() = default;
  RunnerThreads(const RunnerThreads&) = delete;
  RunnerThreads& operator=(const RunnerThreads&) = delete;
  // The owner calls KillAll and JoinAll first (a joinable std::thread must not be
  // destroyed).
  ~RunnerThreads() { JoinAll(); }

  // True once KillAll has begun: no job starts any more.
  bool stopping() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return stopping_;
  }

  // Runs `body` on a new thread for `job`, known by `id` (unique per owner). `body` must
  // call Finished(id) as its last use of the owner. UNAVAILABLE after KillAll: nothing runs.
  [[nodiscard]] absl::Status Start(uint64_t id, std::shared_ptr<Job> job,
                                   absl::AnyInvocable<void() &&> body) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("sandboxd is shutting down");
    Slot& slot = slots_[id];
    slot.job = std::move(job);
    slot.thread = std::thread([body = std::move(body)]() mutable { std::move(body)(); });
    return absl::OkStatus();
  }

  // The job's thread makes no further call into its owner.
  void Finished(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(id);
    if (it != slots_.end()) it->second.finished = true;  // else JoinAll has taken it
  }

  // Joins the threads of finished jobs (quick: they have made their last call). Call it
  // without the owner's lock.
  void ReapFinished() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::thread> finished;
    {
      absl::MutexLock lock(&mu_);
      for (auto it = slots_.begin(); it != slots_.end();) {
        if (it->second.finished) {
          finished.push_back(std::move(it->second.thread));
          it = slots_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (std::thread& t : finished) {
      if (t.joinable()) t.join();
    }
  }

  // Refuses new jobs and kills the ones that have not finished.
  void KillAll() ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<std::shared_ptr<Job>> running;
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
      for (auto& [id, slot] : slots_) {
        if (!slot.finished) running.push_back(slot.job);
      }
    }
    for (auto& job : running) job->Kill();
  }

  // Waits until every thread has ended (a thread that calls this for itself is detached:
  // it is on its way out).
  void JoinAll() ABSL_LOCKS_EXCLUDED(mu_) {
    for (;;) {
      std::vector<std::thread> threads;
      {
        absl::MutexLock lock(&mu_);
        if (slots_.empty()) return;
        for (auto& [id, slot] : slots_) threads.push_back(std::move(slot.thread));
        slots_.clear();
      }
      for (std::thread& t : threads) {
        if (!t.joinable()) continue;
        if (t.get_id() == std::this_thread::get_id()) {
          t.detach();
        } else {
          t.join();
        }
      }
    }
  }

 private:
  struct Slot {
    std::shared_ptr<Job> job;
    std::thread thread;
    bool finished = false;
  };
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<uint64_t, Slot> slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::sandboxd

#endif  // SBX_SANDBOXD_RUNNER_THREADS_H_

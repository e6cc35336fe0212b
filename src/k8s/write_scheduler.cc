#include "src/k8s/write_scheduler.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "src/k8s/thread_priority.h"

namespace sbx::k8s {

absl::Status WriteSchedulerOptions::Validate() const {
  if (workers < 1 || workers > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("write workers ", workers, " not in 1..1024"));
  }
  if (qps < 0) return absl::InvalidArgumentError(absl::StrCat("write qps ", qps, " is negative"));
  if (burst < 1) return absl::InvalidArgumentError(absl::StrCat("write burst ", burst, " below 1"));
  return absl::OkStatus();
}

WriteScheduler::WriteScheduler(WriteSchedulerOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &Clock::Real()),
      limiter_(options_.qps, options_.burst) {
  workers_.reserve(options_.workers);
  for (int i = 0; i < options_.workers; ++i) {
    workers_.push_back(BackgroundThread("sbx-k8s-write", [this] { Worker(); }));
  }
}

WriteScheduler::~WriteScheduler() { Stop(); }

void WriteScheduler::Submit(WritePriority priority, std::function<void()> write,
                            std::function<void()> dropped) {
  const size_t p = static_cast<size_t>(priority);
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queues_[p].push_back({std::move(write), std::move(dropped)});
      ++stats_.submitted[p];
      return;
    }
  }
  if (dropped) dropped();
}

absl::Status WriteScheduler::Run(WritePriority priority, std::function<absl::Status()> write) {
  absl::Status result;
  absl::Notification done;
  Submit(
      priority,
      [&] {
        result = write();
        done.Notify();
      },
      [&] {
        result = absl::CancelledError("shutting down: the write was not made");
        done.Notify();
      });
  done.WaitForNotification();
  return result;
}

void WriteScheduler::Stop() {
  std::vector<Item> dropped;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& q : queues_) {
      for (Item& item : q) dropped.push_back(std::move(item));
      q.clear();
    }
  }
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
  for (Item& item : dropped) {
    if (item.dropped) item.dropped();
  }
}

WriteSchedulerStats WriteScheduler::stats() const {
  absl::MutexLock lock(&mu_);
  WriteSchedulerStats s = stats_;
  for (size_t p = 0; p < queues_.size(); ++p) s.queued[p] = queues_[p].size();
  return s;
}

void WriteScheduler::Worker() {
  while (true) {
    Item item;
    size_t p = 0;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (stopping_) return true;
        for (const auto& q : queues_) {
          if (!q.empty()) return true;
        }
        return false;
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      while (queues_[p].empty()) ++p;
      item = std::move(queues_[p].front());
      queues_[p].pop_front();
    }
    // The token is taken when the write leaves its queue, so a higher priority that
    // arrives while this worker waits for it goes to the next free worker first.
    const absl::Time now = clock_->Now();
    const absl::Duration wait = limiter_.Reserve(now);
    if (wait > absl::ZeroDuration()) {
      {
        absl::MutexLock lock(&mu_);
        ++stats_.throttled;
      }
      // The write has left its queue and holds its token: it waits out the token even
      // when Stop comes meanwhile (as a write already running is finished).
      absl::Mutex wait_mu;
      bool never = false;
      {
        absl::MutexLock lock(&wait_mu);
        clock_->AwaitUntil(wait_mu, &never, now + wait);
      }
      absl::MutexLock lock(&mu_);
      --stats_.throttled;
    }
    item.write();
    absl::MutexLock lock(&mu_);
    ++stats_.done[p];
  }
}

}  // namespace sbx::k8s

#include "src/server/watch_service.h"

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/alarm.h"
#include "src/common/ids.h"
#include "src/server/call.h"
#include "src/server/convert.h"
#include "src/server/status.h"

namespace sbx::server {
namespace {

// How many allocator events one Poll takes; they are written one at a time.
constexpr size_t kPollBatch = 64;

constexpr absl::Duration kDefaultPoolInterval = absl::Seconds(1);
constexpr absl::Duration kMinPoolInterval = absl::Milliseconds(100);
constexpr absl::Duration kMaxPoolInterval = absl::Minutes(1);

v1::WatchEventType EventType(allocator::ClaimEvent::Type t) {
  switch (t) {
    case allocator::ClaimEvent::Type::kAdded:
      return v1::WATCH_EVENT_TYPE_ADDED;
    case allocator::ClaimEvent::Type::kModified:
      return v1::WATCH_EVENT_TYPE_MODIFIED;
    case allocator::ClaimEvent::Type::kDeleted:
      return v1::WATCH_EVENT_TYPE_DELETED;
  }
  return v1::WATCH_EVENT_TYPE_UNSPECIFIED;
}

// A stream that ended before it started (bad request, no access): finishes at once.
template <typename Message>
class FailedStream final : public grpc::ServerWriteReactor<Message> {
 public:
  explicit FailedStream(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

// What both watch streams share: one write in flight at a time (Pump starts the next),
// and a cancel or a failed write finishes the call exactly once — at once, or, with a
// write in flight, when that write is done. Subclasses guard their own state with mu_ too.
template <typename Event>
class WatchWriter : public grpc::ServerWriteReactor<Event> {
 public:
  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    bool end = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      // Cancelled while the write was in flight: the write may still have succeeded, and
      // then this is the last chance to finish.
      if ((!ok || cancelled_) && !finished_) finished_ = end = true;
    }
    if (end) {
      this->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the watch was cancelled"));
      return;
    }
    Pump();
  }

  void OnCancel() override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      // With a write in flight, OnWriteDone finishes the call.
      if (finished_ || writing_) return;
      finished_ = true;
    }
    this->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the watch"));
  }

 protected:
  // Starts the next write if there is one and none is in flight.
  virtual void Pump() ABSL_LOCKS_EXCLUDED(mu_) = 0;

  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // Finish has been (or is about to be) called.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// ---- WatchClaims ----

// Writes the events of one allocator watch. The allocator's `ready` (Pump) and gRPC's
// reactions meet under mu_; the watch is cancelled in OnDone, which waits for a `ready`
// still running (unless OnDone runs inside it, on the same thread), so nothing reaches
// the reactor after it is deleted.
class ClaimsReactor final : public WatchWriter<v1::ClaimEvent> {
 public:
  ClaimsReactor(allocator::Allocator* a, ClaimQuery query, uint64_t start_revision)
      : query_(std::move(query)) {
    allocator::WatchRequest r;
    r.owner = query_.filter.owner;
    r.pool = query_.filter.pool;
    r.labels = query_.filter.labels;
    r.include_ended = query_.filter.include_ended;
    r.start_revision = start_revision;
    absl::StatusOr<std::unique_ptr<allocator::ClaimWatch>> watch =
        a->Watch(std::move(r), [this] { Pump(); });
    if (!watch.ok()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      Finish(ToGrpcStatus(watch.status()));
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      watch_ = std::move(*watch);
    }
    // Takes the initial state (or replayed history) and arms `ready`.
    Pump();
  }

  void OnDone() override ABSL_LOCKS_EXCLUDED(mu_) {
    std::unique_ptr<allocator::ClaimWatch> watch;
    {
      absl::MutexLock lock(&mu_);
      watch = std::move(watch_);
    }
    // Not under mu_: cancelling waits for a running Pump, which takes mu_.
    watch.reset();
    delete this;
  }

 private:
  // Starts the next write, or finishes when the watch has ended. Called by the allocator
  // (`ready`) and after each write. Touches nothing of the reactor after StartWrite or
  // Finish: either may end the call and delete it on this thread.
  void Pump() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::Status end;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_ || watch_ == nullptr) return;
      if (cancelled_) end = absl::CancelledError("the watch was cancelled");
      while (end.ok()) {
        if (next_ == batch_.size()) {
          batch_.clear();
          next_ = 0;
          end = watch_->Poll(&batch_, kPollBatch);
          if (!end.ok()) break;
          if (batch_.empty()) return;  // armed: `ready` calls again
        }
        const allocator::ClaimEvent& e = *batch_[next_++];
        if (!query_.Matches(e.claim)) continue;
        response_.Clear();
        response_.set_type(EventType(e.type));
        ToProto(e.claim, response_.mutable_claim());
        response_.set_revision(static_cast<int64_t>(e.revision));
        response_.set_initial(e.initial);
        writing_ = true;
        break;
      }
      if (!writing_) finished_ = true;
    }
    if (end.ok()) {
      StartWrite(&response_);
    } else {
      Finish(ToGrpcStatus(end));
    }
  }

  const ClaimQuery query_;
  std::unique_ptr<allocator::ClaimWatch> watch_ ABSL_GUARDED_BY(mu_);
  // Events taken from the watch and not written yet: batch_[next_..].
  std::vector<allocator::ClaimEventPtr> batch_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  // The message being written; stable until OnWriteDone.
  v1::ClaimEvent response_;
};

// ---- WatchPools ----

// Polls the pools once per interval with a grpc::Alarm. Two holders keep it alive: gRPC
// (until OnDone) and the alarm (set, or its callback running); the last to let go deletes
// it. The alarm is set under mu_ (its deadline is at least 100 ms away, so its callback
// cannot run inside Set) and cancelled outside it.
class PoolsReactor final : public WatchWriter<v1::PoolEvent> {
 public:
  PoolsReactor(allocator::Allocator* a, std::set<std::string> names, absl::Duration interval,
               const images::Images* images)
      : allocator_(a), names_(std::move(names)), interval_(interval), images_(images) {}

  // The first poll (the initial state), run by the handler.
  void Start() { OnTick(true); }

  void OnDone() override ABSL_LOCKS_EXCLUDED(mu_) {
    grpc::Alarm* alarm;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;  // no tick sets a new alarm from now on
      alarm = alarm_.get();
      ++holders_;  // keeps `alarm` alive while it is cancelled outside the lock
    }
    // Its callback then runs at once (with false) and lets go of its hold.
    if (alarm != nullptr) alarm->Cancel();
    bool last;
    {
      absl::MutexLock lock(&mu_);
      holders_ -= 2;  // gRPC's and the one above
      last = holders_ == 0;
    }
    if (last) delete this;
  }

 private:
  // One poll: queue the changes since the last one (unless the client has not taken the
  // previous ones yet), write, and set the next alarm.
  void OnTick(bool ok) ABSL_LOCKS_EXCLUDED(mu_) {
    bool poll;
    {
      absl::MutexLock lock(&mu_);
      poll = ok && !done_ && !finished_ && queue_.empty();
    }
    if (poll) {
      // Read outside the lock (the allocator takes its own).
      std::map<std::string, v1::Pool> now;
      for (const store::PoolRecord& p : allocator_->ListPools()) {
        if (!names_.empty() && !names_.contains(p.name)) continue;
        v1::Pool pool;
        if (FillPool(*allocator_, p.name, &pool, images_).ok())
          now.emplace(p.name, std::move(pool));
      }
      absl::MutexLock lock(&mu_);
      Diff(now);
    }
    if (ok) Pump();
    bool last;
    {
      absl::MutexLock lock(&mu_);
      if (ok && !done_ && !finished_) {
        ++holders_;  // the next alarm's
        // Replacing the alarm whose callback this is: gRPC keeps it alive until we return.
        alarm_ = std::make_unique<grpc::Alarm>();
        alarm_->Set(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(interval_),
                    [this](bool fired) { OnTick(fired); });
      }
      last = --holders_ == 0;  // this tick's
    }
    if (last) delete this;
  }

  // Queues an event per pool that appeared, changed or disappeared since the last poll.
  void Diff(const std::map<std::string, v1::Pool>& now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [name, pool] : now) {
      v1::Pool compared = pool;
      compared.mutable_status()->clear_updated_at();
      std::string key = SerializeSpec(compared);
      auto it = sent_.find(name);
      if (it != sent_.end() && it->second.key == key) continue;
      v1::PoolEvent& e = queue_.emplace_back();
      e.set_type(it == sent_.end() ? v1::WATCH_EVENT_TYPE_ADDED : v1::WATCH_EVENT_TYPE_MODIFIED);
      *e.mutable_pool() = pool;
      sent_[name] = Sent{std::move(key), pool};
    }
    for (auto it = sent_.begin(); it != sent_.end();) {
      if (now.contains(it->first)) {
        ++it;
        continue;
      }
      v1::PoolEvent& e = queue_.emplace_back();
      e.set_type(v1::WATCH_EVENT_TYPE_DELETED);
      *e.mutable_pool() = std::move(it->second.pool);
      it = sent_.erase(it);
    }
  }

  // Starts the next write if none is in flight. Touches nothing after StartWrite.
  void Pump() override ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_ || cancelled_ || queue_.empty()) return;
      response_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    StartWrite(&response_);
  }

  struct Sent {
    std::string key;  // the pool as compared (status without updated_at), serialized
    v1::Pool pool;    // the pool as sent, for DELETED
  };

  allocator::Allocator* const allocator_;
  const std::set<std::string> names_;
  const absl::Duration interval_;
  const images::Images* const images_;  // may be null

  // gRPC's hold (until OnDone) and the first tick's.
  int holders_ ABSL_GUARDED_BY(mu_) = 2;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::PoolEvent> queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Sent> sent_ ABSL_GUARDED_BY(mu_);
  // The message being written; stable until OnWriteDone.
  v1::PoolEvent response_;
};

}  // namespace

grpc::ServerWriteReactor<v1::ClaimEvent>* WatchClaims(grpc::CallbackServerContext* ctx,
                                                      const v1::WatchClaimsRequest* req,
                                                      allocator::Allocator* allocator,
                                                      const Authenticator* auth) {
  absl::StatusOr<Caller> caller = Authorize(*auth, ctx, false, "WatchClaims");
  if (!caller.ok()) return new FailedStream<v1::ClaimEvent>(caller.status());
  absl::StatusOr<ClaimQuery> query =
      ClaimQueryFromProto(req->filter(), *caller, "watch", allocator->default_namespace());
  if (!query.ok()) return new FailedStream<v1::ClaimEvent>(query.status());
  if (req->start_revision() < 0) {
    return new FailedStream<v1::ClaimEvent>(absl::InvalidArgumentError(
        absl::StrCat("start_revision ", req->start_revision(), " is negative")));
  }
  return new ClaimsReactor(allocator, *std::move(query),
                           static_cast<uint64_t>(req->start_revision()));
}

grpc::ServerWriteReactor<v1::PoolEvent>* WatchPools(grpc::CallbackServerContext* ctx,
                                                    const v1::WatchPoolsRequest* req,
                                                    allocator::Allocator* allocator,
                                                    const Authenticator* auth,
                                                    const images::Images* images) {
  absl::StatusOr<Caller> caller = Authorize(*auth, ctx, true, "WatchPools");
  if (!caller.ok()) return new FailedStream<v1::PoolEvent>(caller.status());
  std::set<std::string> names;
  for (const std::string& given : req->names()) {
    absl::StatusOr<std::string> name =
        CanonicalQualifiedName("names", given, allocator->default_namespace());
    if (!name.ok()) return new FailedStream<v1::PoolEvent>(name.status());
    if (absl::Status s = allocator->GetPool(*name).status(); !s.ok()) {
      return new FailedStream<v1::PoolEvent>(s);
    }
    names.insert(*std::move(name));
  }
  absl::StatusOr<absl::Duration> interval = FromProto("min_interval", req->min_interval());
  if (!interval.ok()) return new FailedStream<v1::PoolEvent>(interval.status());
  if (*interval == absl::ZeroDuration()) *interval = kDefaultPoolInterval;
  if (*interval < kMinPoolInterval || *interval > kMaxPoolInterval) {
    return new FailedStream<v1::PoolEvent>(absl::InvalidArgumentError(absl::StrCat(
        "min_interval ", absl::FormatDuration(*interval), " is outside ",
        absl::FormatDuration(kMinPoolInterval), "..", absl::FormatDuration(kMaxPoolInterval))));
  }
  auto* reactor = new PoolsReactor(allocator, std::move(names), *interval, images);
  reactor->Start();
  return reactor;
}

}  // namespace sbx::server

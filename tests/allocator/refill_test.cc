#include "src/allocator/refill.h"

#include "absl/strings/str_cat.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <optional>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/store/memory_store.h"
#include "tests/allocator/fakes.h"

namespace sbx::allocator {
namespace {

using store::MemoryStore;
using store::MemoryStoreOptions;

MemoryStoreOptions Inline() {
  MemoryStoreOptions o;
  o.callbacks = MemoryStoreOptions::CallbackMode::kInline;
  return o;
}

class RefillTest : public ::testing::Test {
 protected:
  void Start(RefillOptions options, int min_warm,
             store::PoolSizing sizing = store::PoolSizing::kStatic, DemandOptions demand = {}) {
    refill_ = std::make_unique<RefillReconciler>(options, &runtime_, &clock_);
    AllocatorOptions ao;
    ao.timer_thread = false;
    ao.demand = demand;
    auto a = Allocator::Create(ao, &store_, &runtime_, refill_.get(), &clock_, &ids_);
    ASSERT_TRUE(a.ok()) << a.status();
    allocator_ = std::move(*a);
    refill_->Attach(allocator_.get());
    std::optional<absl::Status> done;
    allocator_->PutTemplate(store::TemplateRecord{"py", "local", "spec", 0},
                            [&](absl::Status s) { done = s; });
    ASSERT_TRUE(done.has_value() && done->ok());
    done.reset();
    store::PoolRecord p;
    p.name = "py";
    p.template_name = "py";
    p.min_warm = min_warm;
    p.max_warm = 100;
    p.empty_pool_policy = store::EmptyPoolPolicy::kFail;
    p.sizing = sizing;
    allocator_->PutPool(p, [&](absl::Status s) { done = s; });
    ASSERT_TRUE(done.has_value() && done->ok());
  }
  // Creates still pending are completed while the allocator exists: Stop() waits for them.
  void TearDown() override { CompleteAll(); }

  void CompleteAll() {
    while (runtime_.pending_creates() > 0) runtime_.CompleteCreate("s" + std::to_string(next_++));
  }
  int64_t Warm() { return allocator_->GetPoolStatus("py")->warm; }
  absl::StatusOr<ClaimResult> ClaimNow(const std::string& id) {
    std::optional<absl::StatusOr<ClaimResult>> out;
    ClaimRequest r;
    r.owner = "alice";
    r.claim_id = id;
    r.pool = "py";
    allocator_->Claim(r, [&](absl::StatusOr<ClaimResult> res) { out = std::move(res); });
    return out.value_or(absl::InternalError("did not complete"));
  }

  FakeClock clock_;
  SequentialIdGenerator ids_{"id-"};
  MemoryStore store_{Inline()};
  testing::ManualRuntime runtime_;
  std::unique_ptr<RefillReconciler> refill_;
  std::unique_ptr<Allocator> allocator_;
  int next_ = 1;
};

TEST_F(RefillTest, FillsToTheFloorWithoutOvercreating) {
  Start({}, 3);
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 3u);
  EXPECT_EQ(refill_->creating("py"), 3);
  // Repeated passes and notifications while the creates run start nothing more.
  refill_->PoolBelowTarget("py");
  refill_->RunOnce();
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 3u);
  CompleteAll();
  EXPECT_EQ(Warm(), 3);
  EXPECT_EQ(refill_->creating("py"), 0);
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 0u);
  EXPECT_EQ(refill_->stats().creates_succeeded, 3u);
}

TEST_F(RefillTest, RefillsAfterAClaimAndDeletesTheReleasedSandbox) {
  Start({}, 2);
  refill_->RunOnce();
  CompleteAll();
  auto c = ClaimNow("c1");
  ASSERT_TRUE(c.ok()) << c.status();
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 1u);
  CompleteAll();
  EXPECT_EQ(Warm(), 2);
  std::optional<absl::Status> rel;
  allocator_->Release("alice", "c1",
                      [&](absl::StatusOr<store::ClaimRecord> ended) { rel = ended.status(); });
  ASSERT_TRUE(rel.has_value() && rel->ok());
  EXPECT_EQ(refill_->pending_deletes(), 1u);
  refill_->RunOnce();
  EXPECT_THAT(runtime_.deleted(), ::testing::ElementsAre(c->claim.sandbox_id));
  EXPECT_EQ(refill_->pending_deletes(), 0u);
}

TEST_F(RefillTest, DemandSizingGrowsWithClaimsLearnsTheLatencyAndTrimsAfterTheCoolDown) {
  DemandOptions demand;
  demand.short_window = absl::Seconds(1);
  demand.long_window = absl::Seconds(4);
  demand.cool_down = absl::Seconds(5);
  Start({}, 0, store::PoolSizing::kDemand, demand);
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 0u) << "no demand yet, floor 0";
  // 10 claims a second for 10 s (refused: the pool is FAIL and empty, but they count).
  int id = 0;
  std::vector<absl::Time> started;  // of each create, in order
  for (int second = 0; second < 10; ++second) {
    for (int i = 0; i < 10; ++i) (void)ClaimNow(absl::StrCat("c", id++));
    clock_.Advance(absl::Seconds(1));
    refill_->RunOnce();
    started.resize(runtime_.pending_creates(), clock_.Now());
  }
  absl::StatusOr<PoolStatus> st = allocator_->GetPoolStatus("py");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->target_reason, TargetReason::kDemand);
  EXPECT_NEAR(st->demand.rate_long, 10, 2);
  EXPECT_EQ(st->arrivals, 100u);
  // 10/s x 1 s (the default latency before any create): a few more than 10.
  EXPECT_GT(st->target, 10);
  EXPECT_LT(st->target, 25);
  EXPECT_EQ(runtime_.pending_creates(), static_cast<size_t>(st->target));
  // They are ready 3 s after the last began: the estimate uses the median of what each
  // took from its own start.
  clock_.Advance(absl::Seconds(3));
  std::vector<absl::Duration> took;
  for (absl::Time t : started) took.push_back(clock_.Now() - t);
  std::sort(took.begin(), took.end());
  CompleteAll();
  st = allocator_->GetPoolStatus("py");
  EXPECT_EQ(st->demand.create_samples, static_cast<int>(took.size()));
  EXPECT_EQ(st->demand.create_latency, took[(took.size() + 1) / 2 - 1]);
  EXPECT_EQ(st->warm, static_cast<int64_t>(next_ - 1));
  // Silence: inside the cool-down nothing is trimmed; after it the target falls and the
  // refill retires the warm surplus.
  const int64_t warm = st->warm;
  refill_->RunOnce();
  EXPECT_EQ(refill_->stats().trimmed, 0u);
  for (int second = 0; second < 60; ++second) {
    clock_.Advance(absl::Seconds(1));
    refill_->RunOnce();
  }
  st = allocator_->GetPoolStatus("py");
  EXPECT_EQ(st->target, 0);
  EXPECT_EQ(st->target_reason, TargetReason::kFloor);
  EXPECT_EQ(st->warm, 0);
  EXPECT_EQ(refill_->stats().trimmed, static_cast<uint64_t>(warm));
  EXPECT_EQ(runtime_.deleted().size(), static_cast<size_t>(warm));
}

TEST_F(RefillTest, StaticPoolsKeepTheirSurplus) {
  Start({}, 3);
  refill_->RunOnce();
  CompleteAll();
  store::PoolRecord p = *allocator_->GetPool("py");
  p.min_warm = 1;
  std::optional<absl::Status> done;
  allocator_->PutPool(p, [&](absl::Status s) { done = s; });
  ASSERT_TRUE(done.has_value() && done->ok());
  for (int second = 0; second < 60; ++second) {
    clock_.Advance(absl::Seconds(1));
    refill_->RunOnce();
  }
  EXPECT_EQ(Warm(), 3);
  EXPECT_EQ(refill_->stats().trimmed, 0u);
}

TEST_F(RefillTest, TokenBucketLimitsRuntimeWrites) {
  RefillOptions o;
  o.qps = 10;
  o.burst = 2;
  Start(o, 5);
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 2u);
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 2u);  // no time passed, no tokens
  clock_.Advance(absl::Milliseconds(100));
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 3u);
  clock_.Advance(absl::Seconds(10));  // refills to the burst, not beyond
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 5u);
  CompleteAll();
  EXPECT_EQ(Warm(), 5);
}

TEST_F(RefillTest, CreatesComeBeforeDeletes) {
  RefillOptions o;
  o.qps = 1;
  o.burst = 2;
  Start(o, 0);
  refill_->RetireSandbox(store::SandboxRecord{"old-1", "py", "", "", absl::UnixEpoch()});
  store::PoolRecord p = *allocator_->GetPool("py");
  p.min_warm = 2;
  std::optional<absl::Status> done;
  allocator_->PutPool(p, [&](absl::Status s) { done = s; });
  ASSERT_TRUE(done.has_value() && done->ok());
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 2u);
  EXPECT_TRUE(runtime_.deleted().empty());  // the budget went to the creates
  clock_.Advance(absl::Seconds(1));
  refill_->RunOnce();
  EXPECT_THAT(runtime_.deleted(), ::testing::ElementsAre("old-1"));
}

TEST_F(RefillTest, FailedCreatesBackOff) {
  Start({}, 1);
  refill_->RunOnce();
  runtime_.CompleteCreate("", absl::UnavailableError("bwrap: out of memory"));
  EXPECT_EQ(refill_->stats().creates_failed, 1u);
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 0u);  // backing off (100 ms)
  clock_.Advance(absl::Milliseconds(150));
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 1u);
  runtime_.CompleteCreate("", absl::UnavailableError("again"));
  clock_.Advance(absl::Milliseconds(150));  // the backoff doubled to 200 ms
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 0u);
  clock_.Advance(absl::Milliseconds(100));
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 1u);
  CompleteAll();
  EXPECT_EQ(Warm(), 1);
}

// Issue 33: a create the runtime refuses (a template whose mount holds the server's
// files) shows where the operator looks, not only in the log: PoolStatus.last_error (which
// the API, `sbx pools` and WatchPools show) and the pool's failure count (the metric
// sbx_pool_create_failures_total). A create that succeeds clears the error, not the count.
TEST_F(RefillTest, AFailedCreateShowsInThePoolsStatus) {
  Start({}, 1);
  EXPECT_EQ(allocator_->GetPoolStatus("py")->last_error, "");
  refill_->RunOnce();
  runtime_.CompleteCreate("",
                          absl::InvalidArgumentError("template \"py\": mount source \"/\" holds "
                                                     "\"/var/lib/sbx\""));
  PoolStatus st = *allocator_->GetPoolStatus("py");
  EXPECT_EQ(st.last_error,
            "INVALID_ARGUMENT: template \"py\": mount source \"/\" holds "
            "\"/var/lib/sbx\"");
  EXPECT_EQ(st.create_failures, 1u);
  clock_.Advance(absl::Milliseconds(150));
  refill_->RunOnce();
  CompleteAll();
  st = *allocator_->GetPoolStatus("py");
  EXPECT_EQ(st.last_error, "");
  EXPECT_EQ(st.create_failures, 1u);
  EXPECT_EQ(st.warm, 1);
}

// Issue 23: creates run concurrently, so the failures of one burst add up (here 8 of 10,
// a backoff of 10 s) before a success comes back. A create that succeeds shows the
// runtime works: the pool is refilled at once. At 0045959 the retry time stayed and the
// pass below started nothing for 10 s.
TEST_F(RefillTest, ACreateThatSucceedsEndsTheBackoff) {
  Start({}, 10);
  refill_->RunOnce();
  ASSERT_EQ(runtime_.pending_creates(), 10u);
  for (int i = 0; i < 8; ++i) {
    runtime_.CompleteCreate("", absl::UnavailableError("injected 500"));
  }
  EXPECT_EQ(refill_->stats().creates_failed, 8u);
  refill_->RunOnce();
  EXPECT_EQ(runtime_.pending_creates(), 2u);  // backing off: nothing new
  CompleteAll();
  EXPECT_EQ(Warm(), 2);
  refill_->RunOnce();  // no time has passed
  EXPECT_EQ(runtime_.pending_creates(), 8u);
  CompleteAll();
  EXPECT_EQ(Warm(), 10);
}

TEST_F(RefillTest, SandboxOfADeletedPoolIsDeleted) {
  Start({}, 1);
  refill_->RunOnce();
  std::optional<absl::Status> done;
  store::PoolRecord p = *allocator_->GetPool("py");
  allocator_->DeletePool("py", [&](absl::Status s) { done = s; });
  ASSERT_TRUE(done.has_value() && done->ok());
  runtime_.CompleteCreate("late");
  refill_->RunOnce();
  EXPECT_THAT(runtime_.deleted(), ::testing::ElementsAre("late"));
}

// A runtime for the worker tests: each sandbox is made at once, on the calling thread
// (after BeforeCreate), and deletes succeed.
class InstantRuntime : public runtime::Runtime {
 public:
  void Create(runtime::CreateRequest r, runtime::CreateCallback done) override {
    BeforeCreate();
    runtime::SandboxInfo info;
    info.id = "i" + std::to_string(next_.fetch_add(1));
    info.pool = r.pool;
    std::move(done)(info);
  }
  void Delete(std::string, runtime::DeleteCallback done) override {
    std::move(done)(absl::OkStatus());
  }
  void Suspend(std::string, runtime::DoneCallback done) override {
    std::move(done)(absl::UnimplementedError("not used"));
  }
  void Resume(std::string, runtime::ResumeCallback done) override {
    std::move(done)(absl::UnimplementedError("not used"));
  }
  absl::StatusOr<std::vector<runtime::SandboxInfo>> List() override {
    return std::vector<runtime::SandboxInfo>{};
  }

 protected:
  virtual void BeforeCreate() {}

 private:
  std::atomic<int> next_{1};
};

// Puts template and pool "py" through `a` and waits for both to be committed.
void PutPyPool(Allocator* a, int min_warm, int max_warm, store::EmptyPoolPolicy policy) {
  absl::Notification t, p;
  a->PutTemplate(store::TemplateRecord{"py", "local", "", 0}, [&](absl::Status) { t.Notify(); });
  t.WaitForNotification();
  store::PoolRecord pool;
  pool.name = "py";
  pool.template_name = "py";
  pool.min_warm = min_warm;
  pool.max_warm = max_warm;
  pool.empty_pool_policy = policy;
  a->PutPool(pool, [&](absl::Status) { p.Notify(); });
  p.WaitForNotification();
}

// The worker thread on the real clock keeps a pool full while claims take from it.
TEST(RefillWorkerTest, KeepsAPoolFull) {
  InstantRuntime runtime;
  MemoryStore store;
  SequentialIdGenerator ids("id-");
  RefillReconciler refill({}, &runtime, &Clock::Real());
  auto a = Allocator::Create({}, &store, &runtime, &refill, &Clock::Real(), &ids);
  ASSERT_TRUE(a.ok());
  refill.Start(a->get());
  PutPyPool(a->get(), 4, 8, store::EmptyPoolPolicy::kWait);
  for (int i = 0; i < 50; ++i) {
    absl::Notification done;
    ClaimRequest r;
    r.owner = "o";
    r.claim_id = "c" + std::to_string(i);
    r.pool = "py";
    (*a)->Claim(r, [&](absl::StatusOr<ClaimResult> res) {
      EXPECT_TRUE(res.ok()) << res.status();
      done.Notify();
    });
    ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(20))) << "claim " << i;
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while ((*a)->GetPoolStatus("py")->warm < 4 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ((*a)->GetPoolStatus("py")->warm, 4);
  refill.Stop();
  a->reset();
}

// Notifications that keep arriving while the worker runs a pass are taken together after
// RefillOptions::coalesce instead of waking the worker for each (each wake-up is a context
// switch on the thread that notifies, the claim path's). The first pass is held inside
// the runtime's Create while a notification arrives; then 40 more come 5 ms apart, all
// within the 1 s window. Without the window every one of them would wake the worker for
// a pass of its own.
TEST(RefillWorkerTest, NotificationsArrivingDuringAPassAreTakenTogether) {
  // The first create holds its pass until the test releases it.
  class HeldRuntime : public InstantRuntime {
   public:
    absl::Notification entered, release;

   protected:
    void BeforeCreate() override {
      if (entered.HasBeenNotified()) return;
      entered.Notify();
      release.WaitForNotification();
    }
  } runtime;
  MemoryStore store;
  SequentialIdGenerator ids("id-");
  RefillOptions options;
  options.coalesce = absl::Seconds(1);
  options.resync = absl::Hours(1);  // no pass of its own during the test
  RefillReconciler refill(options, &runtime, &Clock::Real());
  auto a = Allocator::Create({}, &store, &runtime, &refill, &Clock::Real(), &ids);
  ASSERT_TRUE(a.ok());
  refill.Start(a->get());
  PutPyPool(a->get(), 1, 1, store::EmptyPoolPolicy::kFail);
  runtime.entered.WaitForNotification();  // a pass is creating the pool's sandbox
  const uint64_t before = refill.stats().passes;
  refill.PoolBelowTarget("py");  // arrives during the pass
  runtime.release.Notify();
  for (int i = 0; i < 40; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
    refill.PoolBelowTarget("py");
  }
  // Every notification has been taken once the worker runs a pass after the last one.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (refill.stats().passes < before + 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  absl::SleepFor(absl::Milliseconds(50));
  const uint64_t passes = refill.stats().passes - before;
  std::printf("41 notifications after the held pass took %llu more passes\n",
              static_cast<unsigned long long>(passes));
  EXPECT_GE(passes, 1u);
  EXPECT_LT(passes, 10u) << "notifications woke the worker one by one";
  refill.Stop();
  a->reset();
}

}  // namespace
}  // namespace sbx::allocator

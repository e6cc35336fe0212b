// Fair shares under scarcity (issue 22), through the Allocator: waiting claims of an empty
// pool are served by weighted fair share between owners and by priority within an owner
// (waiter_queue.h), and an owner's max_claims is exact (owner_claims.h).

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/allocator/allocator.h"
#include "src/store/memory_store.h"
#include "tests/allocator/fakes.h"

namespace sbx::allocator {
namespace {

using store::EmptyPoolPolicy;
using store::MemoryStore;
using store::MemoryStoreOptions;
using ::testing::HasSubstr;

template <typename T>
struct Result {
  std::optional<T> value;
  auto callback() {
    return [this](T v) { value = std::move(v); };
  }
};

// For claims made from several threads at once: with CallbackMode::kInline a commit that
// joins another thread's group is completed by that thread, after this thread's call has
// returned, so the answer is waited for.
template <typename T>
struct AwaitedResult {
  absl::Notification done;
  std::optional<T> value;
  auto callback() {
    return [this](T v) {
      value = std::move(v);
      done.Notify();
    };
  }
  const T& Await() {
    done.WaitForNotification();
    return *value;
  }
};
using ClaimOut = Result<absl::StatusOr<ClaimResult>>;
using BatchOut = Result<absl::StatusOr<std::vector<ClaimResult>>>;

class FairShareTest : public ::testing::Test {
 protected:
  FairShareTest() {
    MemoryStoreOptions o;
    o.callbacks = MemoryStoreOptions::CallbackMode::kInline;
    store_ = std::make_unique<MemoryStore>(o);
  }

  void SetUp() override {
    Start();
    store::TemplateRecord t;
    t.name = "py";
    t.runtime = "local";
    Result<absl::Status> put;
    allocator_->PutTemplate(t, put.callback());
    ASSERT_TRUE(put.value.has_value() && put.value->ok());
    store::PoolRecord p;
    p.name = "py";
    p.template_name = "py";
    p.min_warm = 0;
    p.max_warm = 10000;
    p.empty_pool_policy = EmptyPoolPolicy::kWait;
    p.default_wait = absl::Hours(1);
    Result<absl::Status> pool;
    allocator_->PutPool(p, pool.callback());
    ASSERT_TRUE(pool.value.has_value() && pool.value->ok());
  }

  void Start() {
    allocator_.reset();
    AllocatorOptions options;
    options.timer_thread = false;
    auto a = Allocator::Create(options, store_.get(), nullptr, &reconciler_, &clock_, &ids_);
    ASSERT_TRUE(a.ok()) << a.status();
    allocator_ = std::move(*a);
  }

  void AddWarm() {
    runtime::SandboxInfo info;
    info.id = absl::StrCat("s", ++sandboxes_);
    info.pool = "py";
    info.endpoint = "unix:/run/" + info.id;
    ASSERT_TRUE(allocator_->AddSandbox(info).ok());
  }

  static ClaimRequest Req(const std::string& owner, const std::string& id,
                          ClaimPriority priority = ClaimPriority::kNormal) {
    ClaimRequest r;
    r.owner = owner;
    r.claim_id = id;
    r.pool = "py";
    r.priority = priority;
    return r;
  }
  static BatchRequest Batch(const std::string& owner, const std::string& id, int count) {
    BatchRequest b;
    b.owner = owner;
    b.batch_id = id;
    b.pool = "py";
    b.count = count;
    return b;
  }

  // The answers live as long as the fixture, longer than the allocator: claims still
  // waiting when a test ends are answered CANCELLED by its destructor.
  ClaimOut* Claim(ClaimRequest r) {
    ClaimOut* out = claim_outs_.emplace_back(std::make_unique<ClaimOut>()).get();
    allocator_->Claim(std::move(r), out->callback());
    return out;
  }
  BatchOut* ClaimBatch(BatchRequest b) {
    BatchOut* out = batch_outs_.emplace_back(std::make_unique<BatchOut>()).get();
    allocator_->ClaimBatch(std::move(b), out->callback());
    return out;
  }
  absl::Status Release(const std::string& owner, const std::string& id) {
    Result<absl::StatusOr<store::ClaimRecord>> out;
    allocator_->Release(owner, id, out.callback());
    return out.value.has_value() ? out.value->status() : absl::InternalError("no answer");
  }
  int64_t Held(const std::string& owner) const {
    for (const OwnerClaimCount& c : allocator_->OwnerClaimCounts()) {
      if (c.owner == owner) return c.held;
    }
    return 0;
  }
  uint64_t Refused(const std::string& owner) const {
    for (const OwnerClaimCount& c : allocator_->OwnerClaimCounts()) {
      if (c.owner == owner) return c.refused;
    }
    return 0;
  }
  PoolStatus PoolNow() const { return *allocator_->GetPoolStatus("py"); }

  FakeClock clock_;
  SequentialIdGenerator ids_{"gen-"};
  std::unique_ptr<MemoryStore> store_;
  testing::RecordingReconciler reconciler_;
  std::vector<std::unique_ptr<ClaimOut>> claim_outs_;
  std::vector<std::unique_ptr<BatchOut>> batch_outs_;
  std::unique_ptr<Allocator> allocator_;
  int sandboxes_ = 0;
};

// The evidence of issue 22: tenant "a" has 5,000 claims waiting (5 batches of 1,000, policy
// WAIT) and tenant "b"'s single WAIT claims each get one of the next two sandboxes added
// (one turn of "a", then "b"), not the 5,001st. Then "a"'s batches are granted, in order.
TEST_F(FairShareTest, ASingleClaimIsNotHeldBackByAnotherTenantsBacklog) {
  std::vector<BatchOut*> batches;
  for (int i = 0; i < 5; ++i) {
    batches.push_back(ClaimBatch(Batch("a", absl::StrCat("big", i), 1000)));
    ASSERT_FALSE(batches.back()->value.has_value()) << batches.back()->value->status();
  }
  EXPECT_EQ(PoolNow().waiting, 5000);
  EXPECT_EQ(Held("a"), 5000);
  for (int k = 0; k < 10; ++k) {
    ClaimOut* b = Claim(Req("b", absl::StrCat("b", k)));
    ASSERT_FALSE(b->value.has_value()) << "the pool is empty: it must wait";
    EXPECT_EQ(PoolNow().waiting, 5000 - k + 1);
    int added = 0;
    while (!b->value.has_value() && added < 5000) {
      AddWarm();
      ++added;
    }
    ASSERT_TRUE(b->value.has_value()) << "b" << k;
    ASSERT_TRUE(b->value->ok()) << b->value->status();
    EXPECT_LE(added, 2) << "b" << k << " waited for " << added << " sandboxes";
  }
  // "a" had one sandbox of each turn: 10 of its 5,000.
  EXPECT_EQ(PoolNow().waiting, 4990);
  std::vector<int> granted_order;
  for (int added = 0; added < 5000 && granted_order.size() < 5; ++added) {
    AddWarm();
    for (int i = 0; i < 5; ++i) {
      if (batches[i]->value.has_value() &&
          std::find(granted_order.begin(), granted_order.end(), i) == granted_order.end()) {
        ASSERT_TRUE(batches[i]->value->ok()) << batches[i]->value->status();
        EXPECT_EQ((*batches[i]->value)->size(), 1000u);
        granted_order.push_back(i);
      }
    }
  }
  EXPECT_EQ(granted_order, (std::vector<int>{0, 1, 2, 3, 4})) << "FIFO within a tenant";
  EXPECT_EQ(PoolNow().waiting, 0);
  EXPECT_EQ(PoolNow().warm, 0);
  EXPECT_EQ(Held("a"), 5000);
  EXPECT_EQ(Held("b"), 10);
}

// Weights from the tenants' lines: while both wait, "heavy" (weight 3) gets three
// sandboxes for each of "light"'s (weight 1).
TEST_F(FairShareTest, WaitingTenantsShareByWeight) {
  std::vector<ClaimOut*> heavy, light;
  for (int i = 0; i < 40; ++i) {
    ClaimRequest h = Req("heavy", absl::StrCat("h", i));
    h.weight = 3;
    heavy.push_back(Claim(h));
    light.push_back(Claim(Req("light", absl::StrCat("l", i))));
  }
  for (int i = 0; i < 40; ++i) AddWarm();
  auto granted = [](const std::vector<ClaimOut*>& claims) {
    int n = 0;
    for (const auto& c : claims) n += c->value.has_value() && c->value->ok();
    return n;
  };
  EXPECT_EQ(granted(heavy), 30);
  EXPECT_EQ(granted(light), 10);
  // FIFO within a tenant: the first 30 of "heavy" were served.
  for (int i = 0; i < 30; ++i) EXPECT_TRUE(heavy[i]->value.has_value()) << i;
}

// Within a tenant, strict priority then FIFO; the priority of "a" does not make "b" wait.
TEST_F(FairShareTest, PrioritiesAreHonouredWithinATenant) {
  auto batch1 = Claim(Req("a", "batch1", ClaimPriority::kBatch));
  auto normal1 = Claim(Req("a", "normal1", ClaimPriority::kNormal));
  auto interactive1 = Claim(Req("a", "interactive1", ClaimPriority::kInteractive));
  auto normal2 = Claim(Req("a", "normal2", ClaimPriority::kNormal));
  BatchRequest waiting_batch = Batch("a", "bulk", 2);
  waiting_batch.priority = ClaimPriority::kBatch;
  auto bulk = ClaimBatch(waiting_batch);
  auto interactive2 = Claim(Req("a", "interactive2", ClaimPriority::kInteractive));
  const std::vector<std::pair<std::string, const ClaimOut*>> expected = {
      {"interactive1", interactive1},
      {"interactive2", interactive2},
      {"normal1", normal1},
      {"normal2", normal2},
      {"batch1", batch1}};
  for (size_t i = 0; i < expected.size(); ++i) {
    AddWarm();
    for (size_t j = 0; j < expected.size(); ++j) {
      EXPECT_EQ(expected[j].second->value.has_value(), j <= i)
          << "after " << i + 1 << " sandboxes, " << expected[j].first;
    }
  }
  // The batch-priority batch, queued before interactive2, comes last.
  EXPECT_FALSE(bulk->value.has_value());
  AddWarm();
  AddWarm();
  ASSERT_TRUE(bulk->value.has_value());
  EXPECT_TRUE(bulk->value->ok()) << bulk->value->status();
}

// A waiter leaves from the middle of its queue (its caller gave up); the others keep their
// order and nothing is given to the one that left.
TEST_F(FairShareTest, AClaimCancelledInTheMiddleLeavesTheOthersInOrder) {
  auto c1 = Claim(Req("a", "c1"));
  ClaimRequest r2 = Req("a", "c2");
  r2.cancellation = std::make_shared<WaitCancellation>();
  auto c2 = Claim(r2);
  auto c3 = Claim(Req("a", "c3"));
  EXPECT_EQ(Held("a"), 3);
  r2.cancellation->Cancel();
  ASSERT_TRUE(c2->value.has_value());
  EXPECT_EQ(c2->value->status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(PoolNow().waiting, 2);
  EXPECT_EQ(Held("a"), 2) << "a cancelled claim gave its slot back";
  AddWarm();
  EXPECT_TRUE(c1->value.has_value());
  EXPECT_FALSE(c3->value.has_value());
  AddWarm();
  ASSERT_TRUE(c3->value.has_value());
  EXPECT_TRUE(c3->value->ok());
  EXPECT_EQ(PoolNow().warm, 0);
}

// max_claims: waiting and active claims count; beyond it RESOURCE_EXHAUSTED with the retry
// hint in the message and nothing held; a retry of an existing claim is answered; a
// release, a wait deadline or a refused batch frees what it held.
TEST_F(FairShareTest, MaxClaimsRefusesBeyondItAndFreesOnRelease) {
  AddWarm();
  auto with_max = [](ClaimRequest r) {
    r.max_claims = 2;
    return r;
  };
  auto c1 = Claim(with_max(Req("a", "c1")));
  ASSERT_TRUE(c1->value.has_value() && c1->value->ok());
  ClaimRequest r2 = with_max(Req("a", "c2"));
  r2.wait = absl::Seconds(5);
  auto c2 = Claim(r2);  // waits (the pool is empty) and counts
  EXPECT_FALSE(c2->value.has_value());
  auto c3 = Claim(with_max(Req("a", "c3")));
  ASSERT_TRUE(c3->value.has_value());
  EXPECT_EQ(c3->value->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c3->value->status().message(), HasSubstr("tenant \"a\" holds 2 claims"));
  EXPECT_THAT(c3->value->status().message(), HasSubstr("at most 2 (its max_claims)"));
  EXPECT_THAT(c3->value->status().message(), HasSubstr("retry after"));
  EXPECT_EQ(allocator_->GetClaim("a", "c3").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(PoolNow().waiting, 1) << "the refused claim queued";
  // A retry of c1 is answered from it.
  auto again = Claim(with_max(Req("a", "c1")));
  ASSERT_TRUE(again->value.has_value());
  ASSERT_TRUE(again->value->ok()) << again->value->status();
  EXPECT_TRUE((*again->value)->replayed);
  // Another tenant is not limited by "a"'s count.
  auto b1 = Claim(with_max(Req("b", "b1")));
  EXPECT_FALSE(b1->value.has_value());
  // A batch counts each claim: one slot would be free after c2's deadline, two are asked.
  clock_.Advance(absl::Seconds(5));
  allocator_->Tick();
  ASSERT_TRUE(c2->value.has_value());
  EXPECT_EQ(c2->value->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Held("a"), 1) << "a claim past its wait deadline gave its slot back";
  BatchRequest two = Batch("a", "two", 2);
  two.max_claims = 2;
  auto refused = ClaimBatch(two);
  ASSERT_TRUE(refused->value.has_value());
  EXPECT_EQ(refused->value->status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused->value->status().message(), HasSubstr("a batch of 2"));
  EXPECT_EQ(Held("a"), 1);
  EXPECT_EQ(Refused("a"), 2u);
  // A release frees its slot: now the batch fits (and waits for its sandboxes).
  ASSERT_TRUE(Release("a", "c1").ok());
  EXPECT_EQ(Held("a"), 0);
  auto fits = ClaimBatch(two);
  EXPECT_FALSE(fits->value.has_value());
  EXPECT_EQ(Held("a"), 2);
  AddWarm();  // b1 came first
  AddWarm();
  AddWarm();
  ASSERT_TRUE(fits->value.has_value());
  EXPECT_TRUE(fits->value->ok()) << fits->value->status();
  EXPECT_EQ(Held("a"), 2);
  EXPECT_EQ(Held("b"), 1);
}

// A BEST_EFFORT batch holds slots for its count while it is decided and keeps one per
// claim it is granted.
TEST_F(FairShareTest, ABestEffortBatchGivesBackTheSlotsItIsNotGranted) {
  AddWarm();
  AddWarm();
  BatchRequest b = Batch("a", "some", 5);
  b.mode = BatchMode::kBestEffort;
  b.policy = EmptyPoolPolicy::kFail;
  b.max_claims = 5;
  auto out = ClaimBatch(b);
  ASSERT_TRUE(out->value.has_value());
  ASSERT_TRUE(out->value->ok()) << out->value->status();
  EXPECT_EQ((*out->value)->size(), 2u);
  EXPECT_EQ(Held("a"), 2);
  for (const ClaimResult& c : **out->value) ASSERT_TRUE(Release("a", c.claim.id).ok());
  EXPECT_EQ(Held("a"), 0);
}

// Concurrent claims of one tenant never together pass its max_claims: of 160 claims from 8
// threads (singles and batches of 2) with max_claims 10 and 100 warm sandboxes, the
// granted ones hold exactly 10 and the refused ones hold no sandbox.
TEST_F(FairShareTest, MaxClaimsIsExactUnderConcurrentClaims) {
  for (int i = 0; i < 100; ++i) AddWarm();
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20;
  std::atomic<int> granted{0}, refused{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string id = absl::StrCat("t", t, "-", i);
        if (i % 4 == 3) {
          BatchRequest b = Batch("a", id, 2);
          b.policy = EmptyPoolPolicy::kFail;
          b.max_claims = 10;
          AwaitedResult<absl::StatusOr<std::vector<ClaimResult>>> out;
          allocator_->ClaimBatch(b, out.callback());
          const absl::StatusOr<std::vector<ClaimResult>>& answer = out.Await();
          if (answer.ok()) {
            granted += static_cast<int>(answer->size());
          } else if (answer.status().code() == absl::StatusCode::kResourceExhausted) {
            ++refused;
          } else {
            ++other;
          }
          continue;
        }
        ClaimRequest r = Req("a", id);
        r.policy = EmptyPoolPolicy::kFail;
        r.max_claims = 10;
        AwaitedResult<absl::StatusOr<ClaimResult>> out;
        allocator_->Claim(r, out.callback());
        const absl::StatusOr<ClaimResult>& answer = out.Await();
        if (answer.ok()) {
          ++granted;
        } else if (answer.status().code() == absl::StatusCode::kResourceExhausted) {
          ++refused;
        } else {
          ++other;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(granted.load(), 10);
  EXPECT_EQ(Held("a"), 10);
  EXPECT_EQ(PoolNow().warm, 90) << "a refused claim held a sandbox";
  ClaimFilter f;
  f.owner = "a";
  f.limit = 0;
  std::vector<store::ClaimRecord> claims = allocator_->ListClaims(f);
  EXPECT_EQ(claims.size(), 10u);
  for (const store::ClaimRecord& c : claims) ASSERT_TRUE(Release("a", c.id).ok()) << c.id;
  EXPECT_EQ(Held("a"), 0);
}

// After a restart the active claims count again (and ended ones do not).
TEST_F(FairShareTest, RecoveredClaimsCount) {
  AddWarm();
  AddWarm();
  AddWarm();
  for (const char* id : {"c1", "c2", "c3"}) {
    auto c = Claim(Req("a", id));
    ASSERT_TRUE(c->value.has_value() && c->value->ok()) << id;
  }
  ASSERT_TRUE(Release("a", "c2").ok());
  Start();
  EXPECT_EQ(Held("a"), 2);
  ClaimRequest r = Req("a", "c4");
  r.max_claims = 2;
  auto c4 = Claim(r);
  ASSERT_TRUE(c4->value.has_value());
  EXPECT_EQ(c4->value->status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace sbx::allocator

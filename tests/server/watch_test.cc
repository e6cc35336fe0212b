// End-to-end tests of the streaming RPCs, ClaimService.WatchClaims and
// AdminService.WatchPools, and of the revisions in ListClaims: a real gRPC server on
// 127.0.0.1:0 over a real Allocator (MemoryStore, RefillingReconciler with instant fake
// sandboxes), called through the generated C++ stubs.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sbx/v1/admin.grpc.pb.h"
#include "sbx/v1/claims.grpc.pb.h"
#include "src/allocator/allocator.h"
#include "src/common/clock.h"
#include "src/common/ids.h"
#include "src/server/server.h"
#include "src/store/memory_store.h"
#include "tests/allocator/fakes.h"

namespace sbx::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kAlice[] = "tok-alice";
constexpr char kBob[] = "tok-bob";
constexpr char kAdmin[] = "tok-root";

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token, int seconds = 20) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

std::string Describe(const grpc::Status& s) {
  return absl::StrCat("status ", static_cast<int>(s.error_code()), ": ", s.error_message());
}

// A server-streaming call and its context.
template <typename Event>
struct Stream {
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientReader<Event>> reader;

  // Reads `n` events (fails the test if the stream ends first).
  std::vector<Event> Read(size_t n) {
    std::vector<Event> out;
    Event e;
    while (out.size() < n && reader->Read(&e)) out.push_back(e);
    EXPECT_EQ(out.size(), n) << "the stream ended early";
    return out;
  }
  // Reads until an event satisfies `want` and returns it (skipping the others).
  template <typename Pred>
  Event ReadUntil(Pred want) {
    Event e;
    while (reader->Read(&e)) {
      if (want(e)) return e;
    }
    ADD_FAILURE() << "the stream ended before the event wanted";
    return Event();
  }
  // Reads until the stream ends; returns its status.
  grpc::Status Drain(std::vector<Event>* events = nullptr) {
    Event e;
    while (reader->Read(&e)) {
      if (events != nullptr) events->push_back(e);
    }
    return reader->Finish();
  }
};

class WatchServiceTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(); }

  void StartServer(size_t watch_queue = 10000) {
    char tmpl[] = "/tmp/sbx-watch-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    {
      std::ofstream out(dir_ + "/tokens");
      out << kAlice << " alice\n" << kBob << " bob\n" << kAdmin << " root admin\n";
    }
    allocator::AllocatorOptions ao;
    ao.watch_queue = watch_queue;
    auto a = allocator::Allocator::Create(ao, &store_, nullptr, &reconciler_, &Clock::Real(),
                                          &IdGenerator::Random());
    ASSERT_TRUE(a.ok()) << a.status();
    allocator_ = std::move(*a);
    reconciler_.Start(allocator_.get());
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.allocator = allocator_.get();
    options.auth.tokens_file = dir_ + "/tokens";
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    claims_ = v1::ClaimService::NewStub(channel_);
    admin_ = v1::AdminService::NewStub(channel_);
  }

  void TearDown() override {
    // Streams still open end when the grace period cancels them.
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(1));
    reconciler_.Stop();
    allocator_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  void MakePool(const std::string& pool, int min_warm, int max_warm) {
    v1::PutTemplateRequest treq;
    treq.mutable_template_()->set_name("py");
    treq.mutable_template_()->set_runtime("local");
    treq.mutable_template_()->mutable_local()->add_command("sleep");
    v1::PutTemplateResponse tresp;
    grpc::Status s = admin_->PutTemplate(Ctx(kAdmin).get(), treq, &tresp);
    ASSERT_TRUE(s.ok()) << Describe(s);
    v1::PutPoolRequest preq;
    v1::Pool* p = preq.mutable_pool();
    p->set_name(pool);
    p->set_template_("py");
    p->set_min_warm(min_warm);
    p->set_max_warm(max_warm);
    p->set_empty_pool_policy(v1::EMPTY_POOL_POLICY_WAIT);
    v1::PutPoolResponse presp;
    s = admin_->PutPool(Ctx(kAdmin).get(), preq, &presp);
    ASSERT_TRUE(s.ok()) << Describe(s);
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      auto st = allocator_->GetPoolStatus(pool);
      if (st.ok() && st->warm >= min_warm) return;
      absl::SleepFor(absl::Milliseconds(5));
    }
    FAIL() << "pool " << pool << " did not fill";
  }

  v1::Claim ClaimOne(const std::string& token, const std::string& id,
                     const std::string& pool = "py", const std::string& team = "") {
    v1::ClaimRequest req;
    req.set_claim_id(id);
    req.set_pool(pool);
    if (!team.empty()) (*req.mutable_labels())["team"] = team;
    v1::ClaimResponse resp;
    grpc::Status s = claims_->Claim(Ctx(token).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << Describe(s);
    return resp.claim();
  }
  void Release(const std::string& token, const std::string& id) {
    v1::ReleaseRequest req;
    req.set_claim_id(id);
    v1::ReleaseResponse resp;
    grpc::Status s = claims_->Release(Ctx(token).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << Describe(s);
  }

  Stream<v1::ClaimEvent> Watch(const std::string& token, const v1::WatchClaimsRequest& req) {
    Stream<v1::ClaimEvent> s;
    s.ctx = Ctx(token);
    s.reader = claims_->WatchClaims(s.ctx.get(), req);
    return s;
  }
  Stream<v1::ClaimEvent> WatchFrom(const std::string& token, int64_t start) {
    v1::WatchClaimsRequest req;
    req.set_start_revision(start);
    return Watch(token, req);
  }
  Stream<v1::PoolEvent> WatchPools(const std::string& token, const v1::WatchPoolsRequest& req) {
    Stream<v1::PoolEvent> s;
    s.ctx = Ctx(token);
    s.reader = admin_->WatchPools(s.ctx.get(), req);
    return s;
  }
  // The status of a stream that is expected to end at once.
  template <typename Event>
  static grpc::Status EndsWith(Stream<Event> s) {
    std::vector<Event> events;
    grpc::Status status = s.Drain(&events);
    EXPECT_TRUE(events.empty());
    return status;
  }

  std::string dir_;
  store::MemoryStore store_;
  allocator::testing::RefillingReconciler reconciler_{"sb-"};
  std::unique_ptr<allocator::Allocator> allocator_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ClaimService::Stub> claims_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
};

TEST_F(WatchServiceTest, ListThenWatchFromTheListsRevision) {
  MakePool("py", 4, 10);
  const v1::Claim c1 = ClaimOne(kAlice, "c1");
  const v1::Claim c2 = ClaimOne(kAlice, "c2");
  EXPECT_GT(c1.revision(), 0);
  EXPECT_GT(c2.revision(), c1.revision());

  v1::ListClaimsRequest list;
  v1::ListClaimsResponse listed;
  grpc::Status s = claims_->ListClaims(Ctx(kAlice).get(), list, &listed);
  ASSERT_TRUE(s.ok()) << Describe(s);
  ASSERT_EQ(listed.claims_size(), 2);
  EXPECT_EQ(listed.revision(), c2.revision());
  EXPECT_EQ(listed.claims(1).revision(), c2.revision());

  Stream<v1::ClaimEvent> w = WatchFrom(kAlice, listed.revision());
  ClaimOne(kAlice, "c3");
  Release(kAlice, "c1");
  std::vector<v1::ClaimEvent> got = w.Read(2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].type(), v1::WATCH_EVENT_TYPE_ADDED);
  EXPECT_EQ(got[0].claim().claim_id(), "c3");
  EXPECT_FALSE(got[0].initial());
  EXPECT_EQ(got[1].type(), v1::WATCH_EVENT_TYPE_MODIFIED);
  EXPECT_EQ(got[1].claim().claim_id(), "c1");
  EXPECT_EQ(got[1].claim().state(), v1::CLAIM_STATE_RELEASED);
  EXPECT_GT(got[0].revision(), listed.revision());
  EXPECT_GT(got[1].revision(), got[0].revision());
  EXPECT_EQ(got[1].claim().revision(), got[1].revision());

  // The client cancels: the stream ends CANCELLED and the server lets go of it.
  w.ctx->TryCancel();
  EXPECT_EQ(w.Drain().error_code(), grpc::StatusCode::CANCELLED);
  ClaimOne(kAlice, "c4");  // publishing goes on without the cancelled watch

  // Resuming from the last revision received continues without gaps or repeats.
  Stream<v1::ClaimEvent> resumed = WatchFrom(kAlice, got[1].revision());
  got = resumed.Read(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].claim().claim_id(), "c4");
  resumed.ctx->TryCancel();
  EXPECT_EQ(resumed.Drain().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(WatchServiceTest, EveryPageOfAListReportsTheFirstPagesRevision) {
  MakePool("py", 4, 10);
  for (int i = 0; i < 3; ++i) ClaimOne(kAlice, absl::StrCat("c", i));
  v1::ListClaimsRequest req;
  req.set_page_size(2);
  v1::ListClaimsResponse first;
  ASSERT_TRUE(claims_->ListClaims(Ctx(kAlice).get(), req, &first).ok());
  ASSERT_FALSE(first.next_page_token().empty());
  ClaimOne(kAlice, "c9");  // a change between the pages
  req.set_page_token(first.next_page_token());
  v1::ListClaimsResponse second;
  grpc::Status s = claims_->ListClaims(Ctx(kAlice).get(), req, &second);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(second.revision(), first.revision());
  EXPECT_EQ(second.claims_size(), 2);  // c2 and c9: pages are read live
  EXPECT_LT(first.revision(), static_cast<int64_t>(allocator_->revision()));
}

TEST_F(WatchServiceTest, InitialStateThenChanges) {
  MakePool("py", 4, 10);
  ClaimOne(kAlice, "b");
  ClaimOne(kAlice, "a");
  ClaimOne(kBob, "x");
  Stream<v1::ClaimEvent> w = WatchFrom(kAlice, 0);
  std::vector<v1::ClaimEvent> got = w.Read(2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].claim().claim_id(), "a");
  EXPECT_EQ(got[1].claim().claim_id(), "b");
  for (const auto& e : got) {
    EXPECT_TRUE(e.initial());
    EXPECT_EQ(e.type(), v1::WATCH_EVENT_TYPE_ADDED);
    EXPECT_EQ(e.revision(), static_cast<int64_t>(allocator_->revision()));
  }
  ClaimOne(kAlice, "c");
  got = w.Read(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].claim().claim_id(), "c");
  EXPECT_FALSE(got[0].initial());
  w.ctx->TryCancel();
  w.Drain();
}

TEST_F(WatchServiceTest, ATenantSeesOnlyItsOwnClaims) {
  MakePool("py", 4, 10);
  Stream<v1::ClaimEvent> bob = WatchFrom(kBob, 0);
  v1::WatchClaimsRequest of_alice;
  of_alice.mutable_filter()->set_owner("alice");
  Stream<v1::ClaimEvent> admin = Watch(kAdmin, of_alice);
  ClaimOne(kAlice, "secret");
  ClaimOne(kBob, "mine");
  std::vector<v1::ClaimEvent> got = bob.Read(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].claim().claim_id(), "mine");
  EXPECT_EQ(got[0].claim().owner(), "bob");
  got = admin.Read(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].claim().claim_id(), "secret");
  // Naming another owner without being an admin.
  grpc::Status s = EndsWith(Watch(kBob, of_alice));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("may not watch claims of owner \"alice\""));
  bob.ctx->TryCancel();
  bob.Drain();
  admin.ctx->TryCancel();
  admin.Drain();
}

TEST_F(WatchServiceTest, FiltersApplyToEvents) {
  MakePool("py", 4, 10);
  MakePool("other", 2, 10);
  v1::WatchClaimsRequest req;
  req.mutable_filter()->set_label_selector("team!=web");
  req.mutable_filter()->add_states(v1::CLAIM_STATE_ACTIVE);
  req.mutable_filter()->set_pool("py");
  Stream<v1::ClaimEvent> w = Watch(kAlice, req);
  ClaimOne(kAlice, "web", "py", "web");
  ClaimOne(kAlice, "elsewhere", "other", "rl");
  ClaimOne(kAlice, "rl", "py", "rl");
  Release(kAlice, "rl");  // RELEASED does not match the states
  ClaimOne(kAlice, "plain", "py");
  std::vector<v1::ClaimEvent> got = w.Read(2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].claim().claim_id(), "rl");
  EXPECT_EQ(got[1].claim().claim_id(), "plain");
  w.ctx->TryCancel();
  w.Drain();
}

TEST_F(WatchServiceTest, BadRequestsEndTheStream) {
  MakePool("py", 1, 10);
  ClaimOne(kAlice, "c1");
  const int64_t now = static_cast<int64_t>(allocator_->revision());
  grpc::Status s = EndsWith(WatchFrom(kAlice, now + 5));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << Describe(s);
  s = EndsWith(WatchFrom(kAlice, -1));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  s = EndsWith(WatchFrom("", 0));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << Describe(s);
  v1::WatchClaimsRequest bad;
  bad.mutable_filter()->set_label_selector("a=b=c");
  s = EndsWith(Watch(kAlice, bad));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("\"a=b=c\""));
  bad = v1::WatchClaimsRequest();
  bad.mutable_filter()->add_states(static_cast<v1::ClaimState>(42));
  s = EndsWith(Watch(kAlice, bad));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
}

TEST_F(WatchServiceTest, ClosingWatchesEndsStreamsWithUnavailable) {
  MakePool("py", 1, 10);
  Stream<v1::ClaimEvent> w = WatchFrom(kAlice, 0);
  ClaimOne(kAlice, "c1");
  ASSERT_EQ(w.Read(1).size(), 1u);
  allocator_->CloseWatches(absl::UnavailableError("the server is shutting down"));
  grpc::Status s = w.Drain();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("shutting down"));
}

TEST_F(WatchServiceTest, ServerShutdownEndsOpenStreams) {
  MakePool("py", 1, 10);
  Stream<v1::ClaimEvent> w = WatchFrom(kAlice, 0);
  v1::WatchPoolsRequest preq;
  Stream<v1::PoolEvent> pools = WatchPools(kAdmin, preq);
  ASSERT_EQ(pools.Read(1).size(), 1u);
  ClaimOne(kAlice, "c1");
  ASSERT_EQ(w.Read(1).size(), 1u);
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Milliseconds(200));
  EXPECT_FALSE(w.Drain().ok());
  EXPECT_FALSE(pools.Drain().ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(WatchServiceTest, ASlowClientIsAborted) {
  TearDown();
  StartServer(/*watch_queue=*/4);
  MakePool("py", 0, 0);
  v1::WatchClaimsRequest req;
  req.set_start_revision(static_cast<int64_t>(allocator_->revision()));
  Stream<v1::ClaimEvent> w = Watch(kAlice, req);
  // Wait until the server has the watch (an event then arrives).
  ASSERT_TRUE(allocator_->AddSandbox({"first", "py", "unix:/x", ""}).ok());
  allocator::ClaimRequest one;
  one.owner = "alice";
  one.claim_id = "first";
  one.pool = "py";
  absl::Notification claimed;
  allocator_->Claim(one, [&](absl::StatusOr<allocator::ClaimResult>) { claimed.Notify(); });
  claimed.WaitForNotification();
  ASSERT_EQ(w.Read(1).size(), 1u);
  // Then, without reading: thousands of events, far more than the queue and the
  // connection's flow-control window hold.
  for (int round = 0; round < 30; ++round) {
    for (int i = 0; i < 100; ++i) {
      ASSERT_TRUE(
          allocator_->AddSandbox({absl::StrCat("s", round, "-", i), "py", "unix:/x", ""}).ok());
    }
    allocator::BatchRequest b;
    b.owner = "alice";
    b.batch_id = absl::StrCat("b", round);
    b.pool = "py";
    b.count = 100;
    absl::Notification done;
    allocator_->ClaimBatch(b, [&](absl::StatusOr<std::vector<allocator::ClaimResult>> r) {
      EXPECT_TRUE(r.ok()) << r.status();
      done.Notify();
    });
    done.WaitForNotification();
  }
  std::vector<v1::ClaimEvent> events;
  grpc::Status s = w.Drain(&events);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("read too slowly"));
  EXPECT_LT(events.size(), 3000u);
  // What did arrive is in order, so the client can resume from its last revision.
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_GT(events[i].revision(), events[i - 1].revision());
  }
  if (!events.empty()) {
    Stream<v1::ClaimEvent> resumed = WatchFrom(kAlice, events.back().revision());
    ASSERT_EQ(resumed.Read(1).size(), 1u);
    resumed.ctx->TryCancel();
    resumed.Drain();
  }
}

TEST_F(WatchServiceTest, WatchPoolsSendsAddedModifiedAndDeleted) {
  MakePool("py", 1, 10);
  v1::WatchPoolsRequest req;
  req.mutable_min_interval()->set_nanos(100'000'000);  // 100 ms, the minimum
  Stream<v1::PoolEvent> w = WatchPools(kAdmin, req);
  std::vector<v1::PoolEvent> got = w.Read(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].type(), v1::WATCH_EVENT_TYPE_ADDED);
  EXPECT_EQ(got[0].pool().name(), "py");
  EXPECT_EQ(got[0].pool().status().warm(), 1);

  // A new pool: ADDED (once its sandboxes are there, its status settles).
  MakePool("new", 0, 5);
  got = w.Read(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].type(), v1::WATCH_EVENT_TYPE_ADDED);
  EXPECT_EQ(got[0].pool().name(), "new");
  // A status change (a claim) and a spec change (scale): MODIFIED. Status changes of "py"
  // (its refill) may come in between.
  ClaimOne(kAlice, "c1");
  v1::PoolEvent e = w.ReadUntil([](const v1::PoolEvent& e) {
    EXPECT_EQ(e.type(), v1::WATCH_EVENT_TYPE_MODIFIED);
    return e.pool().name() == "py" && e.pool().status().claimed() == 1;
  });
  v1::ScalePoolRequest scale;
  scale.set_name("new");
  scale.mutable_max_warm()->set_value(7);
  v1::ScalePoolResponse scaled;
  ASSERT_TRUE(admin_->ScalePool(Ctx(kAdmin).get(), scale, &scaled).ok());
  e = w.ReadUntil([](const v1::PoolEvent& e) { return e.pool().name() == "new"; });
  EXPECT_EQ(e.type(), v1::WATCH_EVENT_TYPE_MODIFIED);
  EXPECT_EQ(e.pool().max_warm(), 7);
  v1::DeletePoolRequest del;
  del.set_name("new");
  v1::DeletePoolResponse deleted;
  ASSERT_TRUE(admin_->DeletePool(Ctx(kAdmin).get(), del, &deleted).ok());
  e = w.ReadUntil([](const v1::PoolEvent& e) { return e.pool().name() == "new"; });
  EXPECT_EQ(e.type(), v1::WATCH_EVENT_TYPE_DELETED);
  EXPECT_EQ(e.pool().max_warm(), 7);  // its last value
  w.ctx->TryCancel();
  EXPECT_EQ(w.Drain().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(WatchServiceTest, WatchPoolsByNameAtMostOncePerInterval) {
  MakePool("py", 1, 10);
  MakePool("other", 1, 10);
  v1::WatchPoolsRequest req;
  req.add_names("py");
  req.mutable_min_interval()->set_nanos(500'000'000);
  Stream<v1::PoolEvent> w = WatchPools(kAdmin, req);
  std::vector<v1::PoolEvent> got = w.Read(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].pool().name(), "py");
  // Status changes every few milliseconds; events still come at most every 500 ms.
  std::thread churn([&] {
    for (int i = 0; i < 20; ++i) {
      ClaimOne(kAlice, absl::StrCat("c", i));
      absl::SleepFor(absl::Milliseconds(40));
    }
  });
  absl::Time last = absl::Now();
  for (int i = 0; i < 2; ++i) {
    got = w.Read(1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].pool().name(), "py");
    const absl::Time now = absl::Now();
    if (i > 0) EXPECT_GE(now - last, absl::Milliseconds(400));
    last = now;
  }
  churn.join();
  w.ctx->TryCancel();
  w.Drain();
}

TEST_F(WatchServiceTest, WatchPoolsValidatesItsRequest) {
  v1::WatchPoolsRequest req;
  req.mutable_min_interval()->set_nanos(50'000'000);
  grpc::Status s = EndsWith(WatchPools(kAdmin, req));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("min_interval 50ms"));
  req.mutable_min_interval()->set_nanos(0);
  req.mutable_min_interval()->set_seconds(61);
  s = EndsWith(WatchPools(kAdmin, req));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  req.mutable_min_interval()->set_seconds(-1);
  s = EndsWith(WatchPools(kAdmin, req));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  req.clear_min_interval();
  req.add_names("Not A Name");
  s = EndsWith(WatchPools(kAdmin, req));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  req.clear_names();
  s = EndsWith(WatchPools(kAlice, req));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << Describe(s);
}

}  // namespace
}  // namespace sbx::server

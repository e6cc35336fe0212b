// End-to-end tests of the sbx.v1 ClaimService and AdminService: a real gRPC server on
// 127.0.0.1:0 over a real Allocator (MemoryStore, RefillingReconciler with instant fake
// sandboxes), called through the generated C++ stubs.

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sbx/v1/admin.grpc.pb.h"
#include "sbx/v1/claims.grpc.pb.h"
#include "sbx/v1/diagnostics.grpc.pb.h"
#include "sbx/v1/sandboxes.grpc.pb.h"
#include "src/allocator/allocator.h"
#include "src/common/clock.h"
#include "src/common/ids.h"
#include "src/server/server.h"
#include "src/store/memory_store.h"
#include "tests/allocator/fakes.h"

namespace sbx::server {
namespace {

using ::testing::HasSubstr;

constexpr char kAlice[] = "tok-alice";
constexpr char kBob[] = "tok-bob";
constexpr char kAdmin[] = "tok-root";

std::string TempDir() {
  char tmpl[] = "/tmp/sbx-server-test-XXXXXX";
  char* dir = mkdtemp(tmpl);
  return dir == nullptr ? std::string("/tmp") : std::string(dir);
}

// A client context with a deadline and, unless `token` is empty, a bearer token.
std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token, int seconds = 10) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

std::string Describe(const grpc::Status& s) {
  return absl::StrCat("status ", static_cast<int>(s.error_code()), ": ", s.error_message());
}

// The call's retry hint (trailer sbx-retry-after-ms), nullopt when there is none.
std::optional<std::string> RetryAfterMs(const grpc::ClientContext& ctx) {
  const auto& trailers = ctx.GetServerTrailingMetadata();
  auto it = trailers.find("sbx-retry-after-ms");
  if (it == trailers.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

// Calls `method` with `bytes` as its one request message, as a client that does not
// use the generated stubs would (no checks of the bytes), and returns the call's status.
// Works for unary and server-streaming methods: responses are read and dropped.
grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& bytes, const std::string& token) {
  grpc::GenericStub stub(channel);
  std::unique_ptr<grpc::ClientContext> ctx = Ctx(token);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(ctx.get(), method, &cq);
  if (call == nullptr) return grpc::Status(grpc::StatusCode::INTERNAL, "PrepareCall failed");
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](int want) { return cq.Next(&tag, &ok) && tag == reinterpret_cast<void*>(want); };
  call->StartCall(reinterpret_cast<void*>(1));
  if (!step(1)) return grpc::Status(grpc::StatusCode::INTERNAL, "StartCall did not complete");
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  call->WriteLast(request, grpc::WriteOptions(), reinterpret_cast<void*>(2));
  step(2);  // not ok when the server has already finished the call
  grpc::ByteBuffer response;
  do {
    call->Read(&response, reinterpret_cast<void*>(3));
  } while (step(3) && ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  if (!step(4)) return grpc::Status(grpc::StatusCode::INTERNAL, "Finish did not complete");
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(/*insecure=*/false); }

  void StartServer(bool insecure) {
    dir_ = TempDir();
    tokens_file_ = dir_ + "/tokens";
    WriteTokens(absl::StrCat("# tenants of the test\n", kAlice, " alice\n", kBob, " bob\n\n",
                             kAdmin, " root admin\n"));
    allocator::AllocatorOptions ao;
    auto a = allocator::Allocator::Create(ao, &store_, nullptr, &reconciler_, &Clock::Real(),
                                          &IdGenerator::Random());
    ASSERT_TRUE(a.ok()) << a.status();
    allocator_ = std::move(*a);
    reconciler_.Start(allocator_.get());

    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.allocator = allocator_.get();
    if (insecure) {
      options.auth.insecure_no_auth = true;
    } else {
      options.auth.tokens_file = tokens_file_;
    }
    auto server = Server::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    claims_ = v1::ClaimService::NewStub(channel_);
    admin_ = v1::AdminService::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(5));
    reconciler_.Stop();
    allocator_.reset();
    std::error_code ec;
    if (dir_ != "/tmp") std::filesystem::remove_all(dir_, ec);
  }

  void WriteTokens(const std::string& text) {
    std::ofstream out(tokens_file_, std::ios::trunc);
    out << text;
  }
  // Tokens of alice (with `alice_limits`, e.g. "max_claims=2"), bob and an admin, loaded.
  void LimitAlice(const std::string& alice_limits) {
    WriteTokens(absl::StrCat(kAlice, " alice ", alice_limits, "\n", kBob, " bob\n", kAdmin,
                             " root admin\n"));
    ASSERT_TRUE(server_->ReloadAuth().ok());
  }

  std::string Token(const std::string& t) const { return insecure_ ? std::string() : t; }

  // Template "py" and pool `pool` of it (min_warm warm sandboxes, policy FAIL unless
  // given), through the admin API; waits until the pool is filled.
  void MakePool(const std::string& pool, int min_warm, int max_warm,
                v1::EmptyPoolPolicy policy = v1::EMPTY_POOL_POLICY_FAIL,
                absl::Duration max_ttl = absl::ZeroDuration(),
                const std::string& selection_policy = "") {
    v1::PutTemplateRequest treq;
    treq.mutable_template_()->set_name("py");
    treq.mutable_template_()->set_runtime("local");
    treq.mutable_template_()->mutable_local()->add_command("sleep");
    treq.mutable_template_()->mutable_local()->add_command("infinity");
    v1::PutTemplateResponse tresp;
    grpc::Status s = admin_->PutTemplate(Ctx(Token(kAdmin)).get(), treq, &tresp);
    ASSERT_TRUE(s.ok()) << Describe(s);
    v1::PutPoolRequest preq;
    v1::Pool* p = preq.mutable_pool();
    p->set_name(pool);
    p->set_template_("py");
    p->set_min_warm(min_warm);
    p->set_max_warm(max_warm);
    p->set_empty_pool_policy(policy);
    if (max_ttl > absl::ZeroDuration())
      p->mutable_max_ttl()->set_seconds(absl::ToInt64Seconds(max_ttl));
    p->set_selection_policy(selection_policy);
    v1::PutPoolResponse presp;
    s = admin_->PutPool(Ctx(Token(kAdmin)).get(), preq, &presp);
    ASSERT_TRUE(s.ok()) << Describe(s);
    WaitWarm(pool, min_warm);
  }

  void WaitWarm(const std::string& pool, int64_t want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      auto st = allocator_->GetPoolStatus(pool);
      if (st.ok() && st->warm >= want) return;
      absl::SleepFor(absl::Milliseconds(5));
    }
    FAIL() << "pool " << pool << " did not reach " << want << " warm sandboxes";
  }

  grpc::Status Claim(const std::string& token, const v1::ClaimRequest& req,
                     v1::ClaimResponse* resp) {
    return claims_->Claim(Ctx(token).get(), req, resp);
  }
  v1::ClaimRequest ClaimReq(const std::string& id, const std::string& pool = "py") {
    v1::ClaimRequest r;
    r.set_claim_id(id);
    r.set_pool(pool);
    return r;
  }

  std::string dir_;
  std::string tokens_file_;
  bool insecure_ = false;
  store::MemoryStore store_;
  allocator::testing::RefillingReconciler reconciler_{"sb-"};
  std::unique_ptr<allocator::Allocator> allocator_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ClaimService::Stub> claims_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
};

TEST_F(ServerTest, ClaimReturnsARunningSandboxAndIsDurable) {
  MakePool("py", 2, 10);
  v1::ClaimRequest req = ClaimReq("job-1");
  req.mutable_ttl()->set_seconds(600);
  (*req.mutable_labels())["team"] = "rl";
  v1::ClaimResponse resp;
  const absl::Time before = absl::Now();
  grpc::Status s = Claim(kAlice, req, &resp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  const v1::Claim& c = resp.claim();
  EXPECT_FALSE(resp.replayed());
  EXPECT_EQ(c.claim_id(), "job-1");
  EXPECT_EQ(c.pool(), "py");
  EXPECT_EQ(c.owner(), "alice");
  EXPECT_THAT(c.sandbox().id(), ::testing::StartsWith("sb-"));
  EXPECT_EQ(c.sandbox().endpoint(), absl::StrCat("unix:/tmp/", c.sandbox().id()));
  EXPECT_EQ(c.state(), v1::CLAIM_STATE_ACTIVE);
  EXPECT_EQ(c.launch_type(), v1::LAUNCH_TYPE_WARM);
  EXPECT_EQ(c.labels().at("team"), "rl");
  EXPECT_TRUE(c.batch_id().empty());
  EXPECT_FALSE(c.has_ended_at());
  const int64_t created = c.created_at().seconds();
  EXPECT_GE(created, absl::ToUnixSeconds(before) - 1);
  EXPECT_EQ(c.expires_at().seconds() - created, 600) << c.DebugString();

  // Durable: the record is in the store when the RPC has returned.
  auto contents = store_.LoadAll();
  ASSERT_TRUE(contents.ok());
  bool found = false;
  for (const auto& r : contents->claims) {
    if (r.owner == "alice" && r.id == "job-1") {
      found = true;
      EXPECT_EQ(r.sandbox_id, c.sandbox().id());
      EXPECT_EQ(r.state, store::ClaimState::kActive);
    }
  }
  EXPECT_TRUE(found) << "claim alice/job-1 not in the store";

  // No ttl: the claim does not expire (expires_at unset).
  v1::ClaimResponse forever;
  s = Claim(kAlice, ClaimReq("job-2"), &forever);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_FALSE(forever.claim().has_expires_at());
  EXPECT_NE(forever.claim().sandbox().id(), c.sandbox().id());
}

TEST_F(ServerTest, RetryWithTheSameClaimIdIsReplayed) {
  MakePool("py", 2, 10);
  MakePool("other", 1, 10);
  v1::ClaimResponse first, second;
  grpc::Status s = Claim(kAlice, ClaimReq("retry-me"), &first);
  ASSERT_TRUE(s.ok()) << Describe(s);
  s = Claim(kAlice, ClaimReq("retry-me"), &second);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_FALSE(first.replayed());
  EXPECT_TRUE(second.replayed());
  EXPECT_EQ(second.claim().sandbox().id(), first.claim().sandbox().id());
  EXPECT_EQ(allocator_->GetPoolStatus("py")->claimed, 1);

  v1::ClaimResponse elsewhere;
  s = Claim(kAlice, ClaimReq("retry-me", "other"), &elsewhere);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << Describe(s);
}

TEST_F(ServerTest, FailPolicyOnEmptyPoolIsResourceExhaustedWithRetryHint) {
  MakePool("empty", 0, 0, v1::EMPTY_POOL_POLICY_WAIT);
  v1::ClaimRequest req = ClaimReq("c1", "empty");
  req.set_empty_pool_policy(v1::EMPTY_POOL_POLICY_FAIL);
  v1::ClaimResponse resp;
  auto ctx = Ctx(kAlice);
  grpc::Status s = claims_->Claim(ctx.get(), req, &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("empty"));
  EXPECT_EQ(RetryAfterMs(*ctx), "1000");
}

// Issue 22: a tenant's claim rate from the tokens file (a reload gives it). Beyond its
// burst, Claim is RESOURCE_EXHAUSTED naming the tenant with the real wait as the retry
// hint; a retry of a granted claim is answered; a batch above the burst can never be
// granted; another tenant is untouched. (Rate 1 per 100 s: no claim comes back while the
// test runs, however slow the machine.)
TEST_F(ServerTest, ATenantAboveItsClaimRateIsRefusedAndOthersAreNot) {
  MakePool("py", 8, 8);
  ASSERT_NO_FATAL_FAILURE(LimitAlice("claim_rate=0.01 claim_burst=2"));
  v1::ClaimResponse resp;
  ASSERT_TRUE(Claim(kAlice, ClaimReq("a1"), &resp).ok());
  ASSERT_TRUE(Claim(kAlice, ClaimReq("a2"), &resp).ok());
  auto ctx = Ctx(kAlice);
  grpc::Status s = claims_->Claim(ctx.get(), ClaimReq("a3"), &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("tenant \"alice\" is above its claim rate"));
  const std::optional<std::string> hint = RetryAfterMs(*ctx);
  ASSERT_TRUE(hint.has_value()) << "no sbx-retry-after-ms trailer";
  int64_t wait_ms = 0;
  ASSERT_TRUE(absl::SimpleAtoi(*hint, &wait_ms)) << *hint;
  EXPECT_GT(wait_ms, 1000) << "the hint is the bucket's wait, not the allocator's 1 s";
  EXPECT_LE(wait_ms, 100000);
  EXPECT_EQ(allocator_->GetClaim("alice", "a3").status().code(), absl::StatusCode::kNotFound)
      << "a refused claim was made";
  // A retry of a granted claim is answered from it.
  v1::ClaimResponse again;
  ASSERT_TRUE(Claim(kAlice, ClaimReq("a1"), &again).ok());
  EXPECT_TRUE(again.replayed());
  // A batch larger than the burst never fits.
  v1::ClaimBatchRequest breq;
  breq.set_pool("py");
  breq.set_count(3);
  v1::ClaimBatchResponse bresp;
  s = claims_->ClaimBatch(Ctx(kAlice).get(), breq, &bresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("at most 2 at once"));
  // Bob has no limit and alice's refusals cost him nothing.
  for (const char* id : {"b1", "b2", "b3"}) {
    grpc::Status b = Claim(kBob, ClaimReq(id), &resp);
    EXPECT_TRUE(b.ok()) << id << ": " << Describe(b);
  }
}

// Issue 22: a tenant's max_claims from the tokens file. Its claims count until released;
// beyond the maximum Claim and ClaimBatch are RESOURCE_EXHAUSTED naming the tenant and the
// limit, with the retry hint, and nothing is held; a retry of a granted claim is answered;
// a release frees a slot; another tenant is untouched.
TEST_F(ServerTest, ATenantAtItsMaxClaimsIsRefusedUntilItReleasesOne) {
  MakePool("py", 8, 8);  // every claim below finds a warm sandbox without the refill
  ASSERT_NO_FATAL_FAILURE(LimitAlice("max_claims=2 weight=3"));
  v1::ClaimResponse resp;
  ASSERT_TRUE(Claim(kAlice, ClaimReq("a1"), &resp).ok());
  ASSERT_TRUE(Claim(kAlice, ClaimReq("a2"), &resp).ok());
  auto ctx = Ctx(kAlice);
  grpc::Status s = claims_->Claim(ctx.get(), ClaimReq("a3"), &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("tenant \"alice\" holds 2 claims"));
  EXPECT_THAT(s.error_message(), HasSubstr("max_claims"));
  EXPECT_EQ(RetryAfterMs(*ctx), "1000");
  EXPECT_EQ(allocator_->GetClaim("alice", "a3").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(allocator_->GetPoolStatus("py")->claimed, 2) << "a refused claim holds a sandbox";
  // A retry of a granted claim is answered.
  v1::ClaimResponse again;
  grpc::Status retry = Claim(kAlice, ClaimReq("a1"), &again);
  ASSERT_TRUE(retry.ok()) << Describe(retry);
  EXPECT_TRUE(again.replayed());
  // A batch counts each of its claims.
  v1::ClaimBatchRequest breq;
  breq.set_pool("py");
  breq.set_count(1);
  v1::ClaimBatchResponse bresp;
  s = claims_->ClaimBatch(Ctx(kAlice).get(), breq, &bresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(s);
  // Bob is not limited by alice's claims.
  for (const char* id : {"b1", "b2", "b3"}) {
    grpc::Status b = Claim(kBob, ClaimReq(id), &resp);
    EXPECT_TRUE(b.ok()) << id << ": " << Describe(b);
  }
  // A release frees a slot.
  v1::ReleaseRequest rel;
  rel.set_claim_id("a1");
  v1::ReleaseResponse relresp;
  ASSERT_TRUE(claims_->Release(Ctx(kAlice).get(), rel, &relresp).ok());
  s = Claim(kAlice, ClaimReq("a3"), &resp);
  EXPECT_TRUE(s.ok()) << Describe(s);
  // A bad value in the tokens file is named and the old table stays.
  WriteTokens(absl::StrCat(kAlice, " alice max_claims=0\n"));
  absl::Status bad = server_->ReloadAuth();
  EXPECT_THAT(std::string(bad.message()), HasSubstr("max_claims \"0\""));
}

// Issue 22: the tokens file's weight and the request's priority reach the pool's queue.
// The pool never refills (max_warm 0): the test adds each sandbox. Alice (weight 3) queues
// five NORMAL claims and then one INTERACTIVE, bob (weight 1) two; the first four sandboxes
// go to alice's interactive claim and her two oldest, then to bob's oldest.
TEST_F(ServerTest, WaitingClaimsAreServedByTenantWeightAndPriority) {
  MakePool("scarce", 0, 0, v1::EMPTY_POOL_POLICY_WAIT);
  ASSERT_NO_FATAL_FAILURE(LimitAlice("weight=3"));
  std::vector<std::thread> callers;
  std::vector<grpc::Status> results(8);
  auto claim_in_background = [&](int i, const std::string& token, const std::string& id,
                                 v1::ClaimPriority priority) {
    callers.emplace_back([&, i, token, id, priority] {
      v1::ClaimRequest req = ClaimReq(id, "scarce");
      req.set_priority(priority);
      v1::ClaimResponse resp;
      results[i] = claims_->Claim(Ctx(token, 30).get(), req, &resp);
    });
  };
  auto wait_for_waiting = [&](int64_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (allocator_->GetPoolStatus("scarce")->waiting < n && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    ASSERT_EQ(allocator_->GetPoolStatus("scarce")->waiting, n);
  };
  // Queued one at a time, so that the order within a tenant is known.
  for (int i = 0; i < 5; ++i) {
    claim_in_background(i, kAlice, absl::StrCat("a", i), v1::CLAIM_PRIORITY_NORMAL);
    wait_for_waiting(i + 1);
  }
  claim_in_background(5, kAlice, "a-now", v1::CLAIM_PRIORITY_INTERACTIVE);
  wait_for_waiting(6);
  claim_in_background(6, kBob, "b0", v1::CLAIM_PRIORITY_UNSPECIFIED);
  wait_for_waiting(7);
  claim_in_background(7, kBob, "b1", v1::CLAIM_PRIORITY_UNSPECIFIED);
  wait_for_waiting(8);
  auto granted = [&](const std::string& owner) {
    allocator::ClaimFilter f;
    f.owner = owner;
    f.pool = "scarce";
    f.limit = 0;
    std::set<std::string> ids;
    for (const store::ClaimRecord& c : allocator_->ListClaims(f)) ids.insert(c.id);
    return ids;
  };
  for (int i = 0; i < 4; ++i) {
    runtime::SandboxInfo info;
    info.id = absl::StrCat("scarce-", i);
    info.pool = "scarce";
    info.endpoint = "unix:/tmp/" + info.id;
    ASSERT_TRUE(allocator_->AddSandbox(info).ok());
  }
  // Deliveries are synchronous; the claims' commits are not: wait for the four to be active.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (granted("alice").size() + granted("bob").size() < 4 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(granted("alice"), (std::set<std::string>{"a-now", "a0", "a1"}));
  EXPECT_EQ(granted("bob"), (std::set<std::string>{"b0"}));
  EXPECT_EQ(allocator_->GetPoolStatus("scarce")->waiting, 4);
  for (int i = 4; i < 8; ++i) {
    runtime::SandboxInfo info;
    info.id = absl::StrCat("scarce-", i);
    info.pool = "scarce";
    info.endpoint = "unix:/tmp/" + info.id;
    ASSERT_TRUE(allocator_->AddSandbox(info).ok());
  }
  for (std::thread& t : callers) t.join();
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(results[i].ok()) << i << ": " << Describe(results[i]);
}

// Issue 22: `sbx claim default --count 3` on the embedded defaults (scripts/
// example-config.yaml: 2 warm, max_warm 16, policy WAIT), as the CLI sends it (no policy:
// the pool's). The batch waits for the refill and gets 3 claims; nothing is left waiting.
TEST_F(ServerTest, ABatchLargerThanTheWarmSandboxesWaitsForTheRefill) {
  MakePool("default", 2, 16, v1::EMPTY_POOL_POLICY_WAIT);
  v1::ClaimBatchRequest breq;
  breq.set_pool("default");
  breq.set_count(3);
  v1::ClaimBatchResponse bresp;
  grpc::Status s = claims_->ClaimBatch(Ctx(kAlice).get(), breq, &bresp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(bresp.claims_size(), 3);
  EXPECT_EQ(allocator_->GetPoolStatus("default")->waiting, 0);
  EXPECT_EQ(allocator_->GetPoolStatus("default")->claimed, 3);
}

// Issue 20: pools live in namespaces ("<namespace>/<pool>", a bare name in the default
// one), and the tokens file confines a tenant to some: beyond them Claim and ClaimBatch
// are PERMISSION_DENIED naming the namespace, and nothing is claimed. Another tenant and
// the admin are not confined.
TEST_F(ServerTest, ATenantConfinedToNamespacesClaimsOnlyFromTheirPools) {
  MakePool("py", 2, 2);
  MakePool("team-a/py", 2, 2);
  MakePool("team-b/py", 1, 1);
  WriteTokens(
      absl::StrCat(kAlice, " alice namespaces=team-a\n", kBob, " bob\n", kAdmin, " root admin\n"));
  ASSERT_TRUE(server_->ReloadAuth().ok());
  v1::ClaimResponse resp;
  grpc::Status ok = Claim(kAlice, ClaimReq("a1", "team-a/py"), &resp);
  ASSERT_TRUE(ok.ok()) << Describe(ok);
  EXPECT_EQ(resp.claim().pool(), "team-a/py");
  for (const char* other : {"team-b/py", "py", "default/py"}) {
    grpc::Status s = Claim(kAlice, ClaimReq("a-x", other), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << other << ": " << Describe(s);
    EXPECT_THAT(s.error_message(), HasSubstr("may not claim from namespace")) << other;
  }
  EXPECT_EQ(allocator_->GetClaim("alice", "a-x").status().code(), absl::StatusCode::kNotFound);
  v1::ClaimBatchRequest breq;
  breq.set_pool("team-b/py");
  breq.set_count(1);
  v1::ClaimBatchResponse bresp;
  grpc::Status batch = claims_->ClaimBatch(Ctx(kAlice).get(), breq, &bresp);
  EXPECT_EQ(batch.error_code(), grpc::StatusCode::PERMISSION_DENIED) << Describe(batch);
  // Bob is not confined; "default/py" is the pool "py".
  grpc::Status b = Claim(kBob, ClaimReq("b1", "default/py"), &resp);
  ASSERT_TRUE(b.ok()) << Describe(b);
  EXPECT_EQ(resp.claim().pool(), "py");
  b = Claim(kBob, ClaimReq("b2", "team-b/py"), &resp);
  EXPECT_TRUE(b.ok()) << Describe(b);
  // A malformed namespace is named.
  grpc::Status bad = Claim(kBob, ClaimReq("b3", "Team/py"), &resp);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(bad);
  EXPECT_THAT(bad.error_message(), HasSubstr("namespace \"Team\""));
}

TEST_F(ServerTest, WaitPolicyGetsTheSandboxThatIsAdded) {
  // max_warm 0: the reconciler adds nothing; the test adds the sandbox itself.
  MakePool("empty", 0, 0, v1::EMPTY_POOL_POLICY_WAIT);
  v1::ClaimRequest req = ClaimReq("waiter", "empty");
  req.mutable_wait_timeout()->set_seconds(20);
  v1::ClaimResponse resp;
  auto ctx = Ctx(kAlice, 30);
  absl::Notification done;
  grpc::Status status;
  claims_->async()->Claim(ctx.get(), &req, &resp, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (allocator_->GetPoolStatus("empty")->waiting < 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_EQ(allocator_->GetPoolStatus("empty")->waiting, 1);
  EXPECT_FALSE(done.HasBeenNotified());
  runtime::SandboxInfo info;
  info.id = "late-1";
  info.pool = "empty";
  info.endpoint = "unix:/tmp/late-1";
  ASSERT_TRUE(allocator_->AddSandbox(info).ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(resp.claim().sandbox().id(), "late-1");

  // And a wait that nothing satisfies ends DEADLINE_EXCEEDED.
  v1::ClaimRequest quick = ClaimReq("too-late", "empty");
  quick.mutable_wait_timeout()->set_nanos(100'000'000);
  v1::ClaimResponse none;
  grpc::Status s = Claim(kAlice, quick, &none);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << Describe(s);
}

// A claim's node_preference reaches the pool's spread policy: a sandbox on a node with the
// labels when one is warm, any other one when none is.
TEST_F(ServerTest, NodePreferenceSteersClaimsOfASpreadPool) {
  MakePool("placed", 0, 10, v1::EMPTY_POOL_POLICY_FAIL, absl::ZeroDuration(), "spread");
  for (const auto& [node, zone] : {std::pair<std::string, std::string>{"n1", "zone-a"},
                                   std::pair<std::string, std::string>{"n2", "zone-b"}}) {
    for (int i = 0; i < 2; ++i) {
      runtime::SandboxInfo info;
      info.id = absl::StrCat(node, "-", i);
      info.pool = "placed";
      info.endpoint = absl::StrCat("unix:/tmp/", info.id);
      info.node = node;
      info.node_labels = {{"kubernetes.io/hostname", node}, {"topology.kubernetes.io/zone", zone}};
      ASSERT_TRUE(allocator_->AddSandbox(info).ok());
    }
  }
  auto claim_in = [&](const std::string& id, const std::string& zone) {
    v1::ClaimRequest req = ClaimReq(id, "placed");
    (*req.mutable_node_preference())["topology.kubernetes.io/zone"] = zone;
    v1::ClaimResponse resp;
    grpc::Status s = Claim(kAlice, req, &resp);
    EXPECT_TRUE(s.ok()) << Describe(s);
    return resp.claim().sandbox().id();
  };
  EXPECT_EQ(claim_in("b1", "zone-b").substr(0, 3), "n2-");
  // spread alone would now pick n1 (no claim there); the preference keeps it on n2.
  EXPECT_EQ(claim_in("b2", "zone-b").substr(0, 3), "n2-");
  // zone-b has no warm sandbox left: any other one.
  EXPECT_EQ(claim_in("b3", "zone-b").substr(0, 3), "n1-");
  v1::ClaimBatchRequest batch;
  batch.set_batch_id("in-a");
  batch.set_pool("placed");
  batch.set_count(1);
  (*batch.mutable_node_preference())["topology.kubernetes.io/zone"] = "zone-a";
  v1::ClaimBatchResponse bresp;
  grpc::Status s = claims_->ClaimBatch(Ctx(kAlice).get(), batch, &bresp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  ASSERT_EQ(bresp.claims_size(), 1);
  EXPECT_EQ(bresp.claims(0).sandbox().id().substr(0, 3), "n1-");
  // A preference is checked like labels.
  v1::ClaimRequest bad = ClaimReq("bad", "placed");
  (*bad.mutable_node_preference())["-zone"] = "x";
  v1::ClaimResponse none;
  s = Claim(kAlice, bad, &none);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("node_preference"));
}

// A client that gives up a waiting claim (its deadline passed, or it cancelled) takes
// the wait with it: the sandbox that comes afterwards stays warm. Before, the claim kept
// waiting and was granted to nobody, holding the sandbox until its TTL (found by the
// TypeScript SDK's tests).
TEST_F(ServerTest, AWaitWhoseClientGaveUpGrantsNothing) {
  MakePool("empty", 0, 0, v1::EMPTY_POOL_POLICY_WAIT);
  v1::ClaimRequest req = ClaimReq("impatient", "empty");
  req.mutable_wait_timeout()->set_seconds(30);
  v1::ClaimResponse resp;
  auto ctx = Ctx(kAlice);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  grpc::Status s = claims_->Claim(ctx.get(), req, &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << Describe(s);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (allocator_->GetPoolStatus("empty")->waiting > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(allocator_->GetPoolStatus("empty")->waiting, 0) << "the wait outlived its call";
  runtime::SandboxInfo info;
  info.id = "late-2";
  info.pool = "empty";
  info.endpoint = "unix:/tmp/late-2";
  ASSERT_TRUE(allocator_->AddSandbox(info).ok());
  EXPECT_EQ(allocator_->GetPoolStatus("empty")->warm, 1);
  EXPECT_EQ(allocator_->GetPoolStatus("empty")->claimed, 0);
  // The same for a batch.
  v1::ClaimBatchRequest batch;
  batch.set_batch_id("impatient-batch");
  batch.set_pool("empty");
  batch.set_count(3);
  batch.mutable_wait_timeout()->set_seconds(30);
  v1::ClaimBatchResponse bresp;
  auto bctx = Ctx(kAlice);
  bctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  s = claims_->ClaimBatch(bctx.get(), batch, &bresp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << Describe(s);
  while ((allocator_->GetPoolStatus("empty")->waiting > 0 ||
          allocator_->GetPoolStatus("empty")->warm < 1) &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(allocator_->GetPoolStatus("empty")->waiting, 0);
  EXPECT_EQ(allocator_->GetPoolStatus("empty")->warm, 1) << "the batch kept the sandbox";
}

// Clients giving up waiting claims (deadlines of 1-20 ms) from 8 threads while sandboxes
// arrive one by one: each give-up runs the call's OnCancel, on whichever thread gRPC sees
// it (the call's reactions run inline, not on gRPC's executor: call.h), racing with
// grants answered from the store's thread. Nothing may hang, no sandbox may be granted
// twice, a claim answered OK is active on its sandbox, and every sandbox is either warm
// or held by exactly one active claim.
TEST_F(ServerTest, ClientsGivingUpWhileSandboxesArriveLoseNothing) {
  MakePool("empty", 0, 0, v1::EMPTY_POOL_POLICY_WAIT);
  constexpr int kThreads = 8;
  constexpr int kPerThread = 30;
  constexpr int kSandboxes = 120;
  std::atomic<bool> adding{true};
  std::thread adder([&] {
    for (int i = 0; i < kSandboxes; ++i) {
      runtime::SandboxInfo info;
      info.id = absl::StrCat("arriving-", i);
      info.pool = "empty";
      info.endpoint = absl::StrCat("unix:/tmp/", info.id);
      EXPECT_TRUE(allocator_->AddSandbox(info).ok());
      absl::SleepFor(absl::Milliseconds(1));
    }
    adding = false;
  });
  absl::Mutex mu;
  std::map<std::string, std::string> granted;  // claim id -> sandbox id
  std::vector<std::thread> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string id = absl::StrCat("give-up-", t, "-", i);
        v1::ClaimRequest req = ClaimReq(id, "empty");
        req.mutable_wait_timeout()->set_seconds(30);
        auto ctx = Ctx(kAlice);
        ctx->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(1 + (t * kPerThread + i) % 20));
        v1::ClaimResponse resp;
        grpc::Status s = claims_->Claim(ctx.get(), req, &resp);
        if (s.ok()) {
          absl::MutexLock lock(&mu);
          granted[id] = resp.claim().sandbox().id();
        } else {
          EXPECT_TRUE(s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                      s.error_code() == grpc::StatusCode::CANCELLED)
              << id << ": " << Describe(s);
        }
      }
    });
  }
  for (std::thread& c : clients) c.join();
  adder.join();
  std::set<std::string> sandboxes;
  for (const auto& [id, sandbox] : granted) {
    EXPECT_TRUE(sandboxes.insert(sandbox).second) << "sandbox " << sandbox << " granted twice";
    absl::StatusOr<store::ClaimRecord> c = allocator_->GetClaim("alice", id);
    ASSERT_TRUE(c.ok()) << id << ": " << c.status();
    EXPECT_EQ(c->state, store::ClaimState::kActive) << id;
    EXPECT_EQ(c->sandbox_id, sandbox) << id;
  }
  // Claims granted after their client gave up are active too (a retry with the same id
  // gets them): warm + claimed accounts for every sandbox once the calls have settled.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (allocator_->GetPoolStatus("empty")->waiting > 0 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  const allocator::PoolStatus st = *allocator_->GetPoolStatus("empty");
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.warm + st.claimed, kSandboxes);
  EXPECT_GE(st.claimed, static_cast<int64_t>(granted.size()));
  std::printf("%zu of %d claims answered OK, %lld sandboxes claimed, %lld warm\n", granted.size(),
              kThreads * kPerThread, static_cast<long long>(st.claimed),
              static_cast<long long>(st.warm));
}

TEST_F(ServerTest, BatchIsAllOrNothing) {
  MakePool("py", 3, 3);
  v1::ClaimBatchRequest req;
  req.set_batch_id("b1");
  req.set_pool("py");
  req.set_count(5);
  v1::ClaimBatchResponse resp;
  auto ctx = Ctx(kAlice);
  grpc::Status s = claims_->ClaimBatch(ctx.get(), req, &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(s);
  EXPECT_TRUE(RetryAfterMs(*ctx).has_value()) << "no sbx-retry-after-ms trailer";
  EXPECT_EQ(allocator_->GetPoolStatus("py")->warm, 3) << "a failed batch held sandboxes";
  EXPECT_EQ(allocator_->GetPoolStatus("py")->claimed, 0);

  req.set_batch_id("b2");
  req.set_count(2);
  s = claims_->ClaimBatch(Ctx(kAlice).get(), req, &resp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(resp.batch_id(), "b2");
  EXPECT_FALSE(resp.replayed());
  ASSERT_EQ(resp.claims_size(), 2);
  EXPECT_EQ(resp.claims(0).claim_id(), "b2#0");
  EXPECT_EQ(resp.claims(1).claim_id(), "b2#1");
  EXPECT_EQ(resp.claims(0).batch_id(), "b2");
  EXPECT_NE(resp.claims(0).sandbox().id(), resp.claims(1).sandbox().id());

  v1::ClaimBatchResponse again;
  s = claims_->ClaimBatch(Ctx(kAlice).get(), req, &again);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_TRUE(again.replayed());
  ASSERT_EQ(again.claims_size(), 2);
  EXPECT_EQ(again.claims(1).sandbox().id(), resp.claims(1).sandbox().id());
  // The same batch id with another count is another batch (failed on 660dada: replayed).
  req.set_count(1);
  s = claims_->ClaimBatch(Ctx(kAlice).get(), req, &again);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("batch id \"b2\" already names a batch of count 2"));

  // Each batch claim can be read on its own.
  v1::GetClaimRequest get;
  get.set_claim_id("b2#1");
  v1::GetClaimResponse got;
  s = claims_->GetClaim(Ctx(kAlice).get(), get, &got);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(got.claim().sandbox().id(), resp.claims(1).sandbox().id());
}

TEST_F(ServerTest, ReleaseEndsTheClaimAndIsIdempotent) {
  MakePool("py", 1, 5);
  v1::ClaimResponse claimed;
  ASSERT_TRUE(Claim(kAlice, ClaimReq("rel"), &claimed).ok());
  const uint64_t retired_before = reconciler_.retired();

  v1::ReleaseRequest req;
  req.set_claim_id("rel");
  v1::ReleaseResponse resp;
  grpc::Status s = claims_->Release(Ctx(kAlice).get(), req, &resp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(resp.claim().state(), v1::CLAIM_STATE_RELEASED);
  EXPECT_EQ(resp.claim().sandbox().id(), claimed.claim().sandbox().id());
  EXPECT_TRUE(resp.claim().has_ended_at());
  EXPECT_EQ(reconciler_.retired(), retired_before + 1) << "the sandbox was not retired";

  v1::GetClaimRequest get;
  get.set_claim_id("rel");
  v1::GetClaimResponse got;
  ASSERT_TRUE(claims_->GetClaim(Ctx(kAlice).get(), get, &got).ok());
  EXPECT_EQ(got.claim().state(), v1::CLAIM_STATE_RELEASED);

  // claims.proto: releasing an ended claim is OK with the claim in its final state, and
  // changes nothing.
  v1::ReleaseResponse second;
  s = claims_->Release(Ctx(kAlice).get(), req, &second);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(second.claim().state(), v1::CLAIM_STATE_RELEASED);
  EXPECT_EQ(second.claim().ended_at().seconds(), resp.claim().ended_at().seconds());
  EXPECT_EQ(reconciler_.retired(), retired_before + 1);

  // The id is spent: claiming with it, or renewing it, is FAILED_PRECONDITION.
  v1::ClaimResponse reuse;
  s = Claim(kAlice, ClaimReq("rel"), &reuse);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(s);
  v1::RenewRequest renew;
  renew.set_claim_id("rel");
  renew.mutable_ttl()->set_seconds(60);
  v1::RenewResponse renewed;
  s = claims_->Renew(Ctx(kAlice).get(), renew, &renewed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("released"));

  v1::ReleaseRequest unknown;
  unknown.set_claim_id("never-made");
  s = claims_->Release(Ctx(kAlice).get(), unknown, &second);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(s);
}

TEST_F(ServerTest, RenewMovesExpiry) {
  MakePool("py", 1, 5, v1::EMPTY_POOL_POLICY_FAIL, absl::Hours(1));
  v1::ClaimRequest creq = ClaimReq("ren");
  creq.mutable_ttl()->set_seconds(60);
  v1::ClaimResponse claimed;
  ASSERT_TRUE(Claim(kAlice, creq, &claimed).ok());

  v1::RenewRequest req;
  req.set_claim_id("ren");
  req.mutable_ttl()->set_seconds(1800);
  v1::RenewResponse resp;
  const int64_t now = absl::ToUnixSeconds(absl::Now());
  grpc::Status s = claims_->Renew(Ctx(kAlice).get(), req, &resp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_GE(resp.claim().expires_at().seconds(), now + 1799);
  EXPECT_LE(resp.claim().expires_at().seconds(), now + 1802);
  EXPECT_EQ(resp.claim().state(), v1::CLAIM_STATE_ACTIVE);

  req.mutable_ttl()->set_seconds(7200);  // above max_ttl 1h
  s = claims_->Renew(Ctx(kAlice).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("max_ttl"));

  // Unset ttl with default_ttl 0 and max_ttl 1h: the claim is capped at max_ttl.
  req.clear_ttl();
  s = claims_->Renew(Ctx(kAlice).get(), req, &resp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_GE(resp.claim().expires_at().seconds(), now + 3599);

  // A claim's ttl above max_ttl is rejected too.
  v1::ClaimRequest longer = ClaimReq("long");
  longer.mutable_ttl()->set_seconds(7200);
  s = Claim(kAlice, longer, &claimed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
}

TEST_F(ServerTest, ListClaimsFiltersBySelectorAndPaginates) {
  MakePool("py", 8, 20);
  MakePool("other", 1, 5);
  for (int i = 0; i < 6; ++i) {
    v1::ClaimRequest req = ClaimReq(absl::StrCat("c", i));
    (*req.mutable_labels())["team"] = i < 5 ? "rl" : "web";
    (*req.mutable_labels())["run"] = absl::StrCat(i);
    if (i == 1) (*req.mutable_labels())["debug"] = "";
    v1::ClaimResponse resp;
    ASSERT_TRUE(Claim(kAlice, req, &resp).ok());
  }
  v1::ClaimResponse resp;
  ASSERT_TRUE(Claim(kAlice, ClaimReq("o1", "other"), &resp).ok());
  v1::ReleaseRequest rel;
  rel.set_claim_id("c4");
  v1::ReleaseResponse released;
  ASSERT_TRUE(claims_->Release(Ctx(kAlice).get(), rel, &released).ok());

  auto ids = [](const v1::ListClaimsResponse& r) {
    std::vector<std::string> out;
    for (const auto& c : r.claims()) out.push_back(c.claim_id());
    return out;
  };
  v1::ListClaimsRequest req;
  req.mutable_filter()->set_pool("py");
  req.mutable_filter()->set_label_selector(" team = rl , !debug, run!=2 ");
  v1::ListClaimsResponse page;
  grpc::Status s = claims_->ListClaims(Ctx(kAlice).get(), req, &page);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_THAT(ids(page), ::testing::ElementsAre("c0", "c3", "c4"));
  EXPECT_TRUE(page.next_page_token().empty());

  // States: only active ones.
  req.mutable_filter()->add_states(v1::CLAIM_STATE_ACTIVE);
  s = claims_->ListClaims(Ctx(kAlice).get(), req, &page);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_THAT(ids(page), ::testing::ElementsAre("c0", "c3"));

  // match_labels and the existence term.
  v1::ListClaimsRequest by_label;
  (*by_label.mutable_filter()->mutable_match_labels())["team"] = "web";
  by_label.mutable_filter()->set_label_selector("run");
  s = claims_->ListClaims(Ctx(kAlice).get(), by_label, &page);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_THAT(ids(page), ::testing::ElementsAre("c5"));

  // Pagination over everything alice has (7 claims), 3 at a time.
  v1::ListClaimsRequest all;
  all.set_page_size(3);
  std::vector<std::string> seen;
  int pages = 0;
  do {
    v1::ListClaimsResponse p;
    s = claims_->ListClaims(Ctx(kAlice).get(), all, &p);
    ASSERT_TRUE(s.ok()) << Describe(s);
    EXPECT_LE(p.claims_size(), 3);
    for (const auto& id : ids(p)) seen.push_back(id);
    all.set_page_token(p.next_page_token());
    ASSERT_LT(++pages, 10);
  } while (!all.page_token().empty());
  EXPECT_THAT(seen, ::testing::ElementsAre("c0", "c1", "c2", "c3", "c4", "c5", "o1"));
  EXPECT_EQ(pages, 3);

  // A token used with another filter is INVALID_ARGUMENT, as is a garbage one.
  v1::ListClaimsResponse first;
  all.set_page_token("");
  ASSERT_TRUE(claims_->ListClaims(Ctx(kAlice).get(), all, &first).ok());
  ASSERT_FALSE(first.next_page_token().empty());
  v1::ListClaimsRequest other = all;
  other.set_page_token(first.next_page_token());
  other.mutable_filter()->set_pool("other");
  s = claims_->ListClaims(Ctx(kAlice).get(), other, &page);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("page_token"));
  other.set_page_token("not a token!");
  s = claims_->ListClaims(Ctx(kAlice).get(), other, &page);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);

  // A malformed selector names the bad term.
  v1::ListClaimsRequest bad;
  bad.mutable_filter()->set_label_selector("team=rl,a=b=c");
  s = claims_->ListClaims(Ctx(kAlice).get(), bad, &page);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("\"a=b=c\""));
  bad.mutable_filter()->set_label_selector("team=rl,,x");
  s = claims_->ListClaims(Ctx(kAlice).get(), bad, &page);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);

  v1::ListClaimsRequest big;
  big.set_page_size(5000);
  s = claims_->ListClaims(Ctx(kAlice).get(), big, &page);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("page_size 5000"));
}

TEST_F(ServerTest, TenantsSeeOnlyTheirOwnClaims) {
  MakePool("py", 3, 5);
  v1::ClaimResponse alices;
  ASSERT_TRUE(Claim(kAlice, ClaimReq("mine"), &alices).ok());

  v1::GetClaimRequest get;
  get.set_claim_id("mine");
  v1::GetClaimResponse got;
  grpc::Status s = claims_->GetClaim(Ctx(kBob).get(), get, &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(s);

  v1::ReleaseRequest rel;
  rel.set_claim_id("mine");
  v1::ReleaseResponse released;
  s = claims_->Release(Ctx(kBob).get(), rel, &released);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(s);
  ASSERT_TRUE(claims_->GetClaim(Ctx(kAlice).get(), get, &got).ok());
  EXPECT_EQ(got.claim().state(), v1::CLAIM_STATE_ACTIVE) << "bob released alice's claim";

  v1::ListClaimsRequest list;
  v1::ListClaimsResponse page;
  ASSERT_TRUE(claims_->ListClaims(Ctx(kBob).get(), list, &page).ok());
  EXPECT_EQ(page.claims_size(), 0);
  list.mutable_filter()->set_owner("alice");
  s = claims_->ListClaims(Ctx(kBob).get(), list, &page);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << Describe(s);
  s = claims_->ListClaims(Ctx(kAdmin).get(), list, &page);
  ASSERT_TRUE(s.ok()) << Describe(s);
  ASSERT_EQ(page.claims_size(), 1);
  EXPECT_EQ(page.claims(0).owner(), "alice");

  // The same claim id is a different claim for bob.
  v1::ClaimResponse bobs;
  s = Claim(kBob, ClaimReq("mine"), &bobs);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_FALSE(bobs.replayed());
  EXPECT_EQ(bobs.claim().owner(), "bob");
  EXPECT_NE(bobs.claim().sandbox().id(), alices.claim().sandbox().id());
}

TEST_F(ServerTest, AuthenticationAndAdminRights) {
  MakePool("py", 1, 5);
  v1::ClaimResponse resp;
  grpc::Status s = Claim("", ClaimReq("x"), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << Describe(s);
  s = Claim("no-such-token", ClaimReq("x"), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << Describe(s);
  EXPECT_THAT(s.error_message(), ::testing::Not(HasSubstr("no-such-token")));
  {
    auto ctx = Ctx("");
    ctx->AddMetadata("authorization", "Basic abc");
    s = claims_->Claim(ctx.get(), ClaimReq("x"), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << Describe(s);
  }

  v1::PutPoolRequest put;
  put.mutable_pool()->set_name("py2");
  put.mutable_pool()->set_template_("py");
  v1::PutPoolResponse presp;
  s = admin_->PutPool(Ctx("").get(), put, &presp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << Describe(s);
  s = admin_->PutPool(Ctx(kAlice).get(), put, &presp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("alice"));
  v1::ListPoolsResponse pools;
  s = admin_->ListPools(Ctx(kBob).get(), v1::ListPoolsRequest(), &pools);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << Describe(s);
  s = admin_->PutPool(Ctx(kAdmin).get(), put, &presp);
  EXPECT_TRUE(s.ok()) << Describe(s);

  // Ping needs no token.
  auto diag = v1::DiagnosticsService::NewStub(channel_);
  v1::PingResponse pong;
  s = diag->Ping(Ctx("").get(), v1::PingRequest(), &pong);
  EXPECT_TRUE(s.ok()) << Describe(s);

  // A reload takes new tokens; a broken file keeps the old ones.
  WriteTokens("tok-carol carol\n");
  ASSERT_TRUE(server_->ReloadAuth().ok());
  s = Claim(kAlice, ClaimReq("y"), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << Describe(s);
  s = Claim("tok-carol", ClaimReq("y"), &resp);
  EXPECT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(resp.claim().owner(), "carol");
  WriteTokens("tok-carol carol\nbroken line with four fields\n");
  absl::Status reload = server_->ReloadAuth();
  EXPECT_EQ(reload.code(), absl::StatusCode::kInvalidArgument) << reload;
  EXPECT_THAT(std::string(reload.message()), HasSubstr(tokens_file_ + ":2:"));
  s = Claim("tok-carol", ClaimReq("y"), &resp);
  EXPECT_TRUE(s.ok()) << Describe(s);
}

TEST_F(ServerTest, BadRequestsNameTheField) {
  MakePool("py", 1, 5);
  struct Case {
    std::string name;
    v1::ClaimRequest req;
    std::string want;
  };
  std::vector<Case> cases;
  {
    Case c{"pool", ClaimReq("ok", "Bad_Pool"), "pool \"Bad_Pool\""};
    cases.push_back(c);
  }
  {
    Case c{"claim id", ClaimReq("has space"), "claim_id \"has space\""};
    cases.push_back(c);
  }
  {
    Case c{"ttl", ClaimReq("ok"), "ttl"};
    c.req.mutable_ttl()->set_seconds(-5);
    cases.push_back(c);
  }
  {
    Case c{"wait", ClaimReq("ok"), "wait_timeout"};
    c.req.mutable_wait_timeout()->set_seconds(7200);
    cases.push_back(c);
  }
  {
    Case c{"label", ClaimReq("ok"), "labels: label key \"-bad\""};
    (*c.req.mutable_labels())["-bad"] = "x";
    cases.push_back(c);
  }
  {
    Case c{"label value", ClaimReq("ok"), "value \"a,b\""};
    (*c.req.mutable_labels())["k"] = "a,b";
    cases.push_back(c);
  }
  {
    Case c{"policy", ClaimReq("ok"), "empty_pool_policy 42"};
    c.req.set_empty_pool_policy(static_cast<v1::EmptyPoolPolicy>(42));
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    v1::ClaimResponse resp;
    grpc::Status s = Claim(kAlice, c.req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name << ": " << Describe(s);
    EXPECT_THAT(s.error_message(), HasSubstr(c.want)) << c.name;
  }
  EXPECT_EQ(allocator_->GetPoolStatus("py")->claimed, 0);

  // A late-bound config that breaks a rule is refused before anything is claimed.
  v1::ClaimRequest with_config = ClaimReq("cfg");
  (*with_config.mutable_config()->mutable_env())["1SEED"] = "7";
  v1::ClaimResponse resp;
  grpc::Status s = Claim(kAlice, with_config, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("config.env: name \"1SEED\""));
  v1::ClaimRequest too_many_files = ClaimReq("cfg2");
  for (int i = 0; i < 65; ++i) {
    too_many_files.mutable_config()->add_files()->set_path("f" + std::to_string(i));
  }
  s = Claim(kAlice, too_many_files, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("config.files has 65 files"));
  EXPECT_EQ(allocator_->GetPoolStatus("py")->claimed, 0);

  v1::ClaimResponse missing;
  s = Claim(kAlice, ClaimReq("ok", "nope"), &missing);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("\"nope\""));

  v1::ClaimBatchRequest batch;
  batch.set_pool("py");
  batch.set_count(0);
  v1::ClaimBatchResponse bresp;
  s = claims_->ClaimBatch(Ctx(kAlice).get(), batch, &bresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("count 0"));
  batch.set_count(1);
  batch.set_batch_id(std::string(121, 'b'));
  s = claims_->ClaimBatch(Ctx(kAlice).get(), batch, &bresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("batch_id"));

  v1::GetClaimRequest get;
  v1::GetClaimResponse got;
  s = claims_->GetClaim(Ctx(kAlice).get(), get, &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("claim_id is empty"));
}

TEST_F(ServerTest, AdminTemplatesAndPools) {
  auto admin = [&] { return Ctx(kAdmin); };
  v1::PutTemplateRequest put;
  v1::Template* t = put.mutable_template_();
  t->set_name("py");
  t->set_runtime("local");
  t->mutable_local()->add_command("python3");
  (*t->mutable_local()->mutable_env())["A"] = "1";
  (*t->mutable_local()->mutable_env())["B"] = "2";
  t->mutable_local()->set_memory_limit_bytes(512 << 20);
  v1::PutTemplateResponse tresp;
  grpc::Status s = admin_->PutTemplate(admin().get(), put, &tresp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_TRUE(tresp.created());
  EXPECT_EQ(tresp.template_().generation(), 1);

  // Identical: nothing changes. Changed: generation 2.
  s = admin_->PutTemplate(admin().get(), put, &tresp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_FALSE(tresp.created());
  EXPECT_EQ(tresp.template_().generation(), 1);
  t->mutable_local()->set_pids_limit(64);
  s = admin_->PutTemplate(admin().get(), put, &tresp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(tresp.template_().generation(), 2);

  // A layer size belongs to an image's sandboxes: the host's root has no layer to size.
  {
    v1::PutTemplateRequest bad = put;
    bad.mutable_template_()->mutable_local()->set_layer_size_bytes(64 << 20);
    s = admin_->PutTemplate(admin().get(), bad, &tresp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
    EXPECT_THAT(s.error_message(), HasSubstr("layer_size_bytes is set without an image"));
    bad.mutable_template_()->mutable_local()->set_layer_size_bytes(-1);
    s = admin_->PutTemplate(admin().get(), bad, &tresp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
    EXPECT_THAT(s.error_message(), HasSubstr("layer_size_bytes -1 is negative"));
  }

  // Optimistic concurrency.
  put.set_expected_generation(1);
  t->mutable_local()->set_pids_limit(65);
  s = admin_->PutTemplate(admin().get(), put, &tresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("generation 2"));
  put.set_expected_generation(2);
  s = admin_->PutTemplate(admin().get(), put, &tresp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(tresp.template_().generation(), 3);
  put.set_expected_generation(0);
  put.set_create_only(true);
  s = admin_->PutTemplate(admin().get(), put, &tresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS) << Describe(s);
  put.set_create_only(false);

  // The spec round-trips.
  v1::GetTemplateRequest gt;
  gt.set_name("py");
  v1::GetTemplateResponse gtr;
  ASSERT_TRUE(admin_->GetTemplate(admin().get(), gt, &gtr).ok());
  EXPECT_EQ(gtr.template_().runtime(), "local");
  ASSERT_EQ(gtr.template_().local().command_size(), 1);
  EXPECT_EQ(gtr.template_().local().command(0), "python3");
  EXPECT_EQ(gtr.template_().local().env().at("B"), "2");
  EXPECT_EQ(gtr.template_().local().pids_limit(), 65);

  // Bad templates.
  v1::PutTemplateRequest bad = put;
  bad.mutable_template_()->set_runtime("docker");
  s = admin_->PutTemplate(admin().get(), bad, &tresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("runtime \"docker\""));
  bad = put;
  bad.mutable_template_()->mutable_local()->add_mounts()->set_source("relative/path");
  s = admin_->PutTemplate(admin().get(), bad, &tresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("mounts[0].source"));

  // Pools.
  v1::PutPoolRequest pp;
  v1::Pool* p = pp.mutable_pool();
  p->set_name("web");
  p->set_template_("nope");
  p->set_min_warm(2);
  p->set_max_warm(4);
  v1::PutPoolResponse presp;
  s = admin_->PutPool(admin().get(), pp, &presp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(s);
  p->set_template_("py");
  p->set_max_warm(1);
  s = admin_->PutPool(admin().get(), pp, &presp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("max_warm 1 is below min_warm 2"));
  p->set_max_warm(4);
  s = admin_->PutPool(admin().get(), pp, &presp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_TRUE(presp.created());
  EXPECT_EQ(presp.pool().generation(), 1);
  EXPECT_EQ(presp.pool().empty_pool_policy(), v1::EMPTY_POOL_POLICY_WAIT);
  EXPECT_EQ(presp.pool().default_wait().seconds(), 30);
  WaitWarm("web", 2);

  v1::GetPoolRequest gp;
  gp.set_name("web");
  v1::GetPoolResponse gpr;
  ASSERT_TRUE(admin_->GetPool(admin().get(), gp, &gpr).ok());
  EXPECT_EQ(gpr.pool().status().warm(), 2);
  EXPECT_EQ(gpr.pool().status().target(), 2);
  EXPECT_EQ(gpr.pool().status().template_generation(), 3);

  v1::ScalePoolRequest scale;
  scale.set_name("web");
  scale.mutable_min_warm()->set_value(3);
  v1::ScalePoolResponse sresp;
  s = admin_->ScalePool(admin().get(), scale, &sresp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(sresp.pool().min_warm(), 3);
  EXPECT_EQ(sresp.pool().max_warm(), 4);
  EXPECT_EQ(sresp.pool().generation(), 2);
  WaitWarm("web", 3);
  scale.mutable_min_warm()->set_value(5);
  s = admin_->ScalePool(admin().get(), scale, &sresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  s = admin_->ScalePool(admin().get(), v1::ScalePoolRequest(), &sresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);

  // Lists page by name.
  p->set_name("api");
  p->set_min_warm(0);
  ASSERT_TRUE(admin_->PutPool(admin().get(), pp, &presp).ok());
  v1::ListPoolsRequest lp;
  lp.set_page_size(1);
  v1::ListPoolsResponse lpr;
  ASSERT_TRUE(admin_->ListPools(admin().get(), lp, &lpr).ok());
  ASSERT_EQ(lpr.pools_size(), 1);
  EXPECT_EQ(lpr.pools(0).name(), "api");
  ASSERT_FALSE(lpr.next_page_token().empty());
  lp.set_page_token(lpr.next_page_token());
  ASSERT_TRUE(admin_->ListPools(admin().get(), lp, &lpr).ok());
  ASSERT_EQ(lpr.pools_size(), 1);
  EXPECT_EQ(lpr.pools(0).name(), "web");
  EXPECT_EQ(lpr.pools(0).status().warm(), 3);
  EXPECT_TRUE(lpr.next_page_token().empty());
  v1::ListTemplatesResponse ltr;
  ASSERT_TRUE(admin_->ListTemplates(admin().get(), v1::ListTemplatesRequest(), &ltr).ok());
  ASSERT_EQ(ltr.templates_size(), 1);
  EXPECT_EQ(ltr.templates(0).name(), "py");

  // Deletes.
  v1::DeleteTemplateRequest dt;
  dt.set_name("py");
  v1::DeleteTemplateResponse dtr;
  s = admin_->DeleteTemplate(admin().get(), dt, &dtr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(s);
  v1::DeletePoolRequest dp;
  dp.set_name("web");
  dp.set_expected_generation(1);
  v1::DeletePoolResponse dpr;
  s = admin_->DeletePool(admin().get(), dp, &dpr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED) << Describe(s);
  dp.set_expected_generation(2);
  s = admin_->DeletePool(admin().get(), dp, &dpr);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_TRUE(dpr.deleted());
  s = admin_->GetPool(admin().get(), gp, &gpr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(s);
  dp.set_expected_generation(0);
  s = admin_->DeletePool(admin().get(), dp, &dpr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(s);
  dp.set_allow_missing(true);
  s = admin_->DeletePool(admin().get(), dp, &dpr);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_FALSE(dpr.deleted());
  dp.set_name("api");
  ASSERT_TRUE(admin_->DeletePool(admin().get(), dp, &dpr).ok());
  s = admin_->DeleteTemplate(admin().get(), dt, &dtr);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_TRUE(dtr.deleted());
  s = admin_->GetTemplate(admin().get(), gt, &gtr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(s);
}

// PutTemplate checks a local template's mounts: source and target absolute and normal
// (no ".", "..", empty components, trailing "/" or NUL), and a target that neither
// equals, lies under nor covers a path the runtime mounts itself (/run/sbx, /proc,
// /dev). The message names the mount and the rule. Failed on 660dada: only "starts with
// /" was checked, so e.g. "/a/../b", "/run/sbx/sock" and "/" were accepted.
TEST_F(ServerTest, PutTemplateRefusesMountsThatAreNotNormalOrCoverControlPaths) {
  struct Case {
    std::string source;
    std::string target;
    std::string want;  // in the message, after the mount's name
  };
  const std::vector<Case> bad = {
      {"/data", "/a/../b", "mounts[0].target \"/a/../b\" has a \"..\" component"},
      {"/data", "/a/./b", "mounts[0].target \"/a/./b\" has a \".\" component"},
      {"/data", "/a//b", "mounts[0].target \"/a//b\" has an empty component"},
      {"/data", "/a/", "mounts[0].target \"/a/\" ends with \"/\""},
      {"/data", "a/b", "mounts[0].target \"a/b\" is not an absolute path"},
      {"/data", std::string("/a\0b", 4), "mounts[0].target \"/a\\x00\\x62\" contains a NUL byte"},
      {"/srv/../etc", "/etc2", "mounts[0].source \"/srv/../etc\" has a \"..\" component"},
      {"/data", "/", "mounts[0].target \"/\" covers \"/run/sbx\""},
      {"/data", "/run", "mounts[0].target \"/run\" covers \"/run/sbx\""},
      {"/data", "/run/sbx", "mounts[0].target \"/run/sbx\" is \"/run/sbx\""},
      {"/data", "/run/sbx/sock", "mounts[0].target \"/run/sbx/sock\" lies under \"/run/sbx\""},
      {"/data", "/run/sbx/workspace/x", "mounts[0].target \"/run/sbx/workspace/x\" lies under"},
      {"/data", "/proc/self", "mounts[0].target \"/proc/self\" lies under \"/proc\""},
      {"/data", "/dev", "mounts[0].target \"/dev\" is \"/dev\""},
      // No target: the source's path, which here is a control path.
      {"/dev/shm", "", "mounts[0].target (empty: the source) \"/dev/shm\" lies under \"/dev\""},
  };
  v1::PutTemplateRequest put;
  v1::Template* t = put.mutable_template_();
  t->set_name("py");
  t->set_runtime("local");
  v1::PutTemplateResponse resp;
  for (const Case& c : bad) {
    t->mutable_local()->clear_mounts();
    v1::BindMount* m = t->mutable_local()->add_mounts();
    m->set_source(c.source);
    m->set_target(c.target);
    grpc::Status s = admin_->PutTemplate(Ctx(kAdmin).get(), put, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.target << ": " << Describe(s);
    EXPECT_THAT(s.error_message(), HasSubstr("template \"py\": local." + c.want)) << c.target;
  }
  v1::ListTemplatesResponse listed;
  ASSERT_TRUE(admin_->ListTemplates(Ctx(kAdmin).get(), v1::ListTemplatesRequest(), &listed).ok());
  EXPECT_EQ(listed.templates_size(), 0) << "a refused template was stored";

  // Paths that only look like control paths, and the usual ones, are fine.
  t->mutable_local()->clear_mounts();
  for (const char* target : {"/data", "/run/sbxdata", "/devices", "/run/other", "/opt/x/y"}) {
    v1::BindMount* m = t->mutable_local()->add_mounts();
    m->set_source("/srv/data");
    m->set_target(target);
  }
  t->mutable_local()->add_mounts()->set_source("/usr/share/dict");  // target: the same
  grpc::Status s = admin_->PutTemplate(Ctx(kAdmin).get(), put, &resp);
  EXPECT_TRUE(s.ok()) << Describe(s);
}

// A TTL whose expiry would not fit google.protobuf.Timestamp (up to 9999-12-31) is
// refused, naming the TTL and the maximum (100 years), wherever a TTL becomes a time:
// Claim, ClaimBatch, Renew, and a pool's default_ttl and max_ttl. Failed on 660dada:
// all were accepted, and the claim's expires_at was some 31 million years ahead.
TEST_F(ServerTest, TtlsAboveTheMaximumAreInvalidArgument) {
  MakePool("py", 2, 5);                             // no max_ttl
  constexpr int64_t kHuge = 1'000'000'000'000'000;  // 10^15 s
  constexpr int64_t kMax = int64_t{100} * 365 * 86400;
  auto expect_refused = [](const grpc::Status& s, const std::string& field) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field << ": " << Describe(s);
    EXPECT_THAT(s.error_message(), HasSubstr(field + " 277777777777h46m40s")) << field;
    EXPECT_THAT(s.error_message(), HasSubstr("876000h (100 years)")) << field;
  };
  v1::ClaimRequest claim = ClaimReq("forever");
  claim.mutable_ttl()->set_seconds(kHuge);
  v1::ClaimResponse claimed;
  expect_refused(Claim(kAlice, claim, &claimed), "ttl");
  v1::ClaimBatchRequest batch;
  batch.set_batch_id("forever");
  batch.set_pool("py");
  batch.set_count(1);
  batch.mutable_ttl()->set_seconds(kHuge);
  v1::ClaimBatchResponse batched;
  expect_refused(claims_->ClaimBatch(Ctx(kAlice).get(), batch, &batched), "ttl");
  EXPECT_EQ(allocator_->GetPoolStatus("py")->claimed, 0);

  // The maximum itself is accepted and gives a valid Timestamp.
  claim.mutable_ttl()->set_seconds(kMax);
  grpc::Status s = Claim(kAlice, claim, &claimed);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_LE(claimed.claim().expires_at().seconds(), absl::ToUnixSeconds(absl::Now()) + kMax);
  EXPECT_LE(claimed.claim().expires_at().seconds(), 253402300799);  // 9999-12-31T23:59:59Z

  v1::RenewRequest renew;
  renew.set_claim_id("forever");
  renew.mutable_ttl()->set_seconds(kHuge);
  v1::RenewResponse renewed;
  expect_refused(claims_->Renew(Ctx(kAlice).get(), renew, &renewed), "ttl");

  v1::PutPoolRequest pool;
  pool.mutable_pool()->set_name("long");
  pool.mutable_pool()->set_template_("py");
  pool.mutable_pool()->mutable_default_ttl()->set_seconds(kHuge);
  v1::PutPoolResponse put;
  expect_refused(admin_->PutPool(Ctx(kAdmin).get(), pool, &put), "default_ttl");
  pool.mutable_pool()->clear_default_ttl();
  pool.mutable_pool()->mutable_max_ttl()->set_seconds(kHuge);
  expect_refused(admin_->PutPool(Ctx(kAdmin).get(), pool, &put), "max_ttl");
}

// A request whose bytes do not parse as the method's message is INVALID_ARGUMENT naming
// the method, for unary and streaming methods alike. Failed on 660dada: gRPC's callback
// handlers answered UNIMPLEMENTED with an empty message.
TEST_F(ServerTest, RequestsThatDoNotParseAreInvalidArgument) {
  MakePool("py", 1, 5);
  // ClaimRequest.pool (field 2, a proto3 string) holding bytes that are not UTF-8, which
  // protobuf refuses to parse.
  const std::string bad_utf8("\x12\x02\xff\xfe", 4);
  // A length-delimited field that claims more bytes than follow.
  const std::string truncated("\x12\x10py", 4);
  struct Case {
    std::string method;
    std::string bytes;
  };
  const std::vector<Case> cases = {
      {"/sbx.v1.ClaimService/Claim", bad_utf8},
      {"/sbx.v1.ClaimService/Claim", truncated},
      {"/sbx.v1.ClaimService/ClaimBatch", bad_utf8},
      {"/sbx.v1.AdminService/PutTemplate", truncated},
      {"/sbx.v1.ClaimService/WatchClaims", truncated},  // server streaming
      {"/sbx.v1.DiagnosticsService/Ping", truncated},   // no token needed
  };
  for (const Case& c : cases) {
    grpc::Status s = RawCall(channel_, c.method, c.bytes, Token(kAdmin));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.method << ": " << Describe(s);
    EXPECT_THAT(s.error_message(), HasSubstr("could not be parsed")) << c.method;
    EXPECT_THAT(s.error_message(), HasSubstr(c.method)) << c.method;
  }
  EXPECT_EQ(allocator_->GetPoolStatus("py")->claimed, 0);

  // Bytes that parse are served as usual, and an unknown method is still UNIMPLEMENTED.
  v1::ClaimRequest good = ClaimReq("raw");
  grpc::Status s =
      RawCall(channel_, "/sbx.v1.ClaimService/Claim", good.SerializeAsString(), Token(kAlice));
  EXPECT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(allocator_->GetPoolStatus("py")->claimed, 1);
  s = RawCall(channel_, "/sbx.v1.ClaimService/NoSuchMethod", "", Token(kAlice));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << Describe(s);
}

// WatchClaims and WatchPools are tested in watch_test.cc.
// SandboxService checks the caller and the claim before it reaches any sandbox (its
// forwarding to sbx-sandboxd is tested end to end in tests/e2e/sandbox_test.py).
TEST_F(ServerTest, SandboxServiceChecksTheClaimFirst) {
  auto sandboxes = v1::SandboxService::NewStub(channel_);
  v1::ReadFileRequest rf;
  v1::ReadFileResponse rfr;
  grpc::Status s = sandboxes->ReadFile(Ctx(kAlice).get(), rf, &rfr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  rf.set_claim_id("nobody-has-this");
  s = sandboxes->ReadFile(Ctx(kAlice).get(), rf, &rfr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(s);
  s = sandboxes->ReadFile(Ctx("").get(), rf, &rfr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << Describe(s);
  v1::SuspendRequest sr;
  sr.set_claim_id("nobody-has-this");
  v1::SuspendResponse srr;
  s = sandboxes->Suspend(Ctx(kAlice).get(), sr, &srr);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(s);
}

class InsecureServerTest : public ServerTest {
 protected:
  void SetUp() override {
    insecure_ = true;
    StartServer(/*insecure=*/true);
  }
};

TEST_F(InsecureServerTest, EveryCallerIsAnonymousAdmin) {
  MakePool("py", 1, 5);  // admin calls without a token
  v1::ClaimResponse resp;
  grpc::Status s = Claim("", ClaimReq("anon"), &resp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(resp.claim().owner(), "anonymous");
  EXPECT_TRUE(server_->ReloadAuth().ok());
}

TEST(ServerStartTest, AllocatorNeedsAuthConfiguration) {
  store::MemoryStore store;
  allocator::testing::RecordingReconciler reconciler;
  auto a = allocator::Allocator::Create({}, &store, nullptr, &reconciler, &Clock::Real(),
                                        &IdGenerator::Random());
  ASSERT_TRUE(a.ok());
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.allocator = a->get();
  auto server = Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
  options.auth.tokens_file = "/nonexistent/tokens";
  server = Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kNotFound) << server.status();
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("/nonexistent/tokens"));
}

TEST(ServerStartTest, WithoutAllocatorClaimsAreUnimplemented) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port()),
                                     grpc::InsecureChannelCredentials());
  auto claims = v1::ClaimService::NewStub(channel);
  v1::ClaimRequest req;
  req.set_pool("py");
  v1::ClaimResponse resp;
  grpc::Status s = claims->Claim(Ctx("").get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << Describe(s);
  EXPECT_EQ((*server)->ReloadAuth().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sbx::server

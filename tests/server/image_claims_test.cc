// Claims by image (issue 34) through a real gRPC server over a real Allocator
// (MemoryStore, the refilling reconciler with instant fake sandboxes for declared pools,
// and a runtime that answers cold creates at once and records their specs), with an image
// cache whose contents the test sets: which pool serves a claim by image (declared ones
// first, the one with warm sandboxes, the caller's namespaces; else the image's on-demand
// pool, made once however many claims race), its errors, the tenant limits
// image_claim_rate and image_cache_bytes, and the counts of how claims were served.
// tests/e2e/image_claim_test.py runs the same against sbx-server with real images.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sbx/v1/admin.pb.h"
#include "sbx/v1/claims.grpc.pb.h"
#include "src/allocator/allocator.h"
#include "src/common/clock.h"
#include "src/common/ids.h"
#include "src/images/images.h"
#include "src/runtime/runtime.h"
#include "src/server/convert.h"
#include "src/server/image_pools.h"
#include "src/server/metrics.h"
#include "src/server/server.h"
#include "src/server/tenant_limits.h"
#include "src/store/memory_store.h"
#include "tests/allocator/fakes.h"

namespace sbx::server {
namespace {

using ::testing::HasSubstr;

constexpr char kAlice[] = "tok-alice";
constexpr char kBob[] = "tok-bob";
constexpr char kTeam[] = "tok-team";  // tenant "team", confined to namespace team-a
constexpr char kAdmin[] = "tok-root";

constexpr char kImageA[] = "oci:/images/a:1";
constexpr char kImageB[] = "oci:/images/b:1";
constexpr char kImageC[] = "oci:/images/c:1";

// An image cache whose images the test sets; it takes references that start with "oci:/".
class FakeImages final : public images::Images {
 public:
  absl::StatusOr<images::Image> Acquire(const std::string& ref) override {
    return absl::UnimplementedError("not in this test");
  }
  void Release(const std::string&) override {}
  bool Hold(const std::string&) override { return false; }
  absl::StatusOr<images::Image> Pull(const std::string& ref) override { return Acquire(ref); }
  std::vector<images::Image> List() const override {
    absl::MutexLock lock(&mu_);
    return cached_;
  }
  absl::Status Remove(const std::string&) override { return absl::OkStatus(); }
  std::string State(const std::string&) const override { return ""; }
  images::ImageCacheStats Stats() const override { return {}; }
  absl::Status CheckReference(const std::string& ref) const override {
    if (absl::StartsWith(ref, "oci:/")) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("image reference \"", ref, "\" is not oci:DIR"));
  }

  // The cache holds `ref` (first pulled by it), `bytes` big; 0 bytes: no longer.
  void Set(const std::string& ref, int64_t bytes) {
    absl::MutexLock lock(&mu_);
    cached_.erase(std::remove_if(cached_.begin(), cached_.end(),
                                 [&](const images::Image& i) { return i.ref == ref; }),
                  cached_.end());
    if (bytes == 0) return;
    images::Image i;
    i.digest = absl::StrCat("sha256:", ref.size());
    i.ref = ref;
    i.bytes = bytes;
    cached_.push_back(i);
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<images::Image> cached_ ABSL_GUARDED_BY(mu_);
};

// Answers every create at once (from a thread of its own, as a runtime would) and records
// the specs it was asked for, by pool.
class InstantRuntime final : public runtime::Runtime {
 public:
  ~InstantRuntime() override { Join(); }
  // Waits for the answers given so far (before the allocator goes).
  void Join() {
    std::vector<std::thread> threads;
    {
      absl::MutexLock lock(&mu_);
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }
  void Create(runtime::CreateRequest request, runtime::CreateCallback done) override {
    runtime::SandboxInfo info;
    {
      absl::MutexLock lock(&mu_);
      info.id = absl::StrCat("cold-", ++created_);
      specs_[request.pool].push_back(request.template_spec);
    }
    info.pool = request.pool;
    info.endpoint = absl::StrCat("unix:/tmp/", info.id);
    absl::MutexLock lock(&mu_);
    threads_.emplace_back(
        [info, done = std::move(done)]() mutable { std::move(done)(std::move(info)); });
  }
  void Delete(std::string, runtime::DeleteCallback done) override {
    std::move(done)(absl::OkStatus());
  }
  void Suspend(std::string, runtime::DoneCallback done) override {
    std::move(done)(absl::UnimplementedError("no"));
  }
  void Resume(std::string, runtime::ResumeCallback done) override {
    std::move(done)(absl::UnimplementedError("no"));
  }
  absl::StatusOr<std::vector<runtime::SandboxInfo>> List() override {
    return std::vector<runtime::SandboxInfo>{};
  }
  std::vector<std::string> specs(const std::string& pool) const {
    absl::MutexLock lock(&mu_);
    auto it = specs_.find(pool);
    return it == specs_.end() ? std::vector<std::string>{} : it->second;
  }

 private:
  mutable absl::Mutex mu_;
  int created_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::vector<std::string>> specs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token, int seconds = 10) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  ctx->AddMetadata("authorization", "Bearer " + token);
  return ctx;
}

std::string Describe(const grpc::Status& s) {
  return absl::StrCat("status ", static_cast<int>(s.error_code()), ": ", s.error_message());
}

v1::ClaimRequest ByImage(const std::string& image, const std::string& id = "") {
  v1::ClaimRequest r;
  r.set_claim_id(id);
  r.set_image(image);
  return r;
}

class ImageClaimsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::Seconds(5));
    runtime_.Join();
    reconciler_.Stop();
    allocator_.reset();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  // The server, with `tenant_lines` appended to the tokens file (alice, bob, team and an
  // admin are always there) and the image claim options given.
  void Start(ImageClaimOptions options, bool with_images = true,
             const std::string& alice_limits = "") {
    char tmpl[] = "/tmp/sbx-image-claims-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/tokens") << kAlice << " alice " << alice_limits << "\n"
                                    << kBob << " bob\n"
                                    << kTeam << " team namespaces=team-a\n"
                                    << kAdmin << " root admin\n";
    auto a = allocator::Allocator::Create(allocator::AllocatorOptions{}, &store_, &runtime_,
                                          &reconciler_, &Clock::Real(), &IdGenerator::Random());
    ASSERT_TRUE(a.ok()) << a.status();
    allocator_ = std::move(*a);
    reconciler_.Start(allocator_.get());
    ServerOptions so;
    so.listen = "127.0.0.1:0";
    so.allocator = allocator_.get();
    so.auth.tokens_file = dir_ + "/tokens";
    so.request_counters = &counters_;
    so.tenant_limiter = &limiter_;
    so.images = with_images ? &images_ : nullptr;
    so.image_claims = std::move(options);
    auto server = Server::Start(so);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
    claims_ = v1::ClaimService::NewStub(channel_);
  }
  void StartLocal(const std::string& alice_limits = "") {
    ImageClaimOptions o;
    o.on_demand = true;
    Start(o, true, alice_limits);
  }

  // Template and pool `name` running `image` (a local template), `warm` kept warm.
  void Declare(const std::string& name, const std::string& image, int warm,
               const std::string& runtime = "local") {
    store::TemplateRecord t;
    t.name = name;
    t.runtime = runtime;
    if (runtime == "local") {
      v1::LocalSpec spec;
      spec.set_image(image);
      t.spec = SerializeSpec(spec);
    } else {
      t.spec = image;  // as the warm-pool controller writes it: the SandboxTemplate's name
    }
    ASSERT_TRUE(allocator::Wait([&](allocator::StatusCallback cb) {
                  allocator_->PutTemplate(t, std::move(cb));
                }).ok());
    store::PoolRecord p;
    p.name = name;
    p.template_name = name;
    p.min_warm = warm;
    p.max_warm = std::max(warm, 1);
    p.empty_pool_policy = store::EmptyPoolPolicy::kWait;
    ASSERT_TRUE(allocator::Wait([&](allocator::StatusCallback cb) {
                  allocator_->PutPool(p, std::move(cb));
                }).ok());
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (allocator_->GetPoolStatus(name)->warm < warm && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(allocator_->GetPoolStatus(name)->warm, warm) << name;
  }

  grpc::Status Claim(const std::string& token, const v1::ClaimRequest& req, v1::ClaimResponse* resp,
                     std::unique_ptr<grpc::ClientContext>* ctx = nullptr) {
    auto c = Ctx(token);
    grpc::Status s = claims_->Claim(c.get(), req, resp);
    if (ctx != nullptr) *ctx = std::move(c);
    return s;
  }

  std::vector<std::string> PoolNames() const {
    std::vector<std::string> names;
    for (const store::PoolRecord& p : allocator_->ListPools()) names.push_back(p.name);
    return names;
  }

  std::string dir_;
  store::MemoryStore store_;
  InstantRuntime runtime_;
  allocator::testing::RefillingReconciler reconciler_{"warm-"};
  FakeImages images_;
  RequestCounters counters_;
  TenantLimiter limiter_;
  std::unique_ptr<allocator::Allocator> allocator_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ClaimService::Stub> claims_;
};

// A declared pool of the image serves it warm, and no on-demand pool is made; among two
// such pools the one with warm sandboxes wins. No tenant limit of images applies to it.
TEST_F(ImageClaimsTest, ADeclaredPoolOfTheImageServesItWarm) {
  ASSERT_NO_FATAL_FAILURE(StartLocal("image_claim_rate=0.001 image_cache_bytes=1"));
  ASSERT_NO_FATAL_FAILURE(Declare("a-cold", kImageA, 0));
  ASSERT_NO_FATAL_FAILURE(Declare("a-warm", kImageA, 2));
  ASSERT_NO_FATAL_FAILURE(Declare("other", kImageB, 2));
  for (const char* id : {"c1", "c2"}) {
    v1::ClaimResponse resp;
    grpc::Status s = Claim(kAlice, ByImage(kImageA, id), &resp);
    ASSERT_TRUE(s.ok()) << Describe(s);
    EXPECT_EQ(resp.claim().pool(), "a-warm");
    EXPECT_EQ(resp.claim().launch_type(), v1::LAUNCH_TYPE_WARM);
  }
  EXPECT_EQ(PoolNames(), (std::vector<std::string>{"a-cold", "a-warm", "other"}));
  EXPECT_EQ(counters_.image_claims(ImageClaimRoute::kDeclaredPool), 2u);
  EXPECT_EQ(counters_.image_claims(ImageClaimRoute::kOnDemandPool), 0u);
  EXPECT_TRUE(runtime_.specs("a-warm").empty()) << "a warm claim created a sandbox";
}

// No pool runs the image: its on-demand pool is made (template = the built-in spec with the
// image, pool with none warm and policy COLD), the claim is served cold from it, and a
// second claim goes to the same pool without writing it again.
TEST_F(ImageClaimsTest, AnImageWithoutAPoolIsServedColdFromItsOnDemandPool) {
  ASSERT_NO_FATAL_FAILURE(StartLocal());
  const std::string name = ImagePools::OnDemandName(kImageB);
  EXPECT_THAT(name, ::testing::MatchesRegex("image-[0-9a-f]{12}"));
  v1::ClaimResponse first, second;
  grpc::Status s = Claim(kAlice, ByImage(kImageB, "first"), &first);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(first.claim().pool(), name);
  EXPECT_EQ(first.claim().launch_type(), v1::LAUNCH_TYPE_COLD);
  absl::StatusOr<store::PoolRecord> pool = allocator_->GetPool(name);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ(pool->template_name, name);
  EXPECT_EQ(pool->min_warm, 0);
  EXPECT_EQ(pool->max_warm, 4);
  EXPECT_EQ(pool->empty_pool_policy, store::EmptyPoolPolicy::kCold);
  EXPECT_EQ(pool->default_wait, absl::Minutes(5));
  absl::StatusOr<store::TemplateRecord> t = allocator_->GetTemplate(name);
  ASSERT_TRUE(t.ok()) << t.status();
  v1::LocalSpec spec;
  ASSERT_TRUE(spec.ParseFromString(t->spec));
  EXPECT_EQ(spec.image(), kImageB);
  EXPECT_FALSE(spec.network());
  EXPECT_EQ(spec.memory_limit_bytes(), 512 << 20);
  EXPECT_EQ(spec.pids_limit(), 512);
  EXPECT_EQ(runtime_.specs(name), std::vector<std::string>{t->spec});

  s = Claim(kBob, ByImage(kImageB, "second"), &second);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(second.claim().pool(), name);
  EXPECT_EQ(allocator_->GetPool(name)->generation, 1u);
  EXPECT_EQ(allocator_->GetTemplate(name)->generation, 1u);
  EXPECT_EQ(counters_.image_claims(ImageClaimRoute::kOnDemandPool), 2u);
  // A retry of the first claim is answered from it.
  v1::ClaimResponse again;
  s = Claim(kAlice, ByImage(kImageB, "first"), &again);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_TRUE(again.replayed());
  EXPECT_EQ(again.claim().sandbox().id(), first.claim().sandbox().id());
  // A policy the caller gives still applies: FAIL on the empty on-demand pool.
  v1::ClaimRequest fail = ByImage(kImageB, "fail");
  fail.set_empty_pool_policy(v1::EMPTY_POOL_POLICY_FAIL);
  v1::ClaimResponse resp;
  s = Claim(kAlice, fail, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr(name));
}

// Many first claims of one image at once, from two tenants: one pool and one template,
// each written once, and every claim served from it.
TEST_F(ImageClaimsTest, RacingFirstClaimsOfAnImageMakeOnePool) {
  ASSERT_NO_FATAL_FAILURE(StartLocal());
  constexpr int kClaims = 16;
  std::vector<std::thread> threads;
  std::vector<grpc::Status> results(kClaims);
  std::vector<std::string> pools(kClaims);
  std::atomic<int> ready{0};
  for (int i = 0; i < kClaims; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < kClaims) std::this_thread::yield();
      v1::ClaimResponse resp;
      results[i] = Claim(i % 2 == 0 ? kAlice : kBob, ByImage(kImageC), &resp);
      pools[i] = resp.claim().pool();
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string name = ImagePools::OnDemandName(kImageC);
  for (int i = 0; i < kClaims; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << Describe(results[i]);
    EXPECT_EQ(pools[i], name) << i;
  }
  EXPECT_EQ(PoolNames(), std::vector<std::string>{name});
  EXPECT_EQ(allocator_->GetPool(name)->generation, 1u) << "the pool was written twice";
  EXPECT_EQ(allocator_->GetTemplate(name)->generation, 1u) << "the template was written twice";
  EXPECT_EQ(runtime_.specs(name).size(), static_cast<size_t>(kClaims));
}

// The race itself, made deterministic by holding the store's commits: the first claim's
// template write is in flight while the others arrive; they write nothing and wait for it,
// and every one is answered with the pool once it is written.
TEST_F(ImageClaimsTest, ClaimsRacingTheWritesOfAnOnDemandPoolWaitForThemAndShareThem) {
  ASSERT_NO_FATAL_FAILURE(StartLocal());
  ImageClaimOptions o;
  o.on_demand = true;
  std::shared_ptr<ImagePools> pools = ImagePools::Create(allocator_.get(), &images_, &limiter_, o);
  Caller alice, bob;
  alice.tenant = "alice";
  bob.tenant = "bob";
  absl::Mutex mu;
  std::vector<absl::StatusOr<ImagePool>> answers;
  store_.Pause();
  for (int i = 0; i < 6; ++i) {
    pools->Resolve(i % 2 == 0 ? alice : bob, kImageC, 1, [&](absl::StatusOr<ImagePool> p) {
      absl::MutexLock lock(&mu);
      answers.push_back(std::move(p));
    });
  }
  EXPECT_EQ(store_.PendingCommits(), 1u) << "a claim racing the first wrote the template again";
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(answers.empty()) << "answered before the pool was written";
  }
  store_.Resume();
  {
    absl::MutexLock lock(&mu);
    auto all = [&] { return answers.size() == 6; };
    ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(10)));
    for (const absl::StatusOr<ImagePool>& a : answers) {
      ASSERT_TRUE(a.ok()) << a.status();
      EXPECT_EQ(a->pool, ImagePools::OnDemandName(kImageC));
      EXPECT_EQ(a->route, ImageRoute::kOnDemandPool);
    }
  }
  EXPECT_EQ(allocator_->GetTemplate(ImagePools::OnDemandName(kImageC))->generation, 1u);
  EXPECT_EQ(allocator_->GetPool(ImagePools::OnDemandName(kImageC))->generation, 1u);
}

// The request's mistakes, and a server that cannot make pools of images.
TEST_F(ImageClaimsTest, PoolAndImageTogetherOrNeitherOrABadReferenceAreInvalid) {
  ASSERT_NO_FATAL_FAILURE(StartLocal());
  ASSERT_NO_FATAL_FAILURE(Declare("py", kImageA, 1));
  v1::ClaimResponse resp;
  v1::ClaimRequest both = ByImage(kImageA);
  both.set_pool("py");
  grpc::Status s = Claim(kAlice, both, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("pool \"py\" and image \"oci:/images/a:1\" are both"));
  s = Claim(kAlice, v1::ClaimRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("pool and image are both empty"));
  s = Claim(kAlice, ByImage("bogus:thing"), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("bogus:thing"));

  v1::ClaimBatchRequest batch;
  batch.set_pool("py");
  batch.set_image(kImageA);
  batch.set_count(2);
  v1::ClaimBatchResponse bresp;
  s = claims_->ClaimBatch(Ctx(kAlice).get(), batch, &bresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("are both set"));
  EXPECT_EQ(counters_.image_claims(ImageClaimRoute::kRefused), 1u)
      << "only the bad reference reached the image's resolution";
  EXPECT_EQ(PoolNames(), std::vector<std::string>{"py"});
}

TEST_F(ImageClaimsTest, ALocalServerWithoutAnImageCacheIsAFailedPrecondition) {
  ImageClaimOptions o;
  o.on_demand = true;
  ASSERT_NO_FATAL_FAILURE(Start(o, /*with_images=*/false));
  v1::ClaimResponse resp;
  grpc::Status s = Claim(kAlice, ByImage(kImageA), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("--image_cache_bytes"));
  EXPECT_THAT(s.error_message(), HasSubstr(kImageA));
  EXPECT_TRUE(PoolNames().empty());
}

// Kubernetes: a pool runs the images of its pod template (here told by the function the
// server is given); an image no pool runs is NOT_FOUND naming it, and nothing is made. An
// image cache on such a server (it takes oci: references only) does not judge Kubernetes
// references.
TEST_F(ImageClaimsTest, WithoutOnDemandPoolsAPoolWhosePodRunsTheImageServesIt) {
  ImageClaimOptions o;
  o.on_demand = false;
  o.kubernetes_images = [](const store::TemplateRecord& t) -> std::vector<std::string> {
    if (t.spec == "python") return {"sidecar:1", "python:3.12"};
    return {"ruby:3"};
  };
  ASSERT_NO_FATAL_FAILURE(Start(o, /*with_images=*/true));
  ASSERT_NO_FATAL_FAILURE(Declare("py", "python", 1, "kubernetes"));
  v1::ClaimResponse resp;
  grpc::Status s = Claim(kAlice, ByImage("python:3.12"), &resp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(resp.claim().pool(), "py");
  s = Claim(kAlice, ByImage("python:3.13"), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("no pool runs image \"python:3.13\""));
  s = Claim(kAlice, ByImage("python 3"), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_EQ(PoolNames(), std::vector<std::string>{"py"});
}

// A tenant confined to namespace team-a: a declared pool of another namespace is not its
// to take (the image's on-demand pool is made in team-a instead); one of team-a is.
TEST_F(ImageClaimsTest, AConfinedTenantGetsPoolsOfItsNamespaces) {
  ASSERT_NO_FATAL_FAILURE(StartLocal());
  ASSERT_NO_FATAL_FAILURE(Declare("a", kImageA, 1));
  v1::ClaimResponse resp;
  grpc::Status s = Claim(kTeam, ByImage(kImageA), &resp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(resp.claim().pool(), absl::StrCat("team-a/", ImagePools::OnDemandName(kImageA)));
  ASSERT_NO_FATAL_FAILURE(Declare("team-a/a", kImageA, 1));
  s = Claim(kTeam, ByImage(kImageA), &resp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(resp.claim().pool(), "team-a/a");
  // Alice may claim anywhere: the default namespace's declared pool.
  s = Claim(kAlice, ByImage(kImageA), &resp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  EXPECT_EQ(resp.claim().pool(), "a");
}

// image_claim_rate: claims of on-demand pools take from the tenant's image bucket (a batch
// its count); beyond it RESOURCE_EXHAUSTED naming the limit with a retry hint. Claims of
// declared pools, other tenants and admins are not limited, nor a retry.
TEST_F(ImageClaimsTest, TheImageClaimRateLimitsOnDemandClaims) {
  ASSERT_NO_FATAL_FAILURE(StartLocal("image_claim_rate=0.01 image_claim_burst=2"));
  ASSERT_NO_FATAL_FAILURE(Declare("a", kImageA, 4));
  v1::ClaimResponse resp;
  ASSERT_TRUE(Claim(kAlice, ByImage(kImageB, "b1"), &resp).ok());
  ASSERT_TRUE(Claim(kAlice, ByImage(kImageC, "c1"), &resp).ok());
  std::unique_ptr<grpc::ClientContext> ctx;
  grpc::Status s = Claim(kAlice, ByImage(kImageB, "b2"), &resp, &ctx);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("tenant \"alice\" is above its image claim rate"));
  EXPECT_THAT(s.error_message(), HasSubstr("image_claim_rate 0.01/s"));
  EXPECT_EQ(ctx->GetServerTrailingMetadata().count("sbx-retry-after-ms"), 1u);
  ASSERT_TRUE(Claim(kAlice, ByImage(kImageB, "b1"), &resp).ok()) << "a retry was refused";
  EXPECT_TRUE(resp.replayed());
  ASSERT_TRUE(Claim(kAlice, ByImage(kImageA), &resp).ok()) << "a declared pool's claim";
  ASSERT_TRUE(Claim(kBob, ByImage(kImageB), &resp).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Claim(kAdmin, ByImage(kImageB), &resp).ok());
  v1::ClaimBatchRequest batch;
  batch.set_image(kImageC);
  batch.set_count(3);
  v1::ClaimBatchResponse bresp;
  s = claims_->ClaimBatch(Ctx(kAlice).get(), batch, &bresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("image_claim_burst"));
  EXPECT_EQ(limiter_.Refusals(), (std::vector<TenantRefusals>{{"alice", "image_claim_rate", 1}}));
  EXPECT_EQ(counters_.image_claims(ImageClaimRoute::kRefused), 2u);
}

// image_cache_bytes: the bytes of images a tenant's claims pulled (the first to find them
// missing) count against it while they are cached; at or above its limit it may pull no
// new image, but may claim cached ones, and removing its images gives room back.
TEST_F(ImageClaimsTest, TheImageCacheBytesOfATenantStopItsNextPull) {
  ASSERT_NO_FATAL_FAILURE(StartLocal("image_cache_bytes=100"));
  v1::ClaimResponse resp;
  ASSERT_TRUE(Claim(kAlice, ByImage(kImageA), &resp).ok());  // alice's pull of A
  images_.Set(kImageA, 150);                                 // ... landed, 150 bytes
  images_.Set(kImageC, 1000);                                // someone else's
  grpc::Status s = Claim(kAlice, ByImage(kImageB), &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("tenant \"alice\" is at its image_cache_bytes 100"));
  EXPECT_THAT(s.error_message(), HasSubstr("take 150 bytes"));
  EXPECT_THAT(s.error_message(), HasSubstr(kImageB));
  EXPECT_FALSE(allocator_->GetPool(ImagePools::OnDemandName(kImageB)).ok());
  ASSERT_TRUE(Claim(kAlice, ByImage(kImageA), &resp).ok()) << "a cached image";
  ASSERT_TRUE(Claim(kAlice, ByImage(kImageC), &resp).ok()) << "a cached image";
  ASSERT_TRUE(Claim(kBob, ByImage(kImageB), &resp).ok()) << "bob has no limit";
  images_.Set(kImageA, 0);  // evicted
  ASSERT_TRUE(Claim(kAlice, ByImage(kImageB), &resp).ok());
  EXPECT_EQ(limiter_.Refusals(), (std::vector<TenantRefusals>{{"alice", "image_cache_bytes", 1}}));
}

// --image_claim_template: on-demand templates copy its spec; missing, the claim is a
// FAILED_PRECONDITION naming it. An existing pool of the on-demand name that runs another
// image is never taken for the image's.
TEST_F(ImageClaimsTest, OnDemandTemplatesCopyTheBaseTemplate) {
  ImageClaimOptions o;
  o.on_demand = true;
  o.base_template = "base";
  ASSERT_NO_FATAL_FAILURE(Start(o));
  v1::ClaimResponse resp;
  grpc::Status s = Claim(kAlice, ByImage(kImageA), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("\"base\" (--image_claim_template)"));

  store::TemplateRecord base;
  base.name = "base";
  base.runtime = "local";
  v1::LocalSpec spec;
  spec.set_network(true);
  spec.set_memory_limit_bytes(int64_t{1} << 30);
  (*spec.mutable_env())["FROM"] = "base";
  spec.set_image("oci:/images/ignored:1");
  base.spec = SerializeSpec(spec);
  ASSERT_TRUE(allocator::Wait([&](allocator::StatusCallback cb) {
                allocator_->PutTemplate(base, std::move(cb));
              }).ok());
  s = Claim(kAlice, ByImage(kImageA), &resp);
  ASSERT_TRUE(s.ok()) << Describe(s);
  v1::LocalSpec made;
  ASSERT_TRUE(made.ParseFromString(allocator_->GetTemplate(resp.claim().pool())->spec));
  EXPECT_EQ(made.image(), kImageA);
  EXPECT_TRUE(made.network());
  EXPECT_EQ(made.memory_limit_bytes(), int64_t{1} << 30);
  EXPECT_EQ(made.env().at("FROM"), "base");

  // The on-demand name of image B taken by a pool of image C.
  ASSERT_NO_FATAL_FAILURE(Declare(ImagePools::OnDemandName(kImageB), kImageC, 0));
  s = Claim(kAlice, ByImage(kImageB), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("runs another image"));
}

// An on-demand template is checked as PutTemplate checks one (the runtime's check): its
// refusal fails the claim, and nothing is written.
TEST_F(ImageClaimsTest, TheRuntimesCheckOfTheOnDemandTemplateCanRefuseIt) {
  ImageClaimOptions o;
  o.on_demand = true;
  o.check_template = [](const v1::Template& t) -> absl::Status {
    if (t.local().image() == kImageB) {
      return absl::InvalidArgumentError(absl::StrCat("template \"", t.name(), "\": not here"));
    }
    return absl::OkStatus();
  };
  ASSERT_NO_FATAL_FAILURE(Start(o));
  v1::ClaimResponse resp;
  grpc::Status s = Claim(kAlice, ByImage(kImageB), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(s);
  EXPECT_THAT(s.error_message(), HasSubstr("not here"));
  EXPECT_THAT(s.error_message(), HasSubstr(ImagePools::OnDemandName(kImageB)));
  EXPECT_TRUE(PoolNames().empty());
  EXPECT_FALSE(allocator_->GetTemplate(ImagePools::OnDemandName(kImageB)).ok());
  ASSERT_TRUE(Claim(kAlice, ByImage(kImageA), &resp).ok());
}

}  // namespace
}  // namespace sbx::server

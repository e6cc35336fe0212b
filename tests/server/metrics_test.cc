// Tests of the server's metrics wiring: the collector over a real Allocator (MemoryStore,
// no runtime) and real RequestCounters, read as Prometheus families, and the text a real
// prometheus::Registry-style serializer makes of them.

#include "src/server/metrics.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "src/allocator/allocator.h"
#include "src/common/clock.h"
#include "src/common/ids.h"
#include "src/store/memory_store.h"
#include "tests/allocator/fakes.h"

namespace sbx::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// The metric of family `name` whose labels include all of `labels`; nullptr if none.
const ClientMetric* Find(const std::vector<MetricFamily>& families, const std::string& name,
                         const std::vector<std::pair<std::string, std::string>>& labels = {}) {
  for (const MetricFamily& f : families) {
    if (f.name != name) continue;
    for (const ClientMetric& m : f.metric) {
      bool all = true;
      for (const auto& [k, v] : labels) {
        bool found = false;
        for (const ClientMetric::Label& l : m.label) found = found || (l.name == k && l.value == v);
        all = all && found;
      }
      if (all) return &m;
    }
  }
  return nullptr;
}

const MetricFamily* FindFamily(const std::vector<MetricFamily>& families, const std::string& name) {
  for (const MetricFamily& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

class MetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = allocator::Allocator::Create({}, &store_, nullptr, &reconciler_, &Clock::Real(),
                                          &IdGenerator::Random());
    ASSERT_TRUE(a.ok()) << a.status();
    allocator_ = std::move(*a);
    store::TemplateRecord t;
    t.name = "t";
    t.runtime = "local";
    ASSERT_TRUE(allocator::Wait([&](auto cb) { allocator_->PutTemplate(t, std::move(cb)); }).ok());
    store::PoolRecord p;
    p.name = "p";
    p.template_name = "t";
    p.min_warm = 3;
    p.max_warm = 3;
    p.empty_pool_policy = store::EmptyPoolPolicy::kFail;
    ASSERT_TRUE(allocator::Wait([&](auto cb) { allocator_->PutPool(p, std::move(cb)); }).ok());
    for (int i = 0; i < 3; ++i) {
      runtime::SandboxInfo info;
      info.id = absl::StrCat("sb", i);
      info.pool = "p";
      info.endpoint = "unix:/tmp/none";
      ASSERT_TRUE(allocator_->AddSandbox(info).ok());
    }
  }

  absl::StatusOr<allocator::ClaimResult> Claim(const std::string& id, int64_t max_claims = 0) {
    allocator::ClaimRequest r;
    r.owner = "alice";
    r.claim_id = id;
    r.pool = "p";
    r.max_claims = max_claims;
    absl::Notification done;
    absl::StatusOr<allocator::ClaimResult> result = absl::UnknownError("not called");
    allocator_->Claim(std::move(r), [&](absl::StatusOr<allocator::ClaimResult> got) {
      result = std::move(got);
      done.Notify();
    });
    done.WaitForNotification();
    return result;
  }

  store::MemoryStore store_;
  allocator::testing::RecordingReconciler reconciler_;
  std::unique_ptr<allocator::Allocator> allocator_;
};

TEST_F(MetricsTest, PoolFamiliesFollowTheAllocator) {
  RequestCounters requests;
  MetricsSources sources;
  sources.allocator = [a = allocator_.get()] { return a; };
  sources.requests = &requests;
  auto collector = NewServerCollector(sources);

  // Before any claim the pool's series exist with zeros.
  std::vector<MetricFamily> before = collector->Collect();
  const ClientMetric* ok =
      Find(before, "sbx_claims_total", {{"pool", "p"}, {"result", "ok"}, {"launch_type", "warm"}});
  ASSERT_NE(ok, nullptr);
  EXPECT_EQ(ok->counter.value, 0);
  ASSERT_NE(Find(before, "sbx_claim_latency_seconds", {{"pool", "p"}, {"launch_type", "warm"}}),
            nullptr);
  EXPECT_EQ(Find(before, "sbx_pool_warm_sandboxes", {{"pool", "p"}})->gauge.value, 3);

  ASSERT_TRUE(Claim("c1").ok());
  ASSERT_TRUE(Claim("c2").ok());
  ASSERT_TRUE(Claim("c2").ok());  // a retry: answered from the table, not counted again
  ASSERT_TRUE(Claim("c3").ok());
  absl::StatusOr<allocator::ClaimResult> none = Claim("c4");  // FAIL policy, pool empty
  ASSERT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(allocator::Wait([&](allocator::StatusCallback cb) {
                allocator_->Release(
                    "alice", "c1",
                    [cb = std::move(cb)](absl::StatusOr<store::ClaimRecord> r) mutable {
                      std::move(cb)(r.status());
                    });
              }).ok());
  requests.CountCall(CountedMethod::kClaim, absl::StatusCode::kOk);
  requests.CountCall(CountedMethod::kClaim, absl::StatusCode::kResourceExhausted);
  requests.CountExec(absl::StatusCode::kOk, absl::Milliseconds(3));

  std::vector<MetricFamily> f = collector->Collect();
  EXPECT_EQ(Find(f, "sbx_claims_total", {{"pool", "p"}, {"result", "ok"}, {"launch_type", "warm"}})
                ->counter.value,
            3);
  const ClientMetric* exhausted = Find(
      f, "sbx_claims_total", {{"pool", "p"}, {"result", "exhausted"}, {"launch_type", "none"}});
  ASSERT_NE(exhausted, nullptr);
  EXPECT_EQ(exhausted->counter.value, 1);
  EXPECT_EQ(Find(f, "sbx_pool_exhausted_total", {{"pool", "p"}})->counter.value, 1);
  EXPECT_EQ(
      Find(f, "sbx_claims_ended_total", {{"pool", "p"}, {"reason", "released"}})->counter.value, 1);

  const ClientMetric* latency =
      Find(f, "sbx_claim_latency_seconds", {{"pool", "p"}, {"launch_type", "warm"}});
  ASSERT_NE(latency, nullptr);
  EXPECT_EQ(latency->histogram.sample_count, 3u);
  EXPECT_GE(latency->histogram.sample_sum, 0);
  const auto& buckets = latency->histogram.bucket;
  ASSERT_EQ(buckets.size(), ClaimLatencyBuckets().size() + 1);
  EXPECT_EQ(buckets.front().upper_bound, 25e-6);
  EXPECT_TRUE(std::isinf(buckets.back().upper_bound));
  EXPECT_EQ(buckets.back().cumulative_count, 3u);
  for (size_t i = 1; i < buckets.size(); ++i) {
    EXPECT_GE(buckets[i].cumulative_count, buckets[i - 1].cumulative_count);
  }

  absl::StatusOr<allocator::PoolStatus> st = allocator_->GetPoolStatus("p");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(Find(f, "sbx_pool_warm_sandboxes", {{"pool", "p"}})->gauge.value, st->warm);
  EXPECT_EQ(Find(f, "sbx_pool_claimed_sandboxes", {{"pool", "p"}})->gauge.value, 2);
  EXPECT_EQ(Find(f, "sbx_pool_target_sandboxes", {{"pool", "p"}})->gauge.value, st->target);
  EXPECT_EQ(Find(f, "sbx_pool_waiting_claims", {{"pool", "p"}})->gauge.value, 0);
  // No refill reconciler given: no starting gauge, no refill families.
  EXPECT_EQ(FindFamily(f, "sbx_pool_starting_sandboxes"), nullptr);
  EXPECT_EQ(FindFamily(f, "sbx_refill_creates_started_total"), nullptr);

  EXPECT_EQ(
      Find(f, "sbx_grpc_requests_total", {{"method", "Claim"}, {"code", "OK"}})->counter.value, 1);
  EXPECT_EQ(
      Find(f, "sbx_grpc_requests_total", {{"method", "Claim"}, {"code", "RESOURCE_EXHAUSTED"}})
          ->counter.value,
      1);
  EXPECT_EQ(
      Find(f, "sbx_grpc_requests_total", {{"method", "Release"}, {"code", "OK"}})->counter.value,
      0);
  EXPECT_EQ(Find(f, "sbx_grpc_requests_total", {{"method", "Release"}, {"code", "NOT_FOUND"}}),
            nullptr);
  EXPECT_EQ(Find(f, "sbx_execs_total", {{"code", "OK"}})->counter.value, 1);
  EXPECT_EQ(Find(f, "sbx_exec_duration_seconds")->histogram.sample_count, 1u);

  // The families serialize to valid exposition text with the expected types.
  const std::string text = prometheus::TextSerializer().Serialize(f);
  EXPECT_NE(text.find("# TYPE sbx_claim_latency_seconds histogram"), std::string::npos);
  EXPECT_NE(
      text.find("sbx_claim_latency_seconds_bucket{pool=\"p\",launch_type=\"warm\",le=\"+Inf\"} 3"),
      std::string::npos)
      << text;
}

TEST_F(MetricsTest, StoreFamiliesComeFromTheReader) {
  MetricsSources sources;
  sources.store = [] {
    StoreCounts c;
    c.commits = 7;
    c.write_batches = 2;
    c.syncs = 2;
    c.committer_busy_seconds = 0.25;
    AtomicHistogram h(CommitLatencyBuckets());
    h.Observe(0.002);
    h.Observe(0.0001);
    c.write_seconds = h.Snapshot();
    return c;
  };
  std::vector<MetricFamily> f = NewServerCollector(sources)->Collect();
  EXPECT_EQ(Find(f, "sbx_store_commits_total")->counter.value, 7);
  EXPECT_EQ(Find(f, "sbx_store_syncs_total")->counter.value, 2);
  EXPECT_EQ(Find(f, "sbx_store_committer_busy_seconds_total")->counter.value, 0.25);
  const ClientMetric* h = Find(f, "sbx_store_commit_duration_seconds");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(h->histogram.sample_count, 2u);
  EXPECT_NEAR(h->histogram.sample_sum, 0.0021, 1e-12);
  // No group histogram given (empty bounds): the family is left out.
  EXPECT_EQ(FindFamily(f, "sbx_store_commit_group_size"), nullptr);
  EXPECT_EQ(FindFamily(f, "sbx_claims_total"), nullptr);
}

// A tenant allowed one claim per second, with a burst of one.
Caller OneClaimPerSecond(const std::string& tenant) {
  Caller c;
  c.tenant = tenant;
  c.limits.claim_rate = 1;
  c.limits.claim_burst = 1;
  return c;
}

TEST_F(MetricsTest, TenantRefusalsAreCountedByTenant) {
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  TenantLimiter limiter(&clock);
  const Caller alice = OneClaimPerSecond("alice");
  ASSERT_TRUE(limiter.TakeClaims(alice, 1).ok());
  ASSERT_FALSE(limiter.TakeClaims(alice, 1).ok());
  ASSERT_FALSE(limiter.TakeClaims(alice, 1).ok());
  MetricsSources sources;
  sources.tenants = &limiter;
  std::vector<MetricFamily> f = NewServerCollector(sources)->Collect();
  const ClientMetric* m =
      Find(f, "sbx_tenant_limited_total", {{"tenant", "alice"}, {"limit", "claim_rate"}});
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->counter.value, 2);
}

// Issue 34: claims by image by how they were served (every route present from the start),
// and the image limits' refusals next to the others.
TEST_F(MetricsTest, ImageClaimsAreCountedByRouteAndImageLimitsByTenant) {
  RequestCounters counters;
  TenantLimiter limiter;
  MetricsSources sources;
  sources.requests = &counters;
  sources.tenants = &limiter;
  std::vector<MetricFamily> f = NewServerCollector(sources)->Collect();
  for (const char* route : {"declared_pool", "on_demand_pool", "refused"}) {
    const ClientMetric* m = Find(f, "sbx_image_claims_total", {{"served", route}});
    ASSERT_NE(m, nullptr) << route;
    EXPECT_EQ(m->counter.value, 0) << route;
  }
  counters.CountImageClaim(ImageClaimRoute::kDeclaredPool);
  counters.CountImageClaim(ImageClaimRoute::kOnDemandPool);
  counters.CountImageClaim(ImageClaimRoute::kOnDemandPool);
  counters.CountImageClaim(ImageClaimRoute::kRefused);
  Caller alice;
  alice.tenant = "alice";
  alice.limits.image_claim_rate = 1;
  alice.limits.image_claim_burst = 1;
  ASSERT_TRUE(limiter.TakeImageClaims(alice, 1).ok());
  ASSERT_FALSE(limiter.TakeImageClaims(alice, 1).ok());
  limiter.CountRefusal("bob", "image_cache_bytes");
  f = NewServerCollector(sources)->Collect();
  EXPECT_EQ(Find(f, "sbx_image_claims_total", {{"served", "declared_pool"}})->counter.value, 1);
  EXPECT_EQ(Find(f, "sbx_image_claims_total", {{"served", "on_demand_pool"}})->counter.value, 2);
  EXPECT_EQ(Find(f, "sbx_image_claims_total", {{"served", "refused"}})->counter.value, 1);
  const ClientMetric* rate =
      Find(f, "sbx_tenant_limited_total", {{"tenant", "alice"}, {"limit", "image_claim_rate"}});
  ASSERT_NE(rate, nullptr);
  EXPECT_EQ(rate->counter.value, 1);
  const ClientMetric* bytes =
      Find(f, "sbx_tenant_limited_total", {{"tenant", "bob"}, {"limit", "image_cache_bytes"}});
  ASSERT_NE(bytes, nullptr);
  EXPECT_EQ(bytes->counter.value, 1);
}

// Issue 22: the max_claims refusals and the claims held come from the allocator, next to
// the claim-rate refusals of the server's limiter, in one family.
TEST_F(MetricsTest, MaxClaimsRefusalsAndClaimsHeldAreCountedByTenant) {
  FakeClock clock(absl::FromUnixSeconds(1'800'000'000));
  TenantLimiter limiter(&clock);
  const Caller alice = OneClaimPerSecond("alice");
  ASSERT_TRUE(limiter.TakeClaims(alice, 1).ok());
  ASSERT_FALSE(limiter.TakeClaims(alice, 1).ok());
  ASSERT_TRUE(Claim("c1", 2).ok());
  ASSERT_TRUE(Claim("c2", 2).ok());
  for (const char* id : {"c3", "c4", "c5"}) {
    EXPECT_EQ(Claim(id, 2).status().code(), absl::StatusCode::kResourceExhausted) << id;
  }
  MetricsSources sources;
  sources.tenants = &limiter;
  sources.allocator = [a = allocator_.get()] { return a; };
  std::vector<MetricFamily> f = NewServerCollector(sources)->Collect();
  const ClientMetric* rate =
      Find(f, "sbx_tenant_limited_total", {{"tenant", "alice"}, {"limit", "claim_rate"}});
  ASSERT_NE(rate, nullptr);
  EXPECT_EQ(rate->counter.value, 1);
  const ClientMetric* max =
      Find(f, "sbx_tenant_limited_total", {{"tenant", "alice"}, {"limit", "max_claims"}});
  ASSERT_NE(max, nullptr);
  EXPECT_EQ(max->counter.value, 3);
  const ClientMetric* held = Find(f, "sbx_tenant_claims", {{"tenant", "alice"}});
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->gauge.value, 2);
}

TEST(MetricsOptionsTest, ValidatesTheAddress) {
  MetricsOptions o;
  EXPECT_TRUE(o.enabled());
  EXPECT_TRUE(o.Validate().ok());
  o.listen = "off";
  EXPECT_FALSE(o.enabled());
  EXPECT_TRUE(o.Validate().ok());
  o.listen = "";
  EXPECT_FALSE(o.enabled());
  o.listen = "127.0.0.1";
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.listen = "127.0.0.1:70000";
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MetricsEndpointTest, ServesRegistryAndCollectorOnPortZero) {
  auto registry = std::make_shared<prometheus::Registry>();
  RegisterBuildInfo(*registry);
  RequestCounters requests;
  MetricsSources sources;
  sources.requests = &requests;
  MetricsOptions options;
  options.listen = "127.0.0.1:0";
  auto endpoint = MetricsEndpoint::Start(options, registry, sources);
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  EXPECT_GT((*endpoint)->port(), 0);
  // A second endpoint on the same port is refused with a clear error.
  options.listen = absl::StrCat("127.0.0.1:", (*endpoint)->port());
  auto second = MetricsEndpoint::Start(options, registry, sources);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace sbx::server

#include "src/server/metrics.h"
#include "src/common/dropped.h"

#include <cmath>
#include <exception>
#include <fstream>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"
#include "src/allocator/allocator.h"
#include "src/allocator/refill.h"
#include "src/allocator/snapshots.h"
#include "src/common/build_info.h"

namespace sbx::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

constexpr int kCodes = 17;

const char* PathName(int path) {
  switch (static_cast<allocator::ClaimPath>(path)) {
    case allocator::ClaimPath::kWarm:
      return "warm";
    case allocator::ClaimPath::kWait:
      return "wait";
    case allocator::ClaimPath::kCold:
      return "cold";
    case allocator::ClaimPath::kNone:
      return "none";
  }
  return "none";
}

// The `result` label of a claim: ok, exhausted, timeout, or the status code in lower case.
std::string ResultName(int code) {
  switch (static_cast<absl::StatusCode>(code)) {
    case absl::StatusCode::kOk:
      return "ok";
    case absl::StatusCode::kResourceExhausted:
      return "exhausted";
    case absl::StatusCode::kDeadlineExceeded:
      return "timeout";
    default:
      return absl::AsciiStrToLower(absl::StatusCodeToString(static_cast<absl::StatusCode>(code)));
  }
}

std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void AddValue(MetricFamily* f, Labels labels, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f->type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f->metric.push_back(std::move(m));
}

void AddHistogram(MetricFamily* f, Labels labels, const HistogramSnapshot& h) {
  ClientMetric m;
  m.label = std::move(labels);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h.counts.size(); ++i) {
    cumulative += h.counts[i];
    ClientMetric::Bucket b;
    b.cumulative_count = cumulative;
    b.upper_bound = i < h.bounds.size() ? h.bounds[i] : std::numeric_limits<double>::infinity();
    m.histogram.bucket.push_back(b);
  }
  m.histogram.sample_count = cumulative;
  m.histogram.sample_sum = h.sum;
  f->metric.push_back(std::move(m));
}

void CollectSnapshots(const allocator::SnapshotStats& st, std::vector<MetricFamily>* out) {
  auto gauge = [&](const char* name, const char* help, double v) {
    auto f = Family(name, help, MetricType::Gauge);
    AddValue(&f, {}, v);
    out->push_back(std::move(f));
  };
  auto counter = [&](const char* name, const char* help, double v) {
    auto f = Family(name, help, MetricType::Counter);
    AddValue(&f, {}, v);
    out->push_back(std::move(f));
  };
  gauge("sbx_snapshots", "Snapshots held (every tenant's)", static_cast<double>(st.snapshots));
  gauge("sbx_snapshot_bytes", "Bytes of the snapshots held (file contents and link targets)",
        static_cast<double>(st.bytes));
  counter("sbx_snapshots_created_total", "Snapshots made since the start",
          static_cast<double>(st.created));
  counter("sbx_snapshot_failures_total",
          "Snapshots that failed since the start (quota refusals included)",
          static_cast<double>(st.failed));
  counter("sbx_snapshots_deleted_total", "Snapshots deleted since the start",
          static_cast<double>(st.deleted));
  counter("sbx_snapshot_quota_refusals_total",
          "Snapshots stopped by a tenant's --snapshot_quota_bytes",
          static_cast<double>(st.quota_refusals));
  auto f = Family("sbx_snapshot_seconds",
                  "Time of a snapshot from the request to its durable record (freeze, copy, "
                  "sync, thaw, commit)",
                  MetricType::Histogram);
  AddHistogram(&f, {}, st.seconds);
  out->push_back(std::move(f));
  auto results = [&](const char* name, const char* help, uint64_t ok, uint64_t failed) {
    auto r = Family(name, help, MetricType::Counter);
    AddValue(&r, {{"result", "ok"}}, static_cast<double>(ok));
    AddValue(&r, {{"result", "error"}}, static_cast<double>(failed));
    out->push_back(std::move(r));
  };
  results("sbx_snapshot_resets_total", "Resets of a sandbox to a snapshot, by result", st.resets,
          st.reset_failures);
  results("sbx_snapshot_forks_total", "Fork calls, by result", st.forks, st.fork_failures);
  counter("sbx_snapshot_forked_claims_total", "Claims answered by Fork calls",
          static_cast<double>(st.forked));
  auto reset = Family("sbx_snapshot_reset_seconds",
                      "Time of a successful reset, from the request to the sandbox serving "
                      "again from the snapshot's files",
                      MetricType::Histogram);
  AddHistogram(&reset, {}, st.reset_seconds);
  out->push_back(std::move(reset));
  auto fork = Family("sbx_snapshot_fork_seconds",
                     "Time of a successful Fork call, until every fork is up (a claim source's "
                     "snapshot included)",
                     MetricType::Histogram);
  AddHistogram(&fork, {}, st.fork_seconds);
  out->push_back(std::move(fork));
}

class ServerCollector final : public prometheus::Collectable {
 public:
  explicit ServerCollector(MetricsSources sources) : sources_(std::move(sources)) {}

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> out;
    const allocator::Allocator* a = sources_.allocator ? sources_.allocator() : nullptr;
    if (a != nullptr) CollectPools(*a, &out);
    if (sources_.refill != nullptr) CollectRefill(&out);
    if (const allocator::Snapshots* snaps = sources_.snapshots ? sources_.snapshots() : nullptr) {
      CollectSnapshots(snaps->stats(), &out);
    }
    if (sources_.sandbox_output_dropped) {
      auto f = Family("sbx_sandbox_output_dropped_bytes_total",
                      "Bytes local sandboxes wrote to their stdout/stderr (bubblewrap's and the "
                      "daemon's, which a workload can reach through /proc/1/fd) that their "
                      "bounded logs (2 x 1 MiB each) did not keep",
                      MetricType::Counter);
      AddValue(&f, {}, static_cast<double>(sources_.sandbox_output_dropped()));
      out.push_back(std::move(f));
    }
    {
      // Errors with no caller to return to (src/common/dropped.h), by the site that
      // dropped them; present (empty) when there were none.
      auto f = Family("sbx_dropped_errors_total",
                      "Errors of work that no caller waits for (a claim expiring, a sandbox "
                      "found gone, a clean-up), logged and counted by the site that met them",
                      MetricType::Counter);
      for (const auto& [site, n] : DroppedErrorCounts()) {
        AddValue(&f, {{"site", site}}, static_cast<double>(n));
      }
      out.push_back(std::move(f));
    }
    if (sources_.images != nullptr) CollectImages(&out);
    if (sources_.store) CollectStore(&out);
    if (sources_.requests != nullptr) CollectRequests(&out);
    if (sources_.tenants != nullptr || a != nullptr) CollectTenants(a, &out);
    return out;
  }

 private:
  void CollectImages(std::vector<MetricFamily>* out) const {
    const images::ImageCacheStats st = sources_.images->Stats();
    auto one = [out](const char* name, const char* help, MetricType type, double value) {
      auto f = Family(name, help, type);
      AddValue(&f, {}, value);
      out->push_back(std::move(f));
    };
    one("sbx_image_cache_bytes", "Bytes the image cache's unpacked images take on disk",
        MetricType::Gauge, static_cast<double>(st.bytes));
    one("sbx_image_cache_budget_bytes", "The image cache's budget (--image_cache_bytes)",
        MetricType::Gauge, static_cast<double>(st.budget_bytes));
    one("sbx_image_cache_images", "Images in the cache", MetricType::Gauge,
        static_cast<double>(st.images));
    one("sbx_image_cache_hits_total", "Image uses the cache answered without a pull",
        MetricType::Counter, static_cast<double>(st.hits));
    one("sbx_image_cache_misses_total", "Image pulls made (fetch and unpack)", MetricType::Counter,
        static_cast<double>(st.misses));
    one("sbx_image_cache_failures_total",
        "Image uses that failed (bad source, digest mismatch, over budget, tool errors)",
        MetricType::Counter, static_cast<double>(st.failures));
    one("sbx_image_cache_evictions_total", "Images evicted to make room", MetricType::Counter,
        static_cast<double>(st.evictions));
    one("sbx_image_cache_unpack_seconds_total", "Time spent fetching and unpacking images",
        MetricType::Counter, st.unpack_seconds);
  }

  void CollectPools(const allocator::Allocator& a, std::vector<MetricFamily>* out) const {
    auto claims = Family("sbx_claims_total",
                         "Claims answered, by pool, result (ok, exhausted, timeout, or the error "
                         "code) and launch_type (warm, wait, cold, none); a batch counts once per "
                         "claim it asked for",
                         MetricType::Counter);
    auto latency = Family("sbx_claim_latency_seconds",
                          "Time from a claim reaching the allocator until it was durable, of "
                          "granted claims, by pool and launch_type",
                          MetricType::Histogram);
    auto ended =
        Family("sbx_claims_ended_total",
               "Claims ended, by pool and reason (released, expired, lost)", MetricType::Counter);
    auto exhausted = Family("sbx_pool_exhausted_total",
                            "Claims and batches that found no warm sandbox to take in the pool",
                            MetricType::Counter);
    auto warm =
        Family("sbx_pool_warm_sandboxes", "Warm sandboxes ready to be claimed", MetricType::Gauge);
    auto claimed =
        Family("sbx_pool_claimed_sandboxes", "Sandboxes held by active claims", MetricType::Gauge);
    auto starting =
        Family("sbx_pool_starting_sandboxes",
               "Sandboxes being created for the pool by the refill reconciler", MetricType::Gauge);
    auto target = Family("sbx_pool_target_sandboxes",
                         "Warm sandboxes the pool should have now, between its floor and "
                         "ceiling (static sizing: floor plus waiting claims; demand sizing: "
                         "the demand estimate plus waiting claims)",
                         MetricType::Gauge);
    auto reason = Family("sbx_pool_target_reason",
                         "1 for what decides the pool's target now (floor, demand, waiters, "
                         "burst, ceiling), 0 for the others",
                         MetricType::Gauge);
    auto demand = Family("sbx_pool_demand_sandboxes",
                         "Warm sandboxes the measured demand calls for (claims expected while a "
                         "new sandbox is made, with margin), before waiters, floor and ceiling",
                         MetricType::Gauge);
    auto rate = Family("sbx_pool_arrival_rate",
                       "Claims per second reaching the pool, averaged over the last seconds "
                       "(window=short) and minutes (window=long)",
                       MetricType::Gauge);
    auto create_latency = Family("sbx_pool_create_latency_seconds",
                                 "Median time the pool's recent sandboxes took from create to "
                                 "ready, as demand sizing uses it",
                                 MetricType::Gauge);
    auto waiting =
        Family("sbx_pool_waiting_claims", "Claims queued for a sandbox (the wait queue's depth)",
               MetricType::Gauge);
    auto min_warm =
        Family("sbx_pool_min_warm", "The pool's floor of warm sandboxes", MetricType::Gauge);
    auto max_warm =
        Family("sbx_pool_max_warm", "The pool's ceiling of warm sandboxes", MetricType::Gauge);
    auto create_failures =
        Family("sbx_pool_create_failures_total",
               "Sandbox creates for the pool that the runtime refused or that failed (a "
               "template refused at create, e.g. a mount holding the server's files; "
               "PoolStatus.last_error says why)",
               MetricType::Counter);

    for (const store::PoolRecord& record : a.ListPools()) {
      absl::StatusOr<allocator::PoolStatus> st = a.GetPoolStatus(record.name);
      if (!st.ok()) continue;  // deleted since the list
      const std::string& pool = record.name;
      const allocator::PoolCountsSnapshot& c = st->counts;
      for (int code = 0; code < kCodes; ++code) {
        for (int path = 0; path < allocator::kClaimPaths; ++path) {
          const uint64_t n = c.claims[code][path];
          // ok/warm always, so that the series exists from the pool's creation.
          if (n == 0 && !(code == 0 && path == 0)) continue;
          AddValue(&claims,
                   {{"pool", pool}, {"result", ResultName(code)}, {"launch_type", PathName(path)}},
                   static_cast<double>(n));
        }
      }
      for (int path = 0; path < allocator::kClaimPaths; ++path) {
        if (path != 0 && c.latency[path].count() == 0) continue;
        AddHistogram(&latency, {{"pool", pool}, {"launch_type", PathName(path)}}, c.latency[path]);
      }
      static constexpr const char* kReasons[] = {"released", "expired", "lost"};
      for (int i = 0; i < 3; ++i) {
        AddValue(&ended, {{"pool", pool}, {"reason", kReasons[i]}},
                 static_cast<double>(c.ended[i]));
      }
      AddValue(&exhausted, {{"pool", pool}}, static_cast<double>(c.exhausted));
      AddValue(&warm, {{"pool", pool}}, static_cast<double>(st->warm));
      AddValue(&claimed, {{"pool", pool}}, static_cast<double>(st->claimed));
      AddValue(&target, {{"pool", pool}}, static_cast<double>(st->target));
      for (allocator::TargetReason r :
           {allocator::TargetReason::kFloor, allocator::TargetReason::kDemand,
            allocator::TargetReason::kWaiters, allocator::TargetReason::kBurst,
            allocator::TargetReason::kCeiling}) {
        AddValue(&reason, {{"pool", pool}, {"reason", allocator::TargetReasonName(r)}},
                 st->target_reason == r ? 1 : 0);
      }
      AddValue(&demand, {{"pool", pool}}, static_cast<double>(st->demand.demand));
      AddValue(&rate, {{"pool", pool}, {"window", "short"}}, st->demand.rate_short);
      AddValue(&rate, {{"pool", pool}, {"window", "long"}}, st->demand.rate_long);
      AddValue(&create_latency, {{"pool", pool}}, absl::ToDoubleSeconds(st->demand.create_latency));
      AddValue(&waiting, {{"pool", pool}}, static_cast<double>(st->waiting));
      AddValue(&min_warm, {{"pool", pool}}, st->min_warm);
      AddValue(&max_warm, {{"pool", pool}}, st->max_warm);
      AddValue(&create_failures, {{"pool", pool}}, static_cast<double>(st->create_failures));
      if (sources_.refill != nullptr) {
        AddValue(&starting, {{"pool", pool}}, sources_.refill->creating(pool));
      }
    }
    for (MetricFamily* f :
         {&claims, &latency, &ended, &exhausted, &warm, &claimed, &starting, &target, &reason,
          &demand, &rate, &create_latency, &waiting, &min_warm, &max_warm, &create_failures}) {
      if (!f->metric.empty()) out->push_back(std::move(*f));
    }
  }

  void CollectRefill(std::vector<MetricFamily>* out) const {
    const allocator::RefillStats s = sources_.refill->stats();
    auto add = [&](const char* name, const char* help, uint64_t v) {
      auto f = Family(name, help, MetricType::Counter);
      AddValue(&f, {}, static_cast<double>(v));
      out->push_back(std::move(f));
    };
    add("sbx_refill_creates_started_total", "Sandbox creates the refill reconciler started",
        s.creates_started);
    add("sbx_refill_creates_succeeded_total", "Sandbox creates that succeeded",
        s.creates_succeeded);
    add("sbx_refill_creates_failed_total", "Sandbox creates that failed (retried with backoff)",
        s.creates_failed);
    add("sbx_refill_deletes_started_total", "Sandbox deletes (retired sandboxes) started",
        s.deletes_started);
    add("sbx_refill_deletes_failed_total", "Sandbox deletes that failed", s.deletes_failed);
    auto pending = Family("sbx_refill_pending_deletes",
                          "Retired sandboxes waiting for their delete", MetricType::Gauge);
    AddValue(&pending, {}, static_cast<double>(sources_.refill->pending_deletes()));
    out->push_back(std::move(pending));
  }

  void CollectStore(std::vector<MetricFamily>* out) const {
    const StoreCounts s = sources_.store();
    auto add = [&](const char* name, const char* help, uint64_t v) {
      auto f = Family(name, help, MetricType::Counter);
      AddValue(&f, {}, static_cast<double>(v));
      out->push_back(std::move(f));
    };
    add("sbx_store_commits_total", "Store commits completed (each claim, release, ... is one)",
        s.commits);
    add("sbx_store_writes_total", "Physical store writes (one per group commit)", s.write_batches);
    add("sbx_store_syncs_total", "fsyncs the store issued", s.syncs);
    {
      auto f = Family("sbx_store_committer_busy_seconds_total",
                      "Time the store's committer thread spent on group commits (write, fsync, "
                      "replication, callbacks); its rate is the committer's busy fraction",
                      MetricType::Counter);
      AddValue(&f, {}, s.committer_busy_seconds);
      out->push_back(std::move(f));
    }
    {
      auto f = Family("sbx_store_syncer_busy_seconds_total",
                      "Time the pipelined commit's syncer thread spent on groups (fsync of the "
                      "log, the standby's acknowledgement, the answers)",
                      MetricType::Counter);
      AddValue(&f, {}, s.syncer_busy_seconds);
      out->push_back(std::move(f));
    }
    auto gauge = [&](const char* name, const char* help, double v) {
      auto f = Family(name, help, MetricType::Gauge);
      AddValue(&f, {}, v);
      out->push_back(std::move(f));
    };
    gauge("sbx_store_writable",
          "1 while the store accepts writes; 0 while it refuses them (disk below its reserve, "
          "after a write error until it recovers, or opened read-only on a full disk)",
          s.writable ? 1 : 0);
    if (s.free_bytes.has_value()) {
      gauge("sbx_store_free_bytes", "Free bytes of the store's file system at its last check",
            static_cast<double>(*s.free_bytes));
      gauge("sbx_store_min_free_bytes",
            "The store's reserve: below this many free bytes it refuses writes (0: none)",
            static_cast<double>(s.min_free_bytes));
    }
    if (!s.write_seconds.bounds.empty()) {
      auto f = Family("sbx_store_commit_duration_seconds",
                      "Time of one group commit: the RocksDB write and its fsync",
                      MetricType::Histogram);
      AddHistogram(&f, {}, s.write_seconds);
      out->push_back(std::move(f));
    }
    if (!s.group_commits.bounds.empty()) {
      auto f = Family("sbx_store_commit_group_size", "Commits carried by one group commit",
                      MetricType::Histogram);
      AddHistogram(&f, {}, s.group_commits);
      out->push_back(std::move(f));
    }
  }

  void CollectRequests(std::vector<MetricFamily>* out) const {
    const RequestCounters& r = *sources_.requests;
    auto calls = Family("sbx_grpc_requests_total",
                        "Calls of the claim methods by method and final gRPC status code",
                        MetricType::Counter);
    for (int m = 0; m < kCountedMethods; ++m) {
      for (int code = 0; code < kCodes; ++code) {
        const uint64_t n = r.calls(static_cast<CountedMethod>(m), code);
        if (n == 0 && code != 0) continue;
        AddValue(&calls,
                 {{"method", MethodName(static_cast<CountedMethod>(m))}, {"code", CodeName(code)}},
                 static_cast<double>(n));
      }
    }
    out->push_back(std::move(calls));
    auto image_claims =
        Family("sbx_image_claims_total",
               "Claim and ClaimBatch calls by image, by how they were served: from a declared "
               "pool of the image, from its on-demand pool, or refused before reaching a pool",
               MetricType::Counter);
    for (int route = 0; route < kImageClaimRoutes; ++route) {
      AddValue(&image_claims,
               {{"served", ImageClaimRouteName(static_cast<ImageClaimRoute>(route))}},
               static_cast<double>(r.image_claims(static_cast<ImageClaimRoute>(route))));
    }
    out->push_back(std::move(image_claims));
    auto execs =
        Family("sbx_execs_total", "Exec calls by final gRPC status code", MetricType::Counter);
    for (int code = 0; code < kCodes; ++code) {
      const uint64_t n = r.execs(code);
      if (n == 0 && code != 0) continue;
      AddValue(&execs, {{"code", CodeName(code)}}, static_cast<double>(n));
    }
    out->push_back(std::move(execs));
    auto exec_seconds =
        Family("sbx_exec_duration_seconds",
               "Exec calls from their first message until their final status (the command's run "
               "time plus set-up)",
               MetricType::Histogram);
    AddHistogram(&exec_seconds, {}, r.exec_seconds());
    out->push_back(std::move(exec_seconds));
  }

  // The claim-rate refusals come from the server's TenantLimiter, the max_claims ones and
  // the claims held from the allocator, which keeps that count (allocator::OwnerClaims).
  void CollectTenants(const allocator::Allocator* a, std::vector<MetricFamily>* out) const {
    auto limited = Family("sbx_tenant_limited_total",
                          "Claim and ClaimBatch calls refused because the tenant was above a "
                          "limit of its tokens-file line, by tenant and limit (claim_rate, "
                          "max_claims, image_claim_rate, image_cache_bytes)",
                          MetricType::Counter);
    if (sources_.tenants != nullptr) {
      for (const TenantRefusals& r : sources_.tenants->Refusals()) {
        AddValue(&limited, {{"tenant", r.tenant}, {"limit", r.limit}},
                 static_cast<double>(r.count));
      }
    }
    if (a != nullptr) {
      auto held = Family("sbx_tenant_claims",
                         "Claims a tenant holds now (waiting for a sandbox, being granted or "
                         "active), which its max_claims bounds",
                         MetricType::Gauge);
      for (const allocator::OwnerClaimCount& c : a->OwnerClaimCounts()) {
        AddValue(&held, {{"tenant", c.owner}}, static_cast<double>(c.held));
        if (c.refused > 0) {
          AddValue(&limited, {{"tenant", c.owner}, {"limit", "max_claims"}},
                   static_cast<double>(c.refused));
        }
      }
      out->push_back(std::move(held));
    }
    out->push_back(std::move(limited));
  }

  const MetricsSources sources_;
};

}  // namespace

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write port file \"", tmp, "\""));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename \"", tmp, "\" to \"", path, "\""));
  }
  return absl::OkStatus();
}

const char* ImageClaimRouteName(ImageClaimRoute r) {
  switch (r) {
    case ImageClaimRoute::kDeclaredPool:
      return "declared_pool";
    case ImageClaimRoute::kOnDemandPool:
      return "on_demand_pool";
    case ImageClaimRoute::kRefused:
      return "refused";
  }
  return "unknown";
}

const char* MethodName(CountedMethod m) {
  switch (m) {
    case CountedMethod::kClaim:
      return "Claim";
    case CountedMethod::kClaimBatch:
      return "ClaimBatch";
    case CountedMethod::kRelease:
      return "Release";
  }
  return "call";
}

absl::Status MetricsOptions::Validate() const {
  if (!enabled()) return absl::OkStatus();
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(listen).substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics listen address \"", listen,
                     "\" is not host:port with a port from 0 to 65535 (or \"off\")"));
  }
  return absl::OkStatus();
}

std::shared_ptr<prometheus::Collectable> NewServerCollector(MetricsSources sources) {
  return std::make_shared<ServerCollector>(std::move(sources));
}

void RegisterBuildInfo(prometheus::Registry& registry) {
  prometheus::BuildGauge()
      .Name("sbx_build_info")
      .Help("Always 1; the labels say which sbx-server build is running")
      .Register(registry)
      .Add({{"version", Version()}, {"commit", GitCommit()}})
      .Set(1);
  // The same under upstream agent-sandbox's name and labels, for its dashboards (its
  // build_date and go_version have no meaning here and are left out).
#if defined(__clang__)
  const std::string compiler = absl::StrCat("clang ", __clang_major__, ".", __clang_minor__);
#elif defined(__GNUC__)
  const std::string compiler = absl::StrCat("gcc ", __GNUC__, ".", __GNUC_MINOR__);
#else
  const std::string compiler = "unknown";
#endif
#if defined(__x86_64__)
  const char* platform = "linux/amd64";
#elif defined(__aarch64__)
  const char* platform = "linux/arm64";
#else
  const char* platform = "linux/unknown";
#endif
  prometheus::BuildGauge()
      .Name("agent_sandbox_build_info")
      .Help("Always 1; upstream agent-sandbox's build metadata labels for this sbx-server")
      .Register(registry)
      .Add({{"git_version", Version()},
            {"git_commit", GitCommit()},
            {"compiler", compiler},
            {"platform", platform}})
      .Set(1);
}

void RegisterClaimsLostAtRestart(prometheus::Registry& registry,
                                 const std::map<std::string, uint64_t>& lost) {
  auto& family = prometheus::BuildCounter()
                     .Name("sbx_claims_lost_at_restart_total")
                     .Help(
                         "Acknowledged claims marked LOST by the reconciliation with the "
                         "runtime when this sbx-server started, by reason")
                     .Register(registry);
  family.Add({{"reason", kLostSandboxMissing}});  // present (0) when nothing was lost
  for (const auto& [reason, n] : lost) {
    family.Add({{"reason", reason}}).Increment(static_cast<double>(n));
  }
}

void RegisterStartSandboxesKept(prometheus::Registry& registry, uint64_t claimed,
                                uint64_t over_limit) {
  auto& family = prometheus::BuildGauge()
                     .Name("sbx_start_sandboxes_kept")
                     .Help(
                         "Sandboxes running but unknown to the store that the reconciliation "
                         "at this sbx-server's start did not delete, by reason: claimed (held "
                         "by a claim the runtime records, adopted), over_delete_limit (more "
                         "than the start may delete without --start_confirm_deletes)")
                     .Register(registry);
  family.Add({{"reason", "claimed"}}).Set(static_cast<double>(claimed));
  family.Add({{"reason", "over_delete_limit"}}).Set(static_cast<double>(over_limit));
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const MetricsOptions& options, std::shared_ptr<prometheus::Registry> registry,
    MetricsSources sources) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (!options.enabled()) {
    return absl::InvalidArgumentError("metrics are off (--metrics_listen); nothing to start");
  }
  std::unique_ptr<MetricsEndpoint> endpoint(new MetricsEndpoint());
  endpoint->registry_ = std::move(registry);
  endpoint->extra_ = sources.extra;
  endpoint->collector_ = NewServerCollector(std::move(sources));
  try {
    // civetweb takes "host:port"; one worker thread is plenty for a scraper or two.
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(options.listen, 1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on \"", options.listen,
                                               "\" (address in use, or not local): ", e.what()));
  }
  endpoint->exposer_->RegisterCollectable(endpoint->registry_);
  endpoint->exposer_->RegisterCollectable(endpoint->collector_);
  for (const auto& extra : endpoint->extra_) endpoint->exposer_->RegisterCollectable(extra);
  const std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  endpoint->port_ = ports.empty() ? 0 : ports.front();
  if (!options.port_file.empty()) {
    if (absl::Status s = WritePortFile(options.port_file, endpoint->port_); !s.ok()) return s;
  }
  spdlog::info("metrics: serving /metrics on port {} (listen \"{}\")", endpoint->port_,
               options.listen);
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  // Stop serving before the collector and registry go.
  exposer_.reset();
}

}  // namespace sbx::server

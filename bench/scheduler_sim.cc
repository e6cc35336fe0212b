// scheduler_sim: the trace-driven simulation of pool sizing (issue 22; docs/benchmarks.md,
// "Pool sizing"). It drives the real Allocator and RefillReconciler on a simulated clock
// with a runtime whose sandboxes are ready after a configurable create latency, so an
// hour of traffic runs in seconds, and compares sizing strategies side by side on
// synthetic traces:
//   steady   Poisson arrivals at 20/s
//   diurnal  a day compressed into the run: 5/s at night to 50/s at noon
//   rl       an RL trainer: 2,000 claims at once every minute, held 20 s (an episode)
//   spikes   agents: 10/s with spikes to 40/s for a minute at random, every 5 min on
//            average
// Strategies: static pools sized for the peak (the most claims seen in any window of the
// longest create latency) and for the mean (mean rate x mean create latency), today's
// floor (the mean) plus waiters, and demand sizing (floor 0).
// For each: the share of claims that waited for a cold start, claim latency p50/p99 (on
// the simulated clock), and idle warm sandbox-seconds (integral of warm sandboxes).
// Claims are WAIT with a wait longer than the run; all randomness is seeded.

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "src/allocator/allocator.h"
#include "src/allocator/refill.h"
#include "src/common/clock.h"
#include "src/common/ids.h"
#include "src/common/status_macros.h"
#include "src/runtime/runtime.h"
#include "src/store/memory_store.h"

namespace sbx::bench {
namespace {

using allocator::Allocator;

struct Settings {
  double minutes = 60;
  // Traffic before the measured minutes, not counted: the estimators learn the trace, as
  // whoever sized a static pool for its peak or mean learned it before.
  double warmup_minutes = 10;
  double create_latency_s = 2;
  double latency_spread = 0.2;  // each create takes latency x U(1 - spread, 1 + spread)
  uint64_t seed = 1;
  double step_ms = 10;
  allocator::DemandOptions demand;
};

struct Arrival {
  double t;       // seconds from the start of traffic
  double hold_s;  // how long the claim is held once granted
};

struct Trace {
  std::string name;
  std::vector<Arrival> arrivals;  // sorted by t
};

// Non-homogeneous Poisson arrivals by thinning: rate(t) <= max_rate.
std::vector<Arrival> Poisson(std::mt19937_64& rng, double duration, double max_rate,
                             const std::function<double(double)>& rate,
                             const std::function<double()>& hold) {
  std::vector<Arrival> out;
  std::exponential_distribution<double> gap(max_rate);
  std::uniform_real_distribution<double> u(0, 1);
  for (double t = gap(rng); t < duration; t += gap(rng)) {
    if (u(rng) * max_rate <= rate(t)) out.push_back({t, hold()});
  }
  return out;
}

std::vector<Trace> MakeTraces(const Settings& s, const std::string& only) {
  const double duration = (s.warmup_minutes + s.minutes) * 60;
  std::vector<Trace> traces;
  auto want = [&](const char* name) { return only == "all" || only == name; };
  if (want("steady")) {
    std::mt19937_64 rng(s.seed);
    std::exponential_distribution<double> hold(1.0 / 30);
    traces.push_back(
        {"steady", Poisson(
                       rng, duration, 20, [](double) { return 20.0; }, [&] { return hold(rng); })});
  }
  if (want("diurnal")) {
    std::mt19937_64 rng(s.seed + 1);
    std::exponential_distribution<double> hold(1.0 / 30);
    // Midnight when the measured run starts and ends, noon halfway.
    const double day = s.minutes * 60;
    const double warmup = s.warmup_minutes * 60;
    auto rate = [day, warmup](double t) {
      return 5 + 45 * (1 - std::cos(2 * M_PI * (t - warmup) / day)) / 2;
    };
    traces.push_back({"diurnal", Poisson(rng, duration, 50, rate, [&] { return hold(rng); })});
  }
  if (want("rl")) {
    std::mt19937_64 rng(s.seed + 2);
    std::uniform_real_distribution<double> hold(18, 22);
    Trace t{"rl", {}};
    for (double at = 30; at < duration; at += 60) {
      for (int i = 0; i < 2000; ++i) t.arrivals.push_back({at, hold(rng)});
    }
    traces.push_back(std::move(t));
  }
  if (want("spikes")) {
    std::mt19937_64 rng(s.seed + 3);
    std::exponential_distribution<double> hold(1.0 / 30);
    std::vector<double> spikes;
    std::exponential_distribution<double> spike_gap(1.0 / 300);
    for (double at = spike_gap(rng); at < duration; at += spike_gap(rng)) spikes.push_back(at);
    auto rate = [spikes](double t) {
      for (double at : spikes) {
        if (t >= at && t < at + 60) return 40.0;
      }
      return 10.0;
    };
    traces.push_back({"spikes", Poisson(rng, duration, 40, rate, [&] { return hold(rng); })});
  }
  return traces;
}

// The most arrivals in any window of `window` seconds.
int64_t PeakInWindow(const std::vector<Arrival>& a, double window) {
  int64_t best = 0;
  size_t lo = 0;
  for (size_t hi = 0; hi < a.size(); ++hi) {
    while (a[hi].t - a[lo].t >= window) ++lo;
    best = std::max<int64_t>(best, static_cast<int64_t>(hi - lo + 1));
  }
  return best;
}

// Simulated events, in time order (FIFO among equal times).
class Events {
 public:
  void At(absl::Time t, std::function<void()> fn) { q_.push({t, seq_++, std::move(fn)}); }
  // Runs every event due at or before `now`, including ones they schedule.
  void RunUntil(absl::Time now) {
    while (!q_.empty() && q_.top().t <= now) {
      auto fn = q_.top().fn;
      q_.pop();
      fn();
    }
  }
  bool empty() const { return q_.empty(); }
  absl::Time next() const { return q_.top().t; }

 private:
  struct Event {
    absl::Time t;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<>> q_;
  uint64_t seq_ = 0;
};

// A runtime whose sandboxes are ready after the create latency on the simulated clock.
class SimRuntime final : public runtime::Runtime {
 public:
  SimRuntime(Events* events, Clock* clock, const Settings& s)
      : events_(events), clock_(clock), rng_(s.seed + 100), settings_(s) {}

  void Create(runtime::CreateRequest request, runtime::CreateCallback done) override {
    std::uniform_real_distribution<double> spread(1 - settings_.latency_spread,
                                                  1 + settings_.latency_spread);
    const double took = settings_.create_latency_s * spread(rng_);
    ++created_;
    auto cb = std::make_shared<runtime::CreateCallback>(std::move(done));
    runtime::SandboxInfo info;
    info.id = absl::StrCat("sb-", created_);
    info.pool = request.pool;
    info.endpoint = absl::StrCat("sim:", created_);
    events_->At(clock_->Now() + absl::Seconds(took),
                [cb, info] { std::move (*cb)(std::move(info)); });
  }
  void Delete(std::string id, runtime::DeleteCallback done) override {
    std::move(done)(absl::OkStatus());
  }
  void Suspend(std::string id, runtime::DoneCallback done) override {
    std::move(done)(absl::UnimplementedError("the simulation does not suspend"));
  }
  void Resume(std::string id, runtime::ResumeCallback done) override {
    std::move(done)(absl::UnimplementedError("the simulation does not suspend"));
  }
  absl::StatusOr<std::vector<runtime::SandboxInfo>> List() override {
    return std::vector<runtime::SandboxInfo>{};
  }
  uint64_t created() const { return created_; }

 private:
  Events* const events_;
  Clock* const clock_;
  std::mt19937_64 rng_;
  const Settings settings_;
  uint64_t created_ = 0;
};

struct Strategy {
  std::string name;
  int32_t min_warm;
  int32_t max_warm;
  store::PoolSizing sizing;
};

struct Result {
  uint64_t claims = 0;
  uint64_t waited = 0;
  uint64_t failed = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  double idle_sandbox_s = 0;
  uint64_t created = 0;
};

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(i), v.end());
  return v[i];
}

absl::StatusOr<Result> Run(const Trace& trace, const Strategy& strategy, const Settings& s) {
  FakeClock clock(absl::FromUnixSeconds(1'700'000'000));
  const absl::Time origin = clock.Now() + absl::Seconds(30);  // 30 s to fill static pools
  const absl::Time measured = origin + absl::Seconds(s.warmup_minutes * 60);
  Events events;
  SimRuntime runtime(&events, &clock, s);
  store::MemoryStoreOptions mo;
  mo.callbacks = store::MemoryStoreOptions::CallbackMode::kInline;
  store::MemoryStore store(mo);
  SequentialIdGenerator ids("sim-");
  allocator::RefillOptions ro;
  // A runtime that keeps up (Kubernetes refill measures past 1,000/s): the strategies,
  // not the refill's rate limit, decide what waits.
  ro.qps = 5000;
  ro.burst = 5000;
  ro.max_creating_per_pool = 5000;
  allocator::RefillReconciler refill(ro, &runtime, &clock);
  allocator::AllocatorOptions ao;
  ao.timer_thread = false;
  ao.max_pool_warm = 100000;
  ao.demand = s.demand;
  ASSIGN_OR_RETURN(std::unique_ptr<Allocator> alloc,
                   Allocator::Create(ao, &store, &runtime, &refill, &clock, &ids));
  refill.Attach(alloc.get());
  absl::Status put;
  alloc->PutTemplate(store::TemplateRecord{"sim", "local", "", 0},
                     [&](absl::Status st) { put = st; });
  RETURN_IF_ERROR(put);
  store::PoolRecord p;
  p.name = "sim";
  p.template_name = "sim";
  p.min_warm = strategy.min_warm;
  p.max_warm = strategy.max_warm;
  p.sizing = strategy.sizing;
  p.empty_pool_policy = store::EmptyPoolPolicy::kWait;
  p.default_wait = allocator::kMaxWait;  // the longest the allocator allows (1 h)
  alloc->PutPool(p, [&](absl::Status st) { put = st; });
  RETURN_IF_ERROR(put);

  Result r;
  std::vector<double> latencies;
  latencies.reserve(trace.arrivals.size());
  const absl::Duration step = absl::Milliseconds(s.step_ms);
  const absl::Time end = measured + absl::Seconds(s.minutes * 60);
  size_t next = 0;
  uint64_t claim_no = 0;
  std::optional<uint64_t> created_before;  // sandboxes made during the warm-up
  absl::Time last_tick = clock.Now();
  for (absl::Time now = clock.Now(); now < end; now += step) {
    clock.Set(now);
    events.RunUntil(now);
    while (next < trace.arrivals.size() && origin + absl::Seconds(trace.arrivals[next].t) <= now) {
      const Arrival a = trace.arrivals[next++];
      // The claim reaches the allocator in this step.
      const absl::Time asked = now;
      const bool counted = asked >= measured;
      allocator::ClaimRequest req;
      req.owner = "sim";
      req.claim_id = absl::StrCat("c", ++claim_no);
      req.pool = "sim";
      if (counted) ++r.claims;
      const std::string id = req.claim_id;
      alloc->Claim(std::move(req), [&, id, asked, counted,
                                    hold = a.hold_s](absl::StatusOr<allocator::ClaimResult> got) {
        if (!got.ok()) {
          if (counted) ++r.failed;
          return;
        }
        const absl::Time granted = clock.Now();
        // Warm claims are granted in the step they reach the allocator; later ones waited.
        if (counted) {
          if (granted > asked) ++r.waited;
          latencies.push_back(absl::ToDoubleMilliseconds(granted - asked));
        }
        events.At(granted + absl::Seconds(hold), [&, id] {
          alloc->Release("sim", id, [](absl::StatusOr<store::ClaimRecord>) {});
        });
      });
    }
    refill.RunOnce();
    if (now - last_tick >= absl::Seconds(1)) {
      alloc->Tick();
      last_tick = now;
    }
    if (now >= measured && !created_before) created_before = runtime.created();
    if (now >= measured) {
      absl::StatusOr<allocator::PoolStatus> st = alloc->GetPoolStatus("sim");
      if (st.ok()) r.idle_sandbox_s += static_cast<double>(st->warm) * absl::ToDoubleSeconds(step);
    }
  }
  // Creates in flight must call back before the refill stops.
  while (!events.empty()) {
    clock.Set(std::max(clock.Now(), events.next()));
    events.RunUntil(clock.Now());
  }
  refill.Stop();
  r.p50_ms = Quantile(latencies, 0.50);
  r.p99_ms = Quantile(latencies, 0.99);
  r.created = runtime.created() - created_before.value_or(0);
  return r;
}

int Main(int argc, char** argv) {
  CLI::App app{"scheduler_sim: pool sizing strategies on simulated traces"};
  Settings s;
  std::string trace_name = "all";
  std::vector<std::string> check;
  app.add_option("--trace", trace_name, "steady, diurnal, rl, spikes or all")
      ->check(CLI::IsMember({"all", "steady", "diurnal", "rl", "spikes"}));
  app.add_option("--minutes", s.minutes, "simulated minutes of traffic per run")
      ->check(CLI::Range(1.0, 24 * 60.0));
  app.add_option("--create_latency", s.create_latency_s, "mean create latency, seconds")
      ->check(CLI::Range(0.01, 600.0));
  app.add_option("--seed", s.seed, "random seed");
  app.add_option("--warmup", s.warmup_minutes, "simulated minutes of traffic before measuring")
      ->check(CLI::Range(0.0, 600.0));
  app.add_option("--cold_fraction", s.demand.cold_fraction, "demand sizing: cold_fraction");
  app.add_option("--latency_quantile", s.demand.latency_quantile,
                 "demand sizing: latency_quantile");
  app.add_option("--burst_margin", s.demand.burst_margin, "demand sizing: burst_margin");
  double cool_down_s = absl::ToDoubleSeconds(s.demand.cool_down);
  app.add_option("--cool_down", cool_down_s, "demand sizing: cool_down, seconds");
  app.add_option("--check", check,
                 "traces on which demand sizing must keep cold waits <= 1% and idle <= half "
                 "the peak pool's (exit 1 otherwise)")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  s.demand.cool_down = absl::Seconds(cool_down_s);
  if (absl::Status v = s.demand.Validate(); !v.ok()) {
    std::fprintf(stderr, "%s\n", std::string(v.message()).c_str());
    return 2;
  }

  std::printf(
      "create latency %.1f s (+-%.0f%%), %.0f simulated minutes measured after %.0f of warm-up, "
      "seed %" PRIu64
      "; demand sizing: cold_fraction %.4f, latency quantile %.2f, burst "
      "margin %.2f, cool-down %.0f s\n\n",
      s.create_latency_s, s.latency_spread * 100, s.minutes, s.warmup_minutes, s.seed,
      s.demand.cold_fraction, s.demand.latency_quantile, s.demand.burst_margin, cool_down_s);
  std::printf(
      "| trace | strategy | floor..ceiling | claims | waited for a cold start | claim p50 | "
      "claim p99 | idle warm sandbox-s | idle vs peak | sandboxes made |\n"
      "|---|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  std::vector<std::string> misses;
  for (const Trace& trace : MakeTraces(s, trace_name)) {
    const double duration = (s.warmup_minutes + s.minutes) * 60;
    const auto mean = static_cast<int32_t>(
        std::ceil(static_cast<double>(trace.arrivals.size()) / duration * s.create_latency_s));
    const auto peak = static_cast<int32_t>(
        PeakInWindow(trace.arrivals, s.create_latency_s * (1 + s.latency_spread)));
    const std::vector<Strategy> strategies = {
        {"static, sized for the peak", peak, peak, store::PoolSizing::kStatic},
        {"static, sized for the mean", mean, mean, store::PoolSizing::kStatic},
        {"floor (mean) + waiters", mean, 100000, store::PoolSizing::kStatic},
        {"demand", 0, 100000, store::PoolSizing::kDemand},
    };
    double peak_idle = 0;
    for (const Strategy& st : strategies) {
      absl::StatusOr<Result> r = Run(trace, st, s);
      if (!r.ok()) {
        std::fprintf(stderr, "%s / %s: %s\n", trace.name.c_str(), st.name.c_str(),
                     r.status().ToString().c_str());
        return 2;
      }
      if (st.name == strategies[0].name) peak_idle = r->idle_sandbox_s;
      const double waited = r->claims == 0 ? 0 : 100.0 * r->waited / r->claims;
      const double vs_peak = peak_idle > 0 ? r->idle_sandbox_s / peak_idle : 0;
      std::printf("| %s | %s | %s | %" PRIu64
                  " | %.2f%% | %.0f ms | %.0f ms | %.0f | %.2f | %" PRIu64 " |\n",
                  trace.name.c_str(), st.name.c_str(),
                  st.max_warm >= 100000 ? absl::StrCat(st.min_warm, "..").c_str()
                                        : absl::StrCat(st.min_warm, "..", st.max_warm).c_str(),
                  r->claims, waited, r->p50_ms, r->p99_ms, r->idle_sandbox_s, vs_peak, r->created);
      std::fflush(stdout);
      const bool held = std::find(check.begin(), check.end(), trace.name) != check.end();
      if (held && r->failed > 0) {
        misses.push_back(absl::StrCat(trace.name, "/", st.name, ": ", r->failed, " claims failed"));
      }
      if (held && st.sizing == store::PoolSizing::kDemand && (waited > 1.0 || vs_peak > 0.5)) {
        misses.push_back(
            absl::StrFormat("%s: demand sizing waited %.2f%% (goal <= 1%%), idle %.2f of "
                            "the peak pool's (goal <= 0.5)",
                            trace.name, waited, vs_peak));
      }
    }
  }
  for (const std::string& m : misses) std::printf("\nmiss: %s", m.c_str());
  std::printf("\n");
  return misses.empty() ? 0 : 1;
}

}  // namespace
}  // namespace sbx::bench

int main(int argc, char** argv) { return sbx::bench::Main(argc, argv); }

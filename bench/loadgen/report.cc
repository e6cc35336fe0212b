#include "bench/loadgen/report.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace sbx::loadgen {
namespace {

using nlohmann::json;

const char* PolicyName(int policy) {
  switch (policy) {
    case 1:
      return "wait";
    case 2:
      return "cold";
    case 3:
      return "fail";
    default:
      return "pool";
  }
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

json LatencyJson(const LatencySummary& l) {
  return json{{"count", l.count}, {"min", l.min_us}, {"mean", l.mean_us},  {"p50", l.p50_us},
              {"p90", l.p90_us},  {"p99", l.p99_us}, {"p99_9", l.p999_us}, {"max", l.max_us}};
}

json ErrorsJson(const std::vector<ErrorCount>& errors) {
  json out = json::array();
  for (const ErrorCount& e : errors) {
    out.push_back(
        json{{"rpc", e.rpc}, {"code", e.code}, {"count", e.count}, {"example", e.example}});
  }
  return out;
}

json ResultJson(const LoadOptions& o, const RunResult& r) {
  json j{{"workload", WorkloadName(r.workload)},
         {"started", r.started},
         {"ok", r.ok},
         {"failed", r.failed},
         {"warmup_ok", r.warmup_ok},
         {"warmup_failed", r.warmup_failed},
         {"elapsed_s", r.elapsed_s},
         {"throughput_ops_per_s", r.throughput},
         {"started_per_s", r.started_per_s},
         {"latency_us", LatencyJson(r.latency)},
         {"errors", ErrorsJson(r.errors)},
         {"cleanup",
          json{{"releases", r.cleanup_releases}, {"errors", ErrorsJson(r.cleanup_errors)}}}};
  if (o.open_loop()) {
    j["send_lag_us"] = LatencyJson(r.send_lag);
    j["throttled"] = r.throttled;
  }
  if (o.timeline) {
    json t = json::array();
    for (const TimelineSecond& s : r.timeline) {
      t.push_back(json{{"second", s.second},
                       {"ok", s.ok},
                       {"failed", s.failed},
                       {"p50_us", s.p50_us},
                       {"p99_us", s.p99_us},
                       {"max_us", s.max_us}});
    }
    j["timeline"] = t;
  }
  return j;
}

std::string Us(double us) { return absl::StrFormat("%.0f", us); }

std::string Row(const RunResult& r) {
  const LatencySummary& l = r.latency;
  return absl::StrFormat("  %-14s %10.1f %9d %7d %8s %8s %8s %8s %8s\n", WorkloadName(r.workload),
                         r.throughput, r.ok, r.failed, Us(l.p50_us), Us(l.p90_us), Us(l.p99_us),
                         Us(l.p999_us), Us(l.max_us));
}

std::string Details(const LoadOptions& o, const RunResult& r) {
  std::string out;
  const char* name = WorkloadName(r.workload);
  for (const ErrorCount& e : r.errors) {
    absl::StrAppendFormat(&out, "  %s errors: %d x %s %s: %s\n", name, e.count, e.rpc, e.code,
                          e.example);
  }
  if (r.warmup_failed > 0) {
    absl::StrAppendFormat(&out, "  %s: %d warm-up operations failed too\n", name, r.warmup_failed);
  }
  if (r.cleanup_releases > 0 || !r.cleanup_errors.empty()) {
    absl::StrAppendFormat(&out, "  %s: %d unmeasured releases", name, r.cleanup_releases);
    uint64_t failed = 0;
    for (const ErrorCount& e : r.cleanup_errors) failed += e.count;
    absl::StrAppendFormat(&out, ", %d failed\n", failed);
    for (const ErrorCount& e : r.cleanup_errors) {
      absl::StrAppendFormat(&out, "    release errors: %d x %s: %s\n", e.count, e.code, e.example);
    }
  }
  for (const TimelineSecond& s : r.timeline) {
    absl::StrAppendFormat(&out, "  %s second %3d: ok %7d failed %5d p50 %8s p99 %8s max %8s\n",
                          name, s.second, s.ok, s.failed, Us(s.p50_us), Us(s.p99_us), Us(s.max_us));
  }
  if (o.open_loop()) {
    absl::StrAppendFormat(&out,
                          "  %s: achieved %.1f starts/s; send lag p50 %s us, p99 %s us, max %s "
                          "us; throttled %d times\n",
                          name, r.started_per_s, Us(r.send_lag.p50_us), Us(r.send_lag.p99_us),
                          Us(r.send_lag.max_us), r.throttled);
  }
  return out;
}

}  // namespace

std::string FormatText(const Report& report) {
  const LoadOptions& o = report.options;
  std::string out = absl::StrCat("sbx-loadgen against ", o.server, ": ");
  if (o.open_loop()) {
    absl::StrAppendFormat(&out, "open loop, %.1f/s (%s arrivals)", o.rate,
                          o.arrival == Arrival::kUniform ? "uniform" : "poisson");
  } else {
    absl::StrAppendFormat(&out, "closed loop, concurrency %d", o.concurrency);
  }
  absl::StrAppendFormat(&out, ", %d connection%s, warm-up %s", o.connections,
                        o.connections == 1 ? "" : "s", absl::FormatDuration(o.warmup));
  if (o.duration > absl::ZeroDuration()) {
    absl::StrAppend(&out, ", duration ", absl::FormatDuration(o.duration));
  }
  if (o.requests > 0) absl::StrAppend(&out, ", at most ", o.requests, " operations");
  if (o.workload != Workload::kPing) absl::StrAppend(&out, ", pool ", o.pool);
  absl::StrAppend(&out, "\n");
  absl::StrAppendFormat(&out,
                        "  latency in us from the %s send time; exact percentiles of all "
                        "samples\n",
                        o.open_loop() ? "intended" : "actual");
  absl::StrAppendFormat(&out, "  %-14s %10s %9s %7s %8s %8s %8s %8s %8s\n", "workload", "ok ops/s",
                        "ok", "errors", "p50", "p90", "p99", "p99.9", "max");
  if (report.baseline) out += Row(*report.baseline);
  out += Row(report.result);
  if (report.baseline) out += Details(o, *report.baseline);
  out += Details(o, report.result);
  if (report.baseline) {
    const RunResult& r = report.result;
    const RunResult& b = *report.baseline;
    if (o.open_loop()) {
      absl::StrAppendFormat(&out,
                            "  ratio %s / ping (open loop, latency): p50 %.2f, p99 %.2f, "
                            "p99.9 %.2f\n",
                            WorkloadName(r.workload), Ratio(r.latency.p50_us, b.latency.p50_us),
                            Ratio(r.latency.p99_us, b.latency.p99_us),
                            Ratio(r.latency.p999_us, b.latency.p999_us));
    } else {
      absl::StrAppendFormat(&out, "  ratio %s / ping (closed loop, throughput): %.3f\n",
                            WorkloadName(r.workload), Ratio(r.throughput, b.throughput));
    }
  }
  return out;
}

std::string FormatJson(const Report& report) {
  const LoadOptions& o = report.options;
  json settings{{"server", o.server},
                {"workload", WorkloadName(o.workload)},
                {"mode", o.open_loop() ? "open" : "closed"},
                {"rate", o.rate},
                {"arrival", o.arrival == Arrival::kUniform ? "uniform" : "poisson"},
                {"concurrency", o.concurrency},
                {"connections", o.connections},
                {"duration_s", absl::ToDoubleSeconds(o.duration)},
                {"requests", o.requests},
                {"warmup_s", absl::ToDoubleSeconds(o.warmup)},
                {"pool", o.pool},
                {"empty_pool_policy", PolicyName(o.empty_pool_policy)},
                {"token", !o.token.empty()},
                {"release_claims", o.release_claims},
                {"max_in_flight", o.max_in_flight},
                {"rpc_timeout_s", absl::ToDoubleSeconds(o.rpc_timeout)},
                {"latency_from", o.open_loop() ? "intended send" : "actual send"},
                {"histogram", "exact: every latency stored, nearest-rank percentiles"}};
  json j{{"settings", settings},
         {"result", ResultJson(o, report.result)},
         {"baseline", nullptr},
         {"ratio", nullptr}};
  if (report.baseline) {
    const RunResult& r = report.result;
    const RunResult& b = *report.baseline;
    j["baseline"] = ResultJson(o, b);
    j["ratio"] = json{{"kind", o.open_loop() ? "latency" : "throughput"},
                      {"throughput", Ratio(r.throughput, b.throughput)},
                      {"p50", Ratio(r.latency.p50_us, b.latency.p50_us)},
                      {"p99", Ratio(r.latency.p99_us, b.latency.p99_us)},
                      {"p99_9", Ratio(r.latency.p999_us, b.latency.p999_us)}};
  }
  return j.dump() + "\n";
}

}  // namespace sbx::loadgen

// sbx-loadgen: load generator for an sbx server. Parses flags, optionally runs the Ping
// baseline, runs the workload, prints the numbers (text or --json).
//
// Exit status: 0 when the runs completed (failed operations are counted and printed, not
// fatal); 1 when the server could not be reached; 2 (or CLI11's own code) for bad flags.

#include <cstdio>
#include <optional>
#include <string>
#include <tuple>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/loadgen/loadgen.h"
#include "bench/loadgen/report.h"

namespace {

int Fail(int code, const absl::Status& status) {
  std::fprintf(stderr, "sbx-loadgen: error: %s\n", std::string(status.message()).c_str());
  return code;
}

// "10s", "500ms", "1m30s", or a plain number of seconds ("2.5").
absl::StatusOr<absl::Duration> ParseDurationFlag(const char* flag, const std::string& text) {
  absl::Duration d;
  if (absl::ParseDuration(text, &d)) return d;
  double seconds;
  if (absl::SimpleAtod(text, &seconds)) return absl::Seconds(seconds);
  return absl::InvalidArgumentError(absl::StrCat(
      "--", flag, " \"", text, "\" is not a duration (e.g. 10s, 500ms, 1m, or seconds)"));
}

}  // namespace

int main(int argc, char** argv) {
  sbx::loadgen::LoadOptions options;
  std::string workload = "ping";
  std::string duration;
  std::string warmup = "1s";
  std::string rpc_timeout = "10s";
  std::string connect_timeout = "5s";
  std::string arrival = "uniform";
  std::string policy = "pool";
  bool baseline = false;
  bool json = false;

  CLI::App app{
      "sbx-loadgen: open- or closed-loop load on an sbx server (Ping, Claim, Claim+Release, "
      "Claim+Exec); prints throughput and latency percentiles"};
  app.add_option("--server", options.server, "host:port of the sbx server")->capture_default_str();
  app.add_option("--workload", workload, "ping | claim | claim-release | claim-exec")
      ->capture_default_str();
  app.add_option("--pool", options.pool, "pool to claim from")->capture_default_str();
  app.add_option("--empty_pool_policy", policy,
                 "policy of each claim: pool (the pool's default) | wait | cold | fail")
      ->capture_default_str();
  app.add_option("--rate", options.rate,
                 "open loop: operations started per second, independent of completions "
                 "(latency from the intended send time)");
  app.add_option("--concurrency", options.concurrency, "closed loop: operations kept in flight");
  app.add_option("--arrival", arrival, "open loop: uniform | poisson")->capture_default_str();
  app.add_option("--connections", options.connections, "gRPC channels (TCP connections)")
      ->capture_default_str();
  app.add_option("--duration", duration,
                 "measured time, e.g. 10s (default 10s unless --requests is given)");
  app.add_option("--requests", options.requests,
                 "stop after this many measured operations (with --duration: whichever first)");
  app.add_option("--warmup", warmup, "run but do not count the first ...")->capture_default_str();
  app.add_option("--token", options.token, "bearer token (authorization metadata)");
  app.add_flag("--baseline", baseline,
               "first run the Ping workload with the same settings, and print the ratio");
  app.add_flag("--json", json, "print one JSON object instead of text");
  app.add_flag("--timeline", options.timeline,
               "also print each second of the measured phase (ops, p50, p99, max)");
  bool keep_claims = false;
  app.add_flag("--keep_claims", keep_claims,
               "claim workload: do not release the claims (the pool drains and refills)");
  app.add_option("--max_in_flight", options.max_in_flight,
                 "open loop: cap on operations in flight (the scheduler waits beyond it)")
      ->capture_default_str();
  app.add_option("--rpc_timeout", rpc_timeout, "deadline of each RPC")->capture_default_str();
  app.add_option("--connect_timeout", connect_timeout, "wait this long for each connection")
      ->capture_default_str();
  app.add_option("--seed", options.seed, "seed of Poisson arrivals")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  options.release_claims = !keep_claims;
  auto w = sbx::loadgen::ParseWorkload(workload);
  if (!w.ok()) return Fail(2, w.status());
  options.workload = *w;
  if (arrival == "uniform") {
    options.arrival = sbx::loadgen::Arrival::kUniform;
  } else if (arrival == "poisson") {
    options.arrival = sbx::loadgen::Arrival::kPoisson;
  } else {
    return Fail(2, absl::InvalidArgumentError(
                       absl::StrCat("--arrival \"", arrival, "\" is not one of uniform, poisson")));
  }
  if (policy == "pool") {
    options.empty_pool_policy = 0;
  } else if (policy == "wait") {
    options.empty_pool_policy = 1;
  } else if (policy == "cold") {
    options.empty_pool_policy = 2;
  } else if (policy == "fail") {
    options.empty_pool_policy = 3;
  } else {
    return Fail(
        2, absl::InvalidArgumentError(absl::StrCat("--empty_pool_policy \"", policy,
                                                   "\" is not one of pool, wait, cold, fail")));
  }
  if (!duration.empty()) {
    auto d = ParseDurationFlag("duration", duration);
    if (!d.ok()) return Fail(2, d.status());
    options.duration = *d;
  } else if (options.requests == 0) {
    options.duration = absl::Seconds(10);
  }
  for (auto [flag, text, out] :
       {std::tuple{"warmup", &warmup, &options.warmup},
        std::tuple{"rpc_timeout", &rpc_timeout, &options.rpc_timeout},
        std::tuple{"connect_timeout", &connect_timeout, &options.connect_timeout}}) {
    auto d = ParseDurationFlag(flag, *text);
    if (!d.ok()) return Fail(2, d.status());
    *out = *d;
  }
  if (absl::Status s = options.Validate(); !s.ok()) return Fail(2, s);

  auto client = sbx::loadgen::LoadClient::Connect(options);
  if (!client.ok()) return Fail(1, client.status());

  sbx::loadgen::Report report;
  report.options = options;
  if (baseline) report.baseline = (*client)->Run(sbx::loadgen::Workload::kPing);
  report.result = (*client)->Run(options.workload);
  const std::string out = json ? FormatJson(report) : FormatText(report);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

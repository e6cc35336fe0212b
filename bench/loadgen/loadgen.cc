#include "bench/loadgen/loadgen.h"

#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "sbx/v1/claims.grpc.pb.h"
#include "sbx/v1/diagnostics.grpc.pb.h"
#include "sbx/v1/sandboxes.grpc.pb.h"

namespace sbx::loadgen {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// Monotonic nanoseconds. Latencies are intervals, so the steady clock rather than the
// injected wall Clock of src/common: a wall-clock step would corrupt them.
int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void SleepUntilNs(int64_t t) {
  std::this_thread::sleep_until(std::chrono::steady_clock::time_point(std::chrono::nanoseconds(t)));
}

// How one operation ended. `rpc` and `code` are set when it failed.
struct Outcome {
  bool ok = true;
  std::string rpc;
  std::string code;
  std::string message;

  static Outcome Ok() { return Outcome(); }
  static Outcome Failed(std::string rpc, std::string code, std::string message) {
    return Outcome{false, std::move(rpc), std::move(code), std::move(message)};
  }
  static Outcome FromStatus(const char* rpc, const grpc::Status& s) {
    if (s.ok()) return Ok();
    return Failed(rpc, absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())),
                  s.error_message());
  }
};

using OutcomeFn = std::function<void(Outcome)>;

// Failures keyed by (rpc, code), with the first message seen.
class ErrorTable {
 public:
  void Add(const Outcome& o) {
    ErrorCount& e = table_[{o.rpc, o.code}];
    if (e.count++ == 0) {
      e.rpc = o.rpc;
      e.code = o.code;
      e.example = o.message;
    }
  }
  std::vector<ErrorCount> Sorted() const {
    std::vector<ErrorCount> out;
    for (const auto& [key, e] : table_) out.push_back(e);
    std::stable_sort(out.begin(), out.end(),
                     [](const ErrorCount& a, const ErrorCount& b) { return a.count > b.count; });
    return out;
  }

 private:
  std::map<std::pair<std::string, std::string>, ErrorCount> table_;
};

// The channels and stubs, one set per connection.
struct Connection {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<sbx::v1::DiagnosticsService::Stub> diagnostics;
  std::unique_ptr<sbx::v1::ClaimService::Stub> claims;
  std::unique_ptr<sbx::v1::SandboxService::Stub> sandboxes;
};

// Exec of `true` as a bidirectional stream: one ExecStart with the half-close, then read
// until the server ends the stream. Deletes itself after reporting.
class ExecTrue final : public grpc::ClientBidiReactor<sbx::v1::ExecRequest, sbx::v1::ExecResponse> {
 public:
  ExecTrue(const std::string& claim_id, OutcomeFn done) : done_(std::move(done)) {
    sbx::v1::ExecStart* start = request_.mutable_start();
    start->set_claim_id(claim_id);
    start->add_argv("true");
  }

  grpc::ClientContext* context() { return &context_; }

  void Go(sbx::v1::SandboxService::Stub* stub) {
    stub->async()->Exec(&context_, this);
    StartWriteLast(&request_, grpc::WriteOptions());
    StartRead(&response_);
    StartCall();
  }

  // A failed write means the call is ending; OnDone reports why.
  void OnWriteDone(bool /*ok*/) override {}

  void OnReadDone(bool ok) override {
    if (!ok) return;  // end of stream; OnDone follows
    if (response_.has_exit()) {
      got_exit_ = true;
      exit_ = response_.exit();
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    Outcome outcome = Outcome::FromStatus("Exec", status);
    if (outcome.ok) {
      if (!got_exit_) {
        outcome = Outcome::Failed("Exec", "NO_EXIT", "stream ended OK without an ExecExit");
      } else if (exit_.has_signal()) {
        outcome = Outcome::Failed("Exec", absl::StrCat("signal=", exit_.signal()),
                                  "`true` was killed by a signal");
      } else if (exit_.exit_code() != 0) {
        outcome = Outcome::Failed("Exec", absl::StrCat("exit_code=", exit_.exit_code()),
                                  "`true` exited non-zero");
      }
    }
    OutcomeFn done = std::move(done_);
    delete this;
    done(std::move(outcome));
  }

 private:
  grpc::ClientContext context_;
  sbx::v1::ExecRequest request_;
  sbx::v1::ExecResponse response_;
  bool got_exit_ = false;
  sbx::v1::ExecExit exit_;
  OutcomeFn done_;
};

class LoadClientImpl;

// One run of one workload: the schedule (open or closed loop) and the bookkeeping.
class Session {
 public:
  Session(LoadClientImpl& client, Workload workload);
  RunResult Go() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void RunOpenLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void StartClosedLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // Closed loop: starts the next operation of a slot, or ends the slot.
  void NextInSlot(size_t connection) ABSL_LOCKS_EXCLUDED(mu_);
  // Starts one operation intended at `intended_ns`; `then` runs after it is recorded.
  void Issue(int64_t intended_ns, size_t connection, bool measured, std::function<void()> then)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Records how an operation ended.
  void Complete(int64_t intended_ns, bool measured, const Outcome& outcome)
      ABSL_LOCKS_EXCLUDED(mu_);
  void SourceEnded() ABSL_LOCKS_EXCLUDED(mu_);

  bool DrainedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return sources_ == 0 && in_flight_ == 0;
  }
  bool BelowCapLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static std::vector<TimelineSecond> Timeline(const std::vector<std::pair<int64_t, int64_t>>& ops);

  LoadClientImpl& client_;
  const Workload workload_;
  int64_t start_ns_ = 0;
  int64_t measure_start_ns_ = 0;
  int64_t end_ns_ = kNever;
  // Measured operations started so far, to stop at --requests. Atomic because closed-loop
  // slots start operations from gRPC's threads; only the count matters (relaxed).
  std::atomic<int64_t> measured_started_{0};

  absl::Mutex mu_;
  // Open loop: one source (the scheduler); closed loop: one per slot.
  int sources_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t ok_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t warmup_ok_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t warmup_failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_measured_done_ns_ ABSL_GUARDED_BY(mu_) = 0;
  LatencySamples latencies_ ABSL_GUARDED_BY(mu_);
  // With --timeline: (start offset in the measured phase, latency or -1 for a failure).
  std::vector<std::pair<int64_t, int64_t>> timeline_ ABSL_GUARDED_BY(mu_);
  ErrorTable errors_ ABSL_GUARDED_BY(mu_);

  // Scheduler thread only (open loop).
  LatencySamples send_lag_;
  uint64_t throttled_ = 0;
};

class LoadClientImpl final : public LoadClient {
 public:
  LoadClientImpl(LoadOptions options, std::vector<Connection> connections)
      : options_(std::move(options)), connections_(std::move(connections)) {
    std::mt19937_64 rng(options_.seed ^ static_cast<uint64_t>(NowNs()));
    run_prefix_ = absl::StrFormat("lg-%08x", static_cast<uint32_t>(rng()));
  }

  ~LoadClientImpl() override { WaitForCleanup(); }

  RunResult Run(Workload workload) override {
    Session session(*this, workload);
    RunResult result = session.Go();
    WaitForCleanup();
    absl::MutexLock lock(&cleanup_mu_);
    result.cleanup_releases = cleanup_releases_;
    result.cleanup_errors = cleanup_errors_.Sorted();
    cleanup_releases_ = 0;
    cleanup_errors_ = ErrorTable();
    return result;
  }

  const LoadOptions& options() const { return options_; }
  size_t connections() const { return connections_.size(); }

  // Starts one operation of `workload` on connection `c`; `done` runs exactly once, on a
  // gRPC thread.
  void StartOperation(Workload workload, size_t c, OutcomeFn done) {
    Connection& conn = connections_[c];
    switch (workload) {
      case Workload::kPing:
        Ping(conn, std::move(done));
        return;
      case Workload::kClaim:
        Claim(conn, [this, &conn, done = std::move(done)](Outcome o, std::string claim_id) {
          // The release is counted before `done` may let the run finish.
          if (!claim_id.empty() && options_.release_claims) CleanupRelease(conn, claim_id);
          done(std::move(o));
        });
        return;
      case Workload::kClaimRelease:
        Claim(conn, [this, &conn, done = std::move(done)](Outcome o, std::string claim_id) {
          if (!o.ok) return done(std::move(o));
          Release(conn, claim_id, std::move(done));
        });
        return;
      case Workload::kClaimExec:
        Claim(conn, [this, &conn, done = std::move(done)](Outcome o, std::string claim_id) {
          if (!o.ok) return done(std::move(o));
          auto* exec = new ExecTrue(claim_id, [this, &conn, claim_id, done](Outcome e) {
            CleanupRelease(conn, claim_id);
            done(std::move(e));
          });
          Prepare(*exec->context());
          exec->Go(conn.sandboxes.get());
        });
        return;
    }
  }

 private:
  void Prepare(grpc::ClientContext& context) const {
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    if (!options_.token.empty()) {
      context.AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
    }
  }

  // One unary call through the callback API. `call` owns context, request and response
  // until the callback has run.
  template <typename Request, typename Response>
  struct UnaryCall {
    grpc::ClientContext context;
    Request request;
    Response response;
  };

  void Ping(Connection& conn, OutcomeFn done) {
    auto* call = new UnaryCall<sbx::v1::PingRequest, sbx::v1::PingResponse>;
    Prepare(call->context);
    conn.diagnostics->async()->Ping(&call->context, &call->request, &call->response,
                                    [call, done = std::move(done)](grpc::Status s) {
                                      delete call;
                                      done(Outcome::FromStatus("Ping", s));
                                    });
  }

  // Claims from the pool; `then` gets the outcome and, when it succeeded, the claim id.
  void Claim(Connection& conn, std::function<void(Outcome, std::string)> then) {
    auto* call = new UnaryCall<sbx::v1::ClaimRequest, sbx::v1::ClaimResponse>;
    Prepare(call->context);
    call->request.set_claim_id(
        absl::StrCat(run_prefix_, "-", next_claim_.fetch_add(1, std::memory_order_relaxed)));
    call->request.set_pool(options_.pool);
    call->request.set_empty_pool_policy(
        static_cast<sbx::v1::EmptyPoolPolicy>(options_.empty_pool_policy));
    conn.claims->async()->Claim(
        &call->context, &call->request, &call->response,
        [call, then = std::move(then)](grpc::Status s) {
          std::string claim_id = s.ok() ? call->response.claim().claim_id() : std::string();
          if (s.ok() && claim_id.empty()) {
            s = grpc::Status(grpc::StatusCode::INTERNAL, "ClaimResponse without a claim_id");
          }
          delete call;
          then(Outcome::FromStatus("Claim", s), std::move(claim_id));
        });
  }

  void Release(Connection& conn, const std::string& claim_id, OutcomeFn done) {
    auto* call = new UnaryCall<sbx::v1::ReleaseRequest, sbx::v1::ReleaseResponse>;
    Prepare(call->context);
    call->request.set_claim_id(claim_id);
    conn.claims->async()->Release(&call->context, &call->request, &call->response,
                                  [call, done = std::move(done)](grpc::Status s) {
                                    delete call;
                                    done(Outcome::FromStatus("Release", s));
                                  });
  }

  // Releases a claim outside the measured time; Run waits for these before returning.
  void CleanupRelease(Connection& conn, const std::string& claim_id)
      ABSL_LOCKS_EXCLUDED(cleanup_mu_) {
    {
      absl::MutexLock lock(&cleanup_mu_);
      ++cleanup_in_flight_;
      ++cleanup_releases_;
    }
    Release(conn, claim_id, [this](Outcome o) {
      absl::MutexLock lock(&cleanup_mu_);
      --cleanup_in_flight_;
      if (!o.ok) cleanup_errors_.Add(o);
    });
  }

  void WaitForCleanup() ABSL_LOCKS_EXCLUDED(cleanup_mu_) {
    absl::MutexLock lock(&cleanup_mu_, absl::Condition(this, &LoadClientImpl::CleanupDoneLocked));
  }
  bool CleanupDoneLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(cleanup_mu_) {
    return cleanup_in_flight_ == 0;
  }

  const LoadOptions options_;
  std::vector<Connection> connections_;
  std::string run_prefix_;
  // Claim ids must be unique for the server's idempotency window; relaxed is enough.
  std::atomic<uint64_t> next_claim_{0};

  absl::Mutex cleanup_mu_;
  int64_t cleanup_in_flight_ ABSL_GUARDED_BY(cleanup_mu_) = 0;
  uint64_t cleanup_releases_ ABSL_GUARDED_BY(cleanup_mu_) = 0;
  ErrorTable cleanup_errors_ ABSL_GUARDED_BY(cleanup_mu_);
};

Session::Session(LoadClientImpl& client, Workload workload) : client_(client), workload_(workload) {
  const size_t expected =
      client_.options().open_loop()
          ? static_cast<size_t>(client_.options().rate *
                                absl::ToDoubleSeconds(client_.options().duration)) +
                16
          : 1 << 16;
  absl::MutexLock lock(&mu_);
  latencies_.Reserve(std::min<size_t>(expected, size_t{1} << 24));
}

RunResult Session::Go() {
  const LoadOptions& o = client_.options();
  start_ns_ = NowNs();
  measure_start_ns_ = start_ns_ + absl::ToInt64Nanoseconds(o.warmup);
  if (o.duration > absl::ZeroDuration()) {
    end_ns_ = measure_start_ns_ + absl::ToInt64Nanoseconds(o.duration);
  }
  if (o.open_loop()) {
    {
      absl::MutexLock lock(&mu_);
      sources_ = 1;
    }
    RunOpenLoop();
  } else {
    StartClosedLoop();
  }
  mu_.LockWhen(absl::Condition(this, &Session::DrainedLocked));
  RunResult r;
  r.workload = workload_;
  r.ok = ok_;
  r.failed = failed_;
  r.started = ok_ + failed_;
  r.warmup_ok = warmup_ok_;
  r.warmup_failed = warmup_failed_;
  // The measured window ends at --duration, or (when --requests ran out first) at the
  // last measured completion; dividing by the whole --duration then would understate the
  // throughput of a run that finished early.
  const bool budget_spent =
      o.requests > 0 && measured_started_.load(std::memory_order_relaxed) >= o.requests;
  int64_t end = std::max(end_ns_ == kNever ? 0 : end_ns_, last_measured_done_ns_);
  if (budget_spent && last_measured_done_ns_ > measure_start_ns_) end = last_measured_done_ns_;
  r.elapsed_s = std::max<double>(0, static_cast<double>(end - measure_start_ns_) / 1e9);
  if (r.elapsed_s > 0) {
    r.throughput = static_cast<double>(r.ok) / r.elapsed_s;
    r.started_per_s = static_cast<double>(r.started) / r.elapsed_s;
  }
  r.latency = latencies_.Summarize();
  r.errors = errors_.Sorted();
  r.timeline = Timeline(timeline_);
  mu_.Unlock();
  r.send_lag = send_lag_.Summarize();
  r.throttled = throttled_;
  return r;
}

std::vector<TimelineSecond> Session::Timeline(const std::vector<std::pair<int64_t, int64_t>>& ops) {
  std::vector<TimelineSecond> out;
  std::vector<LatencySamples> samples;
  for (const auto& [offset, latency] : ops) {
    const size_t second = static_cast<size_t>(std::max<int64_t>(0, offset) / 1'000'000'000);
    while (out.size() <= second) {
      out.push_back(TimelineSecond{static_cast<int64_t>(out.size())});
      samples.emplace_back();
    }
    if (latency < 0) {
      ++out[second].failed;
    } else {
      ++out[second].ok;
      samples[second].Add(latency);
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    LatencySummary l = samples[i].Summarize();
    out[i].p50_us = l.p50_us;
    out[i].p99_us = l.p99_us;
    out[i].max_us = l.max_us;
  }
  return out;
}

bool Session::BelowCapLocked() const { return in_flight_ < client_.options().max_in_flight; }

void Session::RunOpenLoop() {
  const LoadOptions& o = client_.options();
  // Timer slack (50 us by default) would make every sleep wake late; 1 ns asks for the
  // earliest wake-up the kernel can give.
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap_s(o.rate);
  const double interval_ns = 1e9 / o.rate;
  double next = static_cast<double>(start_ns_);
  size_t connection = 0;
  for (uint64_t i = 0;; ++i) {
    const int64_t intended = static_cast<int64_t>(next);
    if (intended >= end_ns_) break;
    const bool measured = intended >= measure_start_ns_;
    if (measured && o.requests > 0 &&
        measured_started_.fetch_add(1, std::memory_order_relaxed) >= o.requests) {
      break;
    }
    if (NowNs() < intended) SleepUntilNs(intended);
    {
      absl::MutexLock lock(&mu_);
      if (!BelowCapLocked()) {
        ++throttled_;
        mu_.Await(absl::Condition(this, &Session::BelowCapLocked));
      }
    }
    if (measured) send_lag_.Add(NowNs() - intended);
    Issue(intended, connection, measured, nullptr);
    connection = (connection + 1) % client_.connections();
    // From the start time, not from the previous send, so rounding never drifts.
    next = o.arrival == Arrival::kUniform ? static_cast<double>(start_ns_) + (i + 1) * interval_ns
                                          : next + gap_s(rng) * 1e9;
  }
  SourceEnded();
}

void Session::StartClosedLoop() {
  const int slots = client_.options().concurrency;
  {
    absl::MutexLock lock(&mu_);
    sources_ = slots;
  }
  for (int i = 0; i < slots; ++i) NextInSlot(static_cast<size_t>(i) % client_.connections());
}

void Session::NextInSlot(size_t connection) {
  const int64_t now = NowNs();
  const bool measured = now >= measure_start_ns_;
  if (now >= end_ns_ ||
      (measured && client_.options().requests > 0 &&
       measured_started_.fetch_add(1, std::memory_order_relaxed) >= client_.options().requests)) {
    SourceEnded();
    return;
  }
  Issue(now, connection, measured, [this, connection] { NextInSlot(connection); });
}

void Session::Issue(int64_t intended_ns, size_t connection, bool measured,
                    std::function<void()> then) {
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  client_.StartOperation(workload_, connection,
                         [this, intended_ns, measured, then = std::move(then)](Outcome outcome) {
                           Complete(intended_ns, measured, outcome);
                           // A closed-loop slot starts its next operation before this one leaves
                           // the count, so the run cannot look drained in between.
                           if (then) then();
                           absl::MutexLock lock(&mu_);
                           --in_flight_;
                         });
}

void Session::Complete(int64_t intended_ns, bool measured, const Outcome& outcome) {
  const int64_t done = NowNs();
  absl::MutexLock lock(&mu_);
  if (!measured) {
    ++(outcome.ok ? warmup_ok_ : warmup_failed_);
    return;
  }
  last_measured_done_ns_ = std::max(last_measured_done_ns_, done);
  if (outcome.ok) {
    ++ok_;
    latencies_.Add(done - intended_ns);
  } else {
    ++failed_;
    errors_.Add(outcome);
  }
  if (client_.options().timeline) {
    timeline_.emplace_back(intended_ns - measure_start_ns_, outcome.ok ? done - intended_ns : -1);
  }
}

void Session::SourceEnded() {
  absl::MutexLock lock(&mu_);
  --sources_;
}

}  // namespace

const char* WorkloadName(Workload w) {
  switch (w) {
    case Workload::kPing:
      return "ping";
    case Workload::kClaim:
      return "claim";
    case Workload::kClaimRelease:
      return "claim-release";
    case Workload::kClaimExec:
      return "claim-exec";
  }
  return "unknown";
}

absl::StatusOr<Workload> ParseWorkload(const std::string& name) {
  for (Workload w :
       {Workload::kPing, Workload::kClaim, Workload::kClaimRelease, Workload::kClaimExec}) {
    if (name == WorkloadName(w)) return w;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("workload \"", name, "\" is not one of ping, claim, claim-release, claim-exec"));
}

absl::Status LoadOptions::Validate() const {
  if (server.empty()) return absl::InvalidArgumentError("server is empty");
  if (!(rate >= 0) || std::isinf(rate)) {
    return absl::InvalidArgumentError(absl::StrCat("rate ", rate, " must be a positive number"));
  }
  if (concurrency < 0) {
    return absl::InvalidArgumentError(absl::StrCat("concurrency ", concurrency, " is negative"));
  }
  if ((rate > 0) == (concurrency > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("give exactly one of --rate (open loop) and --concurrency (closed loop); "
                     "got rate ",
                     rate, " and concurrency ", concurrency));
  }
  if (connections < 1 || connections > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("connections ", connections, " is not between 1 and 1024"));
  }
  if (concurrency > 100000) {
    return absl::InvalidArgumentError(
        absl::StrCat("concurrency ", concurrency, " is above 100000"));
  }
  if (duration < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("duration ", absl::FormatDuration(duration), " is negative"));
  }
  if (requests < 0) {
    return absl::InvalidArgumentError(absl::StrCat("requests ", requests, " is negative"));
  }
  if (duration == absl::ZeroDuration() && requests == 0) {
    return absl::InvalidArgumentError("neither duration nor requests is set");
  }
  if (warmup < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup ", absl::FormatDuration(warmup), " is negative"));
  }
  if (max_in_flight < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_in_flight ", max_in_flight, " is < 1"));
  }
  if (rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rpc_timeout ", absl::FormatDuration(rpc_timeout), " is not positive"));
  }
  if (connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "connect_timeout ", absl::FormatDuration(connect_timeout), " is not positive"));
  }
  if (workload != Workload::kPing && pool.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("workload ", WorkloadName(workload), " needs a pool"));
  }
  if (!sbx::v1::EmptyPoolPolicy_IsValid(empty_pool_policy)) {
    return absl::InvalidArgumentError(
        absl::StrCat("empty_pool_policy ", empty_pool_policy, " is not a sbx.v1.EmptyPoolPolicy"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LoadClient>> LoadClient::Connect(const LoadOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::vector<Connection> connections(static_cast<size_t>(options.connections));
  const auto deadline = absl::ToChronoTime(absl::Now() + options.connect_timeout);
  for (size_t i = 0; i < connections.size(); ++i) {
    grpc::ChannelArguments args;
    // Channels with equal arguments may share one subchannel (one TCP connection); a
    // private subchannel pool and a distinct argument keep each on its own.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("sbx.loadgen.connection", static_cast<int>(i));
    Connection& c = connections[i];
    c.channel = grpc::CreateCustomChannel(options.server, grpc::InsecureChannelCredentials(), args);
    if (!c.channel->WaitForConnected(deadline)) {
      return absl::UnavailableError(absl::StrCat("server ", options.server,
                                                 " did not accept connection ", i + 1, " within ",
                                                 absl::FormatDuration(options.connect_timeout)));
    }
    c.diagnostics = sbx::v1::DiagnosticsService::NewStub(c.channel);
    c.claims = sbx::v1::ClaimService::NewStub(c.channel);
    c.sandboxes = sbx::v1::SandboxService::NewStub(c.channel);
  }
  return std::make_unique<LoadClientImpl>(options, std::move(connections));
}

}  // namespace sbx::loadgen

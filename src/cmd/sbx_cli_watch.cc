// `sbx watch claims`, `sbx watch pools`: the WatchClaims and WatchPools streams, one line
// (or one JSON object) per event until Ctrl-C.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "src/cmd/sbx_cli_commands.h"

namespace sbx::cli {
namespace {

struct WatchClaimsArgs {
  ClaimFilterFlags filter;
  int64_t since = 0;
  int64_t max_events = 0;
};

struct WatchPoolsArgs {
  std::vector<std::string> names;
  std::string interval;
  int64_t max_events = 0;
};

std::string EventName(v1::WatchEventType type) {
  return ShortEnumName(v1::WatchEventType_Name(type), "WATCH_EVENT_TYPE_");
}

// Ends a watch on SIGINT/SIGTERM by cancelling its call; remembers that it did, so that
// the resulting CANCELLED status is the normal end rather than an error.
class Interrupt {
 public:
  explicit Interrupt(grpc::ClientContext* call) : call_(call) {}
  void OnSignal() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    interrupted_ = true;
    call_->TryCancel();
  }
  bool interrupted() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return interrupted_;
  }

 private:
  grpc::ClientContext* const call_;
  mutable absl::Mutex mu_;
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
};

// Reads `reader` until the stream ends, the user interrupts or `max_events` events (0: no
// limit) were printed with `print`. `header` (table output) is printed before the first
// event, so that a watch refused at once prints nothing on stdout.
template <typename Event>
absl::StatusOr<int> Stream(Context& ctx, grpc::ClientContext* call,
                           grpc::ClientReaderInterface<Event>* reader, int64_t max_events,
                           const std::string& header,
                           const std::function<void(const Event&)>& print) {
  Interrupt interrupt(call);
  ctx.signals->SetHandler([&interrupt](int) { interrupt.OnSignal(); });
  Event event;
  int64_t seen = 0;
  bool enough = false;
  while (reader->Read(&event)) {
    if (seen == 0 && !ctx.json()) std::fputs(header.c_str(), stdout);
    print(event);
    std::fflush(stdout);
    if (++seen == max_events) {
      enough = true;
      call->TryCancel();
      break;
    }
  }
  const grpc::Status status = reader->Finish();
  ctx.signals->ClearHandler();
  // The server ends a watch only with an error (e.g. UNAVAILABLE when it shuts down).
  if (enough || interrupt.interrupted() || status.ok()) return 0;
  return FromGrpc(status, *call);
}

absl::StatusOr<int> RunWatchClaims(Context& ctx, const WatchClaimsArgs& a) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::WatchClaimsRequest req;
  FillClaimFilter(a.filter, req.mutable_filter());
  req.set_start_revision(a.since);
  std::unique_ptr<grpc::ClientContext> call = client.NewContext(absl::InfiniteDuration());
  std::unique_ptr<grpc::ClientReader<v1::ClaimEvent>> reader =
      client.claims().WatchClaims(call.get(), req);
  const bool owner = !a.filter.owner.empty();
  const std::string header = absl::StrFormat("%-9s %s%-36s %-16s %-9s %-36s %s\n", "EVENT",
                                             owner ? "OWNER            " : "", "CLAIM", "POOL",
                                             "STATE", "SANDBOX", "REVISION");
  return Stream<v1::ClaimEvent>(
      ctx, call.get(), reader.get(), a.max_events, header, [&ctx, owner](const v1::ClaimEvent& e) {
        if (ctx.json()) {
          PrintJsonLine(e);
          return;
        }
        const v1::Claim& c = e.claim();
        std::printf("%-9s %s%-36s %-16s %-9s %-36s %lld\n", EventName(e.type()).c_str(),
                    owner ? absl::StrFormat("%-16s ", EscapeForTerminal(c.owner())).c_str() : "",
                    EscapeForTerminal(c.claim_id()).c_str(), EscapeForTerminal(c.pool()).c_str(),
                    ShortEnumName(v1::ClaimState_Name(c.state()), "CLAIM_STATE_").c_str(),
                    c.sandbox().id().empty() ? "-" : EscapeForTerminal(c.sandbox().id()).c_str(),
                    static_cast<long long>(e.revision()));
      });
}

absl::StatusOr<int> RunWatchPools(Context& ctx, const WatchPoolsArgs& a) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::WatchPoolsRequest req;
  for (const std::string& n : a.names) req.add_names(n);
  if (!a.interval.empty()) ToProto(ParseDurationFlag(a.interval), req.mutable_min_interval());
  std::unique_ptr<grpc::ClientContext> call = client.NewContext(absl::InfiniteDuration());
  std::unique_ptr<grpc::ClientReader<v1::PoolEvent>> reader =
      client.admin().WatchPools(call.get(), req);
  const std::string header =
      absl::StrFormat("%-9s %-20s %5s %8s %7s %7s %6s %5s %5s\n", "EVENT", "POOL", "WARM",
                      "STARTING", "CLAIMED", "WAITING", "TARGET", "MIN", "MAX");
  return Stream<v1::PoolEvent>(
      ctx, call.get(), reader.get(), a.max_events, header, [&ctx](const v1::PoolEvent& e) {
        if (ctx.json()) {
          PrintJsonLine(e);
          return;
        }
        const v1::Pool& p = e.pool();
        const v1::PoolStatus& s = p.status();
        std::printf("%-9s %-20s %5d %8d %7d %7d %6d %5d %5d%s\n", EventName(e.type()).c_str(),
                    EscapeForTerminal(p.name()).c_str(), s.warm(), s.starting(), s.claimed(),
                    s.waiting_claims(), s.target(), p.min_warm(), p.max_warm(),
                    s.last_error().empty()
                        ? ""
                        : ("   error: " + EscapeForTerminal(s.last_error())).c_str());
      });
}

}  // namespace

void AddWatchCommands(CLI::App& app, Context& ctx, Actions& actions) {
  CLI::App* watch = app.add_subcommand(
      "watch", "Print one line (with -o json: one JSON object) per change until Ctrl-C");
  watch->require_subcommand(0, 1);
  {
    auto a = std::make_shared<WatchClaimsArgs>();
    CLI::App* sub = watch->add_subcommand(
        "claims", "Watch claims: first the current ones (ADDED), then every change");
    AddClaimFilterFlags(sub, &a->filter);
    sub->add_option("--since", a->since,
                    "Resume after this revision (from an earlier event or `claims -o json`); "
                    "default: the current claims first, then changes")
        ->check(CLI::NonNegativeNumber);
    sub->add_option("--max-events", a->max_events, "Stop after this many events (0: never)")
        ->check(CLI::NonNegativeNumber);
    actions[sub] = [&ctx, a] { return RunWatchClaims(ctx, *a); };
  }
  {
    auto a = std::make_shared<WatchPoolsArgs>();
    CLI::App* sub = watch->add_subcommand(
        "pools", "Watch pools' status (admin): first every pool, then changes");
    sub->add_option("name", a->names, "Only these pools (default: all, also new ones)");
    sub->add_option("--interval", a->interval,
                    "At most one event per pool per interval (default 1s; 100ms to 1m)")
        ->check(DurationCheck());
    sub->add_option("--max-events", a->max_events, "Stop after this many events (0: never)")
        ->check(CLI::NonNegativeNumber);
    actions[sub] = [&ctx, a] { return RunWatchPools(ctx, *a); };
  }
}

}  // namespace sbx::cli

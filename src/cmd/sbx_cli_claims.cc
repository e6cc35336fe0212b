// `sbx claim`, `sbx release`, `sbx renew`, `sbx claims [get]`: ClaimService.

#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "src/cmd/sbx_cli_commands.h"

namespace sbx::cli {
namespace {

// A claim without --wait waits for the pool's default_wait (30 s unless the pool says
// otherwise); the client's deadline adds this to --timeout.
constexpr absl::Duration kDefaultPoolWait = absl::Seconds(30);
// A claim by image may go to the image's on-demand pool, which waits 5 minutes by default
// (its first sandbox pulls the image): the deadline allows for that.
constexpr absl::Duration kDefaultImageWait = absl::Minutes(5);
// Pages of ListClaims.
constexpr int kPageSize = 500;

struct ClaimArgs {
  std::string pool;
  std::string image;
  std::string id;
  std::string ttl;
  std::string wait;
  std::string policy;
  std::string priority;
  std::vector<std::string> labels;
  std::vector<std::string> prefer;
  std::vector<std::string> env;
  std::vector<std::string> files;
  int count = 1;
  bool best_effort = false;
  bool quiet = false;
};

struct ListArgs {
  ClaimFilterFlags filter;
  bool quiet = false;
  int page_size = kPageSize;
};

v1::EmptyPoolPolicy PolicyFromFlag(const std::string& policy) {
  if (policy == "wait") return v1::EMPTY_POOL_POLICY_WAIT;
  if (policy == "cold") return v1::EMPTY_POOL_POLICY_COLD;
  if (policy == "fail") return v1::EMPTY_POOL_POLICY_FAIL;
  return v1::EMPTY_POOL_POLICY_UNSPECIFIED;
}

v1::ClaimPriority PriorityFromFlag(const std::string& priority) {
  if (priority == "batch") return v1::CLAIM_PRIORITY_BATCH;
  if (priority == "normal") return v1::CLAIM_PRIORITY_NORMAL;
  if (priority == "interactive") return v1::CLAIM_PRIORITY_INTERACTIVE;
  return v1::CLAIM_PRIORITY_UNSPECIFIED;
}

std::string StateName(v1::ClaimState state) {
  return ShortEnumName(v1::ClaimState_Name(state), "CLAIM_STATE_");
}

// --file LOCAL[:REMOTE]: split at the last ':'; without one the file keeps its base name.
absl::Status AddFile(const std::string& spec, v1::SandboxConfig* config) {
  std::string local = spec;
  std::string remote;
  if (const size_t colon = spec.rfind(':'); colon != std::string::npos) {
    local = spec.substr(0, colon);
    remote = spec.substr(colon + 1);
  }
  if (local.empty()) return UsageError(absl::StrCat("--file \"", spec, "\": no local file"));
  if (remote.empty()) remote = local.substr(local.rfind('/') + 1);
  if (remote.empty()) {
    return UsageError(absl::StrCat("--file \"", spec, "\": no file name for the sandbox"));
  }
  absl::StatusOr<std::string> content = ReadLocalFile(local);
  if (!content.ok()) {
    return absl::Status(content.status().code(),
                        absl::StrCat("--file: ", content.status().message()));
  }
  v1::FileSpec* file = config->add_files();
  file->set_path(remote);
  file->set_content(std::move(*content));
  struct stat st;
  if (local != "-" && ::stat(local.c_str(), &st) == 0) file->set_mode(st.st_mode & 07777);
  return absl::OkStatus();
}

void PrintClaims(const std::vector<v1::Claim>& claims, bool wide, bool owner) {
  std::vector<std::string> header;
  if (owner) header.push_back("OWNER");
  for (const char* h : {"CLAIM", "POOL", "SANDBOX", "STATE", "EXPIRES"}) header.push_back(h);
  if (wide) {
    header.push_back("AGE");
    header.push_back("LABELS");
  }
  Table table(header);
  const absl::Time now = absl::Now();
  for (const v1::Claim& c : claims) {
    std::vector<std::string> row;
    if (owner) row.push_back(c.owner());
    row.push_back(c.claim_id());
    row.push_back(c.pool());
    row.push_back(c.sandbox().id().empty() ? "-" : c.sandbox().id());
    row.push_back(StateName(c.state()) + (c.sandbox().suspended() ? " (suspended)" : ""));
    if (c.state() != v1::CLAIM_STATE_ACTIVE) {
      row.push_back("-");
    } else if (!c.has_expires_at()) {
      row.push_back("never");
    } else {
      row.push_back(RelativeTime(true, c.expires_at(), now));
    }
    if (wide) {
      row.push_back(c.has_created_at() ? HumanDuration(now - FromProto(c.created_at())) : "-");
      row.push_back(FormatLabels(c.labels()));
    }
    table.AddRow(std::move(row));
  }
  table.Print(stdout);
}

// Prints claims as the user asked: ids only (-q), JSON (one object, or an array when
// `as_array`), or a table.
void Show(const Context& ctx, const std::vector<v1::Claim>& claims, bool quiet, bool as_array,
          bool wide = false, bool owner = false) {
  if (quiet) {
    for (const v1::Claim& c : claims) {
      std::printf("%s\n", EscapeForTerminal(c.claim_id()).c_str());
    }
  } else if (ctx.json()) {
    if (as_array) {
      PrintJsonArrayOf(claims);
    } else if (!claims.empty()) {
      PrintJson(claims.front());
    }
  } else {
    PrintClaims(claims, wide, owner);
  }
}

absl::StatusOr<int> RunClaim(Context& ctx, const ClaimArgs& a) {
  if (a.pool.empty() == a.image.empty()) {
    return UsageError(a.pool.empty()
                          ? "claim: give a pool (POOL) or an image (--image REF)"
                          : absl::StrCat("claim: give a pool (\"", a.pool, "\") or an image (\"",
                                         a.image, "\"), not both"));
  }
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;

  v1::SandboxConfig config;
  for (const std::string& kv : a.env) {
    auto [k, v] = SplitKeyValue(kv);
    (*config.mutable_env())[k] = v;
  }
  for (const std::string& f : a.files) {
    if (absl::Status s = AddFile(f, &config); !s.ok()) return s;
  }
  google::protobuf::Map<std::string, std::string> labels;
  for (const std::string& kv : a.labels) {
    auto [k, v] = SplitKeyValue(kv);
    labels[k] = v;
  }
  google::protobuf::Map<std::string, std::string> prefer;
  for (const std::string& kv : a.prefer) {
    auto [k, v] = SplitKeyValue(kv);
    prefer[k] = v;
  }
  const absl::Duration wait = !a.wait.empty()    ? ParseDurationFlag(a.wait)
                              : !a.image.empty() ? kDefaultImageWait
                                                 : kDefaultPoolWait;
  const absl::Duration deadline = a.policy == "fail" ? client.timeout() : wait + client.timeout();

  if (a.count <= 1 && !a.best_effort) {
    v1::ClaimRequest req;
    req.set_claim_id(a.id);
    req.set_pool(a.pool);
    req.set_image(a.image);
    req.set_empty_pool_policy(PolicyFromFlag(a.policy));
    req.set_priority(PriorityFromFlag(a.priority));
    if (!a.wait.empty()) ToProto(ParseDurationFlag(a.wait), req.mutable_wait_timeout());
    if (!a.ttl.empty()) ToProto(ParseDurationFlag(a.ttl), req.mutable_ttl());
    *req.mutable_labels() = labels;
    *req.mutable_node_preference() = prefer;
    *req.mutable_config() = std::move(config);
    v1::ClaimResponse resp;
    if (absl::Status s = client.Call(
            deadline, [&](grpc::ClientContext* c) { return client.claims().Claim(c, req, &resp); });
        !s.ok()) {
      return s;
    }
    if (resp.replayed()) {
      std::fprintf(stderr, "sbx: note: claim \"%s\" already existed; returned unchanged\n",
                   EscapeForTerminal(resp.claim().claim_id()).c_str());
    }
    Show(ctx, {resp.claim()}, a.quiet, false);
    return 0;
  }

  v1::ClaimBatchRequest req;
  req.set_batch_id(a.id);
  req.set_pool(a.pool);
  req.set_image(a.image);
  req.set_count(a.count);
  req.set_mode(a.best_effort ? v1::BATCH_MODE_BEST_EFFORT : v1::BATCH_MODE_ALL_OR_NOTHING);
  req.set_empty_pool_policy(PolicyFromFlag(a.policy));
  req.set_priority(PriorityFromFlag(a.priority));
  if (!a.wait.empty()) ToProto(ParseDurationFlag(a.wait), req.mutable_wait_timeout());
  if (!a.ttl.empty()) ToProto(ParseDurationFlag(a.ttl), req.mutable_ttl());
  *req.mutable_labels() = labels;
  *req.mutable_node_preference() = prefer;
  *req.mutable_config() = std::move(config);
  v1::ClaimBatchResponse resp;
  const absl::Time start = absl::Now();
  absl::Status status;
  {
    // ClaimBatch is one call: the server does not report partial progress, so the display
    // is a spinner with the elapsed time.
    const std::string from = a.image.empty() ? absl::StrCat("pool \"", a.pool, "\"")
                                             : absl::StrCat("image \"", a.image, "\"");
    Progress progress(ctx.stderr_tty, absl::StrCat("claiming ", a.count, " sandboxes from ", from));
    progress.Set(0, 0, a.best_effort ? "(best effort)" : "");
    status = client.Call(deadline, [&](grpc::ClientContext* c) {
      return client.claims().ClaimBatch(c, req, &resp);
    });
    progress.Finish(
        status.ok()
            ? absl::StrFormat("claimed %d of %d sandboxes from pool \"%s\" in %.1fs%s",
                              resp.claims_size(), a.count,
                              resp.claims().empty() ? a.pool : resp.claims(0).pool(),
                              absl::ToDoubleSeconds(absl::Now() - start),
                              resp.replayed() ? " (replayed: the batch already existed)" : "")
            : "");
  }
  if (!status.ok()) return status;
  std::vector<v1::Claim> claims(resp.claims().begin(), resp.claims().end());
  Show(ctx, claims, a.quiet, true);
  return 0;
}

absl::StatusOr<int> RunRelease(Context& ctx, const std::vector<std::string>& ids) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  std::vector<v1::Claim> released;
  bool failed = false;
  for (const std::string& id : ids) {
    v1::ReleaseRequest req;
    req.set_claim_id(id);
    v1::ReleaseResponse resp;
    absl::Status s =
        client.Call([&](grpc::ClientContext* c) { return client.claims().Release(c, req, &resp); });
    if (!s.ok()) {
      // Go on with the other ids; the exit code says that one failed.
      PrintError(absl::Status(s.code(), absl::StrCat("release \"", id, "\": ", s.message())));
      failed = true;
      continue;
    }
    released.push_back(resp.claim());
  }
  if (!released.empty() || !failed) Show(ctx, released, false, ids.size() > 1);
  return failed ? 1 : 0;
}

absl::StatusOr<int> RunRenew(Context& ctx, const std::string& id, const std::string& ttl) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::RenewRequest req;
  req.set_claim_id(id);
  if (!ttl.empty()) ToProto(ParseDurationFlag(ttl), req.mutable_ttl());
  v1::RenewResponse resp;
  if (absl::Status s =
          client.Call([&](grpc::ClientContext* c) { return client.claims().Renew(c, req, &resp); });
      !s.ok()) {
    return s;
  }
  Show(ctx, {resp.claim()}, false, false);
  return 0;
}

absl::StatusOr<int> RunListClaims(Context& ctx, const ListArgs& a) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::ListClaimsRequest req;
  req.set_page_size(a.page_size);
  FillClaimFilter(a.filter, req.mutable_filter());
  std::vector<v1::Claim> claims;
  std::string previous_token;
  while (true) {
    v1::ListClaimsResponse resp;
    if (absl::Status s = client.Call(
            [&](grpc::ClientContext* c) { return client.claims().ListClaims(c, req, &resp); });
        !s.ok()) {
      return s;
    }
    for (v1::Claim& c : *resp.mutable_claims()) claims.push_back(std::move(c));
    if (resp.next_page_token().empty()) break;
    if (resp.next_page_token() == previous_token) {
      return absl::InternalError(absl::StrCat("ListClaims returned the page token \"",
                                              previous_token, "\" twice; stopping"));
    }
    previous_token = resp.next_page_token();
    req.set_page_token(resp.next_page_token());
  }
  if (claims.empty() && !ctx.json() && !a.quiet) {
    std::fprintf(stderr, "No claims found.\n");
    return 0;
  }
  Show(ctx, claims, a.quiet, true, true, !a.filter.owner.empty());
  return 0;
}

absl::StatusOr<int> RunGetClaim(Context& ctx, const std::string& id) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::GetClaimRequest req;
  req.set_claim_id(id);
  v1::GetClaimResponse resp;
  if (absl::Status s = client.Call(
          [&](grpc::ClientContext* c) { return client.claims().GetClaim(c, req, &resp); });
      !s.ok()) {
    return s;
  }
  Show(ctx, {resp.claim()}, false, false, true);
  return 0;
}

}  // namespace

void AddClaimCommands(CLI::App& app, Context& ctx, Actions& actions) {
  {
    auto a = std::make_shared<ClaimArgs>();
    CLI::App* sub = app.add_subcommand(
        "claim",
        "Claim a warm sandbox (or --count of them) from a pool, or one running an image "
        "(--image), and print the claim.\n"
        "Scripts: `id=$(sbx claim POOL -q)` or `sbx claim POOL -o json | jq -r .claimId`.");
    sub->add_option("pool", a->pool, "Pool to claim from (or --image)");
    sub->add_option("--image", a->image,
                    "Claim a sandbox running this image instead of naming a pool: from a pool "
                    "whose template runs it, else (local runtime with an image cache) from the "
                    "image's on-demand pool, made and pulled on first use (waits up to 5m by "
                    "default). The POOL column says which pool served it");
    sub->add_option("--id", a->id,
                    "Claim id, the idempotency key: a retry with the same id returns the same "
                    "claim. With --count, the batch id (claims are ID#0..ID#N-1). Default: "
                    "generated by the server");
    sub->add_option("--ttl", a->ttl,
                    "Lifetime without a renew, e.g. 10m (default: the pool's default_ttl)")
        ->check(DurationCheck());
    sub->add_option("--wait", a->wait,
                    "How long to wait for a sandbox when the pool is empty (policies wait and "
                    "cold), e.g. 30s (default: the pool's default_wait; 5m for an image's "
                    "on-demand pool)")
        ->check(DurationCheck());
    sub->add_option("--policy", a->policy,
                    "When the pool is empty: wait (queue), cold (start one now), fail (error "
                    "at once). Default: the pool's")
        ->check(CLI::IsMember({"wait", "cold", "fail"}));
    sub->add_option("--priority", a->priority,
                    "Place among your own claims waiting for the same empty pool: interactive "
                    "(served first), normal (default) or batch (served last). Other tenants "
                    "are served by their share, whatever the priority")
        ->check(CLI::IsMember({"interactive", "normal", "batch"}));
    sub->add_option("--label", a->labels, "Label k=v recorded on the claim (repeatable)")
        ->allow_extra_args(false)
        ->check(KeyValueCheck());
    sub->add_option("--prefer", a->prefer,
                    "Node label k=v the sandbox's node should have, e.g. "
                    "topology.kubernetes.io/zone=europe-west1-b (repeatable; soft: any sandbox "
                    "when none matches; honoured by spread and pack pools)")
        ->allow_extra_args(false)
        ->check(KeyValueCheck());
    sub->add_option("--env", a->env,
                    "Environment variable K=V for every command run in the sandbox (repeatable)")
        ->allow_extra_args(false)
        ->check(KeyValueCheck());
    sub->add_option("--file", a->files,
                    "LOCAL[:REMOTE]: copy a local file into the sandbox's workspace before the "
                    "claim returns (split at the last ':'; default REMOTE: the base name; 1 MiB "
                    "in total; larger files: sbx cp) (repeatable)")
        ->allow_extra_args(false);
    CLI::Option* count =
        sub->add_option("--count", a->count,
                        "Claim N sandboxes in one call (ClaimBatch); all or nothing unless "
                        "--best-effort")
            ->check(CLI::Range(1, 1000));
    sub->add_flag("--best-effort", a->best_effort,
                  "With --count: accept between 1 and N sandboxes instead of all or nothing")
        ->needs(count);
    sub->add_flag("-q,--quiet", a->quiet, "Print only the claim id(s), one per line");
    actions[sub] = [&ctx, a] { return RunClaim(ctx, *a); };
  }
  {
    auto ids = std::make_shared<std::vector<std::string>>();
    CLI::App* sub =
        app.add_subcommand("release", "Release claims: their sandboxes are destroyed (idempotent)");
    sub->add_option("id", *ids, "Claim id(s)")->required();
    actions[sub] = [&ctx, ids] { return RunRelease(ctx, *ids); };
  }
  {
    auto id = std::make_shared<std::string>();
    auto ttl = std::make_shared<std::string>();
    CLI::App* sub = app.add_subcommand("renew", "Extend an active claim: it expires ttl from now");
    sub->add_option("id", *id, "Claim id")->required();
    sub->add_option("--ttl", *ttl, "New remaining lifetime, e.g. 10m (default: the pool's)")
        ->check(DurationCheck());
    actions[sub] = [&ctx, id, ttl] { return RunRenew(ctx, *id, *ttl); };
  }
  {
    auto a = std::make_shared<ListArgs>();
    CLI::App* sub =
        app.add_subcommand("claims", "List claims (all pages), or `claims get ID` to show one");
    sub->require_subcommand(0, 1);
    AddClaimFilterFlags(sub, &a->filter);
    sub->add_flag("-q,--quiet", a->quiet, "Print only the claim ids");
    sub->add_option("--page-size", a->page_size,
                    "Claims per ListClaims call; every page is read either way")
        ->check(CLI::Range(1, 1000))
        ->capture_default_str();
    actions[sub] = [&ctx, a] { return RunListClaims(ctx, *a); };

    auto id = std::make_shared<std::string>();
    CLI::App* get = sub->add_subcommand("get", "Show one claim, in any state");
    get->add_option("id", *id, "Claim id")->required();
    actions[get] = [&ctx, id] { return RunGetClaim(ctx, *id); };
  }
}

}  // namespace sbx::cli

// `sbx snapshot`, `sbx snapshots [list|get|delete]`, `sbx reset`, `sbx fork`: sbx.v1.Snapshots
// (issue 37).

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "src/cmd/sbx_cli_commands.h"
#include "src/common/status_macros.h"

namespace sbx::cli {
namespace {

void PrintSnapshots(const Context& ctx, const std::vector<const v1::Snapshot*>& snapshots) {
  if (ctx.json()) {
    std::vector<const google::protobuf::Message*> messages(snapshots.begin(), snapshots.end());
    PrintJsonArray(messages);
    return;
  }
  const absl::Time now = absl::Now();
  Table table({"ID", "NAME", "SIZE", "PARENT", "SOURCE CLAIM", "CREATED", "LABELS"});
  for (const v1::Snapshot* s : snapshots) {
    table.AddRow({s->id(), EscapeForTerminal(s->name()), std::to_string(s->size_bytes()),
                  !s->parent_snapshot_id().empty()    ? s->parent_snapshot_id()
                  : !s->parent_image_digest().empty() ? s->parent_image_digest().substr(0, 19)
                                                      : "(host root)",
                  s->source_claim_id(), RelativeTime(s->has_create_time(), s->create_time(), now),
                  FormatLabels(s->labels())});
  }
  table.Print(stdout);
}

google::protobuf::Map<std::string, std::string> Labels(const std::vector<std::string>& kvs) {
  google::protobuf::Map<std::string, std::string> out;
  for (const std::string& kv : kvs) {
    auto [k, v] = SplitKeyValue(kv);
    out[k] = v;
  }
  return out;
}

struct SnapshotArgs {
  std::string claim_id;
  std::string name;
  std::vector<std::string> labels;
};

absl::StatusOr<int> RunSnapshot(Context& ctx, const SnapshotArgs& a) {
  ASSIGN_OR_RETURN(Client * client, ctx.Connect());
  v1::CreateSnapshotRequest req;
  req.set_claim_id(a.claim_id);
  req.set_name(a.name);
  *req.mutable_labels() = Labels(a.labels);
  v1::CreateSnapshotResponse resp;
  // A snapshot copies the sandbox's files: give it longer than a plain call.
  RETURN_IF_ERROR(client->Call(client->timeout() + absl::Minutes(10), [&](grpc::ClientContext* c) {
    return client->snapshots().CreateSnapshot(c, req, &resp);
  }));
  if (ctx.json()) {
    PrintJson(resp);
  } else {
    PrintSnapshots(ctx, {&resp.snapshot()});
    if (resp.dropped_entries() > 0) {
      std::fprintf(stderr, "sbx: %lld sockets or device nodes were left out of the snapshot\n",
                   static_cast<long long>(resp.dropped_entries()));
    }
  }
  return 0;
}

absl::StatusOr<int> RunList(Context& ctx, const std::vector<std::string>& labels) {
  ASSIGN_OR_RETURN(Client * client, ctx.Connect());
  v1::ListSnapshotsRequest req;
  *req.mutable_label_selector() = Labels(labels);
  v1::ListSnapshotsResponse resp;
  RETURN_IF_ERROR(client->Call(
      [&](grpc::ClientContext* c) { return client->snapshots().ListSnapshots(c, req, &resp); }));
  if (ctx.json()) {
    PrintJson(resp);
    return 0;
  }
  std::vector<const v1::Snapshot*> all;
  for (const v1::Snapshot& s : resp.snapshots()) all.push_back(&s);
  PrintSnapshots(ctx, all);
  std::printf(
      "%lld bytes used of %s\n", static_cast<long long>(resp.used_bytes()),
      resp.quota_bytes() > 0 ? absl::StrCat(resp.quota_bytes(), " bytes").c_str() : "no quota");
  return 0;
}

absl::StatusOr<int> RunGet(Context& ctx, const std::string& id) {
  ASSIGN_OR_RETURN(Client * client, ctx.Connect());
  v1::GetSnapshotRequest req;
  req.set_snapshot_id(id);
  v1::GetSnapshotResponse resp;
  RETURN_IF_ERROR(client->Call(
      [&](grpc::ClientContext* c) { return client->snapshots().GetSnapshot(c, req, &resp); }));
  if (ctx.json()) {
    PrintJson(resp.snapshot());
  } else {
    PrintSnapshots(ctx, {&resp.snapshot()});
  }
  return 0;
}

absl::StatusOr<int> RunDelete(Context& ctx, const std::string& id) {
  ASSIGN_OR_RETURN(Client * client, ctx.Connect());
  v1::DeleteSnapshotRequest req;
  req.set_snapshot_id(id);
  v1::DeleteSnapshotResponse resp;
  RETURN_IF_ERROR(client->Call(
      [&](grpc::ClientContext* c) { return client->snapshots().DeleteSnapshot(c, req, &resp); }));
  if (!ctx.json()) std::printf("deleted %s\n", id.c_str());
  return 0;
}

absl::StatusOr<int> RunReset(Context& ctx, const std::string& claim_id,
                             const std::string& snapshot_id) {
  ASSIGN_OR_RETURN(Client * client, ctx.Connect());
  v1::ResetRequest req;
  req.set_claim_id(claim_id);
  req.set_snapshot_id(snapshot_id);
  v1::ResetResponse resp;
  // A reset restarts the sandbox and copies the snapshot's files: as long as a snapshot.
  RETURN_IF_ERROR(client->Call(client->timeout() + absl::Minutes(10), [&](grpc::ClientContext* c) {
    return client->snapshots().Reset(c, req, &resp);
  }));
  if (ctx.json()) {
    PrintJson(resp);
  } else {
    std::printf("claim %s reset to snapshot %s\n", claim_id.c_str(), snapshot_id.c_str());
  }
  return 0;
}

struct ForkArgs {
  std::string source;
  int count = 1;
  std::string batch_id;
  std::string ttl;
  std::string wait;
  std::vector<std::string> labels;
  std::vector<std::string> env;
};

absl::StatusOr<int> RunFork(Context& ctx, const ForkArgs& a) {
  ASSIGN_OR_RETURN(Client * client, ctx.Connect());
  v1::ForkRequest req;
  // Snapshot ids are "sn-..."; anything else is a claim to snapshot first.
  if (absl::StartsWith(a.source, "sn-")) {
    req.set_snapshot_id(a.source);
  } else {
    req.set_claim_id(a.source);
  }
  req.set_count(a.count);
  req.set_batch_id(a.batch_id);
  if (!a.ttl.empty()) ToProto(ParseDurationFlag(a.ttl), req.mutable_ttl());
  if (!a.wait.empty()) ToProto(ParseDurationFlag(a.wait), req.mutable_wait_timeout());
  *req.mutable_labels() = Labels(a.labels);
  if (!a.env.empty()) *req.mutable_config()->mutable_env() = Labels(a.env);
  v1::ForkResponse resp;
  // Forks are created (cold) before the answer: give it the wait the server gives them.
  RETURN_IF_ERROR(client->Call(client->timeout() + absl::Minutes(10), [&](grpc::ClientContext* c) {
    return client->snapshots().Fork(c, req, &resp);
  }));
  if (ctx.json()) {
    PrintJson(resp);
    return 0;
  }
  if (resp.replayed()) {
    std::fprintf(stderr, "sbx: note: forks \"%s\" already existed; returned unchanged\n",
                 EscapeForTerminal(resp.batch_id()).c_str());
  }
  std::printf("%d forks of snapshot %s\n", resp.claims_size(), resp.snapshot_id().c_str());
  Table table({"CLAIM", "SANDBOX", "POOL"});
  for (const v1::Claim& c : resp.claims()) {
    table.AddRow({c.claim_id(), c.sandbox().id(), c.pool()});
  }
  table.Print(stdout);
  return 0;
}

}  // namespace

void AddSnapshotCommands(CLI::App& app, Context& ctx, Actions& actions) {
  {
    auto a = std::make_shared<SnapshotArgs>();
    CLI::App* sub = app.add_subcommand(
        "snapshot",
        "Snapshot a claimed sandbox's files (its root's own layer and its workspace): the "
        "sandbox is frozen for the copy and runs on after it");
    sub->add_option("id", a->claim_id, "Claim id")->required();
    sub->add_option("--name", a->name, "A name for the snapshot (at most 128 bytes)");
    sub->add_option("--label", a->labels, "Label k=v recorded on the snapshot (repeatable)")
        ->allow_extra_args(false)
        ->check(KeyValueCheck());
    actions[sub] = [&ctx, a] { return RunSnapshot(ctx, *a); };
  }
  {
    auto claim = std::make_shared<std::string>();
    auto snapshot = std::make_shared<std::string>();
    CLI::App* sub = app.add_subcommand(
        "reset",
        "Rewind a claimed sandbox to one of your snapshots: its processes are killed and it "
        "starts again with the snapshot's files, keeping its claim id and endpoint");
    sub->add_option("claim", *claim, "Claim id")->required();
    sub->add_option("snapshot", *snapshot, "Snapshot id")->required();
    actions[sub] = [&ctx, claim, snapshot] { return RunReset(ctx, *claim, *snapshot); };
  }
  {
    auto a = std::make_shared<ForkArgs>();
    CLI::App* sub = app.add_subcommand(
        "fork",
        "Claim N new sandboxes that start at a snapshot (or at a claim's files now: it is "
        "snapshotted first); each writes only its own copy");
    sub->add_option("source", a->source, "A snapshot id (sn-...) or a claim id (snapshotted first)")
        ->required();
    sub->add_option("-n,--count", a->count, "How many forks (1 to the server's max batch)")
        ->check(CLI::PositiveNumber);
    sub->add_option("--id", a->batch_id,
                    "Batch id: a retry with it answers the same forks (claims ID#0..ID#N-1)");
    sub->add_option("--ttl", a->ttl, "Each fork's lifetime without a renew (e.g. 30m)");
    sub->add_option("--wait", a->wait, "How long to wait for every fork (default 5m)");
    sub->add_option("--label", a->labels, "Label k=v on every fork (repeatable)")
        ->allow_extra_args(false)
        ->check(KeyValueCheck());
    sub->add_option("--env", a->env, "Late-bound env K=V for every fork (repeatable)")
        ->allow_extra_args(false)
        ->check(KeyValueCheck());
    actions[sub] = [&ctx, a] { return RunFork(ctx, *a); };
  }
  CLI::App* snaps =
      app.add_subcommand("snapshots", "Your snapshots: list them (the default), get or delete one");
  {
    auto labels = std::make_shared<std::vector<std::string>>();
    snaps->add_option("--label", *labels, "Only snapshots with label k=v (repeatable)")
        ->allow_extra_args(false)
        ->check(KeyValueCheck());
    actions[snaps] = [&ctx, labels] { return RunList(ctx, *labels); };
    CLI::App* list = snaps->add_subcommand("list", "List your snapshots (oldest first)");
    auto list_labels = std::make_shared<std::vector<std::string>>();
    list->add_option("--label", *list_labels, "Only snapshots with label k=v (repeatable)")
        ->allow_extra_args(false)
        ->check(KeyValueCheck());
    actions[list] = [&ctx, list_labels] { return RunList(ctx, *list_labels); };
  }
  {
    auto id = std::make_shared<std::string>();
    CLI::App* get = snaps->add_subcommand("get", "Show one snapshot");
    get->add_option("id", *id, "Snapshot id")->required();
    actions[get] = [&ctx, id] { return RunGet(ctx, *id); };
  }
  {
    auto id = std::make_shared<std::string>();
    CLI::App* del = snaps->add_subcommand(
        "delete", "Delete a snapshot (refused while a template, pool or sandbox uses it)");
    del->add_option("id", *id, "Snapshot id")->required();
    actions[del] = [&ctx, id] { return RunDelete(ctx, *id); };
  }
}

}  // namespace sbx::cli

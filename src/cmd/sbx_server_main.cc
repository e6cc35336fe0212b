// sbx-server: parse flags, open the store, start the runtime, the allocator and the
// refill reconciler, serve gRPC, wait for SIGTERM/SIGINT (SIGHUP reloads the tokens
// file), shut down with a deadline.

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <signal.h>
#include <unistd.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/support/log.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"
#include "src/allocator/allocator.h"
#include "src/allocator/refill.h"
#include "src/allocator/snapshots.h"
#include "src/cmd/config.h"
#include "src/cmd/conversion_wiring.h"
#include "src/cmd/e2b_wiring.h"
#include "src/cmd/kube_wiring.h"
#include "src/cmd/proxy_wiring.h"
#include "src/cmd/replication_wiring.h"
#include "src/cmd/wiring.h"
#include "src/common/build_info.h"
#include "src/common/clock.h"
#include "src/common/dropped.h"
#include "src/common/ids.h"
#include "src/common/logging.h"
#include "src/common/sandbox_secret.h"
#include "src/common/signals.h"
#include "src/common/status_macros.h"
#include "src/images/image_cache.h"
#include "src/replication/service.h"
#include "src/runtime/bubblewrap_runtime.h"
#include "src/runtime/instant_runtime.h"
#include "src/server/metrics.h"
#include "src/server/server.h"
#include "src/store/rocksdb_store.h"

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "sbx-server: error: %s\n", std::string(status.message()).c_str());
  return 2;
}

// sbx-sandboxd next to this binary (both are built into the same folder).
std::string DefaultSandboxd() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : (self.parent_path() / "sbx-sandboxd").string();
}

// gRPC's own log lines go through spdlog, so that they take --log_format (a JSON log
// stays one object per line).
void LogFromGrpc(gpr_log_func_args* args) {
  const spdlog::level::level_enum level =
      args->severity == GPR_LOG_SEVERITY_ERROR  ? spdlog::level::err
      : args->severity == GPR_LOG_SEVERITY_INFO ? spdlog::level::info
                                                : spdlog::level::debug;
  spdlog::log(level, "grpc: {} ({}:{})", args->message, args->file, args->line);
}

// Reconciles the recovered allocator with the runtime, the truth for existence: local
// sandboxes outlive a server (its runtime adopts them at start), so a claim made before
// the restart keeps its sandbox. What the store remembers and the runtime lacks is gone
// (warm ones are dropped and refilled, claimed ones become LOST, each logged and counted
// in sbx_claims_lost_at_restart_total); what exists but is not ready keeps its claim, or
// is retired when warm; what the runtime runs and the store does not know (created after
// the last commit) is deleted, except what a claim holds in the runtime's own records (a
// SandboxClaim's Sandbox: adopted, left to its claim), and except when there are more of
// them than `limits` allow without confirmation (a store that lost its history would
// erase the cluster): then none is deleted and each is logged. Only the runtime's List
// decides absence, so it must answer existence with confidence or fail (the Kubernetes
// runtime fails while its cache has not completed a list): a failed List stops the start,
// it never counts as an empty one.
struct StartDeleteLimits {
  // Unknown sandboxes deleted at most: this share of the running ones, and never fewer
  // than `floor` (a restart finds the few made after the last commit).
  double share = 0.2;
  size_t floor = 10;
  bool confirmed = false;  // --start_confirm_deletes: delete them all
};

absl::Status ReconcileWithRuntime(sbx::allocator::Allocator& allocator,
                                  sbx::runtime::Runtime& runtime, prometheus::Registry& registry,
                                  const StartDeleteLimits& limits) {
  auto running = runtime.List();
  if (!running.ok()) {
    return absl::Status(
        running.status().code(),
        absl::StrCat("reconciling the store with the runtime: ", running.status().message()));
  }
  std::unordered_set<std::string> live, unready;
  for (const sbx::runtime::SandboxInfo& s : *running) {
    live.insert(s.id);
    if (!s.ready) unready.insert(s.id);
  }
  // The active claims by sandbox, to name the ones that become LOST.
  sbx::allocator::ClaimFilter active;
  active.all_owners = true;
  active.limit = 0;
  std::unordered_map<std::string, sbx::store::ClaimRecord> claim_of;
  for (sbx::store::ClaimRecord& c : allocator.ListClaims(active)) {
    std::string sandbox = c.sandbox_id;
    claim_of.emplace(std::move(sandbox), std::move(c));
  }
  std::unordered_set<std::string> known;
  size_t gone = 0, deleted = 0, retired = 0, kept_unready = 0;
  std::map<std::string, uint64_t> lost;
  for (const std::string& id : allocator.ListSandboxIds()) {
    known.insert(id);
    if (live.contains(id)) {
      // It exists: a claim on it is kept, ready or not. A warm one that cannot serve now
      // is replaced rather than handed out (RetireWarm refuses a claimed one).
      if (unready.contains(id)) ++(allocator.RetireWarm(id).ok() ? retired : kept_unready);
      continue;
    }
    if (auto c = claim_of.find(id); c != claim_of.end()) {
      spdlog::warn(
          "claim \"{}\" of owner \"{}\" (pool \"{}\") is LOST: its sandbox \"{}\" is not among "
          "the sandboxes the runtime reports existing ({})",
          c->second.id, c->second.owner, c->second.pool, id, sbx::server::kLostSandboxMissing);
      ++lost[sbx::server::kLostSandboxMissing];
    }
    if (allocator.SandboxGone(id).ok()) ++gone;
  }
  std::vector<std::string> unknown;
  size_t adopted_claimed = 0;
  for (const sbx::runtime::SandboxInfo& s : *running) {
    if (known.contains(s.id)) continue;
    if (!s.held_by_claim.empty()) {
      ++adopted_claimed;
      spdlog::info("sandbox {} is unknown to the store but held by claim uid {}: kept", s.id,
                   s.held_by_claim);
      continue;
    }
    unknown.push_back(s.id);
  }
  const size_t limit = std::max(
      limits.floor, static_cast<size_t>(limits.share * static_cast<double>(running->size())));
  size_t over_limit = 0;
  if (unknown.size() > limit && !limits.confirmed) {
    over_limit = unknown.size();
    std::sort(unknown.begin(), unknown.end());
    for (const std::string& id : unknown) {
      spdlog::warn("sandbox {} is unknown to the store: NOT deleted (over the start's limit)", id);
    }
    spdlog::error(
        "{} of the {} running sandboxes are unknown to this replica's store, more than the {} "
        "a start deletes by itself: none was deleted. A store that lost its history would "
        "erase them; if this store is the truth, restart with --start_confirm_deletes "
        "(docs/operations.md)",
        unknown.size(), running->size(), limit);
    unknown.clear();
  }
  for (const std::string& id : unknown) {
    ++deleted;
    runtime.Delete(id, [id](absl::Status s) {
      if (!s.ok() && !absl::IsNotFound(s)) {
        spdlog::warn("unknown sandbox {} not deleted: {}", id, s.ToString());
      }
    });
  }
  sbx::server::RegisterClaimsLostAtRestart(registry, lost);
  sbx::server::RegisterStartSandboxesKept(registry, adopted_claimed, over_limit);
  spdlog::info(
      "runtime reconciled: {} sandboxes adopted ({} claimed ones kept and {} warm ones retired "
      "while not ready), {} from before the restart gone ({} claims LOST), {} unknown ones "
      "deleted, {} unknown ones kept (held by a claim in the runtime), {} kept over the delete "
      "limit",
      live.size() - deleted, kept_unready, retired, gone, lost[sbx::server::kLostSandboxMissing],
      deleted, adopted_claimed, over_limit);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  // First of all, block the stop signals in every thread (gRPC's threads inherit this
  // mask), then wait for them synchronously here: no async-signal-safety concerns.
  const sigset_t stop_signals = sbx::BlockSignals({SIGTERM, SIGINT, SIGHUP});

  sbx::server::ServerOptions server_options;
  sbx::server::MetricsOptions metrics_options;
  sbx::LogOptions log_options;
  double shutdown_grace_s = 10;
  sbx::store::RocksDbStoreOptions store_options;
  store_options.path = ".sbx/data";
  std::string durability = "sync";
  std::string runtime_name = "local";
  sbx::runtime::BubblewrapRuntimeOptions local_options;
  local_options.sandboxd_path = DefaultSandboxd();
  sbx::allocator::RefillOptions refill_options;
  std::string config_path;
  sbx::cmd::KubeFlags kube_flags;
  sbx::cmd::ConversionFlags conversion_flags;
  sbx::cmd::ProxyFlags proxy_flags;
  sbx::cmd::E2bFlags e2b_flags;  // the E2B-compatible API (src/gateway/e2b)
  // Outlives the proxy and the metrics endpoint that reads it.
  sbx::gateway::ProxyCounters proxy_counters;

  CLI::App app{"sbx-server: warm-pool sandbox allocator for AI agents (gRPC)"};
  // A flag given twice takes its last value, so wrappers (scripts/run) can set defaults
  // that the caller's own flags override.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_version_flag("--version",
                       std::string(sbx::Version()) + " (" + std::string(sbx::GitCommit()) + ")");
  app.add_option("--listen", server_options.listen, "host:port to serve gRPC on (port 0: any)")
      ->capture_default_str();
  std::string advertise_address;
  app.add_option("--advertise_address", advertise_address,
                 "with --kube_leader_election: host:port at which the other replicas reach this "
                 "one's gRPC port, to relay calls to it while it leads (default: --listen's host "
                 "with the bound port; needed when that host is a wildcard)");
  app.add_option("--port_file", server_options.port_file,
                 "write the bound port to this file once serving");
  app.add_option("--max_receive_message_bytes", server_options.max_receive_message_bytes,
                 "largest request accepted")
      ->capture_default_str();
  app.add_option("--shutdown_grace_seconds", shutdown_grace_s,
                 "on SIGTERM/SIGINT, let calls in flight finish for this long")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--data_dir", store_options.path,
                 "RocksDB store folder (created when missing or empty)")
      ->capture_default_str();
  app.add_option("--data_min_free_bytes", store_options.min_free_bytes,
                 "free space kept on the --data_dir file system: below it the store refuses "
                 "writes (UNAVAILABLE) until space returns, and a start opens it read-only; 0: "
                 "no reserve")
      ->capture_default_str();
  app.add_option("--durability", durability,
                 "sync: fsync each group commit; buffered: OS-buffered (survives kill -9, not "
                 "power loss)")
      ->capture_default_str();
  app.add_option("--store_pipeline", store_options.pipeline,
                 "with --durability sync: write the next group commit while the previous one "
                 "is being synced (false: write, sync and answer each group before the next)")
      ->capture_default_str();
  app.add_option("--config", config_path, "YAML file declaring templates and pools at start");
  app.add_option("--runtime", runtime_name,
                 "local: bubblewrap sandboxes on this machine; instant: sandboxes that are "
                 "only names, for load tests of the claim path (nothing runs in them); none: no "
                 "runtime (pools stay empty); kubernetes: SandboxWarmPools of the cluster "
                 "(needs --kubeconfig) are the pools, their members Sandboxes and pods")
      ->capture_default_str();
  app.add_option("--sandboxd", local_options.sandboxd_path, "sbx-sandboxd binary")
      ->capture_default_str();
  app.add_option("--sandbox_root", local_options.root_dir,
                 "folder for the local sandboxes' sockets")
      ->capture_default_str();
  app.add_option("--bwrap", local_options.bwrap_path, "bubblewrap binary of the local runtime")
      ->capture_default_str();
  app.add_flag("--insecure_local_no_isolation", local_options.allow_unisolated,
               "DEVELOPMENT ONLY: when bubblewrap cannot isolate sandboxes, run them as plain "
               "processes with the server's own user, files and network (default: refuse to "
               "start)");
  app.add_option("--sandbox_uid_base", local_options.sandbox_uid_base,
                 "as root: the first host uid of the local sandboxes (each gets its own)")
      ->capture_default_str();
  std::string sandbox_key_file;
  app.add_option("--sandbox_key_file", sandbox_key_file,
                 "key of the sandboxes' daemon secrets (made on first start, mode 0600; "
                 "default: sandbox.key in --data_dir; see --sandbox_key_secret for a key "
                 "shared by several replicas)");
  double replication_ack_timeout_s = 2;
  app.add_option("--replication_ack_timeout_s", replication_ack_timeout_s,
                 "with --kube_leader_election: how long the leader waits for its in-sync "
                 "standby to acknowledge a group commit before it drops the standby (and, once "
                 "the Lease names no standby, acknowledges alone)")
      ->capture_default_str();
  StartDeleteLimits start_delete_limits;
  app.add_option("--start_max_delete_share", start_delete_limits.share,
                 "at start, running sandboxes unknown to the store are deleted only while they "
                 "are at most this share of the running ones (or 10); past it none is, each is "
                 "logged (a store that lost its history would erase the cluster)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--start_confirm_deletes", start_delete_limits.confirmed,
               "at start, delete every running sandbox unknown to the store, however many");
  int replication_copies = 1;
  app.add_option("--replication_copies", replication_copies,
                 "with --kube_leader_election: copies of a commit (the leader's, its in-sync "
                 "standby's) needed to acknowledge it while no standby is in sync. 1: the leader "
                 "acknowledges alone, so claims are served through a standby's restart or loss "
                 "(what it acknowledges then is lost if its volume is lost too before a standby "
                 "catches up); the default, because losing both at once is rarer than a standby "
                 "restart, which 2 turns into an outage. 2: the leader refuses every write "
                 "(UNAVAILABLE, nothing written) until a standby is in sync and named in the Lease")
      ->capture_default_str();
  sbx::images::ImageCacheOptions image_options;
  image_options.budget_bytes = 0;  // off unless asked for
  app.add_option("--image_cache_bytes", image_options.budget_bytes,
                 "bytes the OCI image cache may keep on disk (unpacked images, least recently "
                 "used evicted first); 0: no image cache")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  app.add_option("--image_cache_dir", image_options.dir,
                 "folder of the image cache (default: images in --data_dir)");
  app.add_option("--image_import_dir", image_options.import_dirs,
                 "a folder under which local image references (oci:, oci-archive:, "
                 "docker-archive:) may lie; repeatable (none: only docker:// references)");
  app.add_option("--image_registry", image_options.allow_registry,
                 "accept docker:// image references (fetched from a registry)")
      ->capture_default_str();
  std::string image_claim_template;
  app.add_option("--image_claim_template", image_claim_template,
                 "a local template (in --config or the store) whose spec the on-demand pools of "
                 "claims by image copy, with the claim's image set (default: no network, 512 MiB "
                 "of memory, 512 processes); needs --runtime local and --image_cache_bytes");
  sbx::allocator::SnapshotsOptions snapshot_options;
  app.add_option(
         "--snapshot_quota_bytes", snapshot_options.quota_bytes,
         "bytes of snapshots each tenant may hold (their files under --data_dir/snapshots); "
         "0: no quota")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  app.add_flag("--delete_sandboxes_on_exit", local_options.delete_on_exit,
               "kill every local sandbox when the server stops (default: leave them running; "
               "the next server on the same --sandbox_root adopts them, claims intact)");
  app.add_option("--refill_qps", refill_options.qps, "runtime writes per second")
      ->capture_default_str();
  app.add_option("--refill_max_creating", refill_options.max_creating_per_pool,
                 "creates in flight per pool (until each sandbox is ready)")
      ->capture_default_str();
  app.add_option("--auth_tokens_file", server_options.auth.tokens_file,
                 "bearer tokens: one '<token> <tenant> [admin]' per line (SIGHUP reloads)");
  app.add_flag("--insecure_no_auth", server_options.auth.insecure_no_auth,
               "no authentication: every caller is tenant 'anonymous' with admin rights (the "
               "default when --auth_tokens_file is not given)");
  app.add_option("--max_concurrent_execs", server_options.sandbox_limits.max_concurrent_execs,
                 "Exec calls running at once per sandbox; more get RESOURCE_EXHAUSTED")
      ->capture_default_str();
  app.add_option("--max_exec_output_bytes", server_options.sandbox_limits.max_exec_output_bytes,
                 "cap on one Exec's stdout+stderr sent to the client (the rest is counted and "
                 "dropped; exit.truncated says so); at most 64 MiB")
      ->capture_default_str();
  app.add_option("--max_processes", server_options.sandbox_limits.max_processes,
                 "processes (StartProcess) running at once per sandbox; more get "
                 "RESOURCE_EXHAUSTED")
      ->capture_default_str();
  app.add_option("--max_ptys", server_options.sandbox_limits.max_ptys,
                 "PTY processes (StartProcess with a pty, sbx shell) running at once per sandbox")
      ->capture_default_str();
  app.add_option("--max_replay_bytes", server_options.sandbox_limits.max_replay_bytes,
                 "bytes the replay buffers of all processes of a sandbox may hold together (a "
                 "process's buffer is 1 MiB unless it asks otherwise; beyond it the oldest output "
                 "is dropped and counted)")
      ->capture_default_str();
  app.add_option("--tls_cert_file", server_options.tls_cert_file,
                 "serve TLS with this PEM certificate (chain); needs --tls_key_file");
  app.add_option("--tls_key_file", server_options.tls_key_file, "PEM private key for TLS");
  app.add_option("--tls_client_ca_file", server_options.tls_client_ca_file,
                 "require client certificates signed by this PEM CA (mTLS)");
  app.add_option("--metrics_listen", metrics_options.listen,
                 "host:port to serve Prometheus metrics on (GET /metrics; port 0: any); \"\" or "
                 "\"off\": no metrics endpoint")
      ->capture_default_str();
  app.add_option("--metrics_port_file", metrics_options.port_file,
                 "write the bound metrics port to this file once serving");
  app.add_option("--log_level", log_options.level, "trace|debug|info|warn|error|critical|off")
      ->capture_default_str();
  app.add_option("--log_format", log_options.format, "text|json")->capture_default_str();
  sbx::cmd::AddKubeFlags(app, &kube_flags);
  sbx::cmd::AddConversionFlags(app, &conversion_flags);
  sbx::cmd::AddProxyFlags(app, &proxy_flags);
  sbx::cmd::AddE2bFlags(app, &e2b_flags);
  CLI11_PARSE(app, argc, argv);

  if (absl::Status s = sbx::InitLogging(log_options); !s.ok()) return Fail(s);
  gpr_set_log_function(LogFromGrpc);
  if (runtime_name != "local" && runtime_name != "instant" && runtime_name != "none" &&
      runtime_name != "kubernetes") {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "runtime \"", runtime_name, "\" is not one of local, instant, none, kubernetes")));
  }
  if (runtime_name == "kubernetes" && kube_flags.kubeconfig.empty()) {
    return Fail(absl::InvalidArgumentError(
        "--runtime kubernetes needs a cluster: --kubeconfig PATH or --kubeconfig in-cluster"));
  }
  if (!kube_flags.sandbox_key_secret.empty() && kube_flags.kubeconfig.empty()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--sandbox_key_secret \"", kube_flags.sandbox_key_secret,
                     "\" needs a cluster: --kubeconfig PATH or --kubeconfig in-cluster")));
  }
  if (!kube_flags.sandbox_key_secret.empty() && !sandbox_key_file.empty()) {
    return Fail(absl::InvalidArgumentError(
        "--sandbox_key_secret and --sandbox_key_file both name the sandbox key: give one"));
  }
  if (kube_flags.leader_election && kube_flags.sandbox_key_secret.empty() &&
      sandbox_key_file.empty()) {
    return Fail(absl::InvalidArgumentError(
        "--kube_leader_election needs a sandbox key every replica shares (daemon secrets and "
        "the replicas' replication token derive from it): --sandbox_key_secret NAME, or "
        "--sandbox_key_file naming one file all replicas read"));
  }
  if (replication_copies != 1 && replication_copies != 2) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--replication_copies must be 1 or 2 (got ", replication_copies, ")")));
  }
  if (replication_copies == 2 && !kube_flags.leader_election) {
    return Fail(absl::InvalidArgumentError(
        "--replication_copies=2 needs --kube_leader_election and a second replica: without a "
        "standby every write would be refused"));
  }
  if (!(replication_ack_timeout_s > 0)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--replication_ack_timeout_s must be positive (got ", replication_ack_timeout_s, ")")));
  }
  if (!image_claim_template.empty() &&
      (runtime_name != "local" || image_options.budget_bytes == 0)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--image_claim_template \"", image_claim_template,
        "\" is the base of on-demand pools of images, which only a server with --runtime local "
        "and an image cache (--image_cache_bytes) makes")));
  }
  if (absl::Status s = refill_options.Validate(); !s.ok()) return Fail(s);
  if (absl::Status s = metrics_options.Validate(); !s.ok()) return Fail(s);
  sbx::cmd::ServerConfig config;
  if (!config_path.empty()) {
    auto loaded = sbx::cmd::LoadConfig(config_path);
    if (!loaded.ok()) return Fail(loaded.status());
    config = std::move(*loaded);
  }

  spdlog::info("sbx-server {} ({}) starting", sbx::Version(), sbx::GitCommit());
  auto mode = sbx::store::ParseDurability(durability);
  if (!mode.ok()) return Fail(mode.status());
  store_options.durability = *mode;
  auto store = sbx::store::OpenRocksDbStore(store_options);
  if (!store.ok()) return Fail(store.status());
  spdlog::info("store: RocksDB at \"{}\", durability {} ({}), free-space reserve {} bytes",
               store_options.path, std::string(sbx::store::DurabilityName(*mode)),
               *mode != sbx::store::Durability::kSync ? "OS-buffered, no fsync"
               : store_options.pipeline               ? "fsync per group commit, pipelined"
                                                      : "fsync per group commit",
               store_options.min_free_bytes);

  // One registry for every Prometheus metric of the process: the Kubernetes client and
  // controllers register theirs in it; the server's own families are read at scrape time
  // from the allocator, refill reconciler, store and request counters (metrics.h).
  auto registry = std::make_shared<prometheus::Registry>();
  sbx::server::RegisterBuildInfo(*registry);
  kube_flags.registry = registry;
  // The runtime reports sandboxes that die; the allocator exists only later, so the
  // report goes through this pointer (set before any sandbox can exist). Declared before
  // the controllers, which report through it until they are destroyed.
  std::atomic<sbx::allocator::Allocator*> allocator_for_reports{nullptr};
  // The cluster's client, when one is configured (the controllers start further down).
  std::unique_ptr<sbx::cmd::KubeControllers> kube;
  if (!kube_flags.kubeconfig.empty()) {
    auto connected = sbx::cmd::ConnectKube(kube_flags);
    if (!connected.ok()) return Fail(connected.status());
    kube = *std::move(connected);
  }
  // Served by every replica from the start, leader or not.
  auto conversion = sbx::cmd::StartConversion(
      conversion_flags, kube != nullptr ? kube->client() : nullptr, registry.get());
  if (!conversion.ok()) return Fail(conversion.status());
  // The key of the daemons' secrets, known before any sandbox is made or driven: from the
  // Secret that every replica shares, or from the file beside the store, which must exist
  // first (RocksDB makes its folder only when it is missing or empty).
  absl::StatusOr<sbx::SandboxSecrets> sandbox_secrets;
  if (!kube_flags.sandbox_key_secret.empty()) {
    auto key = kube->LoadSandboxKey(kube_flags);
    if (!key.ok()) return Fail(key.status());
    sandbox_secrets = sbx::SandboxSecrets::FromKey(*std::move(key));
  } else {
    if (sandbox_key_file.empty()) sandbox_key_file = store_options.path + "/sandbox.key";
    sandbox_secrets = sbx::SandboxSecrets::LoadOrCreate(sandbox_key_file);
    if (!sandbox_secrets.ok()) return Fail(sandbox_secrets.status());
  }
  auto secret_of = [secrets = *sandbox_secrets](absl::string_view id) { return secrets.For(id); };
  server_options.sandbox_secret = secret_of;
  local_options.secret_for = [secret_of](const std::string& id) { return secret_of(id); };
  // A Sandbox's secret is that of its allocator id (src/k8s/namespaces.h).
  const std::string default_namespace = sbx::cmd::DefaultNamespace(kube_flags);
  kube_flags.sandboxd_secret = [secret_of, default_namespace](const std::string& ns,
                                                              const std::string& name) {
    return secret_of(sbx::QualifiedName(ns, name, default_namespace));
  };
  // What no sandbox may see: the server's store, key and credentials.
  for (const std::string& path : {store_options.path, sandbox_key_file,
                                  server_options.auth.tokens_file, server_options.tls_key_file}) {
    if (!path.empty()) {
      local_options.hidden_paths.push_back(std::filesystem::absolute(path).lexically_normal());
    }
  }

  // The local runtime's image cache (docs/architecture.md, "Images").
  std::unique_ptr<sbx::images::ImageCache> image_cache;
  if (image_options.budget_bytes > 0) {
    if (image_options.dir.empty()) image_options.dir = store_options.path + "/images";
    image_options.dir = std::filesystem::absolute(image_options.dir).lexically_normal();
    auto opened = sbx::images::ImageCache::Open(image_options);
    if (!opened.ok()) return Fail(opened.status());
    image_cache = *std::move(opened);
  }
  std::unique_ptr<sbx::runtime::BubblewrapRuntime> local;
  std::unique_ptr<sbx::runtime::Runtime> runtime;
  if (runtime_name == "local") {
    local_options.images = image_cache.get();
    local_options.snapshots_dir = store_options.path + "/snapshots";
    local_options.on_gone = [&allocator_for_reports](const std::string& id) {
      if (auto* a = allocator_for_reports.load())
        sbx::DropTo{"server.sandbox_gone", absl::StatusCode::kNotFound}(a->SandboxGone(id));
    };
    auto made = sbx::runtime::BubblewrapRuntime::Make(local_options);
    if (!made.ok()) return Fail(made.status());
    local = std::move(*made);
    runtime = sbx::cmd::NewLocalSpecTranslator(local.get());
  } else if (runtime_name == "kubernetes") {
    // Started below, with the controllers, before the allocator: its caches are the
    // runtime's List().
  } else if (runtime_name == "instant") {
    spdlog::warn(
        "INSTANT RUNTIME: sandboxes are only names, nothing can run in them; use this for load "
        "tests of the claim path only");
    runtime = sbx::runtime::NewInstantRuntime();
  } else {
    spdlog::warn("no runtime: pools are never filled; claims can only wait or fail");
  }
  sbx::server::RequestCounters request_counters;
  sbx::server::TenantLimiter tenant_limiter;
  sbx::runtime::Runtime* active_runtime = runtime.get();
  // With leader election, this replica serves its port as a standby (relaying sbx.v1 calls
  // to the leader) until it leads; everything that acts starts then (Activate below).
  const bool standby_first = kube != nullptr && kube_flags.leader_election;
  std::unique_ptr<sbx::server::Server> standby;
  std::unique_ptr<sbx::cmd::Replication> replication;
  std::atomic<bool> stopping{false};
  // What a leader that loses the Lease stops first, on the elector's thread, before the
  // server's shutdown (docs/architecture.md, "Fencing"): set once everything it names
  // exists.
  absl::Mutex quiesce_mu;
  std::function<void()> quiesce;
  std::once_flag quiesced;
  if (standby_first) {
    if (kube_flags.identity.empty()) kube_flags.identity = sbx::cmd::DefaultIdentity();
    // Store replication (docs/architecture.md, "Replicas"): this replica follows the
    // leader into its store, and takes the Lease only when that store holds every claim
    // the last leader acknowledged.
    sbx::cmd::ReplicationOptions replication_options;
    replication_options.identity = kube_flags.identity;
    replication_options.token = sandbox_secrets->For(sbx::replication::kReplicationTokenLabel);
    replication_options.ack_timeout = absl::Seconds(replication_ack_timeout_s);
    // Asked by the elector (after StartKube has made `kube`'s caches) for a missing Lease.
    replication_options.cluster_sandboxes = [&kube] { return kube->ClusterSandboxes(); };
    replication_options.copies =
        replication_copies == 2 ? sbx::replication::Copies::kTwo : sbx::replication::Copies::kOne;
    if (!server_options.tls_cert_file.empty()) {
      auto hop = sbx::server::HopCredentials(server_options);
      if (!hop.ok()) return Fail(hop.status());
      replication_options.credentials = *std::move(hop);
    }
    auto created = sbx::cmd::Replication::Create(store->get(), std::move(replication_options));
    if (!created.ok()) return Fail(created.status());
    replication = *std::move(created);
    kube_flags.may_lead = [r = replication.get()](const sbx::k8s::LeaseTerm& t) {
      return r->MayLead(t);
    };
    kube_flags.leader_unreachable = [r = replication.get()] { return r->LeaderUnreachable(); };
    server_options.extra_services.push_back(replication->NewService());
    sbx::server::ServerOptions standby_options = server_options;
    standby_options.extra_services = {replication->NewService()};
    sbx::server::ForwardOptions forward;
    forward.identity = kube_flags.identity;
    forward.leader_address = [&kube]() -> std::string {
      sbx::k8s::LeaderElector* elector = kube->elector();
      return elector != nullptr ? elector->LeaderAddress() : std::string();
    };
    standby_options.forward = std::move(forward);
    auto started = sbx::server::Server::Start(standby_options);
    if (!started.ok()) return Fail(started.status());
    standby = *std::move(started);
    auto advertised =
        sbx::cmd::AdvertisedAddress(advertise_address, server_options.listen, standby->port());
    if (!advertised.ok()) return Fail(advertised.status());
    kube_flags.advertise_address = *advertised;
    // The next start binds the same port (gRPC sets SO_REUSEPORT), so that clients keep
    // one address across the promotion.
    server_options.listen = sbx::cmd::WithPort(server_options.listen, standby->port());
    kube_flags.on_stopped_leading = [&stopping, &quiesce_mu, &quiesce] {
      if (stopping.load()) return;
      spdlog::error(
          "this replica no longer leads: it acknowledges nothing more and its controllers, "
          "write queues and refill stop now; then the server stops, so that it restarts as a "
          "standby (its allocator may not act beside the new leader's)");
      std::function<void()> first;
      {
        absl::MutexLock lock(&quiesce_mu);
        first = quiesce;
      }
      if (first) first();
      kill(getpid(), SIGTERM);
    };
  }
  if (kube != nullptr) {
    absl::Status started = sbx::cmd::StartKube(
        *kube, kube_flags, runtime_name == "kubernetes",
        [&allocator_for_reports](const std::string& id) {
          if (auto* a = allocator_for_reports.load())
            sbx::DropTo{"server.sandbox_gone", absl::StatusCode::kNotFound}(a->SandboxGone(id));
        });
    if (!started.ok()) return Fail(started);
    if (runtime_name == "kubernetes") active_runtime = kube->runtime();
  }
  if (replication != nullptr) {
    replication->StartFollowing([&kube]() -> std::string {
      sbx::k8s::LeaderElector* elector = kube->elector();
      if (elector == nullptr || elector->IsLeader()) return "";
      return elector->LeaderAddress();
    });
  }
  sbx::allocator::RefillReconciler refill(refill_options, active_runtime, &sbx::Clock::Real());
  if (replication != nullptr) {
    absl::MutexLock lock(&quiesce_mu);
    // Once, whoever comes first: the elector's thread or the shutdown below.
    quiesce = [&replication, &kube, &refill, &quiesced] {
      std::call_once(quiesced, [&] {
        replication->Stop();  // nothing more is acknowledged
        kube->StopPools();    // controllers, then the write queues and the runtime's creates
        refill.Stop();
      });
    };
  }
  sbx::allocator::AllocatorOptions allocator_options;
  allocator_options.default_namespace = default_namespace;
  // The allocator recovers from the store when this replica serves: at once, or (a
  // standby) once it leads, from the store it replicated as a standby.
  std::unique_ptr<sbx::allocator::Allocator> allocator;
  std::atomic<const sbx::allocator::Allocator*> allocator_for_metrics{nullptr};
  // Set once the snapshots are made (activate, below); read by the metrics endpoint.
  std::atomic<const sbx::allocator::Snapshots*> snapshots_for_metrics{nullptr};
  auto open_allocator = [&]() -> absl::Status {
    auto created =
        sbx::allocator::Allocator::Create(allocator_options, store->get(), active_runtime, &refill,
                                          &sbx::Clock::Real(), &sbx::IdGenerator::Random());
    if (!created.ok()) {
      return absl::Status(
          created.status().code(),
          absl::StrCat("store \"", store_options.path, "\": ", created.status().message()));
    }
    allocator = *std::move(created);
    allocator_for_reports = allocator.get();
    allocator_for_metrics = allocator.get();
    const auto& rec = allocator->recovery();
    spdlog::info(
        "recovered {} templates, {} pools, {} sandboxes, {} active and {} ended claims in {}",
        rec.templates, rec.pools, rec.sandboxes, rec.active_claims, rec.ended_claims,
        absl::FormatDuration(rec.took));
    return absl::OkStatus();
  };
  if (!standby_first) {
    if (absl::Status s = open_allocator(); !s.ok()) return Fail(s);
  }
  std::unique_ptr<sbx::server::MetricsEndpoint> metrics;
  if (metrics_options.enabled()) {
    sbx::server::MetricsSources sources;
    sources.allocator = [&allocator_for_metrics] { return allocator_for_metrics.load(); };
    if (active_runtime != nullptr) sources.refill = &refill;
    sources.store = [store = store->get()] {
      const sbx::store::StoreStats st = store->Stats();
      sbx::server::StoreCounts c;
      c.commits = st.commits;
      c.write_batches = st.write_batches;
      c.syncs = st.syncs;
      c.committer_busy_seconds = st.committer_busy_seconds;
      c.syncer_busy_seconds = st.syncer_busy_seconds;
      c.write_seconds = st.write_seconds;
      c.group_commits = st.group_commits;
      c.writable = st.writable;
      c.free_bytes = st.free_bytes;
      c.min_free_bytes = st.min_free_bytes;
      return c;
    };
    sources.requests = &request_counters;
    sources.tenants = &tenant_limiter;
    sources.images = image_cache.get();
    sources.snapshots = [&snapshots_for_metrics] { return snapshots_for_metrics.load(); };
    if (local != nullptr) {
      sources.sandbox_output_dropped = [l = local.get()] { return l->output_dropped_bytes(); };
    }
    if (replication != nullptr) sources.extra.push_back(replication->Collector());
    if (!proxy_flags.proxy.listen.empty()) {
      sources.extra.push_back(sbx::cmd::ProxyCollector(&proxy_counters));
    }
    auto started = sbx::server::MetricsEndpoint::Start(metrics_options, registry, sources);
    if (!started.ok()) return Fail(started.status());
    metrics = *std::move(started);
  }

  server_options.request_counters = &request_counters;
  server_options.tenant_limiter = &tenant_limiter;
  server_options.images = image_cache.get();
  server_options.check_template = sbx::cmd::NewTemplateCheck(local.get(), kube != nullptr);
  // Claims by image: on-demand pools with the local runtime (image_pools.h); declared
  // pools only elsewhere (on Kubernetes a pool's SandboxTemplate says what it runs).
  server_options.image_claims.on_demand = runtime_name == "local";
  server_options.image_claims.kubernetes_images =
      sbx::cmd::NewKubernetesTemplateImages(kube != nullptr ? kube->kube_runtime() : nullptr);
  if (server_options.auth.tokens_file.empty()) server_options.auth.insecure_no_auth = true;
  // What a serving replica does (at once, or once it leads): reconcile with the runtime,
  // apply the config, refill, serve the pools and claims of the cluster, and the API.
  absl::Mutex server_mu;
  snapshot_options.reconcile = runtime_name == "local";
  std::unique_ptr<sbx::allocator::Snapshots> snapshots;  // outlives the server
  std::unique_ptr<sbx::server::Server> server;
  sbx::cmd::RunningProxy port_proxy;
  sbx::cmd::RunningE2b e2b_front;  // after `server`: it calls the server's services
  auto activate = [&]() -> absl::Status {
    if (active_runtime != nullptr) {
      RETURN_IF_ERROR(
          ReconcileWithRuntime(*allocator, *active_runtime, *registry, start_delete_limits));
    }
    RETURN_IF_ERROR(sbx::cmd::ApplyConfig(config, *allocator));
    if (!image_claim_template.empty()) {
      ASSIGN_OR_RETURN(server_options.image_claims.base_template,
                       sbx::cmd::CheckImageClaimTemplate(*allocator, image_claim_template));
    }
    if (active_runtime != nullptr) refill.Start(allocator.get());
    if (kube != nullptr) RETURN_IF_ERROR(kube->StartPools(allocator.get()));
    server_options.allocator = allocator.get();
    ASSIGN_OR_RETURN(snapshots, sbx::allocator::Snapshots::Make(
                                    snapshot_options, allocator.get(), store->get(), active_runtime,
                                    &sbx::Clock::Real(), &sbx::IdGenerator::Random()));
    server_options.snapshots = snapshots.get();
    snapshots_for_metrics = snapshots.get();
    ASSIGN_OR_RETURN(port_proxy, sbx::cmd::StartProxy(proxy_flags, server_options.auth,
                                                      *sandbox_secrets, allocator.get(),
                                                      &server_options.port_urls, &proxy_counters));
    ASSIGN_OR_RETURN(auto started, sbx::server::Server::Start(server_options));
    // The E2B front: a translation onto the services just started, through their
    // in-process channel.
    ASSIGN_OR_RETURN(auto front, sbx::cmd::StartE2b(e2b_flags, server_options, *started,
                                                    *sandbox_secrets, port_proxy.proxy.get()));
    absl::MutexLock lock(&server_mu);
    server = std::move(started);
    e2b_front = std::move(front);
    return absl::OkStatus();
  };
  std::thread promotion;
  if (!standby_first) {
    if (absl::Status s = activate(); !s.ok()) return Fail(s);
  } else {
    promotion = std::thread([&] {
      while (!stopping.load()) {
        sbx::k8s::LeaderElector* elector = kube->elector();
        if (elector != nullptr && elector->IsLeader()) break;
        absl::SleepFor(absl::Milliseconds(20));
      }
      if (stopping.load()) return;
      spdlog::info("this replica leads: serving the API itself, the standby relay stops");
      sbx::k8s::LeaderElector* elector = kube->elector();
      absl::Status led = replication->Lead(elector->Term(), [elector](const std::string& name) {
        return elector->PublishSyncReplica(name);
      });
      if (led.ok()) led = open_allocator();
      if (!led.ok()) {
        spdlog::error("cannot lead: {}", led.ToString());
        kill(getpid(), SIGTERM);
        return;
      }
      if (absl::Status s = activate(); !s.ok()) {
        spdlog::error("cannot serve after taking the lead: {}", s.ToString());
        kill(getpid(), SIGTERM);
        return;
      }
      standby->Shutdown(absl::Seconds(shutdown_grace_s));
      // Calls that reach the relay while it stops may end CANCELLED (gRPC's server answers
      // so for calls it can no longer start); from here on only this replica's API serves.
      spdlog::info("the standby relay has stopped: the API is served by this replica alone");
    });
  }

  int signal = 0;
  while (true) {
    sigwait(&stop_signals, &signal);
    if (signal != SIGHUP) break;
    absl::MutexLock lock(&server_mu);
    if (server == nullptr) {
      spdlog::info("SIGHUP: a standby has no tokens to reload (the leader checks them)");
      continue;
    }
    absl::Status s = server->ReloadAuth();
    if (s.ok() && port_proxy.auth != nullptr) s = port_proxy.auth->Reload();
    if (s.ok() && e2b_front.auth != nullptr) s = e2b_front.auth->Reload();
    if (s.ok()) {
      spdlog::info("SIGHUP: tokens reloaded");
    } else {
      spdlog::error("SIGHUP: tokens not reloaded, the old ones stay: {}", s.ToString());
    }
  }
  spdlog::info("received {}, shutting down (grace {} s)", signal == SIGTERM ? "SIGTERM" : "SIGINT",
               shutdown_grace_s);
  stopping.store(true);
  if (promotion.joinable()) promotion.join();
  // A leader stops acknowledging first (later commits fail with UNAVAILABLE), so that its
  // in-sync standby, still named by the Lease, holds everything it acknowledged and takes
  // over as soon as the Lease is released below; this also ends the standby's stream,
  // which would otherwise hold the server's shutdown for its whole grace period.
  if (replication != nullptr) replication->Stop();
  if (standby != nullptr) standby->Shutdown(absl::Seconds(shutdown_grace_s));
  {
    absl::MutexLock lock(&server_mu);
    if (server != nullptr) server->Shutdown(absl::Seconds(shutdown_grace_s));
    // After the server: its shutdown ends the calls the front's handlers wait on (a process
    // stream may wait for output for long), so that they finish before the front's wait.
    if (e2b_front.front != nullptr) e2b_front.front->Shutdown();
  }
  if (port_proxy.proxy != nullptr) port_proxy.proxy->Shutdown();
  {
    std::function<void()> first;
    {
      absl::MutexLock lock(&quiesce_mu);
      first = quiesce;
    }
    if (first) first();  // waits for the elector's thread if it began
  }
  if (kube != nullptr) kube->StopPools();
  metrics.reset();  // reads the allocator, refill, store and replication: goes before them
  refill.Stop();
  allocator_for_reports = nullptr;
  allocator_for_metrics = nullptr;
  allocator.reset();
  kube.reset();
  conversion->reset();
  runtime.reset();
  local.reset();  // leaves the sandboxes running unless --delete_sandboxes_on_exit
  if (absl::Status s = (*store)->Close(); !s.ok()) return Fail(s);
  spdlog::info("sbx-server stopped");
  return 0;
}

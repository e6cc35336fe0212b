// sbx-server's flags (server_flags.h).

#include "src/cmd/server_flags.h"

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "src/common/build_info.h"
#include "src/common/status_macros.h"

namespace sbx::cmd {
namespace {

// sbx-sandboxd next to this binary (both are built into the same folder).
std::string DefaultSandboxd() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : (self.parent_path() / "sbx-sandboxd").string();
}

}  // namespace

ServerFlags::ServerFlags() {
  store.path = ".sbx/data";
  local.sandboxd_path = DefaultSandboxd();
  image.budget_bytes = 0;  // off unless asked for
}

void AddServerFlags(CLI::App& app, ServerFlags& flags) {
  // A flag given twice takes its last value, so wrappers (scripts/run) can set defaults
  // that the caller's own flags override.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_version_flag("--version", std::string(Version()) + " (" + std::string(GitCommit()) + ")");
  app.add_option("--listen", flags.server.listen, "host:port to serve gRPC on (port 0: any)")
      ->capture_default_str();
  app.add_option("--advertise_address", flags.advertise_address,
                 "with --kube_leader_election: host:port at which the other replicas reach this "
                 "one's gRPC port, to relay calls to it while it leads (default: --listen's host "
                 "with the bound port; needed when that host is a wildcard)");
  app.add_option("--port_file", flags.server.port_file,
                 "write the bound port to this file once serving");
  app.add_option("--max_receive_message_bytes", flags.server.max_receive_message_bytes,
                 "largest request accepted")
      ->capture_default_str();
  app.add_option("--shutdown_grace_seconds", flags.shutdown_grace_s,
                 "on SIGTERM/SIGINT, let calls in flight finish for this long")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--data_dir", flags.store.path,
                 "RocksDB store folder (created when missing or empty)")
      ->capture_default_str();
  app.add_option("--data_min_free_bytes", flags.store.min_free_bytes,
                 "free space kept on the --data_dir file system: below it the store refuses "
                 "writes (UNAVAILABLE) until space returns, and a start opens it read-only; 0: "
                 "no reserve")
      ->capture_default_str();
  app.add_option("--durability", flags.durability,
                 "sync: fsync each group commit; buffered: OS-buffered (survives kill -9, not "
                 "power loss)")
      ->capture_default_str();
  app.add_option("--store_pipeline", flags.store.pipeline,
                 "with --durability sync: write the next group commit while the previous one "
                 "is being synced (false: write, sync and answer each group before the next)")
      ->capture_default_str();
  app.add_option("--config", flags.config_path, "YAML file declaring templates and pools at start");
  app.add_option("--runtime", flags.runtime,
                 "local: bubblewrap sandboxes on this machine; instant: sandboxes that are "
                 "only names, for load tests of the claim path (nothing runs in them); none: no "
                 "runtime (pools stay empty); kubernetes: SandboxWarmPools of the cluster "
                 "(needs --kubeconfig) are the pools, their members Sandboxes and pods")
      ->capture_default_str();
  app.add_option("--sandboxd", flags.local.sandboxd_path, "sbx-sandboxd binary")
      ->capture_default_str();
  app.add_option("--sandbox_root", flags.local.root_dir, "folder for the local sandboxes' sockets")
      ->capture_default_str();
  app.add_option("--bwrap", flags.local.bwrap_path, "bubblewrap binary of the local runtime")
      ->capture_default_str();
  app.add_flag("--insecure_local_no_isolation", flags.local.allow_unisolated,
               "DEVELOPMENT ONLY: when bubblewrap cannot isolate sandboxes, run them as plain "
               "processes with the server's own user, files and network (default: refuse to "
               "start)");
  app.add_option("--sandbox_uid_base", flags.local.sandbox_uid_base,
                 "as root: the first host uid of the local sandboxes (each gets its own)")
      ->capture_default_str();
  app.add_option("--sandbox_key_file", flags.sandbox_key_file,
                 "key of the sandboxes' daemon secrets (made on first start, mode 0600; "
                 "default: sandbox.key in --data_dir; see --sandbox_key_secret for a key "
                 "shared by several replicas)");
  app.add_option("--replication_ack_timeout_s", flags.replication_ack_timeout_s,
                 "with --kube_leader_election: how long the leader waits for its in-sync "
                 "standby to acknowledge a group commit before it drops the standby (and, once "
                 "the Lease names no standby, acknowledges alone)")
      ->capture_default_str();
  app.add_option("--start_max_delete_share", flags.start_delete_limits.share,
                 "at start, running sandboxes unknown to the store are deleted only while they "
                 "are at most this share of the running ones (or 10); past it none is, each is "
                 "logged (a store that lost its history would erase the cluster)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--start_confirm_deletes", flags.start_delete_limits.confirmed,
               "at start, delete every running sandbox unknown to the store, however many");
  app.add_option("--replication_copies", flags.replication_copies,
                 "with --kube_leader_election: copies of a commit (the leader's, its in-sync "
                 "standby's) needed to acknowledge it while no standby is in sync. 1: the leader "
                 "acknowledges alone, so claims are served through a standby's restart or loss "
                 "(what it acknowledges then is lost if its volume is lost too before a standby "
                 "catches up); the default, because losing both at once is rarer than a standby "
                 "restart, which 2 turns into an outage. 2: the leader refuses every write "
                 "(UNAVAILABLE, nothing written) until a standby is in sync and named in the Lease")
      ->capture_default_str();
  app.add_option("--image_cache_bytes", flags.image.budget_bytes,
                 "bytes the OCI image cache may keep on disk (unpacked images, least recently "
                 "used evicted first); 0: no image cache")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  app.add_option("--image_cache_dir", flags.image.dir,
                 "folder of the image cache (default: images in --data_dir)");
  app.add_option("--image_import_dir", flags.image.import_dirs,
                 "a folder under which local image references (oci:, oci-archive:, "
                 "docker-archive:) may lie; repeatable (none: only docker:// references)");
  app.add_option("--image_registry", flags.image.allow_registry,
                 "accept docker:// image references (fetched from a registry)")
      ->capture_default_str();
  app.add_option("--image_claim_template", flags.image_claim_template,
                 "a local template (in --config or the store) whose spec the on-demand pools of "
                 "claims by image copy, with the claim's image set (default: no network, 512 MiB "
                 "of memory, 512 processes); needs --runtime local and --image_cache_bytes");
  app.add_option(
         "--snapshot_quota_bytes", flags.snapshots.quota_bytes,
         "bytes of snapshots each tenant may hold (their files under --data_dir/snapshots); "
         "0: no quota")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  app.add_flag("--delete_sandboxes_on_exit", flags.local.delete_on_exit,
               "kill every local sandbox when the server stops (default: leave them running; "
               "the next server on the same --sandbox_root adopts them, claims intact)");
  app.add_option("--refill_qps", flags.refill.qps, "runtime writes per second")
      ->capture_default_str();
  app.add_option("--refill_max_creating", flags.refill.max_creating_per_pool,
                 "creates in flight per pool (until each sandbox is ready)")
      ->capture_default_str();
  app.add_option("--auth_tokens_file", flags.server.auth.tokens_file,
                 "bearer tokens: one '<token> <tenant> [admin]' per line (SIGHUP reloads)");
  app.add_flag("--insecure_no_auth", flags.server.auth.insecure_no_auth,
               "no authentication: every caller is tenant 'anonymous' with admin rights (the "
               "default when --auth_tokens_file is not given)");
  app.add_option("--max_concurrent_execs", flags.server.sandbox_limits.max_concurrent_execs,
                 "Exec calls running at once per sandbox; more get RESOURCE_EXHAUSTED")
      ->capture_default_str();
  app.add_option("--max_exec_output_bytes", flags.server.sandbox_limits.max_exec_output_bytes,
                 "cap on one Exec's stdout+stderr sent to the client (the rest is counted and "
                 "dropped; exit.truncated says so); at most 64 MiB")
      ->capture_default_str();
  app.add_option("--max_processes", flags.server.sandbox_limits.max_processes,
                 "processes (StartProcess) running at once per sandbox; more get "
                 "RESOURCE_EXHAUSTED")
      ->capture_default_str();
  app.add_option("--max_ptys", flags.server.sandbox_limits.max_ptys,
                 "PTY processes (StartProcess with a pty, sbx shell) running at once per sandbox")
      ->capture_default_str();
  app.add_option("--max_replay_bytes", flags.server.sandbox_limits.max_replay_bytes,
                 "bytes the replay buffers of all processes of a sandbox may hold together (a "
                 "process's buffer is 1 MiB unless it asks otherwise; beyond it the oldest output "
                 "is dropped and counted)")
      ->capture_default_str();
  app.add_option("--tls_cert_file", flags.server.tls_cert_file,
                 "serve TLS with this PEM certificate (chain); needs --tls_key_file");
  app.add_option("--tls_key_file", flags.server.tls_key_file, "PEM private key for TLS");
  app.add_option("--tls_client_ca_file", flags.server.tls_client_ca_file,
                 "require client certificates signed by this PEM CA (mTLS)");
  app.add_option("--metrics_listen", flags.metrics.listen,
                 "host:port to serve Prometheus metrics on (GET /metrics; port 0: any); \"\" or "
                 "\"off\": no metrics endpoint")
      ->capture_default_str();
  app.add_option("--metrics_port_file", flags.metrics.port_file,
                 "write the bound metrics port to this file once serving");
  app.add_option("--log_level", flags.log.level, "trace|debug|info|warn|error|critical|off")
      ->capture_default_str();
  app.add_option("--log_format", flags.log.format, "text|json")->capture_default_str();
  AddKubeFlags(app, &flags.kube);
  AddConversionFlags(app, &flags.conversion);
  AddProxyFlags(app, &flags.proxy);
  AddE2bFlags(app, &flags.e2b);
}

absl::Status CheckServerFlags(const ServerFlags& flags) {
  if (flags.runtime != "local" && flags.runtime != "instant" && flags.runtime != "none" &&
      flags.runtime != "kubernetes") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--runtime \"", flags.runtime, "\" is not one of local, instant, none, kubernetes"));
  }
  if (flags.runtime == "kubernetes" && flags.kube.kubeconfig.empty()) {
    return absl::InvalidArgumentError(
        "--runtime kubernetes needs a cluster: --kubeconfig PATH or --kubeconfig in-cluster");
  }
  if (!flags.kube.sandbox_key_secret.empty() && flags.kube.kubeconfig.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sandbox_key_secret \"", flags.kube.sandbox_key_secret,
                     "\" needs a cluster: --kubeconfig PATH or --kubeconfig in-cluster"));
  }
  if (!flags.kube.sandbox_key_secret.empty() && !flags.sandbox_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--sandbox_key_secret and --sandbox_key_file both name the sandbox key: give one");
  }
  if (flags.kube.leader_election && flags.kube.sandbox_key_secret.empty() &&
      flags.sandbox_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--kube_leader_election needs a sandbox key every replica shares (daemon secrets and "
        "the replicas' replication token derive from it): --sandbox_key_secret NAME, or "
        "--sandbox_key_file naming one file all replicas read");
  }
  if (flags.replication_copies != 1 && flags.replication_copies != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replication_copies must be 1 or 2 (got ", flags.replication_copies, ")"));
  }
  if (flags.replication_copies == 2 && !flags.kube.leader_election) {
    return absl::InvalidArgumentError(
        "--replication_copies=2 needs --kube_leader_election and a second replica: without a "
        "standby every write would be refused");
  }
  if (!(flags.replication_ack_timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replication_ack_timeout_s must be positive (got ",
                     flags.replication_ack_timeout_s, ")"));
  }
  if (!flags.image_claim_template.empty() &&
      (flags.runtime != "local" || flags.image.budget_bytes == 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--image_claim_template \"", flags.image_claim_template,
        "\" is the base of on-demand pools of images, which only a server with --runtime local "
        "and an image cache (--image_cache_bytes) makes"));
  }
  // The refill's options that are flags, named as flags (RefillOptions::Validate names
  // its fields); then the rest of its checks.
  if (!(flags.refill.qps > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--refill_qps must be > 0 (got ", flags.refill.qps, ")"));
  }
  if (flags.refill.max_creating_per_pool < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--refill_max_creating must be at least 1 (got ",
                                                   flags.refill.max_creating_per_pool, ")"));
  }
  RETURN_IF_ERROR(flags.refill.Validate());
  if (absl::Status s = flags.metrics.Validate(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--metrics_listen: ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace sbx::cmd

// sbx-server as an object (server_app.h): the wiring of its components, their activation,
// and the one shutdown order.

#include "src/cmd/server_app.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "src/cmd/conversion_wiring.h"
#include "src/cmd/wiring.h"
#include "src/common/build_info.h"
#include "src/common/clock.h"
#include "src/common/dropped.h"
#include "src/common/ids.h"
#include "src/common/status_macros.h"
#include "src/replication/service.h"
#include "src/runtime/instant_runtime.h"
#include "src/store/rocksdb_store.h"

namespace sbx::cmd {
namespace {

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
absl::Status ReconcileWithRuntime(allocator::Allocator& allocator, runtime::Runtime& runtime,
                                  prometheus::Registry& registry, const StartDeleteLimits& limits) {
  auto running = runtime.List();
  if (!running.ok()) {
    return absl::Status(
        running.status().code(),
        absl::StrCat("reconciling the store with the runtime: ", running.status().message()));
  }
  std::unordered_set<std::string> live, unready;
  for (const runtime::SandboxInfo& s : *running) {
    live.insert(s.id);
    if (!s.ready) unready.insert(s.id);
  }
  // The active claims by sandbox, to name the ones that become LOST.
  allocator::ClaimFilter active;
  active.all_owners = true;
  active.limit = 0;
  std::unordered_map<std::string, store::ClaimRecord> claim_of;
  for (store::ClaimRecord& c : allocator.ListClaims(active)) {
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
          c->second.id, c->second.owner, c->second.pool, id, server::kLostSandboxMissing);
      ++lost[server::kLostSandboxMissing];
    }
    if (allocator.SandboxGone(id).ok()) ++gone;
  }
  std::vector<std::string> unknown;
  size_t adopted_claimed = 0;
  for (const runtime::SandboxInfo& s : *running) {
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
  server::RegisterClaimsLostAtRestart(registry, lost);
  server::RegisterStartSandboxesKept(registry, adopted_claimed, over_limit);
  spdlog::info(
      "runtime reconciled: {} sandboxes adopted ({} claimed ones kept and {} warm ones retired "
      "while not ready), {} from before the restart gone ({} claims LOST), {} unknown ones "
      "deleted, {} unknown ones kept (held by a claim in the runtime), {} kept over the delete "
      "limit",
      live.size() - deleted, kept_unready, retired, gone, lost[server::kLostSandboxMissing],
      deleted, adopted_claimed, over_limit);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerApp>> ServerApp::Create(ServerFlags flags) {
  RETURN_IF_ERROR(CheckServerFlags(flags));
  std::unique_ptr<ServerApp> app(new ServerApp(std::move(flags)));
  absl::Status made = app->Init();
  if (!made.ok()) {
    // Whatever was made stops in the usual order, with no grace (nothing serves yet).
    ReportDropped("server.shutdown_after_failed_start", app->Shutdown(absl::ZeroDuration()));
    return made;
  }
  return app;
}

ServerApp::ServerApp(ServerFlags flags) : flags_(std::move(flags)) {}

ServerApp::~ServerApp() {
  if (!shut_down_) ReportDropped("server.shutdown_at_destruction", Shutdown(absl::ZeroDuration()));
}

absl::Status ServerApp::Init() {
  if (!flags_.config_path.empty()) {
    ASSIGN_OR_RETURN(config_, LoadConfig(flags_.config_path));
  }

  spdlog::info("sbx-server {} ({}) starting", Version(), GitCommit());
  ASSIGN_OR_RETURN(const store::Durability mode, store::ParseDurability(flags_.durability));
  store::RocksDbStoreOptions& store_options = flags_.store;
  store_options.durability = mode;
  ASSIGN_OR_RETURN(store_, store::OpenRocksDbStore(store_options));
  spdlog::info("store: RocksDB at \"{}\", durability {} ({}), free-space reserve {} bytes",
               store_options.path, std::string(store::DurabilityName(mode)),
               mode != store::Durability::kSync ? "OS-buffered, no fsync"
               : store_options.pipeline         ? "fsync per group commit, pipelined"
                                                : "fsync per group commit",
               store_options.min_free_bytes);

  // One registry for every Prometheus metric of the process: the Kubernetes client and
  // controllers register theirs in it; the server's own families are read at scrape time
  // from the allocator, refill reconciler, store and request counters (metrics.h).
  registry_ = std::make_shared<prometheus::Registry>();
  server::RegisterBuildInfo(*registry_);
  KubeFlags& kube_flags = flags_.kube;
  kube_flags.registry = registry_;
  if (!kube_flags.kubeconfig.empty()) {
    ASSIGN_OR_RETURN(kube_, ConnectKube(kube_flags));
  }
  // Served by every replica from the start, leader or not.
  ASSIGN_OR_RETURN(conversion_,
                   StartConversion(flags_.conversion, kube_ != nullptr ? kube_->client() : nullptr,
                                   registry_.get()));
  // The key of the daemons' secrets, known before any sandbox is made or driven: from the
  // Secret that every replica shares, or from the file beside the store, which must exist
  // first (RocksDB makes its folder only when it is missing or empty).
  server::ServerOptions& server_options = flags_.server;
  runtime::BubblewrapRuntimeOptions& local_options = flags_.local;
  if (!kube_flags.sandbox_key_secret.empty()) {
    ASSIGN_OR_RETURN(std::string key, kube_->LoadSandboxKey(kube_flags));
    sandbox_secrets_ = SandboxSecrets::FromKey(std::move(key));
  } else {
    if (flags_.sandbox_key_file.empty()) {
      flags_.sandbox_key_file = store_options.path + "/sandbox.key";
    }
    ASSIGN_OR_RETURN(sandbox_secrets_, SandboxSecrets::LoadOrCreate(flags_.sandbox_key_file));
  }
  auto secret_of = [secrets = *sandbox_secrets_](absl::string_view id) { return secrets.For(id); };
  server_options.sandbox_secret = secret_of;
  local_options.secret_for = [secret_of](const std::string& id) { return secret_of(id); };
  // A Sandbox's secret is that of its allocator id (src/k8s/namespaces.h).
  default_namespace_ = DefaultNamespace(kube_flags);
  kube_flags.sandboxd_secret = [secret_of, default_namespace = default_namespace_](
                                   const std::string& ns, const std::string& name) {
    return secret_of(QualifiedName(ns, name, default_namespace));
  };
  // What no sandbox may see: the server's store, key and credentials.
  for (const std::string& path : {store_options.path, flags_.sandbox_key_file,
                                  server_options.auth.tokens_file, server_options.tls_key_file}) {
    if (!path.empty()) {
      local_options.hidden_paths.push_back(std::filesystem::absolute(path).lexically_normal());
    }
  }

  // The local runtime's image cache (docs/architecture.md, "Images").
  images::ImageCacheOptions& image_options = flags_.image;
  if (image_options.budget_bytes > 0) {
    if (image_options.dir.empty()) image_options.dir = store_options.path + "/images";
    image_options.dir = std::filesystem::absolute(image_options.dir).lexically_normal();
    ASSIGN_OR_RETURN(image_cache_, images::ImageCache::Open(image_options));
  }
  const std::string& runtime_name = flags_.runtime;
  if (runtime_name == "local") {
    local_options.images = image_cache_.get();
    local_options.snapshots_dir = store_options.path + "/snapshots";
    local_options.on_gone = [this](const std::string& id) {
      if (auto* a = allocator_for_reports_.load())
        DropTo{"server.sandbox_gone", absl::StatusCode::kNotFound}(a->SandboxGone(id));
    };
    ASSIGN_OR_RETURN(local_, runtime::BubblewrapRuntime::Make(local_options));
    runtime_ = NewLocalSpecTranslator(local_.get());
  } else if (runtime_name == "kubernetes") {
    // Started below, with the controllers, before the allocator: its caches are the
    // runtime's List().
  } else if (runtime_name == "instant") {
    spdlog::warn(
        "INSTANT RUNTIME: sandboxes are only names, nothing can run in them; use this for load "
        "tests of the claim path only");
    runtime_ = runtime::NewInstantRuntime();
  } else {
    spdlog::warn("no runtime: pools are never filled; claims can only wait or fail");
  }
  active_runtime_ = runtime_.get();
  standby_first_ = kube_ != nullptr && kube_flags.leader_election;
  if (standby_first_) {
    if (kube_flags.identity.empty()) kube_flags.identity = DefaultIdentity();
    // Store replication (docs/architecture.md, "Replicas"): this replica follows the
    // leader into its store, and takes the Lease only when that store holds every claim
    // the last leader acknowledged.
    ReplicationOptions replication_options;
    replication_options.identity = kube_flags.identity;
    replication_options.token = sandbox_secrets_->For(replication::kReplicationTokenLabel);
    replication_options.ack_timeout = absl::Seconds(flags_.replication_ack_timeout_s);
    // Asked by the elector (after StartKube has made kube_'s caches) for a missing Lease.
    replication_options.cluster_sandboxes = [this] { return kube_->ClusterSandboxes(); };
    replication_options.copies =
        flags_.replication_copies == 2 ? replication::Copies::kTwo : replication::Copies::kOne;
    if (!server_options.tls_cert_file.empty()) {
      ASSIGN_OR_RETURN(replication_options.credentials, server::HopCredentials(server_options));
    }
    ASSIGN_OR_RETURN(replication_,
                     Replication::Create(store_.get(), std::move(replication_options)));
    kube_flags.may_lead = [r = replication_.get()](const k8s::LeaseTerm& t) {
      return r->MayLead(t);
    };
    kube_flags.leader_unreachable = [r = replication_.get()] { return r->LeaderUnreachable(); };
    server_options.extra_services.push_back(replication_->NewService());
    server::ServerOptions standby_options = server_options;
    standby_options.extra_services = {replication_->NewService()};
    server::ForwardOptions forward;
    forward.identity = kube_flags.identity;
    forward.leader_address = [this]() -> std::string {
      k8s::LeaderElector* elector = kube_->elector();
      return elector != nullptr ? elector->LeaderAddress() : std::string();
    };
    standby_options.forward = std::move(forward);
    ASSIGN_OR_RETURN(standby_, server::Server::Start(standby_options));
    ASSIGN_OR_RETURN(
        kube_flags.advertise_address,
        AdvertisedAddress(flags_.advertise_address, server_options.listen, standby_->port()));
    // The next start binds the same port (gRPC sets SO_REUSEPORT), so that clients keep
    // one address across the promotion.
    server_options.listen = WithPort(server_options.listen, standby_->port());
    kube_flags.on_stopped_leading = [this] {
      if (stopping_.load()) return;
      spdlog::error(
          "this replica no longer leads: it acknowledges nothing more and its controllers, "
          "write queues and refill stop now; then the server stops, so that it restarts as a "
          "standby (its allocator may not act beside the new leader's)");
      Quiesce();
      kill(getpid(), SIGTERM);
    };
  }
  if (kube_ != nullptr) {
    RETURN_IF_ERROR(
        StartKube(*kube_, kube_flags, runtime_name == "kubernetes", [this](const std::string& id) {
          if (auto* a = allocator_for_reports_.load())
            DropTo{"server.sandbox_gone", absl::StatusCode::kNotFound}(a->SandboxGone(id));
        }));
    if (runtime_name == "kubernetes") active_runtime_ = kube_->runtime();
  }
  if (replication_ != nullptr) {
    replication_->StartFollowing([this]() -> std::string {
      k8s::LeaderElector* elector = kube_->elector();
      if (elector == nullptr || elector->IsLeader()) return "";
      return elector->LeaderAddress();
    });
  }
  refill_ =
      std::make_unique<allocator::RefillReconciler>(flags_.refill, active_runtime_, &Clock::Real());
  if (replication_ != nullptr) {
    absl::MutexLock lock(&quiesce_mu_);
    quiesce_armed_ = true;
  }
  allocator_options_.default_namespace = default_namespace_;
  if (!standby_first_) RETURN_IF_ERROR(OpenAllocator());
  server::MetricsOptions& metrics_options = flags_.metrics;
  if (metrics_options.enabled()) {
    server::MetricsSources sources;
    sources.allocator = [this] { return allocator_for_metrics_.load(); };
    if (active_runtime_ != nullptr) sources.refill = refill_.get();
    sources.store = [store = store_.get()] {
      const store::StoreStats st = store->Stats();
      server::StoreCounts c;
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
    sources.requests = &request_counters_;
    sources.tenants = &tenant_limiter_;
    sources.images = image_cache_.get();
    sources.snapshots = [this] { return snapshots_for_metrics_.load(); };
    if (local_ != nullptr) {
      sources.sandbox_output_dropped = [l = local_.get()] { return l->output_dropped_bytes(); };
    }
    if (replication_ != nullptr) sources.extra.push_back(replication_->Collector());
    if (!flags_.proxy.proxy.listen.empty()) {
      sources.extra.push_back(ProxyCollector(&proxy_counters_));
    }
    ASSIGN_OR_RETURN(metrics_, server::MetricsEndpoint::Start(metrics_options, registry_, sources));
  }

  server_options.request_counters = &request_counters_;
  server_options.tenant_limiter = &tenant_limiter_;
  server_options.images = image_cache_.get();
  server_options.check_template = NewTemplateCheck(local_.get(), kube_ != nullptr);
  // Claims by image: on-demand pools with the local runtime (image_pools.h); declared
  // pools only elsewhere (on Kubernetes a pool's SandboxTemplate says what it runs).
  server_options.image_claims.on_demand = runtime_name == "local";
  server_options.image_claims.kubernetes_images =
      NewKubernetesTemplateImages(kube_ != nullptr ? kube_->kube_runtime() : nullptr);
  if (server_options.auth.tokens_file.empty()) server_options.auth.insecure_no_auth = true;
  flags_.snapshots.reconcile = runtime_name == "local";
  return absl::OkStatus();
}

absl::Status ServerApp::OpenAllocator() {
  auto created =
      allocator::Allocator::Create(allocator_options_, store_.get(), active_runtime_, refill_.get(),
                                   &Clock::Real(), &IdGenerator::Random());
  if (!created.ok()) {
    return absl::Status(created.status().code(), absl::StrCat("store \"", flags_.store.path,
                                                              "\": ", created.status().message()));
  }
  allocator_ = *std::move(created);
  allocator_for_reports_ = allocator_.get();
  allocator_for_metrics_ = allocator_.get();
  const auto& rec = allocator_->recovery();
  spdlog::info(
      "recovered {} templates, {} pools, {} sandboxes, {} active and {} ended claims in {}",
      rec.templates, rec.pools, rec.sandboxes, rec.active_claims, rec.ended_claims,
      absl::FormatDuration(rec.took));
  return absl::OkStatus();
}

// What a serving replica does (at once, or once it leads): reconcile with the runtime,
// apply the config, refill, serve the pools and claims of the cluster, and the API.
absl::Status ServerApp::Activate() {
  server::ServerOptions& server_options = flags_.server;
  if (active_runtime_ != nullptr) {
    RETURN_IF_ERROR(ReconcileWithRuntime(*allocator_, *active_runtime_, *registry_,
                                         flags_.start_delete_limits));
  }
  RETURN_IF_ERROR(ApplyConfig(config_, *allocator_));
  if (!flags_.image_claim_template.empty()) {
    ASSIGN_OR_RETURN(server_options.image_claims.base_template,
                     CheckImageClaimTemplate(*allocator_, flags_.image_claim_template));
  }
  if (active_runtime_ != nullptr) refill_->Start(allocator_.get());
  if (kube_ != nullptr) RETURN_IF_ERROR(kube_->StartPools(allocator_.get()));
  server_options.allocator = allocator_.get();
  ASSIGN_OR_RETURN(snapshots_, allocator::Snapshots::Make(flags_.snapshots, allocator_.get(),
                                                          store_.get(), active_runtime_,
                                                          &Clock::Real(), &IdGenerator::Random()));
  server_options.snapshots = snapshots_.get();
  snapshots_for_metrics_ = snapshots_.get();
  ASSIGN_OR_RETURN(port_proxy_,
                   StartProxy(flags_.proxy, server_options.auth, *sandbox_secrets_,
                              allocator_.get(), &server_options.port_urls, &proxy_counters_));
  ASSIGN_OR_RETURN(auto started, server::Server::Start(server_options));
  // The E2B front: a translation onto the services just started, through their
  // in-process channel.
  ASSIGN_OR_RETURN(auto front, StartE2b(flags_.e2b, server_options, *started, *sandbox_secrets_,
                                        port_proxy_.proxy.get()));
  absl::MutexLock lock(&server_mu_);
  server_ = std::move(started);
  e2b_front_ = std::move(front);
  return absl::OkStatus();
}

absl::Status ServerApp::Start() {
  if (!standby_first_) return Activate();
  promotion_ = std::thread([this] { Promote(); });
  return absl::OkStatus();
}

void ServerApp::Promote() {
  while (!stopping_.load()) {
    k8s::LeaderElector* elector = kube_->elector();
    if (elector != nullptr && elector->IsLeader()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (stopping_.load()) return;
  spdlog::info("this replica leads: serving the API itself, the standby relay stops");
  k8s::LeaderElector* elector = kube_->elector();
  absl::Status led = replication_->Lead(elector->Term(), [elector](const std::string& name) {
    return elector->PublishSyncReplica(name);
  });
  if (led.ok()) led = OpenAllocator();
  if (!led.ok()) {
    spdlog::error("cannot lead: {}", led.ToString());
    kill(getpid(), SIGTERM);
    return;
  }
  if (absl::Status s = Activate(); !s.ok()) {
    spdlog::error("cannot serve after taking the lead: {}", s.ToString());
    kill(getpid(), SIGTERM);
    return;
  }
  standby_->Shutdown(absl::Seconds(flags_.shutdown_grace_s));
  // Calls that reach the relay while it stops may end CANCELLED (gRPC's server answers
  // so for calls it can no longer start); from here on only this replica's API serves.
  spdlog::info("the standby relay has stopped: the API is served by this replica alone");
}

void ServerApp::Quiesce() {
  {
    absl::MutexLock lock(&quiesce_mu_);
    if (!quiesce_armed_) return;
  }
  // Once, whoever comes first: the elector's thread or Shutdown (which waits for the
  // elector's thread if it began).
  std::call_once(quiesced_, [this] {
    replication_->Stop();  // nothing more is acknowledged
    kube_->StopPools();    // controllers, then the write queues and the runtime's creates
    refill_->Stop();
  });
}

void ServerApp::ReloadAuth() {
  absl::MutexLock lock(&server_mu_);
  if (server_ == nullptr) {
    spdlog::info("SIGHUP: a standby has no tokens to reload (the leader checks them)");
    return;
  }
  absl::Status s = server_->ReloadAuth();
  if (s.ok() && port_proxy_.auth != nullptr) s = port_proxy_.auth->Reload();
  if (s.ok() && e2b_front_.auth != nullptr) s = e2b_front_.auth->Reload();
  if (s.ok()) {
    spdlog::info("SIGHUP: tokens reloaded");
  } else {
    spdlog::error("SIGHUP: tokens not reloaded, the old ones stay: {}", s.ToString());
  }
}

// The shutdown order, once. Each step says why it comes where it does.
absl::Status ServerApp::Shutdown(absl::Duration grace) {
  if (shut_down_) return absl::OkStatus();
  shut_down_ = true;
  // 1. No promotion may start serving while the rest stops.
  stopping_.store(true);
  if (promotion_.joinable()) promotion_.join();
  // 2. A leader stops acknowledging first (later commits fail with UNAVAILABLE), so that
  // its in-sync standby, still named by the Lease, holds everything it acknowledged and
  // takes over as soon as the Lease is released below; this also ends the standby's
  // stream, which would otherwise hold the server's shutdown for its whole grace period.
  if (replication_ != nullptr) replication_->Stop();
  // 3. The fronts, outermost first: the standby's relay, then the API (its watch streams
  // end with UNAVAILABLE), then the E2B front after the server, whose shutdown ends the
  // calls the front's handlers wait on (a process stream may wait for output for long),
  // so that they finish before the front's wait; then the port proxy.
  if (standby_ != nullptr) standby_->Shutdown(grace);
  {
    absl::MutexLock lock(&server_mu_);
    if (server_ != nullptr) server_->Shutdown(grace);
    if (e2b_front_.front != nullptr) e2b_front_.front->Shutdown();
  }
  if (port_proxy_.proxy != nullptr) port_proxy_.proxy->Shutdown();
  // 4. What acts on the cluster and the runtime (the quiesce of a deposed leader, if the
  // elector's thread has not run it: replication, pools, refill), with nothing left that
  // calls into it.
  Quiesce();
  if (kube_ != nullptr) kube_->StopPools();
  // 5. The metrics endpoint reads the allocator, refill, store and replication: it goes
  // before them.
  metrics_.reset();
  // 6. Refill before the allocator it feeds; the allocator before the runtime and the
  // store it uses; the reports' pointer cleared before the allocator goes.
  if (refill_ != nullptr) refill_->Stop();
  allocator_for_reports_ = nullptr;
  allocator_for_metrics_ = nullptr;
  allocator_.reset();
  // 7. The cluster's controllers and webhook, then the runtimes (the local one leaves the
  // sandboxes running unless --delete_sandboxes_on_exit).
  kube_.reset();
  conversion_.reset();
  runtime_.reset();
  local_.reset();
  // 8. The store last: everything above may still commit while it stops.
  return store_ != nullptr ? store_->Close() : absl::OkStatus();
}

}  // namespace sbx::cmd

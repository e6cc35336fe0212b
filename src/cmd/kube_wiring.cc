#include "src/cmd/kube_wiring.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"
#include "src/common/ids.h"
#include "src/common/status_macros.h"
#include "src/k8s/config.h"
#include "src/k8s/json_fields.h"
#include "src/k8s/resources.h"
#include "src/k8s/sandbox_key.h"

namespace sbx::cmd {

void AddKubeFlags(CLI::App& app, KubeFlags* flags) {
  app.add_option("--kubeconfig", flags->kubeconfig,
                 "run the Kubernetes controllers against this cluster: a kubeconfig file, or "
                 "\"in-cluster\" for the pod's service account");
  app.add_option("--kube_context", flags->context, "kubeconfig context (default: current)");
  app.add_option("--kube_namespace", flags->ns, "namespace to act in (default: all)");
  app.add_option("--kube_qps", flags->qps, "API requests per second (client-side limit)")
      ->capture_default_str();
  app.add_option("--kube_burst", flags->burst, "API request burst")->capture_default_str();
  app.add_option("--kube_http", flags->http_transport,
                 "HTTP client for the API server: socket (requests on their callers' threads) "
                 "or cpprest (cpprestsdk's asynchronous client)")
      ->check(CLI::IsMember({"socket", "cpprest"}))
      ->capture_default_str();
  app.add_option("--kube_workers", flags->workers, "reconcile workers per controller")
      ->capture_default_str();
  app.add_flag("--kube_leader_election", flags->leader_election,
               "reconcile only while holding the sbx-controller Lease (for several replicas)");
  app.add_option("--kube_lease_namespace", flags->lease_namespace, "namespace of the Lease")
      ->capture_default_str();
  app.add_option("--kube_identity", flags->identity,
                 "this replica's name in the Lease (default: hostname-pid)");
  app.add_option("--kube_lease_duration_seconds", flags->lease_duration_s,
                 "with --kube_leader_election: how long the Lease holds without a renewal; a "
                 "replica that can reach the leader, or has no replication stream from it, "
                 "takes a silent leader's Lease after this")
      ->capture_default_str();
  app.add_option("--kube_renew_deadline_seconds", flags->renew_deadline_s,
                 "with --kube_leader_election: the leader's write window: it writes nothing "
                 "(and steps down) once its last successful renewal began this long ago, on "
                 "its monotonic clock; a standby whose replication stream broke takes over "
                 "0.5 s after that")
      ->capture_default_str();
  app.add_option("--kube_retry_period_seconds", flags->retry_period_s,
                 "with --kube_leader_election: how often the Lease is renewed or looked at, "
                 "and the timeout of each election request (never retried)")
      ->capture_default_str();
  app.add_option("--kube_pool_namespace", flags->pool_namespace,
                 "the default namespace: its pools are named without one over gRPC and in the "
                 "store (\"py\" is \"<this>/py\"), those of others \"<namespace>/<pool>\" "
                 "(default: --kube_namespace, else \"default\"); with --runtime kubernetes, "
                 "SandboxWarmPools and SandboxClaims are served in --kube_namespace (every "
                 "namespace when unset)");
  app.add_option("--kube_write_workers", flags->write_workers,
                 "threads writing Sandboxes and claim bindings (writes in flight at once)")
      ->capture_default_str();
  app.add_option("--kube_write_qps", flags->write_qps,
                 "budget of those writes per second (claim bindings first, then refills, then "
                 "clean-up)")
      ->capture_default_str();
  app.add_option("--kube_write_burst", flags->write_burst, "burst of that budget")
      ->capture_default_str();
  app.add_option("--kube_claim_workers", flags->claim_workers, "SandboxClaim reconcile workers")
      ->capture_default_str();
  app.add_flag("--kube_claim_annotations", flags->claim_annotations,
               "write upstream's SandboxClaim annotations agents.x-k8s.io/sandbox-name and "
               "controller-first-observed-at, as upstream does by default (one or two more "
               "writes per claim; =false: none)")
      ->capture_default_str();
  app.add_option("--kube_node_labels", flags->node_labels,
                 "watch Nodes (cluster-wide list and watch) so that sandboxes carry their "
                 "node's labels, which a claim's node_preference matches (false: none)")
      ->capture_default_str();
  app.add_option("--kube_ready_timeout_seconds", flags->ready_timeout_s,
                 "a warm-pool member not Ready after this long is replaced (unless its pod is "
                 "unschedulable)")
      ->capture_default_str();
  app.add_option("--kube_server_pod_labels", flags->server_pod_labels,
                 "labels of sbx-server's pods (\"k=v,k2=v2\"): the default NetworkPolicy of a "
                 "SandboxTemplate admits them to the sbx-sandboxd port of its pods (\"\": "
                 "none)")
      ->capture_default_str();
  app.add_option("--kube_server_namespace", flags->server_namespace,
                 "namespace of sbx-server's pods, for that rule and for --sandbox_key_secret "
                 "(default: the kubeconfig context's namespace; in-cluster, the pod's own)");
  app.add_option("--cluster", flags->clusters,
                 "with --kubeconfig and --runtime kubernetes: also serve this member cluster, "
                 "NAME=KUBECONFIG[,key=value...] (keys context, qps, burst, write_qps, "
                 "write_burst, weight, min, max; repeat for more clusters): pools span the "
                 "home cluster and these (docs/kubernetes.md, \"Fleet\")");
  app.add_option("--kube_cluster_name", flags->cluster_name,
                 "with --cluster: the name of the --kubeconfig (home) cluster in the fleet")
      ->capture_default_str();
  app.add_option("--fleet_placement", flags->fleet_placement,
                 "with --cluster: which cluster gets a pool's next member: spread (fewest "
                 "members), pack (the first below its max, home first), weighted (weight x "
                 "measured create rate); per-cluster min first")
      ->check(CLI::IsMember({"spread", "pack", "weighted"}))
      ->capture_default_str();
  app.add_option("--fleet_cluster_timeout_seconds", flags->fleet_cluster_timeout_s,
                 "with --cluster: a cluster whose API has not answered for this long is "
                 "excluded: it takes no creates and its warm members are retired, never handed "
                 "out, until it answers again")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--sandbox_key_secret", flags->sandbox_key_secret,
                 "with --kubeconfig: keep the key of the sandboxes' daemon secrets in this "
                 "Secret of --kube_server_namespace (made on first start, then shared by every "
                 "replica) instead of --sandbox_key_file");
}

std::string DefaultIdentity() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, "-", getpid());
}

std::string WithPort(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  return absl::StrCat(colon == std::string::npos ? listen : listen.substr(0, colon), ":", port);
}

absl::StatusOr<std::string> AdvertisedAddress(const std::string& advertise,
                                              const std::string& listen, int bound_port) {
  if (!advertise.empty()) {
    const size_t colon = advertise.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(absl::string_view(advertise).substr(colon + 1), &port) || port <= 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--advertise_address \"", advertise, "\" is not host:port with a port from 1 to 65535"));
    }
    return advertise;
  }
  const size_t colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen \"", listen,
        "\" does not say where the other replicas reach this one: give --advertise_address "
        "host:port (the pod's IP and the gRPC port; the chart sets it)"));
  }
  return WithPort(listen, bound_port);
}

std::string DefaultNamespace(const KubeFlags& flags) {
  if (!flags.pool_namespace.empty()) return flags.pool_namespace;
  return flags.ns.empty() ? "default" : flags.ns;
}

namespace {

// "k=v,k2=v2" as a map; INVALID_ARGUMENT naming the flag and the bad entry.
absl::StatusOr<std::map<std::string, std::string>> ParseLabels(const std::string& flag,
                                                               const std::string& text) {
  std::map<std::string, std::string> labels;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    kv.first = std::string(absl::StripAsciiWhitespace(kv.first));
    kv.second = std::string(absl::StripAsciiWhitespace(kv.second));
    if (kv.first.empty() || entry.find('=') == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": \"", entry, "\" is not key=value (in \"", text, "\")"));
    }
    labels[kv.first] = kv.second;
  }
  return labels;
}

// The namespace of sbx-server's own pods.
std::string ServerNamespace(const KubeFlags& flags, const k8s::ClusterConfig& cluster) {
  return flags.server_namespace.empty() ? cluster.default_namespace : flags.server_namespace;
}

// The flags of member cluster `spec`: the home cluster's, with its kubeconfig, context,
// limits and no election; its own on the Sandboxes' daemon secrets (those of their fleet
// ids, "NAME:<allocator name>") and no metrics (a registry holds each family once).
KubeFlags MemberFlags(const KubeFlags& home, const k8s::ClusterSpec& spec) {
  KubeFlags member = home;
  member.clusters.clear();
  member.cluster_name = spec.name;
  member.kubeconfig = spec.kubeconfig;
  member.context = spec.context;
  if (spec.qps) member.qps = *spec.qps;
  if (spec.burst) member.burst = *spec.burst;
  if (spec.write_qps) member.write_qps = *spec.write_qps;
  if (spec.write_burst) member.write_burst = *spec.write_burst;
  member.leader_election = false;
  member.sandbox_key_secret.clear();
  member.registry = nullptr;
  member.identity =
      absl::StrCat(home.identity.empty() ? DefaultIdentity() : home.identity, "@", spec.name);
  if (home.sandboxd_secret) {
    // home.sandboxd_secret(ns, name) is the secret of allocator name QualifiedName(ns, name,
    // default namespace); the fleet id of a member's Sandbox is "NAME:" + that name, which
    // is QualifiedName("NAME:" + ns, name) outside the default namespace and
    // "NAME:" + name in it.
    member.sandboxd_secret = [base = home.sandboxd_secret, prefix = spec.name + ":",
                              default_ns = DefaultNamespace(home)](const std::string& ns,
                                                                   const std::string& name) {
      return ns == default_ns ? base(ns, prefix + name) : base(prefix + ns, name);
    };
  }
  return member;
}

}  // namespace

KubeControllers::~KubeControllers() {
  StopPools();
  fleet_for_reports_.store(nullptr, std::memory_order_release);
  fleet_.reset();
  members_.clear();
  runtime_.reset();
  member_pools_.reset();
  member_templates_.reset();
  templates_.reset();
  sandboxes_.reset();
  client_.reset();
  election_client_.reset();
}

size_t KubeControllers::ClusterSandboxes() const {
  if (sandboxes_ == nullptr) return 0;
  size_t n = 0;
  for (const k8s::ObjectPtr& sandbox : sandboxes_->sandbox_informer().List()) {
    const k8s::Json& labels =
        k8s::json_fields::Field(k8s::json_fields::Field(*sandbox, "metadata"), "labels");
    if (!k8s::json_fields::Str(labels, k8s::kSbxPoolLabel).empty() ||
        !k8s::json_fields::Str(labels, k8s::kClaimUidLabel).empty()) {
      ++n;
    }
  }
  return n;
}

absl::Status KubeControllers::StartPools(allocator::Allocator* allocator) {
  if (pools_ == nullptr) return absl::OkStatus();
  allocator_.store(allocator, std::memory_order_release);
  pools_->Start(allocator, runtime_.get());
  // In a fleet there is no claim controller yet (docs/kubernetes.md, "Fleet").
  return claims_ != nullptr ? claims_->Start(allocator) : absl::OkStatus();
}

void KubeControllers::StopPools() {
  // The probers first: a lost cluster's report retires members from the allocator.
  if (health_ != nullptr) health_->Stop();
  for (auto& member : members_) {
    if (member->health_ != nullptr) member->health_->Stop();
  }
  allocator_.store(nullptr, std::memory_order_release);
  if (claims_ != nullptr) claims_->Stop();
  if (pools_ != nullptr) pools_->Stop();
  for (auto& member : members_) member->StopPools();
  if (writes_ != nullptr) writes_->Stop();
  if (runtime_ != nullptr) runtime_->Shutdown();
}

absl::StatusOr<std::string> KubeControllers::LoadSandboxKey(const KubeFlags& flags) {
  k8s::SandboxKeyOptions options;
  options.ns = ServerNamespace(flags, client_->cluster());
  options.name = flags.sandbox_key_secret;
  options.deadline = absl::Seconds(30);
  return k8s::LoadOrCreateSandboxKey(*client_, options);
}

absl::StatusOr<std::unique_ptr<KubeControllers>> ConnectKube(const KubeFlags& flags) {
  absl::StatusOr<k8s::ClusterConfig> cluster =
      flags.kubeconfig == "in-cluster" ? k8s::LoadInCluster()
                                       : k8s::LoadKubeconfig(flags.kubeconfig, flags.context);
  if (!cluster.ok()) return cluster.status();
  k8s::ClientOptions client_options;
  client_options.qps = flags.qps;
  client_options.burst = flags.burst;
  client_options.transport = flags.http_transport;
  client_options.registry = flags.registry;
  // The replica's name in every request's User-Agent, so that the API server's audit log
  // (and the emulator's request log) tells which replica wrote what.
  client_options.user_agent =
      absl::StrCat(client_options.user_agent, " (",
                   flags.identity.empty() ? DefaultIdentity() : flags.identity, ")");
  auto kube = std::make_unique<KubeControllers>();
  ASSIGN_OR_RETURN(kube->client_, k8s::Client::Create(*cluster, client_options));
  if (flags.leader_election) {
    if (!(flags.retry_period_s > 0 && flags.renew_deadline_s > flags.retry_period_s &&
          flags.lease_duration_s > flags.renew_deadline_s)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "leader election needs --kube_lease_duration_seconds > --kube_renew_deadline_seconds "
          "> --kube_retry_period_seconds > 0 (got ",
          flags.lease_duration_s, ", ", flags.renew_deadline_s, ", ", flags.retry_period_s, ")"));
    }
    // A renewal is two requests (read, compare-and-swap write), each bounded by the retry
    // period and never retried: an attempt cannot hang past the renew deadline's reach.
    k8s::ClientOptions election = client_options;
    election.request_timeout = absl::Seconds(flags.retry_period_s);
    election.max_retries = 0;
    election.qps = 0;  // the shared limiter's queue must not delay a renewal
    election.registry = nullptr;
    ASSIGN_OR_RETURN(kube->election_client_, k8s::Client::Create(*cluster, election));
  }
  if (!flags.clusters.empty()) {
    if (flags.leader_election) {
      return absl::InvalidArgumentError(
          "--cluster with --kube_leader_election: not yet (the member clusters' controllers "
          "are not fenced by the home cluster's Lease); run one replica of a fleet");
    }
    if (absl::Status s = ValidateName("--kube_cluster_name", flags.cluster_name); !s.ok()) {
      return s;
    }
    std::set<std::string> names = {flags.cluster_name};
    for (const std::string& text : flags.clusters) {
      ASSIGN_OR_RETURN(k8s::ClusterSpec spec, k8s::ParseClusterSpec(text));
      if (!names.insert(spec.name).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--cluster \"", text, "\": cluster \"", spec.name, "\" is named twice (",
            spec.name == flags.cluster_name ? "it is the home cluster's --kube_cluster_name"
                                            : "by another --cluster",
            ")"));
      }
      KubeFlags member = MemberFlags(flags, spec);
      absl::StatusOr<std::unique_ptr<KubeControllers>> connected = ConnectKube(member);
      if (!connected.ok()) {
        return absl::Status(
            connected.status().code(),
            absl::StrCat("--cluster \"", spec.name, "\": ", connected.status().message()));
      }
      kube->members_.push_back(*std::move(connected));
      kube->member_specs_.push_back(std::move(spec));
    }
  }
  return kube;
}

absl::Status StartKube(KubeControllers& kube, const KubeFlags& flags, bool serve_pools,
                       std::function<void(const std::string&)> on_gone) {
  if (kube.members_.empty()) {
    return StartCluster(kube, flags, serve_pools, KubeControllers::Role::kAlone,
                        std::move(on_gone));
  }
  if (!serve_pools) {
    return absl::InvalidArgumentError(
        "--cluster needs --runtime kubernetes (a fleet serves warm pools across clusters)");
  }
  ASSIGN_OR_RETURN(const k8s::FleetPlacement placement,
                   k8s::ParseFleetPlacement(flags.fleet_placement));
  // Each cluster's gone reports, in fleet ids; none come before the fleet exists (a
  // member is reported gone only after it was reported ready or listed).
  auto gone_of = [&kube, on_gone](size_t cluster) {
    return [&kube, on_gone, cluster](const std::string& id) {
      k8s::FleetRuntime* fleet = kube.fleet_for_reports_.load(std::memory_order_acquire);
      if (fleet != nullptr && on_gone) on_gone(fleet->Gone(cluster, id));
    };
  };
  RETURN_IF_ERROR(StartCluster(kube, flags, true, KubeControllers::Role::kHome, gone_of(0)));
  k8s::FleetRuntimeOptions fleet_options;
  fleet_options.placement = placement;
  fleet_options.clusters.push_back(k8s::FleetCluster{flags.cluster_name, kube.runtime_.get()});
  for (size_t i = 0; i < kube.members_.size(); ++i) {
    const k8s::ClusterSpec& spec = kube.member_specs_[i];
    absl::Status started = StartCluster(*kube.members_[i], MemberFlags(flags, spec), true,
                                        KubeControllers::Role::kMember, gone_of(i + 1));
    if (!started.ok()) {
      return absl::Status(started.code(),
                          absl::StrCat("--cluster \"", spec.name, "\": ", started.message()));
    }
    fleet_options.clusters.push_back(k8s::FleetCluster{spec.name, kube.members_[i]->runtime_.get(),
                                                       spec.min, spec.max, spec.weight});
  }
  // Each cluster's health: a probe client (short timeout, no retries, no rate limit: its
  // answer is the cluster's, not the client's queue's) and the prober.
  const absl::Duration bound = absl::Seconds(flags.fleet_cluster_timeout_s);
  std::vector<KubeControllers*> all = {&kube};
  for (auto& member : kube.members_) all.push_back(member.get());
  for (size_t i = 0; i < all.size(); ++i) {
    KubeControllers& c = *all[i];
    k8s::ClientOptions probe;
    probe.request_timeout = std::min(bound / 2, absl::Seconds(5));
    probe.max_retries = 0;
    probe.qps = 0;
    probe.transport = flags.http_transport;
    probe.registry = nullptr;
    ASSIGN_OR_RETURN(c.probe_client_, k8s::Client::Create(c.client_->cluster(), probe));
    k8s::FleetHealthOptions health;
    health.bound = bound;
    health.interval = std::min(absl::Seconds(1), bound / 3);
    health.probe = [client = c.probe_client_.get(), ns = flags.ns]() -> absl::Status {
      k8s::ListOptions one;
      one.limit = 1;
      return client->List(k8s::kSandboxes, ns, one).status();
    };
    const std::string name = fleet_options.clusters[i].name;
    health.on_change = [&kube, i, name, bound](bool healthy, const absl::Status& error) {
      if (healthy) {
        spdlog::warn("fleet: cluster \"{}\" answers again: it takes creates again", name);
        return;
      }
      // Its warm members' state is unknown: none may be handed out. (Claimed ones stay
      // claimed; their clusters may still run them.)
      int retired = 0;
      k8s::FleetRuntime* fleet = kube.fleet_for_reports_.load(std::memory_order_acquire);
      allocator::Allocator* allocator = kube.allocator_.load(std::memory_order_acquire);
      if (fleet != nullptr && allocator != nullptr) {
        for (const std::string& id : fleet->MembersOf(i)) {
          // FAILED_PRECONDITION: claimed (the claim keeps it); NOT_FOUND: gone already.
          if (allocator->RetireWarm(id).ok()) ++retired;
        }
      }
      spdlog::error(
          "fleet: cluster \"{}\" excluded: its API has not answered for {} (last error: {}); "
          "it takes no creates and {} warm members were retired, never to be handed out",
          name, absl::FormatDuration(bound), error.ToString(), retired);
    };
    RETURN_IF_ERROR(health.Validate());
    c.health_ = std::make_unique<k8s::FleetHealth>(std::move(health));
    fleet_options.clusters[i].healthy = [h = c.health_.get()] { return h->Healthy(); };
  }
  RETURN_IF_ERROR(fleet_options.Validate());
  kube.fleet_ = std::make_unique<k8s::FleetRuntime>(std::move(fleet_options));
  kube.fleet_for_reports_.store(kube.fleet_.get(), std::memory_order_release);
  for (KubeControllers* c : all) c->health_->Start();
  std::vector<std::string> names;
  for (const k8s::FleetCluster& c : kube.fleet_->options().clusters) names.push_back(c.name);
  spdlog::info(
      "fleet: {} clusters ({}), placement {}; kubectl SandboxClaims are not served "
      "in a fleet yet",
      names.size(), absl::StrJoin(names, ", "), flags.fleet_placement);
  return absl::OkStatus();
}

absl::Status StartCluster(KubeControllers& kube, const KubeFlags& flags, bool serve_pools,
                          KubeControllers::Role role,
                          std::function<void(const std::string&)> on_gone) {
  ASSIGN_OR_RETURN(auto server_pod_labels,
                   ParseLabels("--kube_server_pod_labels", flags.server_pod_labels));
  k8s::Client* client = kube.client_.get();
  const k8s::ClusterConfig& cluster = client->cluster();

  k8s::SandboxControllerOptions options;
  options.ns = flags.ns;
  options.workers = flags.workers;
  options.registry = flags.registry;
  options.sandboxd_secret = flags.sandboxd_secret;
  options.leader_election = flags.leader_election;
  options.election.lease_namespace = flags.lease_namespace;
  options.election.lease_name = "sbx-controller";
  options.election.identity = flags.identity.empty() ? DefaultIdentity() : flags.identity;
  options.election.address = flags.advertise_address;
  options.election.may_lead = flags.may_lead;
  options.election.leader_unreachable = flags.leader_unreachable;
  options.election.lease_duration = absl::Seconds(flags.lease_duration_s);
  options.election.renew_deadline = absl::Seconds(flags.renew_deadline_s);
  options.election.retry_period = absl::Seconds(flags.retry_period_s);
  options.election_client = kube.election_client_.get();
  options.on_stopped_leading = flags.on_stopped_leading;
  kube.sandboxes_ = std::make_unique<k8s::SandboxController>(client, options);
  k8s::SandboxController* sandboxes = kube.sandboxes_.get();

  k8s::Namespaces namespaces;
  namespaces.watch = flags.ns;
  namespaces.default_ns = DefaultNamespace(flags);
  const std::string& pool_ns = namespaces.default_ns;
  if (serve_pools) {
    if (!flags.ns.empty() && flags.ns != pool_ns) {
      return absl::InvalidArgumentError(absl::StrCat("--kube_pool_namespace \"", pool_ns,
                                                     "\" is outside --kube_namespace \"", flags.ns,
                                                     "\""));
    }
    k8s::WriteSchedulerOptions write_options;
    write_options.workers = flags.write_workers;
    write_options.qps = flags.write_qps;
    write_options.burst = flags.write_burst;
    RETURN_IF_ERROR(write_options.Validate());
    kube.writes_ = std::make_unique<k8s::WriteScheduler>(write_options);
    auto is_leader = [sandboxes] { return sandboxes->IsLeader(); };
    const k8s::Informer* pools_informer = nullptr;
    const k8s::Informer* templates_informer = nullptr;
    if (role != KubeControllers::Role::kMember) {
      k8s::WarmPoolControllerOptions pool_options;
      pool_options.namespaces = namespaces;
      pool_options.is_leader = is_leader;
      pool_options.registry = flags.registry;
      kube.pools_ = std::make_unique<k8s::WarmPoolController>(
          client, kube.writes_.get(), &sandboxes->sandbox_informer(), pool_options);
      pools_informer = &kube.pools_->pools();
      templates_informer = &kube.pools_->templates();
    } else {
      // A member cluster's copies of the pools and templates, which its members are made
      // from and owned by; the home cluster's define the pools.
      kube.member_pools_ = std::make_unique<k8s::Informer>(
          client, k8s::NamespaceInformer(k8s::kSandboxWarmPools, flags.ns));
      kube.member_templates_ = std::make_unique<k8s::Informer>(
          client, k8s::NamespaceInformer(k8s::kSandboxTemplates, flags.ns));
      pools_informer = kube.member_pools_.get();
      templates_informer = kube.member_templates_.get();
    }
    if (role == KubeControllers::Role::kAlone) {
      k8s::ClaimControllerOptions claim_options;
      claim_options.namespaces = namespaces;
      claim_options.workers = flags.claim_workers;
      claim_options.claim_annotations = flags.claim_annotations;
      claim_options.is_leader = is_leader;
      claim_options.registry = flags.registry;
      kube.claims_ = std::make_unique<k8s::ClaimController>(
          client, kube.writes_.get(), &sandboxes->sandbox_informer(), &kube.pools_->pools(),
          &kube.pools_->templates(), claim_options);
    }
    k8s::KubeRuntimeOptions runtime_options;
    runtime_options.namespaces = namespaces;
    runtime_options.ready_timeout = absl::Seconds(flags.ready_timeout_s);
    runtime_options.on_gone = std::move(on_gone);
    runtime_options.registry = flags.registry;
    if (flags.node_labels) {
      kube.nodes_ =
          std::make_unique<k8s::Informer>(client, k8s::NamespaceInformer(k8s::kNodes, ""));
      kube.nodes_->Start();
      runtime_options.nodes = kube.nodes_.get();
    }
    RETURN_IF_ERROR(runtime_options.Validate());
    kube.runtime_ = std::make_unique<k8s::KubeRuntime>(
        client, kube.writes_.get(), &sandboxes->sandbox_informer(), pools_informer,
        templates_informer, runtime_options);
    k8s::KubeRuntime* runtime = kube.runtime_.get();
    k8s::InformerHandler feed;
    feed.on_add = [runtime](const k8s::ObjectPtr& o) { runtime->OnSandbox(o); };
    feed.on_update = [runtime](const k8s::ObjectPtr&, const k8s::ObjectPtr& o) {
      runtime->OnSandbox(o);
    };
    feed.on_delete = [runtime](const k8s::ObjectPtr& o) { runtime->OnSandboxDeleted(o); };
    sandboxes->sandbox_informer().AddHandler(std::move(feed));
  }
  RETURN_IF_ERROR(sandboxes->Start());
  k8s::TemplateControllerOptions template_options;
  template_options.ns = flags.ns;
  template_options.is_leader = [sandboxes] { return sandboxes->IsLeader(); };
  template_options.registry = flags.registry;
  template_options.network_policy.server_pod_labels = std::move(server_pod_labels);
  template_options.network_policy.server_namespace = ServerNamespace(flags, cluster);
  kube.templates_ = std::make_unique<k8s::TemplateController>(client, template_options);
  RETURN_IF_ERROR(kube.templates_->Start());
  if (serve_pools && kube.member_pools_ != nullptr) {
    kube.member_pools_->Start();
    kube.member_templates_->Start();
    for (const k8s::Informer* informer : {kube.member_pools_.get(), kube.member_templates_.get()}) {
      if (!informer->WaitForSync(absl::Seconds(30))) {
        return absl::UnavailableError(
            "the SandboxWarmPool and SandboxTemplate informers did not complete their first "
            "list within 30 s (are the extensions.agents.x-k8s.io CRDs installed?)");
      }
    }
  }
  if (serve_pools && kube.pools_ != nullptr) {
    RETURN_IF_ERROR(kube.pools_->StartInformers(absl::Seconds(30)));
  }
  if (serve_pools && kube.claims_ != nullptr) {
    RETURN_IF_ERROR(kube.claims_->StartInformers(absl::Seconds(30)));
  }
  if (serve_pools) {
    if (kube.nodes_ != nullptr && !kube.nodes_->WaitForSync(absl::Seconds(30))) {
      return absl::UnavailableError(
          "the Node informer did not complete its first list within 30 s (Nodes are listed "
          "for their labels; --kube_node_labels=false turns that off)");
    }
  }
  spdlog::info(
      "kubernetes{}: {} at {}; Sandbox controller running ({} workers{}, namespace {}), "
      "SandboxTemplate NetworkPolicies kept{}",
      role == KubeControllers::Role::kAlone
          ? std::string()
          : absl::StrCat(" (cluster \"", flags.cluster_name, "\")"),
      cluster.source, cluster.server, flags.workers,
      flags.leader_election ? ", leader election as " + options.election.identity : "",
      flags.ns.empty() ? "all" : flags.ns,
      serve_pools ? absl::StrCat("; serving SandboxWarmPools and SandboxClaims of ",
                                 flags.ns.empty() ? std::string("every namespace")
                                                  : absl::StrCat("\"", flags.ns, "\""),
                                 " (default namespace \"", pool_ns, "\")")
                  : std::string());
  return absl::OkStatus();
}

}  // namespace sbx::cmd

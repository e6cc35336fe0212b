#pragma once
// sbx-server's command line: every flag's value in one struct, and the one function that
// declares them (name, default, help text) on a CLI::App. The components' own option
// structs hold most values, so a flag's default is its struct's; the few values that are
// only flags live here. ServerApp (server_app.h) is made from a ServerFlags.
//
// Thread-safety: none; fill it on one thread before starting anything.

#include <cstddef>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "src/allocator/refill.h"
#include "src/allocator/snapshots.h"
#include "src/cmd/conversion_wiring.h"
#include "src/cmd/e2b_wiring.h"
#include "src/cmd/kube_wiring.h"
#include "src/cmd/proxy_wiring.h"
#include "src/common/logging.h"
#include "src/images/image_cache.h"
#include "src/runtime/bubblewrap_runtime.h"
#include "src/server/metrics.h"
#include "src/server/server.h"
#include "src/store/rocksdb_store.h"

namespace sbx::cmd {

// How many running sandboxes unknown to the store a start deletes by itself
// (--start_max_delete_share, --start_confirm_deletes; ServerApp's reconciliation).
struct StartDeleteLimits {
  // Unknown sandboxes deleted at most: this share of the running ones, and never fewer
  // than `floor` (a restart finds the few made after the last commit).
  double share = 0.2;
  size_t floor = 10;
  bool confirmed = false;  // --start_confirm_deletes: delete them all
};

struct ServerFlags {
  // Sets the defaults that differ from the option structs' own (the store's path, the
  // sandboxd next to this binary, no image cache).
  ServerFlags();

  server::ServerOptions server;
  server::MetricsOptions metrics;
  LogOptions log;
  double shutdown_grace_s = 10;
  store::RocksDbStoreOptions store;
  std::string durability = "sync";  // store.durability, parsed at Create
  std::string runtime = "local";    // local, instant, none or kubernetes
  runtime::BubblewrapRuntimeOptions local;
  allocator::RefillOptions refill;
  std::string config_path;
  KubeFlags kube;
  ConversionFlags conversion;
  ProxyFlags proxy;
  E2bFlags e2b;  // the E2B-compatible API (src/gateway/e2b)
  std::string advertise_address;
  std::string sandbox_key_file;
  double replication_ack_timeout_s = 2;
  StartDeleteLimits start_delete_limits;
  int replication_copies = 1;
  images::ImageCacheOptions image;
  std::string image_claim_template;
  allocator::SnapshotsOptions snapshots;
};

// Declares every flag of sbx-server on `app`, bound to `flags` (whose current values are
// the defaults shown by --help), with --version and the policy that a flag given twice
// takes its last value (so wrappers such as scripts/run can set defaults that the
// caller's own flags override).
void AddServerFlags(CLI::App& app, ServerFlags& flags);

// The checks across flags that parsing cannot make, and each component's Validate():
// INVALID_ARGUMENT naming the flag at fault.
[[nodiscard]] absl::Status CheckServerFlags(const ServerFlags& flags);

}  // namespace sbx::cmd

// sbx-server: parse flags, start the service, wait for SIGTERM/SIGINT, shut down with a
// deadline.

#include <csignal>
#include <cstdio>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"
#include "src/allocator/allocator.h"
#include "src/common/build_info.h"
#include "src/common/clock.h"
#include "src/common/ids.h"
#include "src/common/logging.h"
#include "src/server/server.h"
#include "src/store/rocksdb_store.h"

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "sbx-server: error: %s\n", std::string(status.message()).c_str());
  return 2;
}

// This build has no runtime wired to the allocator yet: nothing can create or delete
// sandboxes, so refill requests are logged (once per pool) and retired sandboxes are
// only reported. The local and Kubernetes runtimes replace this.
class NoRuntimeReconciler final : public sbx::allocator::Reconciler {
 public:
  void PoolBelowTarget(const std::string& pool) override {
    absl::MutexLock lock(&mu_);
    if (warned_.insert(pool).second) {
      spdlog::warn("pool \"{}\" is below target, but no runtime is configured to refill it", pool);
    }
  }
  void RetireSandbox(const sbx::store::SandboxRecord& sandbox) override {
    spdlog::info("sandbox \"{}\" retired (no runtime configured to delete it)", sandbox.id);
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_set<std::string> warned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

int main(int argc, char** argv) {
  // First of all, block the stop signals in every thread (gRPC's threads inherit this mask), then
  // wait for them synchronously here: no async-signal-safety concerns.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  sbx::server::ServerOptions server_options;
  sbx::LogOptions log_options;
  double shutdown_grace_s = 10;
  sbx::store::RocksDbStoreOptions store_options;
  store_options.path = ".sbx/data";
  std::string durability = "sync";

  CLI::App app{"sbx-server: warm-pool sandbox allocator for AI agents (gRPC)"};
  // A flag given twice takes its last value, so wrappers (scripts/run) can set defaults
  // that the caller's own flags override.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.set_version_flag("--version",
                       std::string(sbx::Version()) + " (" + std::string(sbx::GitCommit()) + ")");
  app.add_option("--listen", server_options.listen, "host:port to serve gRPC on (port 0: any)")
      ->capture_default_str();
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
  app.add_option("--durability", durability,
                 "sync: fsync each group commit; buffered: OS-buffered (survives kill -9, not "
                 "power loss)")
      ->capture_default_str();
  app.add_option("--log_level", log_options.level, "trace|debug|info|warn|error|critical|off")
      ->capture_default_str();
  app.add_option("--log_format", log_options.format, "text|json")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (absl::Status s = sbx::InitLogging(log_options); !s.ok()) return Fail(s);

  spdlog::info("sbx-server {} ({}) starting", sbx::Version(), sbx::GitCommit());
  auto mode = sbx::store::ParseDurability(durability);
  if (!mode.ok()) return Fail(mode.status());
  store_options.durability = *mode;
  auto store = sbx::store::OpenRocksDbStore(store_options);
  if (!store.ok()) return Fail(store.status());
  spdlog::info(
      "store: RocksDB at \"{}\", durability {} ({})", store_options.path,
      std::string(sbx::store::DurabilityName(*mode)),
      *mode == sbx::store::Durability::kSync ? "fsync per group commit" : "OS-buffered, no fsync");
  NoRuntimeReconciler reconciler;
  auto allocator = sbx::allocator::Allocator::Create(
      {}, store->get(), nullptr, &reconciler, &sbx::Clock::Real(), &sbx::IdGenerator::Random());
  if (!allocator.ok()) {
    return Fail(absl::Status(
        allocator.status().code(),
        absl::StrCat("store \"", store_options.path, "\": ", allocator.status().message())));
  }
  const auto& rec = (*allocator)->recovery();
  spdlog::info(
      "recovered {} templates, {} pools, {} sandboxes, {} active and {} ended claims "
      "in {}",
      rec.templates, rec.pools, rec.sandboxes, rec.active_claims, rec.ended_claims,
      absl::FormatDuration(rec.took));

  auto server = sbx::server::Server::Start(server_options);
  if (!server.ok()) return Fail(server.status());

  int signal = 0;
  sigwait(&stop_signals, &signal);
  spdlog::info("received {}, shutting down (grace {} s)", signal == SIGTERM ? "SIGTERM" : "SIGINT",
               shutdown_grace_s);
  (*server)->Shutdown(absl::Seconds(shutdown_grace_s));
  allocator->reset();
  if (absl::Status s = (*store)->Close(); !s.ok()) return Fail(s);
  spdlog::info("sbx-server stopped");
  return 0;
}

// N Sandboxes applied at once against the API emulator: time until all are Ready, API
// writes per Sandbox (the emulator's counters), and the controller's CPU and memory.
// The controller runs as it does in production, inside `sbx-server --kubeconfig`, in its
// own process, so /proc tells its CPU time and peak RSS apart from this driver's.
//
//   k8s_sandbox_bench --emulator PATH/kube-emulator --server PATH/sbx-server \
//       --crds charts/sbx/crds --count 1000 --latency_ms 5 --workers 32
//
// The driver creates the Sandboxes with `--create_concurrency` threads through sbx's
// client (rate limiter off) and follows their status through an informer.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "src/k8s/client.h"
#include "src/k8s/informer.h"
#include "src/k8s/sandbox_objects.h"
#include "tests/k8s/emulator_process.h"

extern char** environ;

namespace sbx::k8s {
namespace {

struct Flags {
  std::string emulator;
  std::string server;
  std::string crds;
  int count = 1000;
  int latency_ms = 5;
  int workers = 32;
  int create_concurrency = 32;
  int timeout_s = 600;
};

// utime+stime in seconds and peak RSS in MiB of `pid`.
void ProcessUsage(pid_t pid, double* cpu_s, double* peak_mib) {
  std::ifstream stat_file(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // Fields after the ")" of the command name: state is field 3; utime 14, stime 15.
  std::vector<std::string> fields = absl::StrSplit(stat.substr(stat.rfind(')') + 2), ' ');
  int64_t utime = 0, stime = 0;
  if (fields.size() > 13) {
    (void)absl::SimpleAtoi(fields[11], &utime);
    (void)absl::SimpleAtoi(fields[12], &stime);
  }
  *cpu_s = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  *peak_mib = 0;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      int64_t kib = 0;
      std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kib)) *peak_mib = kib / 1024.0;
    }
  }
}

int Run(const Flags& flags) {
  emulator::EmulatorProcess emu(flags.emulator,
                                {"--pod_ready_delay_ms", "50", "--watch_history", "10000000"});
  if (!emu.ok()) {
    std::fprintf(stderr, "%s\n", emu.error().c_str());
    return 1;
  }
  ClientOptions options;
  options.qps = 0;
  auto client = *Client::Create(emu.Cluster(), options);
  for (const Json& crd : emulator::LoadManifests(flags.crds)) {
    auto created = client->Create(kCustomResourceDefinitions, "", crd);
    if (!created.ok()) {
      std::fprintf(stderr, "CRD: %s\n", created.status().ToString().c_str());
      return 1;
    }
  }

  // The controller: sbx-server with a kubeconfig pointing at the emulator.
  const std::string dir =
      std::filesystem::temp_directory_path() / absl::StrCat("sbx-k8s-bench-", getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/kubeconfig")
      << "apiVersion: v1\nkind: Config\ncurrent-context: emu\nclusters: [{name: emu, cluster: "
         "{server: \""
      << emu.url()
      << "\"}}]\ncontexts: [{name: emu, context: {cluster: emu, user: u}}]\nusers: [{name: u, "
         "user: {token: x}}]\n";
  std::vector<std::string> args = {flags.server,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--metrics_listen",
                                   "127.0.0.1:0",
                                   "--data_dir",
                                   dir + "/data",
                                   "--runtime",
                                   "none",
                                   "--kubeconfig",
                                   dir + "/kubeconfig",
                                   "--kube_workers",
                                   absl::StrCat(flags.workers),
                                   "--kube_qps",
                                   "0",
                                   "--log_level",
                                   "warn"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t server = -1;
  if (posix_spawn(&server, flags.server.c_str(), nullptr, nullptr, argv.data(), environ) != 0) {
    std::fprintf(stderr, "cannot start %s\n", flags.server.c_str());
    return 1;
  }
  // Ready once its informers have synced; a Sandbox applied earlier would still be picked
  // up, but the clock should start with a running controller.
  absl::SleepFor(absl::Seconds(2));
  double cpu_before, peak_before;
  ProcessUsage(server, &cpu_before, &peak_before);

  std::atomic<int> ready{0};
  InformerOptions watch;
  watch.resource = kSandboxes;
  watch.ns = "default";
  Informer informer(client.get(), watch);
  InformerHandler handler;
  absl::Mutex mu;
  absl::flat_hash_set<std::string> ready_names;
  auto seen = [&](const ObjectPtr& o) {
    if (!IsReady(o->value("status", Json::object()))) return;
    absl::MutexLock lock(&mu);
    if (ready_names.insert((*o)["metadata"]["name"].get<std::string>()).second) ++ready;
  };
  handler.on_add = seen;
  handler.on_update = [&](const ObjectPtr&, const ObjectPtr& o) { seen(o); };
  informer.AddHandler(handler);
  informer.Start();
  informer.WaitForSync(absl::Seconds(30));

  (void)emu.AdminCall("POST", "/emulator/stats/reset");
  (void)emu.AdminCall("POST", "/emulator/faults", Json{{"latency_ms", flags.latency_ms}});
  const absl::Time start = absl::Now();
  std::atomic<int> next{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> creators;
  for (int t = 0; t < flags.create_concurrency; ++t) {
    creators.emplace_back([&] {
      for (int i = next.fetch_add(1); i < flags.count; i = next.fetch_add(1)) {
        Json sandbox = {
            {"metadata", {{"name", absl::StrCat("bench-", i)}}},
            {"spec",
             {{"podTemplate",
               {{"spec",
                 {{"containers", {{{"name", "main"}, {"image", "python:3.12-slim"}}}}}}}}}}};
        if (!client->Create(kSandboxes, "default", sandbox).ok()) ++failed;
      }
    });
  }
  for (auto& c : creators) c.join();
  const absl::Duration created_in = absl::Now() - start;
  const absl::Time deadline = start + absl::Seconds(flags.timeout_s);
  while (ready.load() < flags.count - failed.load() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Duration all_ready = absl::Now() - start;
  double cpu_after, peak_after;
  ProcessUsage(server, &cpu_after, &peak_after);
  absl::StatusOr<Json> stats = emu.AdminCall("GET", "/emulator/stats");
  informer.Stop();
  kill(server, SIGTERM);
  waitpid(server, nullptr, 0);
  std::filesystem::remove_all(dir);

  int64_t writes = stats.ok() ? stats->value("writes", int64_t{0}) : -1;
  const Json requests = stats.ok() ? (*stats)["requests"] : Json::object();
  const int64_t by_driver = requests.value("create sandboxes", int64_t{0});
  std::printf("k8s_sandbox_bench: %d Sandboxes, %d ms injected latency, %d controller workers\n",
              flags.count, flags.latency_ms, flags.workers);
  std::printf("  created by the driver in %.2f s (%d failed)\n", absl::ToDoubleSeconds(created_in),
              failed.load());
  std::printf("  all Ready after %.2f s (%d of %d Ready) -> %.0f Sandboxes/s\n",
              absl::ToDoubleSeconds(all_ready), ready.load(), flags.count,
              ready.load() / absl::ToDoubleSeconds(all_ready));
  std::printf("  controller API writes: %lld (%.2f per Sandbox):",
              static_cast<long long>(writes - by_driver),
              static_cast<double>(writes - by_driver) / flags.count);
  for (const char* key : {"create pods", "patch sandboxes/status", "update sandboxes/status",
                          "create services", "create persistentvolumeclaims"}) {
    std::printf(" %s=%lld", key, static_cast<long long>(requests.value(key, int64_t{0})));
  }
  std::printf("\n  (the emulator's fake kubelet adds its own pod writes, not counted here)\n");
  std::printf(
      "  controller (sbx-server) CPU: %.2f s during the run; peak RSS %.1f MiB (%.1f MiB "
      "before the Sandboxes)\n",
      cpu_after - cpu_before, peak_after, peak_before);
  return ready.load() == flags.count ? 0 : 1;
}

}  // namespace
}  // namespace sbx::k8s

int main(int argc, char** argv) {
  sbx::k8s::Flags flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const std::string value = argv[i + 1];
    bool ok = true;
    if (key == "--emulator") {
      flags.emulator = value;
    } else if (key == "--server") {
      flags.server = value;
    } else if (key == "--crds") {
      flags.crds = value;
    } else if (key == "--count") {
      ok = absl::SimpleAtoi(value, &flags.count) && flags.count > 0;
    } else if (key == "--latency_ms") {
      ok = absl::SimpleAtoi(value, &flags.latency_ms) && flags.latency_ms >= 0;
    } else if (key == "--workers") {
      ok = absl::SimpleAtoi(value, &flags.workers) && flags.workers > 0;
    } else if (key == "--create_concurrency") {
      ok = absl::SimpleAtoi(value, &flags.create_concurrency) && flags.create_concurrency > 0;
    } else if (key == "--timeout_s") {
      ok = absl::SimpleAtoi(value, &flags.timeout_s) && flags.timeout_s > 0;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad flag %s %s\n", key.c_str(), value.c_str());
      return 2;
    }
  }
  if (flags.emulator.empty() || flags.server.empty() || flags.crds.empty()) {
    std::fprintf(stderr,
                 "usage: %s --emulator PATH --server PATH/sbx-server --crds charts/sbx/crds "
                 "[--count 1000] [--latency_ms 5] [--workers 32] [--create_concurrency 32]\n",
                 argv[0]);
    return 2;
  }
  return sbx::k8s::Run(flags);
}

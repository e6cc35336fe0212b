// The Kubernetes client against the API emulator (tests/kube_emulator): creates/s and
// watch events/s, with 0 and 5 ms of injected latency per request. The baseline is a GET of
// one small object through the same client in the same run.
//
//   k8s_client_bench --emulator build/clang/tests/kube_emulator/kube-emulator [--transport cpprest]
//
// --transport picks the client's HTTP transport (ClientOptions::transport, default socket).
// The client runs with its rate limiter off (qps 0) so that the numbers are the client's
// and the emulator's, not the limiter's.

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "src/k8s/client.h"
#include "src/k8s/leader_election.h"
#include "tests/k8s/emulator_process.h"

namespace sbx::k8s {
namespace {

std::string g_emulator_path;
emulator::EmulatorProcess* g_emulator = nullptr;
std::unique_ptr<Client> g_client;
std::atomic<int64_t> g_serial{0};

void SetLatency(benchmark::State& state, int64_t ms) {
  absl::StatusOr<Json> answer =
      g_emulator->AdminCall("POST", "/emulator/faults", Json{{"latency_ms", ms}});
  if (!answer.ok()) state.SkipWithError(answer.status().ToString().c_str());
}

Json Lease(const std::string& name) {
  return {{"metadata", {{"name", name}, {"namespace", "bench"}}},
          {"spec", {{"holderIdentity", "bench"}, {"leaseDurationSeconds", 15}}}};
}

// Baseline: read one small object.
void BM_K8s_Get(benchmark::State& state) {
  if (state.thread_index() == 0) SetLatency(state, state.range(0));
  for (auto _ : state) {
    absl::StatusOr<Json> got = g_client->Get(kNamespaces, "", "bench");
    if (!got.ok()) state.SkipWithError(got.status().ToString().c_str());
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_K8s_Create(benchmark::State& state) {
  if (state.thread_index() == 0) SetLatency(state, state.range(0));
  for (auto _ : state) {
    const std::string name = absl::StrCat("c-", g_serial.fetch_add(1));
    absl::StatusOr<Json> created = g_client->Create(kLeases, "bench", Lease(name));
    if (!created.ok()) state.SkipWithError(created.status().ToString().c_str());
  }
  state.SetItemsProcessed(state.iterations());
}

// Issue 32's fence: a write (a Secret create, which a leader's client fences) through a
// client without a fence (arg 0, the baseline) and with a leading elector's fence (arg 1),
// alternating in one run; and the fence's check alone.
LeaderElector* g_elector = nullptr;
std::unique_ptr<Client> g_fenced;

Json Secret(const std::string& name) {
  return {{"metadata", {{"name", name}, {"namespace", "bench"}}}, {"type", "Opaque"}};
}

void BM_K8s_CreateFenced(benchmark::State& state) {
  if (state.thread_index() == 0) SetLatency(state, 0);
  Client* client = state.range(0) == 0 ? g_client.get() : g_fenced.get();
  for (auto _ : state) {
    const std::string name = absl::StrCat("s-", g_serial.fetch_add(1));
    absl::Status created = client->CreateNoResult(kSecrets, "bench", Secret(name));
    if (!created.ok()) state.SkipWithError(created.ToString().c_str());
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Fence_WriteWindow(benchmark::State& state) {
  for (auto _ : state) {
    absl::StatusOr<absl::Duration> window = g_elector->WriteWindow();
    if (!window.ok()) state.SkipWithError(window.status().ToString().c_str());
    benchmark::DoNotOptimize(window);
  }
  state.SetItemsProcessed(state.iterations());
}

// Replays `kEvents` changes from the watch history: each iteration opens a watch at the
// version before they were made and reads all of them.
void BM_K8s_WatchEvents(benchmark::State& state) {
  constexpr int kEvents = 5000;
  SetLatency(state, 0);
  static std::string from_version;
  if (from_version.empty()) {
    std::string version;
    auto listed = g_client->ListAll(kNamespaces, "", {}, &version);
    if (!listed.ok()) {
      state.SkipWithError(listed.status().ToString().c_str());
      return;
    }
    from_version = version;
    std::vector<std::thread> writers;
    std::atomic<int> next{0};
    for (int t = 0; t < 16; ++t) {
      writers.emplace_back([&] {
        for (int i = next.fetch_add(1); i < kEvents; i = next.fetch_add(1)) {
          Json lease = Lease(absl::StrCat("w-", i));
          lease["metadata"]["namespace"] = "watched";
          (void)g_client->Create(kLeases, "watched", lease);
        }
      });
    }
    for (auto& w : writers) w.join();
  }
  SetLatency(state, state.range(0));
  for (auto _ : state) {
    WatchOptions options;
    options.resource_version = from_version;
    options.allow_bookmarks = false;
    absl::StatusOr<std::unique_ptr<Watch>> watch =
        g_client->StartWatch(kLeases, "watched", options);
    if (!watch.ok()) {
      state.SkipWithError(watch.status().ToString().c_str());
      return;
    }
    int seen = 0;
    while (seen < kEvents) {
      WatchEvent event;
      absl::StatusOr<bool> more = (*watch)->Next(&event);
      if (!more.ok() || !*more) {
        state.SkipWithError(more.ok() ? "watch ended early" : more.status().ToString().c_str());
        return;
      }
      if (event.type != WatchEvent::Type::kBookmark) ++seen;
    }
    (*watch)->Cancel();
  }
  state.SetItemsProcessed(state.iterations() * kEvents);
}

BENCHMARK(BM_K8s_Get)
    ->ArgName("latency_ms")
    ->Arg(0)
    ->Arg(5)
    ->Threads(1)
    ->Threads(16)
    ->UseRealTime();
BENCHMARK(BM_K8s_Create)
    ->ArgName("latency_ms")
    ->Arg(0)
    ->Arg(5)
    ->Threads(1)
    ->Threads(16)
    ->Threads(64)
    ->UseRealTime();
BENCHMARK(BM_K8s_WatchEvents)->ArgName("latency_ms")->Arg(0)->Arg(5)->UseRealTime();
BENCHMARK(BM_K8s_CreateFenced)
    ->ArgName("fenced")
    ->Arg(0)
    ->Arg(1)
    ->Arg(0)
    ->Arg(1)
    ->Threads(1)
    ->Threads(16)
    ->UseRealTime();
BENCHMARK(BM_Fence_WriteWindow)->Threads(1)->Threads(2);

}  // namespace
}  // namespace sbx::k8s

int main(int argc, char** argv) {
  std::vector<char*> rest;
  sbx::k8s::ClientOptions options;
  options.qps = 0;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--emulator") == 0 && i + 1 < argc) {
      sbx::k8s::g_emulator_path = argv[++i];
    } else if (std::strcmp(argv[i], "--transport") == 0 && i + 1 < argc) {
      options.transport = argv[++i];
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (sbx::k8s::g_emulator_path.empty()) {
    std::fprintf(stderr,
                 "usage: %s --emulator PATH/kube-emulator [--transport socket|cpprest] "
                 "[benchmark flags]\n",
                 argv[0]);
    return 2;
  }
  sbx::k8s::emulator::EmulatorProcess emulator(sbx::k8s::g_emulator_path,
                                               {"--watch_history", "1000000"});
  if (!emulator.ok()) {
    std::fprintf(stderr, "%s\n", emulator.error().c_str());
    return 1;
  }
  sbx::k8s::g_emulator = &emulator;
  auto client = sbx::k8s::Client::Create(emulator.Cluster(), options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 1;
  }
  sbx::k8s::g_client = *std::move(client);
  for (const char* ns : {"bench", "watched"}) {
    auto made = sbx::k8s::g_client->Create(sbx::k8s::kNamespaces, "",
                                           sbx::k8s::Json{{"metadata", {{"name", ns}}}});
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
      return 1;
    }
  }
  // A leader for the fenced client (it leads for the whole run: renewals every second).
  auto fenced = sbx::k8s::Client::Create(emulator.Cluster(), options);
  if (!fenced.ok()) {
    std::fprintf(stderr, "%s\n", fenced.status().ToString().c_str());
    return 1;
  }
  sbx::k8s::g_fenced = *std::move(fenced);
  sbx::k8s::LeaderElectionOptions election;
  election.identity = "bench";
  election.lease_namespace = "bench";
  election.lease_name = "bench-leader";
  election.renew_deadline = absl::Seconds(3);
  election.retry_period = absl::Seconds(1);
  sbx::k8s::LeaderElector elector(sbx::k8s::g_client.get(), election, nullptr, nullptr);
  elector.Start();
  for (int i = 0; i < 500 && !elector.IsLeader(); ++i) absl::SleepFor(absl::Milliseconds(10));
  if (!elector.IsLeader()) {
    std::fprintf(stderr, "the bench's elector did not lead\n");
    return 1;
  }
  sbx::k8s::g_elector = &elector;
  sbx::k8s::g_fenced->SetWriteFence(&elector);
  int bench_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&bench_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  elector.Stop();
  sbx::k8s::g_fenced.reset();
  sbx::k8s::g_client.reset();
  return 0;
}

// Local runtime benchmarks, against the real bubblewrap and sbx-sandboxd:
//   BM_Local_ColdCreate: Runtime::Create until the daemon accepts connections, then Delete.
//   BM_Local_ExecTrue:   `true` run through a warm sandbox's daemon (connect, Exec, exit).
//   BM_Local_ExecTrue/reused_channel: the same on a channel kept open (the server's case).
// With --image=REF (a local reference, e.g. oci:DIR:TAG, its folder the import folder),
// each runs again on sandboxes of that image (copy-on-write root; the image pulled into a
// cache before timing): BM_Local_ColdCreate/image, BM_Local_ExecTrue/.../image; the
// host-root ones are .../host. --exec=PATH is what ExecTrue runs (default /bin/true; give a
// path that both roots have, e.g. /usr/bin/true with an image holding the host's).
// Each prints the median and 90th percentile of its iterations as counters p50_ms, p90_ms
// (the targets are medians; Google Benchmark's own time column is the mean).
// --gap_ms=N leaves the machine idle N ms after each delete of ColdCreate (outside the
// timing): back-to-back creates share kernel work that a create on a quiet server (one
// refill at a time) pays alone.
// Usage: runtime_bench --sandboxd=/path/to/sbx-sandboxd [--image=REF] [--exec=PATH]
//        [--gap_ms=N] [benchmark flags]

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "benchmark/benchmark.h"
#include "grpcpp/grpcpp.h"
#include "sbx/sandboxd/v1/sandboxd.grpc.pb.h"
#include "src/common/sandbox_secret.h"
#include "src/images/image_cache.h"
#include "src/runtime/bubblewrap_runtime.h"

namespace {

namespace pb = ::sbx::sandboxd::v1;
using sbx::runtime::BubblewrapRuntime;

std::string g_sandboxd;
std::string g_image;  // --image: a reference; empty: no image variants
std::string g_exec = "/bin/true";
int g_gap_ms = 0;  // --gap_ms: idle time after each delete, outside the timing
std::unique_ptr<sbx::images::ImageCache> g_cache;

// Per-iteration wall times, reported as percentile counters.
class Samples {
 public:
  void Start() { start_ = std::chrono::steady_clock::now(); }
  void Stop() {
    ms_.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
            .count());
  }
  void Report(benchmark::State& state) {
    if (ms_.empty()) return;
    std::sort(ms_.begin(), ms_.end());
    auto at = [&](double q) { return ms_[static_cast<size_t>(q * (ms_.size() - 1) + 0.5)]; };
    state.counters["p50_ms"] = at(0.5);
    state.counters["p90_ms"] = at(0.9);
  }

 private:
  std::chrono::steady_clock::time_point start_;
  std::vector<double> ms_;
};

// The daemons' secrets (what sbx-server derives from its key; any string of 16+ bytes).
std::string SecretOf(const std::string& id) { return "bench-secret-" + id; }

std::unique_ptr<BubblewrapRuntime> MakeRuntime() {
  sbx::runtime::BubblewrapRuntimeOptions o;
  o.root_dir = "/tmp/sbx-bench-rt-" + std::to_string(getpid());
  o.sandboxd_path = g_sandboxd;
  o.images = g_cache.get();
  o.secret_for = SecretOf;
  o.delete_on_exit = true;
  auto rt = BubblewrapRuntime::Make(o);
  if (!rt.ok()) std::fprintf(stderr, "runtime: %s\n", rt.status().ToString().c_str());
  return rt.ok() ? std::move(*rt) : nullptr;
}

absl::StatusOr<sbx::runtime::SandboxInfo> CreateSync(BubblewrapRuntime& rt, bool image) {
  absl::Notification done;
  absl::StatusOr<sbx::runtime::SandboxInfo> out = absl::InternalError("no answer");
  sbx::runtime::CreateRequest req;
  req.pool = "bench";
  if (image) {
    sbx::runtime::LocalSpec spec;
    spec.image = g_image;
    req.template_spec = sbx::runtime::EncodeLocalSpec(spec);
  }
  rt.Create(req, [&](absl::StatusOr<sbx::runtime::SandboxInfo> info) {
    out = std::move(info);
    done.Notify();
  });
  done.WaitForNotification();
  return out;
}

void DeleteSync(BubblewrapRuntime& rt, const std::string& id) {
  absl::Notification done;
  rt.Delete(id, [&](absl::Status) { done.Notify(); });
  done.WaitForNotification();
}

bool ExecTrue(pb::Sandboxd::Stub& stub, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.AddMetadata(sbx::kSandboxSecretMetadata, SecretOf(id));
  auto stream = stub.Exec(&ctx);
  pb::ExecRequest start;
  start.mutable_start()->add_argv(g_exec);
  if (!stream->Write(start)) return false;
  stream->WritesDone();
  pb::ExecResponse r;
  bool exited = false;
  while (stream->Read(&r)) exited = exited || r.has_exit();
  return stream->Finish().ok() && exited;
}

void BM_Local_ColdCreate(benchmark::State& state, bool image) {
  if (image && g_cache == nullptr) return state.SkipWithError("no --image");
  auto rt = MakeRuntime();
  if (rt == nullptr) return state.SkipWithError("runtime did not start");
  Samples samples;
  for (auto _ : state) {
    samples.Start();
    auto info = CreateSync(*rt, image);
    samples.Stop();
    if (!info.ok()) return state.SkipWithError(std::string(info.status().message()).c_str());
    state.PauseTiming();
    DeleteSync(*rt, info->id);
    if (g_gap_ms > 0) usleep(static_cast<useconds_t>(g_gap_ms) * 1000);
    state.ResumeTiming();
  }
  state.counters["isolated"] = rt->isolated() ? 1 : 0;
  samples.Report(state);
}

void BM_Local_ExecTrue(benchmark::State& state, bool reuse_channel, bool image) {
  if (image && g_cache == nullptr) return state.SkipWithError("no --image");
  auto rt = MakeRuntime();
  if (rt == nullptr) return state.SkipWithError("runtime did not start");
  auto info = CreateSync(*rt, image);
  if (!info.ok()) return state.SkipWithError(std::string(info.status().message()).c_str());
  auto channel = grpc::CreateChannel(info->endpoint, grpc::InsecureChannelCredentials());
  auto stub = pb::Sandboxd::NewStub(channel);
  Samples samples;
  for (auto _ : state) {
    samples.Start();
    if (reuse_channel) {
      if (!ExecTrue(*stub, info->id)) return state.SkipWithError("exec failed");
    } else {
      grpc::ChannelArguments args;
      args.SetInt("grpc.use_local_subchannel_pool", 1);  // a fresh connection every time
      auto fresh = pb::Sandboxd::NewStub(
          grpc::CreateCustomChannel(info->endpoint, grpc::InsecureChannelCredentials(), args));
      if (!ExecTrue(*fresh, info->id)) return state.SkipWithError("exec failed");
    }
    samples.Stop();
  }
  samples.Report(state);
  DeleteSync(*rt, info->id);
}

// Host root and image alternate, so that both see the same machine.
BENCHMARK_CAPTURE(BM_Local_ColdCreate, host, false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(40)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Local_ColdCreate, image, true)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(40)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Local_ExecTrue, new_channel_host, false, false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(200)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Local_ExecTrue, new_channel_image, false, true)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(200)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Local_ExecTrue, reused_channel_host, true, false)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(200)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Local_ExecTrue, reused_channel_image, true, true)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(200)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--sandboxd=", 0) == 0) g_sandboxd = arg.substr(11);
    if (arg.rfind("--image=", 0) == 0) g_image = arg.substr(8);
    if (arg.rfind("--exec=", 0) == 0) g_exec = arg.substr(7);
    if (arg.rfind("--gap_ms=", 0) == 0) g_gap_ms = std::atoi(arg.c_str() + 9);
  }
  const std::string cache_dir = "/tmp/sbx-bench-images-" + std::to_string(getpid());
  if (!g_image.empty()) {
    // The image's folder is the import folder; the image is in the cache before timing.
    std::string path = g_image.substr(g_image.find(':') + 1);
    path = path.substr(0, path.find(':'));
    sbx::images::ImageCacheOptions o;
    o.dir = cache_dir;
    o.budget_bytes = int64_t{4} << 30;
    o.import_dirs = {std::filesystem::canonical(std::filesystem::path(path).parent_path())};
    auto cache = sbx::images::ImageCache::Open(o);
    auto pulled = cache.ok() ? (*cache)->Pull(g_image) : cache.status();
    if (!pulled.ok()) {
      std::fprintf(stderr, "image %s: %s\n", g_image.c_str(), pulled.status().ToString().c_str());
      return 1;
    }
    g_cache = std::move(*cache);
  }
  if (g_sandboxd.empty()) {
    std::error_code ec;
    g_sandboxd = (std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().parent_path() /
                  "src/cmd/sbx-sandboxd")
                     .string();
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  std::filesystem::remove_all("/tmp/sbx-bench-rt-" + std::to_string(getpid()), ec);
  g_cache.reset();
  std::filesystem::remove_all(cache_dir, ec);
  return 0;
}

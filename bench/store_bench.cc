// Store benchmarks.
//
//   BM_Store_GroupCommit_{Sync,Buffered}/threads:N  N writers, each committing one small
//       claim record and waiting for its callback, through RocksDbStore's group commit.
//       items_per_second = acknowledged claims/s; commit_latency_us = mean time from
//       Commit() to the callback; claims_per_write = mean group size.
//   BM_Store_RawRocksDbSyncedPut/threads:N  the baseline: one synced RocksDB Put per claim,
//       no store. With one thread this is one fsync per claim; with more, RocksDB's own
//       write thread merges concurrent writers, which is the comparison for our committer.
//   BM_Store_Recovery  Open + LoadAll of a store holding 1,000,000 claim records (written
//       untimed, buffered, in setup): the restart path. Reports seconds and records/s; the
//       first iteration is a cold restart (the files evicted from the page cache,
//       cold_restart_s), the others find them cached (warm_restart_s).
//
// Databases live in a fresh directory under $SBX_BENCH_DIR (default: the system temp
// directory); put it on the disk you want measured (tmpfs makes fsync free).

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/page_cache.h"
#include "benchmark/benchmark.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "src/store/record_codec.h"
#include "src/store/rocksdb_store.h"
#include "src/store/store.h"

namespace sbx::store {
namespace {

namespace fs = std::filesystem;

std::string MakeTempDir(const char* name) {
  const char* base = getenv("SBX_BENCH_DIR");
  std::string tmpl =
      absl::StrCat(base != nullptr ? std::string(base) : fs::temp_directory_path().string(),
                   "/sbx_", name, "_XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    perror("mkdtemp");
    abort();
  }
  return tmpl;
}

// A claim as the claim path writes it: 32-hex ids, owner, pool, endpoint, times.
ClaimRecord BenchClaim(uint64_t n) {
  ClaimRecord c;
  c.id = absl::StrCat(absl::Hex(0x5b8f3a1c00000000ULL + n, absl::kZeroPad16),
                      absl::Hex(n * 0x9e3779b97f4a7c15ULL, absl::kZeroPad16));
  c.owner = "tenant-rl-trainer";
  c.pool = "python-3-12";
  c.sandbox_id = absl::StrCat(absl::Hex(n * 0xc2b2ae3d27d4eb4fULL, absl::kZeroPad16),
                              absl::Hex(0x27d4eb2f165667c5ULL + n, absl::kZeroPad16));
  c.endpoint = absl::StrCat("unix:///run/sbx/", c.sandbox_id, ".sock");
  c.created = absl::FromUnixSeconds(1'700'000'000 + static_cast<int64_t>(n));
  c.expires = c.created + absl::Minutes(30);
  return c;
}

// --- Group commit ---

// One store per benchmark run, shared by its threads (Setup/Teardown run once per run).
std::unique_ptr<Store> g_store;
std::string g_dir;
std::atomic<uint64_t> g_next_id{0};  // relaxed: only uniqueness of the claim ids matters

void OpenStore(Durability durability) {
  g_dir = MakeTempDir("store_bench");
  RocksDbStoreOptions options;
  options.path = g_dir + "/db";
  options.durability = durability;
  absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(options);
  if (!store.ok()) {
    fprintf(stderr, "%s\n", store.status().ToString().c_str());
    abort();
  }
  g_store = *std::move(store);
}

void SetupSync(const benchmark::State&) { OpenStore(Durability::kSync); }
void SetupBuffered(const benchmark::State&) { OpenStore(Durability::kBuffered); }

void TeardownStore(const benchmark::State&) {
  g_store.reset();
  std::error_code ec;
  fs::remove_all(g_dir, ec);
}

// Waits for one callback.
class Waiter {
 public:
  void Done() {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  void Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    done_ = false;
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

void BM_Store_GroupCommit(benchmark::State& state) {
  Waiter waiter;
  double latency_us_sum = 0;
  for (auto _ : state) {
    WriteBatch batch;
    batch.Put(BenchClaim(g_next_id.fetch_add(1, std::memory_order_relaxed)));
    const auto start = std::chrono::steady_clock::now();
    g_store->Commit(std::move(batch), [&](absl::Status s) {
      if (!s.ok()) {
        fprintf(stderr, "commit failed: %s\n", s.ToString().c_str());
        abort();
      }
      waiter.Done();
    });
    waiter.Wait();
    latency_us_sum +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["commit_latency_us"] = benchmark::Counter(
      latency_us_sum / static_cast<double>(state.iterations()), benchmark::Counter::kAvgThreads);
  if (state.thread_index() == 0) {
    // Every thread has left the loop (and so seen its last callback) by now.
    const StoreStats stats = g_store->Stats();
    state.counters["claims_per_write"] =
        static_cast<double>(stats.commits) / static_cast<double>(stats.write_batches);
  }
}
BENCHMARK(BM_Store_GroupCommit)
    ->Name("BM_Store_GroupCommit_Sync")
    ->Setup(SetupSync)
    ->Teardown(TeardownStore)
    ->Threads(1)
    ->Threads(16)
    ->Threads(64)
    ->UseRealTime()
    ->MinTime(1.0);
BENCHMARK(BM_Store_GroupCommit)
    ->Name("BM_Store_GroupCommit_Buffered")
    ->Setup(SetupBuffered)
    ->Teardown(TeardownStore)
    ->Threads(1)
    ->Threads(16)
    ->Threads(64)
    ->UseRealTime()
    ->MinTime(1.0);

// --- Baseline: one synced RocksDB write per claim ---

std::unique_ptr<rocksdb::DB> g_raw_db;

void SetupRaw(const benchmark::State&) {
  g_dir = MakeTempDir("store_bench_raw");
  rocksdb::Options options;
  options.create_if_missing = true;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, g_dir + "/db", &raw);
  if (!s.ok()) {
    fprintf(stderr, "%s\n", s.ToString().c_str());
    abort();
  }
  g_raw_db.reset(raw);
}

void TeardownRaw(const benchmark::State&) {
  g_raw_db->Close().PermitUncheckedError();
  g_raw_db.reset();
  std::error_code ec;
  fs::remove_all(g_dir, ec);
}

void BM_Store_RawRocksDbSyncedPut(benchmark::State& state) {
  rocksdb::WriteOptions sync;
  sync.sync = true;
  double latency_us_sum = 0;
  for (auto _ : state) {
    WriteBatch batch;  // encoded the same way the store encodes it
    batch.Put(BenchClaim(g_next_id.fetch_add(1, std::memory_order_relaxed)));
    const Mutation& m = batch.mutations()[0];
    std::string value;
    codec::EncodeValue(m, &value);
    const auto start = std::chrono::steady_clock::now();
    rocksdb::Status s = g_raw_db->Put(sync, codec::EncodeKey(m.kind, m.key), value);
    if (!s.ok()) abort();
    latency_us_sum +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["commit_latency_us"] = benchmark::Counter(
      latency_us_sum / static_cast<double>(state.iterations()), benchmark::Counter::kAvgThreads);
}
BENCHMARK(BM_Store_RawRocksDbSyncedPut)
    ->Setup(SetupRaw)
    ->Teardown(TeardownRaw)
    ->Threads(1)
    ->Threads(16)
    ->Threads(64)
    ->UseRealTime()
    ->MinTime(1.0);

// --- Recovery ---

constexpr int kRecoveryRecords = 1'000'000;
std::string g_recovery_dir;

void SetupRecovery(const benchmark::State&) {
  g_recovery_dir = MakeTempDir("store_bench_recovery");
  RocksDbStoreOptions options;
  options.path = g_recovery_dir + "/db";
  options.durability = Durability::kBuffered;
  absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(options);
  if (!store.ok()) abort();
  constexpr int kPerBatch = 1000;
  for (int i = 0; i < kRecoveryRecords; i += kPerBatch) {
    WriteBatch batch;
    for (int j = i; j < i + kPerBatch; ++j) batch.Put(BenchClaim(j));
    if (!(*store)->CommitAndWait(std::move(batch)).ok()) abort();
  }
  if (!(*store)->Close().ok()) abort();
}

void TeardownRecovery(const benchmark::State&) {
  std::error_code ec;
  fs::remove_all(g_recovery_dir, ec);
}

void BM_Store_Recovery(benchmark::State& state) {
  RocksDbStoreOptions options;
  options.path = g_recovery_dir + "/db";
  double open_s = 0;
  double load_s = 0;
  double cold_open_s = 0;
  double cold_load_s = 0;
  int iteration = 0;
  for (auto _ : state) {
    // The first iteration is the cold restart: the database's files are not in the page
    // cache. Later ones find them there (a process restart on the same machine).
    const bool cold = iteration == 0;
    if (cold) {
      state.PauseTiming();
      if (sbx::bench::EvictFromPageCache(options.path) < 0) {
        state.SkipWithError("could not evict the database from the page cache");
        break;
      }
      state.ResumeTiming();
    }
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<std::unique_ptr<Store>> store = OpenRocksDbStore(options);
    if (!store.ok()) abort();
    const auto opened = std::chrono::steady_clock::now();
    absl::StatusOr<Contents> contents = (*store)->LoadAll();
    const auto loaded = std::chrono::steady_clock::now();
    if (!contents.ok() || contents->claims.size() != static_cast<size_t>(kRecoveryRecords)) {
      fprintf(stderr, "recovery read %zu claims: %s\n", contents.ok() ? contents->claims.size() : 0,
              contents.status().ToString().c_str());
      abort();
    }
    open_s += std::chrono::duration<double>(opened - start).count();
    load_s += std::chrono::duration<double>(loaded - opened).count();
    if (cold) {
      cold_open_s = std::chrono::duration<double>(opened - start).count();
      cold_load_s = std::chrono::duration<double>(loaded - opened).count();
    }
    // The first load in the process is the honest restart: later ones reuse memory the
    // previous one freed, and page faults are a large part of the cost.
    printf("BM_Store_Recovery: iteration %d (%s): open %.3f s + LoadAll %.3f s\n", iteration,
           cold ? "cold: files evicted from the page cache" : "warm page cache",
           std::chrono::duration<double>(opened - start).count(),
           std::chrono::duration<double>(loaded - opened).count());
    ++iteration;
    state.PauseTiming();  // freeing a million records and closing is not part of a restart
    contents->claims.clear();
    store->reset();
    state.ResumeTiming();
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["open_s"] = open_s / n;
  state.counters["load_s"] = load_s / n;
  state.counters["restart_s"] = (open_s + load_s) / n;
  state.counters["records_per_s"] = kRecoveryRecords * n / (open_s + load_s);
  state.counters["cold_restart_s"] = cold_open_s + cold_load_s;
  if (n > 1)
    state.counters["warm_restart_s"] = (open_s + load_s - cold_open_s - cold_load_s) / (n - 1);
  printf(
      "BM_Store_Recovery: cold (first, page cache evicted) open %.3f s + LoadAll %.3f s = %.3f s\n",
      cold_open_s, cold_load_s, cold_open_s + cold_load_s);
  printf("BM_Store_Recovery: %d records, open %.3f s + LoadAll %.3f s = %.3f s, %.0f records/s\n",
         kRecoveryRecords, open_s / n, load_s / n, (open_s + load_s) / n,
         kRecoveryRecords * n / (open_s + load_s));
}
BENCHMARK(BM_Store_Recovery)
    ->Setup(SetupRecovery)
    ->Teardown(TeardownRecovery)
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace sbx::store

BENCHMARK_MAIN();

// The child of crash_loop_test: opens the store at argv[1] (fsync on), recovers the
// allocator, and claims and releases from several threads until it is killed. It writes
// one line per acknowledged operation to stdout with a single write(2) each, after the
// operation's callback reported it durable:
//   READY <active claims recovered> <ended claims recovered> <revision recovered>
//   A <owner>/<claim id> <sandbox id> <revision>   a claim was acknowledged
//   R <owner>/<claim id> <revision>                its release was acknowledged

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "src/allocator/allocator.h"
#include "src/store/rocksdb_store.h"
#include "tests/allocator/fakes.h"

namespace {

void Say(const std::string& line) {
  const std::string out = line + "\n";
  // One write per line: a pipe write this small is atomic, so the parent never sees a
  // torn line, and what it reads was acknowledged before the kill.
  if (write(STDOUT_FILENO, out.data(), out.size()) != static_cast<ssize_t>(out.size())) _exit(3);
}

int Die(const std::string& what) {
  std::fprintf(stderr, "crash_child: %s\n", what.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sbx;
  if (argc != 3) return Die("usage: crash_child DB_PATH RUN_ID");
  store::RocksDbStoreOptions so;
  so.path = argv[1];
  so.durability = store::Durability::kSync;
  auto store = store::OpenRocksDbStore(so);
  if (!store.ok()) return Die(store.status().ToString());

  allocator::testing::RefillingReconciler reconciler(absl::StrCat("r", argv[2], "-"));
  allocator::AllocatorOptions options;
  auto a = allocator::Allocator::Create(options, store->get(), nullptr, &reconciler, &Clock::Real(),
                                        &IdGenerator::Random());
  if (!a.ok()) return Die(a.status().ToString());
  allocator::Allocator& alloc = **a;

  if (!alloc.GetPool("py").ok()) {
    absl::Notification t_done, p_done;
    alloc.PutTemplate(store::TemplateRecord{"py", "local", "", 0},
                      [&](absl::Status) { t_done.Notify(); });
    t_done.WaitForNotification();
    store::PoolRecord p;
    p.name = "py";
    p.template_name = "py";
    p.min_warm = 16;
    p.max_warm = 64;
    p.empty_pool_policy = store::EmptyPoolPolicy::kWait;
    alloc.PutPool(p, [&](absl::Status) { p_done.Notify(); });
    p_done.WaitForNotification();
  }
  reconciler.Start(&alloc);
  Say(absl::StrCat("READY ", alloc.recovery().active_claims, " ", alloc.recovery().ended_claims,
                   " ", alloc.revision()));

  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      absl::BitGen gen;
      const std::string owner = absl::StrCat("o", t % 3);
      while (true) {
        absl::Mutex mu;
        bool done = false;
        std::string sandbox;
        allocator::ClaimRequest req;
        req.owner = owner;
        req.pool = "py";
        req.claim_id = IdGenerator::Random().Next();
        alloc.Claim(req, [&](absl::StatusOr<allocator::ClaimResult> r) {
          if (r.ok()) {
            sandbox = r->claim.sandbox_id;
            Say(absl::StrCat("A ", owner, "/", req.claim_id, " ", sandbox, " ", r->claim.revision));
          }
          absl::MutexLock lock(&mu);
          done = true;
        });
        {
          absl::MutexLock lock(&mu);
          mu.Await(absl::Condition(&done));
          done = false;
        }
        // Keep about half of the claims active, so that restarts have claims to recover.
        if (sandbox.empty() || absl::Bernoulli(gen, 0.5)) continue;
        alloc.Release(owner, req.claim_id, [&](absl::StatusOr<store::ClaimRecord> ended) {
          // The release is durable; its revision is in the ended record.
          if (ended.ok()) {
            Say(absl::StrCat("R ", owner, "/", req.claim_id, " ", ended->revision));
          }
          absl::MutexLock lock(&mu);
          done = true;
        });
        absl::MutexLock lock(&mu);
        mu.Await(absl::Condition(&done));
      }
    });
  }
  for (auto& th : threads) th.join();
  return 0;
}

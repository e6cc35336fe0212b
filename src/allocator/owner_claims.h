#pragma once
// OwnerClaims: how many claims each owner (tenant) holds, for its maximum (max_claims).
//
// A claim holds a slot of its owner from the moment it is accepted as new (a retry of an
// existing claim takes none) until it fails or its end is durable: while it waits for a
// sandbox, while it is being granted, and while it is active. A batch takes one slot per
// claim, all at once or none. Taking checks the maximum and counts in one compare-and-swap
// on the owner's counter, so concurrent claims can never together pass the maximum.
//
// Slots are handed out as a move-only Slots object that gives them back when it is reset
// or destroyed, so that every path that drops a claim (or a batch) drops its slots.
//
// Thread-safety: every method may be called from any thread; a Slots object is not shared.
// Lifetime: a Slots object may outlive the OwnerClaims that gave it (it shares its
// owner's counter).

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "src/allocator/claim_table.h"

namespace sbx::allocator {

// One owner's numbers (Allocator::OwnerClaimCounts).
struct OwnerClaimCount {
  std::string owner;
  // Claims held now (waiting, being granted or active).
  int64_t held = 0;
  // Claim and ClaimBatch requests refused for max_claims since the start.
  uint64_t refused = 0;
  bool operator==(const OwnerClaimCount&) const = default;
};

class OwnerClaims {
 private:
  struct Counter {
    explicit Counter(absl::string_view owner_in) : owner(owner_in) {}
    const std::string owner;
    // The slots held. Atomic so that a claim takes and gives back slots without a lock;
    // relaxed, because it orders nothing else: exactness needs only that each change is
    // one read-modify-write of this one word.
    std::atomic<int64_t> held{0};
    // Refusals, for metrics; relaxed, a statistic.
    std::atomic<uint64_t> refused{0};
  };

 public:
  // Slots taken for one owner; gives them back when reset or destroyed.
  class Slots {
   public:
    Slots() = default;
    Slots(Slots&& other) noexcept
        : counter_(std::move(other.counter_)), n_(std::exchange(other.n_, 0)) {}
    Slots& operator=(Slots&& other) noexcept {
      if (this != &other) {
        Reset();
        counter_ = std::move(other.counter_);
        n_ = std::exchange(other.n_, 0);
      }
      return *this;
    }
    Slots(const Slots&) = delete;
    Slots& operator=(const Slots&) = delete;
    ~Slots() { Reset(); }

    int64_t count() const { return n_; }
    // Moves `n` (at most count()) of these slots into a new Slots object.
    Slots Split(int64_t n) {
      n = std::min(n, n_);
      n_ -= n;
      return Slots(counter_, n);
    }
    // Gives every slot back.
    void Reset() {
      if (n_ > 0) counter_->held.fetch_sub(n_, std::memory_order_relaxed);
      n_ = 0;
    }

   private:
    friend class OwnerClaims;
    Slots(std::shared_ptr<Counter> counter, int64_t n) : counter_(std::move(counter)), n_(n) {}
    std::shared_ptr<Counter> counter_;
    int64_t n_ = 0;
  };

  // Takes `n` slots of `owner` if it then holds at most `max` (0: no maximum). Otherwise
  // RESOURCE_EXHAUSTED naming the owner, what it holds and its maximum (nothing taken).
  [[nodiscard]] absl::StatusOr<Slots> Take(absl::string_view owner, int64_t n, int64_t max) {
    std::shared_ptr<Counter> c = CounterOf(owner);
    int64_t held = c->held.load(std::memory_order_relaxed);
    do {
      if (max > 0 && held + n > max) {
        c->refused.fetch_add(1, std::memory_order_relaxed);
        return absl::ResourceExhaustedError(
            absl::StrCat("tenant \"", owner, "\" holds ", held, " claim", held == 1 ? "" : "s",
                         " (waiting or active) and may hold at most ", max, " (its max_claims); ",
                         n == 1 ? "one more claim" : absl::StrCat("a batch of ", n),
                         " would pass it: release claims first, or retry after about 1s"));
      }
    } while (!c->held.compare_exchange_weak(held, held + n, std::memory_order_relaxed));
    return Slots(std::move(c), n);
  }

  // Slots `owner` holds now (0 for an owner never seen).
  int64_t Held(absl::string_view owner) const {
    std::shared_ptr<Counter> c = owners_.Find(owner);
    return c == nullptr ? 0 : c->held.load(std::memory_order_relaxed);
  }

  // Every owner seen so far, sorted by owner.
  std::vector<OwnerClaimCount> Counts() const {
    std::vector<OwnerClaimCount> out;
    owners_.ForEach([&](const std::shared_ptr<Counter>& c) {
      out.push_back(OwnerClaimCount{c->owner, c->held.load(std::memory_order_relaxed),
                                    c->refused.load(std::memory_order_relaxed)});
    });
    std::sort(out.begin(), out.end(),
              [](const OwnerClaimCount& a, const OwnerClaimCount& b) { return a.owner < b.owner; });
    return out;
  }

 private:
  std::shared_ptr<Counter> CounterOf(absl::string_view owner) {
    if (std::shared_ptr<Counter> c = owners_.Find(owner)) return c;
    return owners_.Insert(std::make_shared<Counter>(owner)).first;
  }

  // Owners are tenants (and the Kubernetes claim controller's per-namespace owners): few,
  // so they are kept for the life of the process. Sharded like the claim table, so that
  // claims of different owners rarely meet on a lock (those of one owner meet on its
  // counter anyway).
  ShardedTable<Counter, &Counter::owner> owners_{16};
};

}  // namespace sbx::allocator

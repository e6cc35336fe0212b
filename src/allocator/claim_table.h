#pragma once
// ShardedTable: the allocator's claim table (allocator_impl.h uses it for its ClaimEntry;
// owner_claims.h for its per-owner counters), here on its own so that it is tested and
// measured alone (tests/allocator/claim_table_test.cc, bench/allocator_bench.cc
// BM_ClaimTable_*).
//
// Shared objects hashed by a string field of theirs (the key lives once, in the object)
// into shards, each a hash set under its own mutex, so that operations on different keys
// rarely meet on a lock. Lookups by key are heterogeneous: no string is built to find.
//
// Thread-safety: every method may be called from any thread. ForEach is not a consistent
// snapshot (it copies one shard at a time and calls `fn` outside the shard's lock).

#include <bit>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace sbx::allocator {

// A hash set of shared objects keyed by one of their string fields, looked up by that
// string (heterogeneous lookup).
template <typename T, const std::string T::*kField>
struct ByField {
  static absl::string_view Key(absl::string_view k) { return k; }
  static absl::string_view Key(const std::shared_ptr<T>& p) { return (*p).*kField; }
  struct Hash {
    using is_transparent = void;
    template <typename K>
    size_t operator()(const K& k) const {
      return absl::HashOf(Key(k));
    }
  };
  struct Eq {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return Key(a) == Key(b);
    }
  };
  using Set = absl::flat_hash_set<std::shared_ptr<T>, Hash, Eq>;
};

template <typename T, const std::string T::*kKey>
class ShardedTable {
 public:
  using Ptr = std::shared_ptr<T>;

  // `shards` is a power of two (AllocatorOptions::claim_shards is checked so).
  explicit ShardedTable(int shards)
      : shift_(shards <= 1 ? 0 : 64 - std::countr_zero(static_cast<unsigned>(shards))) {
    shards_.reserve(shards);
    for (int i = 0; i < shards; ++i) shards_.push_back(std::make_unique<Shard>());
  }

  // Inserts `entry` unless its key exists. Returns the entry now in the table and whether
  // it is `entry`.
  std::pair<Ptr, bool> Insert(Ptr entry) {
    Shard& s = ShardFor((*entry).*kKey);
    absl::MutexLock lock(&s.mu);
    auto [it, inserted] = s.set.insert(std::move(entry));
    return {*it, inserted};
  }

  Ptr Find(absl::string_view key) const {
    const Shard& s = ShardFor(key);
    absl::MutexLock lock(&s.mu);
    auto it = s.set.find(key);
    return it == s.set.end() ? nullptr : *it;
  }

  // Erases `entry` only if it is still the one in the table under its key.
  bool Erase(const Ptr& entry) {
    const absl::string_view key = (*entry).*kKey;
    Shard& s = ShardFor(key);
    absl::MutexLock lock(&s.mu);
    auto it = s.set.find(key);
    if (it == s.set.end() || *it != entry) return false;
    s.set.erase(it);
    return true;
  }

  void Reserve(size_t n) {
    for (auto& s : shards_) {
      absl::MutexLock lock(&s->mu);
      s->set.reserve(n / shards_.size() + 1);
    }
  }

  size_t size() const {
    size_t n = 0;
    for (const auto& s : shards_) {
      absl::MutexLock lock(&s->mu);
      n += s->set.size();
    }
    return n;
  }

  // Calls fn(entry) for every entry, shard by shard.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const auto& shard : shards_) {
      std::vector<Ptr> copy;
      {
        absl::MutexLock lock(&shard->mu);
        copy.assign(shard->set.begin(), shard->set.end());
      }
      for (const Ptr& e : copy) fn(e);
    }
  }

 private:
  struct Shard {
    mutable absl::Mutex mu;
    typename ByField<T, kKey>::Set set ABSL_GUARDED_BY(mu);
  };
  // The shard comes from the hash's high bits: the sets use the low bits for their slots
  // and control bytes, and sharding on those would leave each set with few distinct ones.
  size_t Index(absl::string_view key) const {
    return shift_ == 0 ? 0 : absl::HashOf(key) >> shift_;
  }
  Shard& ShardFor(absl::string_view key) { return *shards_[Index(key)]; }
  const Shard& ShardFor(absl::string_view key) const { return *shards_[Index(key)]; }

  const int shift_;
  std::vector<std::unique_ptr<Shard>> shards_;
};

}  // namespace sbx::allocator

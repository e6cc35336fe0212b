#include "src/allocator/ready_set.h"

#include <algorithm>
#include <array>
#include <string>
#include <thread>

#include "absl/base/internal/raw_logging.h"
#include "absl/base/thread_annotations.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "concurrentqueue/concurrentqueue.h"

namespace sbx::allocator {
namespace {

class FifoReadySet final : public SelectionPolicy {
 public:
  void Push(SandboxPtr sandbox) override { queue_.enqueue(std::move(sandbox)); }
  SandboxPtr Pop() override {
    SandboxPtr out;
    if (queue_.try_dequeue(out)) return out;
    return nullptr;
  }
  size_t SizeApprox() const override { return queue_.size_approx(); }

 private:
  moodycamel::ConcurrentQueue<SandboxPtr> queue_;
};

// spread and pack: one lock-free queue per node, with per-node counts of the members
// queued and of the sandboxes claimed. A Pop looks at every node of the pool (a pool's
// warm sandboxes sit on a handful of nodes; the cost is linear in their number) and
// takes from the one its order picks. No lock on Pop: the node table only grows, by
// publishing a new entry behind an atomic size.
class NodeReadySet final : public SelectionPolicy {
 public:
  enum class Order : uint8_t { kSpread, kPack };

  explicit NodeReadySet(Order order) : order_(order) {}

  void Push(SandboxPtr sandbox) override {
    Node* node = NodeOf(*sandbox);
    sandbox->node_claims = &node->claimed;
    node->queue.enqueue(std::move(sandbox));
    // After the enqueue, so that every count a Pop reserves has a member behind it.
    // release pairs with the reservation's acquire: the reserving Pop sees the member.
    node->available.fetch_add(1, std::memory_order_release);
  }

  SandboxPtr Pop() override { return Take(nullptr); }

  SandboxPtr PopPreferring(const NodeLabels& prefer) override {
    return Take(prefer.empty() ? nullptr : &prefer);
  }

  size_t SizeApprox() const override {
    const int n = size_.load(std::memory_order_acquire);
    int64_t total = 0;
    for (int i = 0; i < n; ++i) {
      total += std::max<int64_t>(0, nodes_[i]->available.load(std::memory_order_relaxed));
    }
    return static_cast<size_t>(total);
  }

  std::atomic<int64_t>* ClaimCounter(const Sandbox& sandbox) override {
    return &NodeOf(sandbox)->claimed;
  }

  bool SwitchTo(absl::string_view name) override {
    if (name == "spread") {
      order_.store(Order::kSpread, std::memory_order_relaxed);
      return true;
    }
    if (name == "pack") {
      order_.store(Order::kPack, std::memory_order_relaxed);
      return true;
    }
    return false;
  }

 private:
  // Entries beyond this many nodes share the last one (their counts mix).
  static constexpr int kMaxNodes = 1024;

  // One bit per label (key and value), so that nodes are filtered by one AND each instead
  // of map lookups; only the node picked is then checked on its labels (a bit shared by
  // two labels can let a node through that lacks one).
  static uint64_t LabelBit(const std::string& key, const std::string& value) {
    return uint64_t{1} << (absl::HashOf(key, value) & 63);
  }
  static uint64_t LabelMask(const NodeLabels& labels) {
    uint64_t mask = 0;
    for (const auto& [key, value] : labels) mask |= LabelBit(key, value);
    return mask;
  }

  struct Node {
    Node(std::string name_in, NodeLabels labels_in)
        : name(std::move(name_in)), labels(std::move(labels_in)), label_mask(LabelMask(labels)) {}
    const std::string name;
    const NodeLabels labels;
    const uint64_t label_mask;
    moodycamel::ConcurrentQueue<SandboxPtr> queue;
    // Members in `queue` that no Pop has reserved yet. A Pop reserves one (a CAS that
    // keeps it non-negative) before it dequeues, so a reserved member is always there and
    // a Pop never spins on a count that a preempted thread has yet to lower. Atomic, as
    // Pushes and Pops race on it; see Push and Take for the orders. On a cache line of
    // its own (with `claimed`): every Pop reads it, so it must not share one with the
    // queue's indices or the fields Pick reads.
    alignas(64) std::atomic<int64_t> available{0};
    // Sandboxes of this node claimed from the pool, moved through Sandbox::node_claims by
    // the pool. Relaxed everywhere: it steers the choice and orders nothing.
    std::atomic<int64_t> claimed{0};
  };

  static bool HasLabels(const Node& node, const NodeLabels& prefer) {
    for (const auto& [key, value] : prefer) {
      auto it = node.labels.find(key);
      if (it == node.labels.end() || it->second != value) return false;
    }
    return true;
  }

  // The node with a member that the order picks among the first `n`, or null. With
  // `prefer_mask` (not 0), only nodes whose label_mask has its bits; with `prefer` (not
  // null) too, only nodes that have its labels.
  Node* Pick(int n, uint64_t prefer_mask, const NodeLabels* prefer, Order order) const {
    Node* best = nullptr;
    int64_t best_claimed = 0;
    int64_t best_available = 0;
    // spread scans from a place of each thread's own, so that concurrent claims resolve
    // exact ties on different nodes instead of all contending for one; pack keeps ties on
    // the first node, to keep claims together.
    static thread_local const uint32_t scan_salt =
        static_cast<uint32_t>(absl::Hash<std::thread::id>()(std::this_thread::get_id()));
    const int start = order == Order::kSpread && n > 0 ? static_cast<int>(scan_salt % n) : 0;
    for (int k = 0; k < n; ++k) {
      const int i = start + k < n ? start + k : start + k - n;
      Node* node = nodes_[i].get();
      // The labels first: they never change, so other nodes' hot counts stay untouched.
      if ((node->label_mask & prefer_mask) != prefer_mask) continue;
      if (prefer != nullptr && !HasLabels(*node, *prefer)) continue;
      const int64_t available = node->available.load(std::memory_order_relaxed);
      if (available <= 0) continue;
      const int64_t claimed = node->claimed.load(std::memory_order_relaxed);
      bool better;
      if (best == nullptr) {
        better = true;
      } else if (order == Order::kPack) {
        better = claimed > best_claimed;  // ties: the first node, so claims stay together
      } else {
        // Ties: the node with the most warm members, so warm members stay balanced too.
        better = claimed < best_claimed || (claimed == best_claimed && available > best_available);
      }
      if (better) {
        best = node;
        best_claimed = claimed;
        best_available = available;
      }
    }
    return best;
  }

  SandboxPtr Take(const NodeLabels* prefer) {
    const Order order = order_.load(std::memory_order_relaxed);
    const uint64_t prefer_mask = prefer != nullptr ? LabelMask(*prefer) : 0;
    while (true) {
      const int n = size_.load(std::memory_order_acquire);
      Node* node = nullptr;
      if (prefer != nullptr) {
        node = Pick(n, prefer_mask, nullptr, order);
        if (node != nullptr && !HasLabels(*node, *prefer)) {
          node = Pick(n, prefer_mask, prefer, order);  // let through by a shared bit
        }
      }
      if (node == nullptr) node = Pick(n, 0, nullptr, order);
      if (node == nullptr) return nullptr;
      int64_t available = node->available.load(std::memory_order_relaxed);
      bool reserved = false;
      while (available > 0 && !reserved) {
        // acquire pairs with Push's release: the member counted is in the queue.
        reserved = node->available.compare_exchange_weak(
            available, available - 1, std::memory_order_acquire, std::memory_order_relaxed);
      }
      // Other Pops took the node's last members since it was picked: they made progress,
      // and this one looks again.
      if (!reserved) continue;
      SandboxPtr out;
      // The reserved member is in the queue; a try fails only while another consumer
      // is in the middle of taking a different member of the same queue.
      while (!node->queue.try_dequeue(out)) {
      }
      return out;
    }
  }

  Node* Find(absl::string_view name, int from, int to) const {
    for (int i = from; i < to; ++i) {
      if (nodes_[i]->name == name) return nodes_[i].get();
    }
    return nullptr;
  }

  Node* NodeOf(const Sandbox& sandbox) {
    const int n = size_.load(std::memory_order_acquire);
    if (Node* node = Find(sandbox.node, 0, n)) return node;
    absl::MutexLock lock(&grow_mu_);
    const int m = size_.load(std::memory_order_relaxed);
    if (Node* node = Find(sandbox.node, n, m)) return node;  // added meanwhile
    if (m == kMaxNodes) return nodes_[kMaxNodes - 1].get();
    nodes_[m] = std::make_unique<Node>(
        sandbox.node, sandbox.node_labels != nullptr ? *sandbox.node_labels : NodeLabels());
    // release: a reader that sees the new size sees the entry.
    size_.store(m + 1, std::memory_order_release);
    return nodes_[m].get();
  }

  // Which order Pop follows. Atomic because SwitchTo may change it while Pops run;
  // relaxed, as a Pop may follow either order.
  std::atomic<Order> order_;
  // nodes_[0, size_) are set and never change; entries are written under grow_mu_
  // before size_ is raised (release; readers acquire).
  std::array<std::unique_ptr<Node>, kMaxNodes> nodes_;
  std::atomic<int> size_{0};
  absl::Mutex grow_mu_;
};

}  // namespace

const char* SandboxStateName(SandboxState s) {
  switch (s) {
    case SandboxState::kWarm:
      return "warm";
    case SandboxState::kClaimed:
      return "claimed";
    case SandboxState::kDead:
      return "dead";
    case SandboxState::kRetired:
      return "retired";
  }
  return "unknown";
}

std::unique_ptr<SelectionPolicy> NewFifoReadySet() { return std::make_unique<FifoReadySet>(); }

std::unique_ptr<SelectionPolicy> NewNodeReadySet(absl::string_view name) {
  ABSL_RAW_CHECK(name == "spread" || name == "pack", "not a node-aware selection policy");
  return std::make_unique<NodeReadySet>(name == "pack" ? NodeReadySet::Order::kPack
                                                       : NodeReadySet::Order::kSpread);
}

absl::StatusOr<std::unique_ptr<SelectionPolicy>> NewSelectionPolicy(absl::string_view name) {
  if (name == "fifo" || name.empty()) return NewFifoReadySet();
  if (name == "spread" || name == "pack") return NewNodeReadySet(name);
  return absl::InvalidArgumentError(absl::StrCat(
      "selection policy \"", name, "\" is not known (known: ", kKnownSelectionPolicies, ")"));
}

}  // namespace sbx::allocator

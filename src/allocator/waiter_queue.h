#pragma once
// WaiterQueue: the claims waiting for a warm sandbox of one pool, served by weighted fair
// share between tenants and by priority within a tenant.
//
// Between tenants: deficit round robin (Shreedhar and Varghese) with every waiter costing
// one sandbox. The tenants with waiters form a ring; the tenant at its head gets a turn of
// `weight` sandboxes (or fewer, if it runs out of waiters), then goes to the back. So a
// tenant with a 10,000-claim backlog holds back another tenant's single claim by at most
// its own weight: the newcomer joins the ring's back and its turn comes after each tenant
// ahead of it has had one turn. A tenant's weight is that of its most recently queued
// waiter (the server gives every waiter the weight of its tenant's tokens-file line).
//
// Within a tenant: strict priority (every waiting INTERACTIVE claim before any NORMAL, every
// NORMAL before any BATCH), and FIFO within one priority.
//
// Push, Pop and Remove are O(1) apart from one hash lookup of the tenant.
//
// Thread-safety: none; the pool guards its queue with its mutex.
// Lifetime: a waiter is queued at most once at a time, and at most in one queue.

#include <array>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "src/allocator/sandbox.h"

namespace sbx::allocator {

// How urgent a waiting claim is within its tenant's share of an empty pool (claims.proto
// ClaimPriority). Higher values are served first.
enum class ClaimPriority : uint8_t {
  kBatch = 0,        // background work: after the tenant's other claims
  kNormal = 1,       // the default
  kInteractive = 2,  // a person or an agent waits on it: before the tenant's other claims
};
inline constexpr int kClaimPriorities = 3;

class WaiterQueue;

// A claim waiting for a warm sandbox (policy WAIT, or COLD while its sandbox starts).
struct Waiter {
  // Receives the sandbox, already moved to kClaimed. Runs outside the pool's lock.
  absl::AnyInvocable<void(SandboxPtr) &&> deliver;
  // Whose share the waiter is served from (the claim's owner), its place within it, and
  // the owner's weight (at least 1; see WaiterQueue).
  std::string owner;
  ClaimPriority priority = ClaimPriority::kNormal;
  int weight = 1;

 private:
  friend class WaiterQueue;
  // The queue holding the waiter (null: none) and its place there; written only by that
  // queue, under its pool's lock.
  const WaiterQueue* queue = nullptr;
  std::list<std::shared_ptr<Waiter>>::iterator position;
};
using WaiterPtr = std::shared_ptr<Waiter>;

class WaiterQueue {
 public:
  WaiterQueue() = default;
  WaiterQueue(const WaiterQueue&) = delete;
  WaiterQueue& operator=(const WaiterQueue&) = delete;

  // Queues `waiter` behind its owner's waiters of its priority. A waiter already queued
  // (here or in another queue) is an invariant broken by the caller: the process aborts.
  void Push(WaiterPtr waiter);
  // Takes the next waiter by fair share and priority; nullptr when empty.
  WaiterPtr Pop();
  // Takes `waiter` out if it is queued here. Returns whether it was.
  bool Remove(const WaiterPtr& waiter);

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Waiters of `owner` (0 for an owner with none).
  size_t size(const std::string& owner) const;

 private:
  struct Tenant {
    // FIFO queues by priority (index: the ClaimPriority value).
    std::array<std::list<WaiterPtr>, kClaimPriorities> queues;
    size_t size = 0;
    int weight = 1;
    // Sandboxes left in the current turn, while the tenant is at the ring's head.
    int64_t deficit = 0;
    std::list<Tenant*>::iterator in_ring;
  };

  // Takes `owner`'s tenant out of the ring and forgets it (it has no waiter left).
  void DropTenant(const std::string& owner, Tenant* tenant);

  // Every tenant with waiters, and only those.
  absl::flat_hash_map<std::string, std::unique_ptr<Tenant>> tenants_;
  // Tenants with waiters in round-robin order; the head has the current turn.
  std::list<Tenant*> ring_;
  size_t size_ = 0;
};

}  // namespace sbx::allocator

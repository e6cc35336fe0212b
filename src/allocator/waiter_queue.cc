#include "src/allocator/waiter_queue.h"

#include <algorithm>
#include <utility>

#include "absl/base/internal/raw_logging.h"

namespace sbx::allocator {
namespace {

size_t Index(ClaimPriority p) {
  return std::min<size_t>(static_cast<size_t>(p), kClaimPriorities - 1);
}

}  // namespace

void WaiterQueue::Push(WaiterPtr waiter) {
  ABSL_RAW_CHECK(waiter->queue == nullptr, "a waiter was queued twice");
  std::unique_ptr<Tenant>& slot = tenants_[waiter->owner];
  if (slot == nullptr) {
    // A tenant with no waiter joins at the back: everyone ahead has a turn first.
    slot = std::make_unique<Tenant>();
    slot->in_ring = ring_.insert(ring_.end(), slot.get());
  }
  Tenant& t = *slot;
  t.weight = std::max(1, waiter->weight);
  std::list<WaiterPtr>& q = t.queues[Index(waiter->priority)];
  waiter->queue = this;
  Waiter* w = waiter.get();
  w->position = q.insert(q.end(), std::move(waiter));
  ++t.size;
  ++size_;
}

WaiterPtr WaiterQueue::Pop() {
  if (ring_.empty()) return nullptr;
  Tenant* t = ring_.front();
  if (t->deficit <= 0) t->deficit = t->weight;  // its turn begins
  WaiterPtr waiter;
  for (size_t p = kClaimPriorities; p-- > 0;) {
    std::list<WaiterPtr>& q = t->queues[p];
    if (q.empty()) continue;
    waiter = std::move(q.front());
    q.pop_front();
    break;
  }
  ABSL_RAW_CHECK(waiter != nullptr, "a tenant in the ring has no waiter");
  waiter->queue = nullptr;
  --t->size;
  --size_;
  --t->deficit;
  if (t->size == 0) {
    DropTenant(waiter->owner, t);
  } else if (t->deficit <= 0) {
    ring_.splice(ring_.end(), ring_, t->in_ring);  // its turn is over: to the back
  }
  return waiter;
}

bool WaiterQueue::Remove(const WaiterPtr& waiter) {
  if (waiter->queue != this) return false;
  auto it = tenants_.find(waiter->owner);
  ABSL_RAW_CHECK(it != tenants_.end(), "a queued waiter's tenant is not in the queue");
  Tenant* t = it->second.get();
  // Keeps the waiter alive: `waiter` may be the very pointer the list holds.
  WaiterPtr keep = waiter;
  t->queues[Index(keep->priority)].erase(keep->position);
  keep->queue = nullptr;
  --t->size;
  --size_;
  if (t->size == 0) DropTenant(keep->owner, t);
  return true;
}

size_t WaiterQueue::size(const std::string& owner) const {
  auto it = tenants_.find(owner);
  return it == tenants_.end() ? 0 : it->second->size;
}

void WaiterQueue::DropTenant(const std::string& owner, Tenant* tenant) {
  ring_.erase(tenant->in_ring);
  tenants_.erase(owner);
}

}  // namespace sbx::allocator

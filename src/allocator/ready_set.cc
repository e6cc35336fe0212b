#include "src/allocator/ready_set.h"

#include "absl/strings/str_cat.h"
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

absl::StatusOr<std::unique_ptr<SelectionPolicy>> NewSelectionPolicy(absl::string_view name) {
  if (name == "fifo" || name.empty()) return NewFifoReadySet();
  return absl::InvalidArgumentError(
      absl::StrCat("selection policy \"", name, "\" is not known (known: fifo)"));
}

}  // namespace sbx::allocator

#include "src/common/dropped.h"

#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"

namespace sbx {
namespace {

absl::Mutex& Mu() {
  static absl::Mutex* mu = new absl::Mutex();
  return *mu;
}
std::map<std::string, uint64_t>& Counts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(Mu()) {
  static auto* counts = new std::map<std::string, uint64_t>();
  return *counts;
}

}  // namespace

void ReportDropped(const char* site, const absl::Status& status) {
  if (status.ok()) return;
  {
    absl::MutexLock lock(&Mu());
    ++Counts()[site];
  }
  spdlog::warn("{}: an error with no caller to return to: {}", site, status.ToString());
}

std::map<std::string, uint64_t> DroppedErrorCounts() {
  absl::MutexLock lock(&Mu());
  return Counts();
}

}  // namespace sbx

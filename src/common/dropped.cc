#include "src/common/dropped.h"

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace sbx {
namespace {

// Per site, a warning at most every kLogEvery: a store refusing writes fails every commit
// of the same kind at once, and the count says how many.
constexpr absl::Duration kLogEvery = absl::Seconds(10);

absl::Mutex& Mu() {
  static absl::Mutex* mu = new absl::Mutex();
  return *mu;
}
std::map<std::string, uint64_t>& Counts() ABSL_EXCLUSIVE_LOCKS_REQUIRED(Mu()) {
  static auto* counts = new std::map<std::string, uint64_t>();
  return *counts;
}
std::map<std::string, absl::Time>& LastLogged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(Mu()) {
  static auto* last = new std::map<std::string, absl::Time>();
  return *last;
}

}  // namespace

void ReportDropped(const char* site, const absl::Status& status) {
  if (status.ok()) return;
  uint64_t count = 0;
  {
    absl::MutexLock lock(&Mu());
    count = ++Counts()[site];
    auto [last, first] = LastLogged().try_emplace(site, absl::InfinitePast());
    const absl::Time now = absl::Now();
    if (now - last->second < kLogEvery) return;
    last->second = now;
  }
  spdlog::warn(
      "{}: an error with no caller to return to ({} so far at this site; logged at most every "
      "{}): {}",
      site, count, absl::FormatDuration(kLogEvery), status.ToString());
}

std::map<std::string, uint64_t> DroppedErrorCounts() {
  absl::MutexLock lock(&Mu());
  return Counts();
}

}  // namespace sbx

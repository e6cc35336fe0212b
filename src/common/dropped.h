#pragma once
// Errors nobody waits for: the answer of a commit or a release that runs on its own (a
// claim expiring, a sandbox found gone, a clean-up delete) has no caller to return to.
// Such a status is never dropped silently: ReportDropped logs it with the site that
// dropped it and counts it per site, and sbx-server exports the counts as
// sbx_dropped_errors_total{site} (docs/metrics.md). Sites are short stable names
// ("allocator.expire"), one per place in the code. scripts/check_dropped.py fails the
// build's checks on an empty status callback or an IgnoreError() without a reason.
//
// Thread-safety: every function may be called from any thread.

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sbx {

// Counts `status` and logs it (a warning naming `site`, at most one per site every 10 s),
// unless it is OK. `site` must be a
// string literal (its address is kept).
void ReportDropped(const char* site, const absl::Status& status);
template <typename T>
void ReportDropped(const char* site, const absl::StatusOr<T>& result) {
  ReportDropped(site, result.status());
}

// A completion callback that reports what it gets (for APIs that take one):
//   store->Commit(batch, DropTo("allocator.sandbox_gone_commit"));
// `expected` and `also_expected` name codes that are an answer, not an error, at that site
// (ending a claim that has ended already: FAILED_PRECONDITION; deleting what is gone:
// NOT_FOUND); they are neither logged nor counted.
struct DropTo {
  const char* site;
  absl::StatusCode expected = absl::StatusCode::kOk;
  absl::StatusCode also_expected = absl::StatusCode::kOk;
  void operator()(const absl::Status& s) const {
    if (s.code() != expected && s.code() != also_expected) ReportDropped(site, s);
  }
  template <typename T>
  void operator()(const absl::StatusOr<T>& r) const {
    (*this)(r.status());
  }
};

// The counts so far, by site.
std::map<std::string, uint64_t> DroppedErrorCounts();

}  // namespace sbx

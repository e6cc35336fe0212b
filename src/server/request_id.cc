#include "src/server/request_id.h"

#include <atomic>
#include <cstdint>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "src/common/logging.h"

namespace sbx::server {
namespace {

const std::string& ProcessPrefix() {
  static const std::string* prefix = [] {
    absl::BitGen gen;
    return new std::string(absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16)));
  }();
  return *prefix;
}

bool Sane(absl::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

std::string NewRequestId() {
  // Relaxed: only uniqueness matters.
  static std::atomic<uint64_t> next{1};
  return absl::StrCat(ProcessPrefix(), "-",
                      absl::Hex(next.fetch_add(1, std::memory_order_relaxed)));
}

std::string RequestId(grpc::CallbackServerContext* ctx) {
  std::string id;
  const auto& md = ctx->client_metadata();
  if (auto it = md.find(kRequestIdKey); it != md.end()) {
    const absl::string_view given(it->second.data(), it->second.size());
    if (Sane(given)) id = std::string(given);
  }
  if (id.empty()) id = NewRequestId();
  ctx->AddInitialMetadata(kRequestIdKey, id);
  return id;
}

void CallRecord::Done(const absl::Status& status) const {
  if (counters != nullptr) counters->CountCall(method, status.code());
  const bool serious = absl::IsInternal(status) || absl::IsUnknown(status) ||
                       absl::IsDataLoss(status) || absl::IsUnavailable(status);
  const spdlog::level::level_enum level = serious ? spdlog::level::warn : spdlog::level::debug;
  if (!spdlog::default_logger_raw()->should_log(level)) return;
  ScopedLogField field("request_id", request_id);
  spdlog::log(level, "{} {}: {}", MethodName(method), what,
              status.ok() ? std::string("OK") : status.ToString());
}

}  // namespace sbx::server

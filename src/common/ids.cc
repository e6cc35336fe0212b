#include "src/common/ids.h"

#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "src/common/status_macros.h"

namespace sbx {
namespace {

class RandomIdGenerator final : public IdGenerator {
 public:
  std::string Next() override {
    // One generator per thread: absl::BitGen is not thread-safe, and a shared one
    // behind a lock would serialize every claim that needs an id.
    thread_local absl::BitGen gen;
    char bytes[16];
    for (int i = 0; i < 16; i += 8) {
      uint64_t v = absl::Uniform<uint64_t>(gen);
      std::memcpy(bytes + i, &v, 8);
    }
    return absl::BytesToHexString(absl::string_view(bytes, sizeof(bytes)));
  }
};

std::string Quote(absl::string_view s) {
  constexpr size_t kMaxShown = 80;
  if (s.size() > kMaxShown)
    return absl::StrCat("\"", absl::CHexEscape(s.substr(0, kMaxShown)), "...\"");
  return absl::StrCat("\"", absl::CHexEscape(s), "\"");
}

}  // namespace

IdGenerator& IdGenerator::Random() {
  static RandomIdGenerator* gen = new RandomIdGenerator();
  return *gen;
}

std::string SequentialIdGenerator::Next() {
  return absl::StrCat(prefix_, next_.fetch_add(1, std::memory_order_relaxed));
}

absl::Status ValidateName(absl::string_view what, absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (name.size() > 63) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Quote(name), " is longer than 63 characters"));
  }
  for (char c : name) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-')) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " ", Quote(name), " may contain only lowercase letters, digits and '-'"));
    }
  }
  if (name.front() == '-' || name.back() == '-') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Quote(name), " must start and end with a letter or digit"));
  }
  return absl::OkStatus();
}

absl::Status ValidateQualifiedName(absl::string_view what, absl::string_view qualified) {
  const size_t slash = qualified.find('/');
  if (slash == absl::string_view::npos) return ValidateName(what, qualified);
  RETURN_IF_ERROR(ValidateName(absl::StrCat(what, " ", Quote(qualified), ": namespace"),
                               qualified.substr(0, slash)));
  return ValidateName(absl::StrCat(what, " ", Quote(qualified), ": name"),
                      qualified.substr(slash + 1));
}

std::string QualifiedName(absl::string_view ns, absl::string_view name,
                          absl::string_view default_ns) {
  if (ns == default_ns) return std::string(name);
  return absl::StrCat(ns, "/", name);
}

NamespacedName SplitQualifiedName(absl::string_view qualified, absl::string_view default_ns) {
  const size_t slash = qualified.find('/');
  if (slash == absl::string_view::npos) {
    return {std::string(default_ns), std::string(qualified)};
  }
  return {std::string(qualified.substr(0, slash)), std::string(qualified.substr(slash + 1))};
}

absl::StatusOr<std::string> CanonicalQualifiedName(absl::string_view what,
                                                   absl::string_view qualified,
                                                   absl::string_view default_ns) {
  RETURN_IF_ERROR(ValidateQualifiedName(what, qualified));
  NamespacedName parts = SplitQualifiedName(qualified, default_ns);
  return QualifiedName(parts.ns, parts.name, default_ns);
}

absl::Status ValidateKey(absl::string_view what, absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (key.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Quote(key), " is longer than 128 characters"));
  }
  for (char c : key) {
    if (!(absl::ascii_isalnum(c) || c == '.' || c == '_' || c == ':' || c == '-')) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", Quote(key), " may contain only letters, digits and . _ : -"));
    }
  }
  return absl::OkStatus();
}

std::string KubeClaimOwner(absl::string_view ns) { return absl::StrCat(kKubeClaimOwnerPrefix, ns); }

bool IsKubeClaimOwner(absl::string_view owner) {
  return absl::StartsWith(owner, kKubeClaimOwnerPrefix);
}

}  // namespace sbx

#pragma once
// FNV-1a: a small hash whose values are the same on every build and machine, for names
// and fingerprints that are stored or sent (label values, object names, page tokens).
// Not for hash tables, and nothing an attacker controls may rely on it.

#include <cstdint>

#include "absl/strings/string_view.h"

namespace sbx {

inline constexpr uint32_t kFnv1a32Offset = 2166136261u;
inline constexpr uint64_t kFnv1a64Offset = 14695981039346656037ull;

// FNV-1a, 32 bits, of `s`, continuing from `h`.
inline uint32_t Fnv1a32(absl::string_view s, uint32_t h = kFnv1a32Offset) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

// FNV-1a, 64 bits, of `s`, continuing from `h`.
inline uint64_t Fnv1a64(absl::string_view s, uint64_t h = kFnv1a64Offset) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace sbx

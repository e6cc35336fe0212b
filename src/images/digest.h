#pragma once
// The one adapter of the image cache to OpenSSL: sha256 digests of manifests and blobs.
//
// Thread-safety: free function without state.

#include <string>

#include "absl/strings/string_view.h"

namespace sbx::images {

// The sha256 of `bytes` as 64 lower-case hex digits.
std::string Sha256Hex(absl::string_view bytes);

}  // namespace sbx::images

#pragma once
// SandboxSecrets: the per-sandbox secrets with which sbx-server proves to a sandbox's
// daemon (sbx-sandboxd) that the call comes from it. A sandbox's secret is
// HMAC-SHA256(key, sandbox id) in hex, so the server can name the secret of any sandbox
// it knows (after a restart too) while one sandbox's secret says nothing about another's.
// The key is 32 random bytes, made on first start and kept in a file beside the store
// (mode 0600) or, on Kubernetes, in a Secret that every replica shares (src/k8s/sandbox_key.h).
//
// Thread-safety: immutable after construction; For() may be called from any thread.

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sbx {

// The gRPC metadata entry in which every call to a sandbox's daemon carries its secret.
inline constexpr char kSandboxSecretMetadata[] = "sbx-sandbox-secret";

class SandboxSecrets {
 public:
  // The size of a key.
  static constexpr size_t kKeyBytes = 32;

  // A new key: kKeyBytes from OpenSSL's random generator. FAILED_PRECONDITION when it has
  // none to give.
  [[nodiscard]] static absl::StatusOr<std::string> NewKey();
  // Reads the key from `path`, or makes one there (created exclusively, mode 0600, written
  // and fsynced before it is used) when the file does not exist. Errors: FAILED_PRECONDITION
  // naming the file when it cannot be read or made, is not a regular file, is readable by
  // others than its owner, or does not hold a key of 32 bytes.
  [[nodiscard]] static absl::StatusOr<SandboxSecrets> LoadOrCreate(const std::string& path);
  // A key given directly (tests). At least 16 bytes.
  static SandboxSecrets FromKey(std::string key);

  // The secret of sandbox `id`: 64 hex digits.
  std::string For(absl::string_view id) const;

 private:
  explicit SandboxSecrets(std::string key) : key_(std::move(key)) {}
  std::string key_;
};

}  // namespace sbx

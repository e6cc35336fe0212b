#pragma once
// Identifier generation and validation of user-chosen names.
//
// Thread-safety: IdGenerator implementations are safe to call from any thread.

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sbx {

class IdGenerator {
 public:
  virtual ~IdGenerator() = default;
  // A new identifier, unique with overwhelming probability: 32 lowercase hex characters
  // (128 random bits) for the random generator.
  virtual std::string Next() = 0;

  // The process-wide random generator (seeded from the OS).
  static IdGenerator& Random();
};

// Deterministic ids "<prefix><n>" for tests.
class SequentialIdGenerator final : public IdGenerator {
 public:
  explicit SequentialIdGenerator(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string Next() override;

 private:
  const std::string prefix_;
  // Atomic so that concurrent callers each get a distinct number; relaxed is enough
  // because only uniqueness matters, not ordering with other memory.
  std::atomic<uint64_t> next_{1};
};

// Checks a name chosen by a user (pool, template): 1-63 characters of [a-z0-9-], starting
// and ending with an alphanumeric (a DNS-1123 label, so it can name Kubernetes objects).
// Returns INVALID_ARGUMENT naming `what` and the offending value.
[[nodiscard]] absl::Status ValidateName(absl::string_view what, absl::string_view name);

// Namespaces. A pool, a template and a sandbox of the kubernetes runtime belong to a
// namespace (a Kubernetes namespace there; just a name space elsewhere). The allocator, its
// store and the API name them "<namespace>/<name>", or "<name>" alone in the server's
// default namespace (AllocatorOptions::default_namespace, "default" unless configured), so
// that names given before namespaces existed keep their meaning and each thing has exactly
// one name: "<default namespace>/<name>" is only an input spelling (CanonicalQualifiedName).
struct NamespacedName {
  std::string ns;
  std::string name;
  bool operator==(const NamespacedName&) const = default;
};
// Checks a qualified pool or template name: "<name>" or "<namespace>/<name>", both parts
// DNS-1123 labels (ValidateName). INVALID_ARGUMENT naming `what` and the value.
[[nodiscard]] absl::Status ValidateQualifiedName(absl::string_view what,
                                                 absl::string_view qualified);
// The one name of `name` in `ns`: "<name>" when ns is `default_ns`, else "<ns>/<name>".
std::string QualifiedName(absl::string_view ns, absl::string_view name,
                          absl::string_view default_ns);
// The parts of a qualified name ("<name>" is in `default_ns`); the text after the first
// '/' is the name.
NamespacedName SplitQualifiedName(absl::string_view qualified, absl::string_view default_ns);
// Validates `qualified` (as ValidateQualifiedName) and answers its one name:
// "<default_ns>/<name>" becomes "<name>".
[[nodiscard]] absl::StatusOr<std::string> CanonicalQualifiedName(absl::string_view what,
                                                                 absl::string_view qualified,
                                                                 absl::string_view default_ns);

// Checks a client-chosen identifier (claim id / idempotency key): 1-128 characters of
// [A-Za-z0-9._:-]. Returns INVALID_ARGUMENT naming `what` and the value.
[[nodiscard]] absl::Status ValidateKey(absl::string_view what, absl::string_view key);

// Owners starting with this prefix belong to the Kubernetes claim controller: it holds
// the allocator claims of SandboxClaims made in namespace <ns> (by kubectl or a client
// library) under owner "k8s-<ns>" (KubeClaimOwner). It does not mirror the claims of
// such owners as SandboxClaims, and releases any it finds no SandboxClaim for (at start,
// for instance), so no tenant may have a name in this space: the server refuses one in
// its tokens file (src/server/auth.h).
inline constexpr absl::string_view kKubeClaimOwnerPrefix = "k8s-";
// The owner of the claims of SandboxClaims in namespace `ns`: "k8s-<ns>".
std::string KubeClaimOwner(absl::string_view ns);
// Whether `owner` is in the reserved space (starts with kKubeClaimOwnerPrefix; case
// matters, as it does for owners).
bool IsKubeClaimOwner(absl::string_view owner);

}  // namespace sbx

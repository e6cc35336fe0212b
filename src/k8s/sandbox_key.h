#pragma once
// The key of the sandboxes' daemon secrets (src/common/sandbox_secret.h) kept in a
// Kubernetes Secret, so that every replica of sbx-server uses the same key and the key
// outlives them: after a failover the new leader computes the same secrets as the pods the
// old one made, and a lost data volume loses no key.
//
// The Secret (type Opaque, data "key": the key in base64) is read; when it does not exist
// it is made with a new random key; when another replica made it first (the create says
// ALREADY_EXISTS), the winner's is read and used. The key is never changed by sbx.
//
// Thread-safety: LoadOrCreateSandboxKey may be called from any thread; concurrent calls
// (in this or other processes) for the same Secret return the same key.

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/common/clock.h"
#include "src/k8s/client.h"

namespace sbx::k8s {

// The data key of the Secret that holds the key.
inline constexpr char kSandboxKeyDataKey[] = "key";

struct SandboxKeyOptions {
  // Namespace and name of the Secret. Required.
  std::string ns;
  std::string name;
  // Give up (DEADLINE_EXCEEDED) when no key is in hand after this long. Each request
  // already has the client's own retries; between rounds of them this waits retry_period.
  absl::Duration deadline = absl::Seconds(30);
  absl::Duration retry_period = absl::Seconds(1);
  // The time source for deadline and waits; must outlive the call.
  Clock* clock = &Clock::Real();

  // INVALID_ARGUMENT naming the field when a name is empty or a duration is not positive.
  [[nodiscard]] absl::Status Validate() const;
};

// The key (SandboxSecrets::kKeyBytes raw bytes) from the Secret `options.ns/options.name`,
// made when it does not exist. Errors, each naming the Secret:
//   FAILED_PRECONDITION  the Secret has no data "key", or it is not base64 of 32 bytes
//                        (sbx does not overwrite it: existing sandboxes may depend on it)
//   PERMISSION_DENIED    RBAC does not allow get of the Secret or create of secrets
//   DEADLINE_EXCEEDED    the API server did not answer usefully before the deadline (the
//                        message carries the last error)
//   the client's code    any other error of the API server (client.h)
[[nodiscard]] absl::StatusOr<std::string> LoadOrCreateSandboxKey(Client& client,
                                                                 const SandboxKeyOptions& options);

}  // namespace sbx::k8s

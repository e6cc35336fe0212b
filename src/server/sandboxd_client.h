#pragma once
// The server's side of sbx-sandboxd, the daemon in every sandbox: one gRPC channel per
// sandbox (cached; each call on it carries that sandbox's secret), the translation of sbx.v1
// requests into the daemon's sbx.sandboxd.v1 ones, and the checks of per-claim configuration (env,
// files) shared by ClaimService (late binding) and SandboxService (Exec's env).
//
// Thread-safety: SandboxdClients may be used from any thread.
// Lifetime: callbacks of calls in flight run even after the SandboxdClients is gone
// (channels are reference-counted by gRPC); it must outlive nothing but its callers.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "sbx/sandboxd/v1/sandboxd.grpc.pb.h"
#include "sbx/v1/types.pb.h"
#include "src/allocator/allocator.h"  // store::ClaimRecord

namespace sbx::server {

// Limits of SandboxConfig and Exec env (types.proto).
inline constexpr int kMaxEnvEntries = 256;
inline constexpr size_t kMaxEnvNameBytes = 256;
inline constexpr size_t kMaxEnvValueBytes = 32 * 1024;
inline constexpr int kMaxConfigFiles = 64;
inline constexpr size_t kMaxConfigFileBytes = 1024 * 1024;

// INVALID_ARGUMENT naming `field`, the entry and the rule it breaks.
[[nodiscard]] absl::Status ValidateEnv(absl::string_view field,
                                       const google::protobuf::Map<std::string, std::string>& env);
// Checks a claim's late-bound config (env and files; paths are checked by the daemon).
[[nodiscard]] absl::Status ValidateSandboxConfig(absl::string_view field,
                                                 const v1::SandboxConfig& config);
bool HasConfig(const v1::SandboxConfig& config);

class SandboxdClients {
 public:
  // The secret of sandbox `id`, which every call to its daemon carries (sandboxd.h,
  // kSecretMetadata). Empty function: calls carry none.
  using SecretFn = std::function<std::string(absl::string_view id)>;

  // `max_channels` bounds the cache (each channel holds a socket to one sandbox).
  explicit SandboxdClients(SecretFn secret = nullptr, size_t max_channels = 4096)
      : secret_(std::move(secret)), max_channels_(max_channels) {}

  // The daemon stub of the sandbox a claim holds. FAILED_PRECONDITION when the sandbox
  // cannot run anything (the instant runtime's sandboxes) or its endpoint is unknown.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<sandboxd::v1::Sandboxd::Stub>> Stub(
      const store::ClaimRecord& claim) ABSL_LOCKS_EXCLUDED(mu_);

  // Applies `config` to the claim's sandbox (sandboxd Configure); `done` runs on a gRPC
  // thread. Errors: the daemon's (naming the file), UNAVAILABLE when it cannot be reached
  // within `timeout`.
  // (The env is kept with the claim, store::ClaimRecord::env, for Reset to give again.)
  void Configure(const store::ClaimRecord& claim, const v1::SandboxConfig& config,
                 absl::Duration timeout, absl::AnyInvocable<void(absl::Status) &&> done);

  // --- Reset (issue 37) ---
  // How many resets of claim `claim_id` have begun; a daemon call notes it at its start.
  uint64_t ResetGeneration(const std::string& claim_id) ABSL_LOCKS_EXCLUDED(mu_);
  // A reset of the claim to `snapshot_id` begins (before its sandbox's processes die).
  void BeginReset(const std::string& claim_id, const std::string& snapshot_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The claim's sandbox was restarted: its cached channel (connected to the old daemon)
  // goes, so the next call connects to the new daemon at once.
  void ForgetChannel(const std::string& sandbox_id) ABSL_LOCKS_EXCLUDED(mu_);
  // A daemon call that ended with `status` after starting at `generation`: ABORTED naming
  // the snapshot when a reset of the claim began since and the call failed; else
  // FromDaemon's status.
  [[nodiscard]] absl::Status FromDaemonSince(const grpc::Status& status,
                                             const store::ClaimRecord& claim, uint64_t generation)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct ResetNote {
    uint64_t generation = 0;
    std::string snapshot_id;
  };
  const SecretFn secret_;
  const size_t max_channels_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<sandboxd::v1::Sandboxd::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, ResetNote> resets_ ABSL_GUARDED_BY(mu_);
};

// A daemon's error as the client of SandboxService sees it: UNAVAILABLE and
// DEADLINE_EXCEEDED of the transport name the sandbox; others keep code and message.
[[nodiscard]] absl::Status FromDaemon(const grpc::Status& status, const store::ClaimRecord& claim);

}  // namespace sbx::server

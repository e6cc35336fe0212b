#pragma once
// GrpcClaimMirror: makes gRPC claims on Kubernetes-backed pools visible as SandboxClaims.
//
// A gRPC claim is answered from memory with no API write. The mirror hears of it
// afterwards (an all-owners allocator watch; kubectl claims, owner "k8s-...", have their
// objects already) and writes, in the namespace of the claim's pool, a SandboxClaim named
// GrpcClaimName(owner, id) carrying the sandbox's name, the same binding patch of the
// Sandbox as a kubectl claim gets, and a Ready status — idempotent writes at claim
// priority (ClaimWriter), so a retry after a conflict or a crash never binds another
// sandbox. When the gRPC claim ends, its SandboxClaim is deleted.
//
// The ClaimController owns the mirror: they share the SandboxClaim informer (whose events
// the controller routes here), the work queue and its workers, and the ClaimWriter.
//
// Thread-safety: Start/Stop from one thread; Reconcile from the workers, different claims
// at once.
// Lifetime: the client, writer, informers and allocator outlive the mirror; Stop before
// the allocator goes.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "src/allocator/allocator.h"
#include "src/common/clock.h"
#include "src/k8s/claim_writer.h"
#include "src/k8s/informer.h"
#include "src/k8s/namespaces.h"

namespace sbx::k8s {

// The SandboxClaim name of gRPC claim (owner, id): "grpc-<16 hex of FNV-1a 64 of
// owner/id>". Names already in clusters must not change.
std::string GrpcClaimName(const std::string& owner, const std::string& id);

class GrpcClaimMirror {
 public:
  // Mirrors the claims of pools of `namespaces` (the allocator's pool names tell their
  // namespace): `claims` and `sandboxes` are their SandboxClaim and Sandbox informers.
  // `enqueue` puts the work of gRPC claim (owner, id), whose SandboxClaim is in namespace
  // ns, into the work queue whose workers call Reconcile.
  using Enqueue =
      std::function<void(const std::string& ns, const std::string& owner, const std::string& id)>;
  GrpcClaimMirror(ClaimWriter* writer, const Informer* claims, const Informer* sandboxes,
                  Namespaces namespaces, const Clock* clock, Enqueue enqueue);
  ~GrpcClaimMirror();

  // Starts the allocator watch and the thread that follows it. Errors: the allocator's
  // (UNAVAILABLE when the watch cannot start).
  [[nodiscard]] absl::Status Start(allocator::Allocator* allocator);
  // Ends the watch and joins its thread. Idempotent.
  void Stop();

  // Makes gRPC claim (owner, id)'s SandboxClaim show the claim: written and bound while
  // the claim is active, deleted once it has ended. INTERNAL when the SandboxClaim names
  // another sandbox than the allocator's claim (never rebound); else the API's errors.
  // `ns` is the namespace of its pool (the work's).
  [[nodiscard]] absl::Status Reconcile(const std::string& ns, const std::string& owner,
                                       const std::string& id);

 private:
  void WatchLoop();
  // The SandboxClaim of active claim `c` named `name`: the informer's copy, else the
  // one made now (or, after a retry, the one made before).
  [[nodiscard]] absl::StatusOr<types::SandboxClaim> ShownClaim(const store::ClaimRecord& c,
                                                               const std::string& name,
                                                               const NamespacedName& pool,
                                                               const std::string& sandbox);
  void WakeWatcher() ABSL_LOCKS_EXCLUDED(mu_);

  ClaimWriter* const writer_;
  const Informer* const claims_;
  const Informer* const sandboxes_;
  const Namespaces namespaces_;
  const Clock* const clock_;
  const Enqueue enqueue_;
  // Set by Start before the watcher runs; read by workers, which may run before.
  std::atomic<allocator::Allocator*> allocator_{nullptr};
  std::unique_ptr<allocator::ClaimWatch> watch_;
  std::thread watcher_;
  // Set once by Stop; read by the watcher between polls.
  std::atomic<bool> stopping_{false};

  absl::Mutex mu_;
  // The watch has events (or Stop wants the watcher to look at stopping_).
  bool watch_ready_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace sbx::k8s

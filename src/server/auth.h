#pragma once
// Bearer-token authentication for the sbx.v1 services: who is calling (the tenant) and
// whether that caller may use AdminService.
//
// Tokens come from a file, one entry per line:
//
//   # comment
//   <token> <tenant> [admin] [claim_rate=R] [claim_burst=B] [max_claims=N] [weight=W]
//           [namespaces=N1,N2,...] [image_claim_rate=R] [image_claim_burst=B]
//           [image_cache_bytes=N]
//
// namespaces=... confines the tenant to the pools of those namespaces (src/common/ids.h:
// "<ns>/<pool>", or a bare pool name in the server's default namespace): Claim and
// ClaimBatch from a pool of any other namespace answer PERMISSION_DENIED. Without it the
// tenant may claim from every pool. An admin is never confined.
//
// claim_rate=R limits the tenant to R claims per second on average (a ClaimBatch of N
// counts N), up to claim_burst=B at once (default: R rounded up, at least 1); beyond it
// Claim and ClaimBatch answer RESOURCE_EXHAUSTED with the time to wait (tenant_limits.h).
//
// max_claims=N lets the tenant hold at most N claims at once (a ClaimBatch of K counts K;
// claims waiting for a sandbox count; a claim counts until its release, expiry or loss is
// durable); beyond it Claim and ClaimBatch answer RESOURCE_EXHAUSTED with a retry hint and
// hold nothing. The allocator keeps the count (allocator::OwnerClaims), so that it is exact
// under concurrent claims. Default: no maximum.
//
// weight=W (1 to 1000, default 1) is the tenant's share of an empty pool: tenants with
// claims waiting for the same pool are served in turns of W sandboxes each
// (allocator::WaiterQueue), so a tenant of weight 2 gets twice the sandboxes of one of
// weight 1 while both wait, and no backlog of one tenant holds back another's claim for
// longer than one turn of each tenant waiting.
//
// image_claim_rate=R limits the tenant's claims by image (ClaimRequest.image) that no
// declared pool serves (those of on-demand pools, image_pools.h) to R per second on
// average, up to image_claim_burst=B at once (default: R rounded up, at least 1), a token
// bucket as for claim_rate (a ClaimBatch of N counts N); beyond it RESOURCE_EXHAUSTED
// naming the limit, with the time to wait. image_cache_bytes=N refuses (RESOURCE_EXHAUSTED
// naming the limit) such claims of an image that is not in the image cache while the
// images the tenant's claims pulled take N bytes or more of it (image_pools.h says how
// bytes are attributed). Claims served by declared pools are not limited by either, and
// an admin by neither.
//
// Limits belong to the tenant: every line (token) of one tenant must give the same ones.
//
// Tokens are any run of non-blank characters; tenants follow the claim-id syntax
// ([A-Za-z0-9._:-], 1-128 characters) because they become the owner of claims, and may
// not start with "k8s-" (kKubeClaimOwnerPrefix, src/common/ids.h): those owners belong to
// the Kubernetes claim controller. Blank
// lines and lines starting with '#' are skipped. With `insecure_no_auth` there is no file
// and every caller is the tenant "anonymous" with admin rights.
//
// Thread-safety: Authenticate and Reload may be called from any thread concurrently; a
// reload swaps the whole table at once, so a call sees either the old or the new one.
// Lifetime: plain object; the server owns it.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace sbx::server {

struct AuthOptions {
  // File of tokens (see above). Required unless insecure_no_auth.
  std::string tokens_file;
  // Accept every call without a token as tenant "anonymous" with admin rights. For a
  // local, single-user server only; the server logs a warning at start.
  bool insecure_no_auth = false;

  // INVALID_ARGUMENT when neither or both of tokens_file and insecure_no_auth are set.
  [[nodiscard]] absl::Status Validate() const;
};

// What one tenant may do (from its lines of the tokens file).
struct TenantLimits {
  double claim_rate = 0;  // claims per second on average; 0: unlimited
  int claim_burst = 0;    // claims at once; set whenever claim_rate is
  // The namespaces whose pools the tenant may claim from, sorted, without duplicates;
  // empty: every namespace.
  std::vector<std::string> namespaces;
  int64_t max_claims = 0;  // claims held at once (waiting or active); 0: unlimited
  int weight = 1;          // share of an empty pool, 1..allocator::kMaxWeight
  // Claims by image served by on-demand pools: per second on average (0: unlimited) and
  // at once (set whenever image_claim_rate is).
  double image_claim_rate = 0;
  int image_claim_burst = 0;
  // Bytes of the image cache the tenant's claims by image may have pulled before it may
  // pull no more; 0: unlimited.
  int64_t image_cache_bytes = 0;
  bool operator==(const TenantLimits&) const = default;
};

// The authenticated caller of one RPC.
struct Caller {
  std::string tenant;
  bool admin = false;
  TenantLimits limits;
};

// Whether `caller` may claim from the pools of namespace `ns`: admins and tenants
// without namespaces= everywhere, others in theirs.
bool MayClaimFrom(const Caller& caller, absl::string_view ns);

// The tenant every caller becomes with insecure_no_auth.
inline constexpr absl::string_view kAnonymousTenant = "anonymous";

class Authenticator {
 public:
  // Reads the tokens file. Errors: INVALID_ARGUMENT for bad options or a malformed line
  // (the message starts with "<file>:<line>:"), NOT_FOUND / PERMISSION_DENIED / INTERNAL
  // when the file cannot be read.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Authenticator>> Create(
      const AuthOptions& options);

  // `authorization` is the value of the call's "authorization" metadata entry, if any.
  // UNAUTHENTICATED when it is missing, not "Bearer <token>", or the token is unknown.
  [[nodiscard]] absl::StatusOr<Caller> Authenticate(
      std::optional<absl::string_view> authorization) const ABSL_LOCKS_EXCLUDED(mu_);

  // The bearer value ("Bearer <token>") with which a call acts as `tenant`: one of the
  // tenant's tokens (the smallest, so the same one every time), or "" with
  // insecure_no_auth (calls need none). nullopt when the tenant has no token (any more).
  // For sbx-server's own fronts that act for a tenant they authenticated otherwise (the
  // E2B front's envd access tokens, src/gateway/e2b); never sent back to a client. Linear in the
  // number of tokens.
  std::optional<std::string> BearerOf(absl::string_view tenant) const ABSL_LOCKS_EXCLUDED(mu_);

  // Reads the tokens file again and, if it parses, replaces the table. On error the old
  // table stays in force and the error (as for Create) is returned. A no-op (OK) with
  // insecure_no_auth.
  [[nodiscard]] absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);

  bool insecure() const { return options_.insecure_no_auth; }
  // Number of tokens currently accepted (0 with insecure_no_auth).
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Table = absl::flat_hash_map<std::string, Caller>;
  explicit Authenticator(AuthOptions options) : options_(std::move(options)) {}
  [[nodiscard]] static absl::StatusOr<std::shared_ptr<const Table>> Load(const std::string& path);

  const AuthOptions options_;
  mutable absl::Mutex mu_;
  // Immutable once published: readers copy the pointer under the lock and look up outside.
  std::shared_ptr<const Table> table_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::server

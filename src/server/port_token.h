#pragma once
// Signed port URLs: a token that lets whoever holds it reach one port of one claim's
// sandbox through the port proxy (src/gateway/gateway.h) until it expires, without the
// tenant's bearer token, so that a browser can open a sandbox's web app. The owner asks
// for one with SandboxService.GetPortUrl.
//
// A token is base64url(payload) "." base64url(HMAC-SHA256(key, payload)), the payload
// "v1|<owner>|<claim id>|<port>|<expiry, unix seconds>". Owner and claim id follow the
// claim-id syntax (no '|'). The key is derived from the sandbox-secret key
// (src/common/sandbox_secret.h), so tokens outlive a restart and every replica accepts
// every other's; they are not revocable before their expiry except by a new key (or by
// releasing the claim: the proxy only reaches active claims).
//
// Thread-safety: immutable after construction; any thread.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace sbx::server {

struct PortGrant {
  std::string owner;     // tenant that owns the claim
  std::string claim_id;  // the claim, as its owner names it
  int port = 0;          // 1..65535
  absl::Time expires;    // whole seconds
};

// Longest lifetime GetPortUrl gives a token.
inline constexpr absl::Duration kMaxPortTokenTtl = absl::Hours(24 * 7);

class PortTokens {
 public:
  // `key`: at least 16 bytes.
  explicit PortTokens(std::string key);

  std::string Sign(const PortGrant& grant) const;
  // The grant a token carries. UNAUTHENTICATED naming what is wrong: malformed, a
  // signature that does not match (forged or altered), or expired at `now`.
  [[nodiscard]] absl::StatusOr<PortGrant> Verify(absl::string_view token, absl::Time now) const;

 private:
  std::string Mac(absl::string_view payload) const;
  std::string key_;
};

}  // namespace sbx::server

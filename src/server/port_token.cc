#include "src/server/port_token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sbx::server {

PortTokens::PortTokens(std::string key) : key_(std::move(key)) {
  if (key_.size() < 16) std::abort();  // an invariant: the key comes from SandboxSecrets
}

std::string PortTokens::Mac(absl::string_view payload) const {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
           reinterpret_cast<const unsigned char*>(payload.data()), payload.size(), out,
           &len) == nullptr) {
    std::abort();  // only on allocation failure inside OpenSSL
  }
  return std::string(reinterpret_cast<const char*>(out), len);
}

std::string PortTokens::Sign(const PortGrant& grant) const {
  const std::string payload = absl::StrCat("v1|", grant.owner, "|", grant.claim_id, "|", grant.port,
                                           "|", absl::ToUnixSeconds(grant.expires));
  return absl::StrCat(absl::WebSafeBase64Escape(payload), ".",
                      absl::WebSafeBase64Escape(Mac(payload)));
}

absl::StatusOr<PortGrant> PortTokens::Verify(absl::string_view token, absl::Time now) const {
  const size_t dot = token.find('.');
  std::string payload, mac;
  if (token.size() > 1024 || dot == absl::string_view::npos ||
      !absl::WebSafeBase64Unescape(token.substr(0, dot), &payload) ||
      !absl::WebSafeBase64Unescape(token.substr(dot + 1), &mac)) {
    return absl::UnauthenticatedError("port URL token is malformed");
  }
  const std::string want = Mac(payload);
  if (mac.size() != want.size() || CRYPTO_memcmp(mac.data(), want.data(), want.size()) != 0) {
    return absl::UnauthenticatedError("port URL token has a bad signature");
  }
  std::vector<absl::string_view> parts = absl::StrSplit(payload, '|');
  PortGrant grant;
  int64_t expires = 0;
  if (parts.size() != 5 || parts[0] != "v1" || !absl::SimpleAtoi(parts[3], &grant.port) ||
      !absl::SimpleAtoi(parts[4], &expires)) {
    return absl::UnauthenticatedError("port URL token is malformed");
  }
  grant.owner = std::string(parts[1]);
  grant.claim_id = std::string(parts[2]);
  grant.expires = absl::FromUnixSeconds(expires);
  if (now >= grant.expires) {
    return absl::UnauthenticatedError(
        absl::StrCat("port URL token expired at ", absl::FormatTime(grant.expires)));
  }
  return grant;
}

}  // namespace sbx::server

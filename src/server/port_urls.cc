// SandboxService.GetPortUrl: signed URLs of the port proxy (port_token.h).
#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "src/common/status_macros.h"
#include "src/server/call.h"
#include "src/server/convert.h"
#include "src/server/sandbox_service.h"

namespace sbx::server {
namespace {

bool IsDnsLabel(absl::string_view s) {
  if (s.empty() || s.size() > 63 || s.front() == '-' || s.back() == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-';
  });
}

}  // namespace

grpc::ServerUnaryReactor* SandboxService::GetPortUrl(grpc::CallbackServerContext* ctx,
                                                     const v1::GetPortUrlRequest* req,
                                                     v1::GetPortUrlResponse* resp) {
  auto run = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(Caller caller, Authorize(*auth_, ctx, false, "GetPortUrl"));
    if (port_urls_.tokens == nullptr) {
      return absl::FailedPreconditionError(
          "this server runs no port proxy (start sbx-server with --proxy_listen)");
    }
    if (req->port() < 1 || req->port() > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("port ", req->port(), " is not in 1..65535"));
    }
    absl::Duration ttl = absl::Hours(1);
    if (req->has_ttl()) {
      ttl = absl::Seconds(req->ttl().seconds()) + absl::Nanoseconds(req->ttl().nanos());
      if (ttl < absl::Seconds(1) || ttl > kMaxPortTokenTtl) {
        return absl::InvalidArgumentError(absl::StrCat("ttl ", absl::FormatDuration(ttl),
                                                       " is not in 1s..",
                                                       absl::FormatDuration(kMaxPortTokenTtl)));
      }
    }
    // The claim must be the caller's and active now (the proxy checks again per connection).
    ASSIGN_OR_RETURN(store::ClaimRecord claim, ActiveClaim(caller, req->claim_id()));
    PortGrant grant;
    grant.owner = claim.owner;
    grant.claim_id = claim.id;
    grant.port = req->port();
    grant.expires = absl::FromUnixSeconds(absl::ToUnixSeconds(absl::Now() + ttl));
    const std::string token = port_urls_.tokens->Sign(grant);
    resp->set_token(token);
    resp->set_url(absl::StrCat(port_urls_.base_url, "/_sbx/", claim.id, "/", grant.port,
                               "/?sbx_token=", token));
    if (!port_urls_.domain.empty() && IsDnsLabel(claim.id)) {
      const absl::string_view base = port_urls_.base_url;
      const absl::string_view scheme = base.substr(0, base.find("://"));
      resp->set_host_url(absl::StrCat(scheme, "://", grant.port, "-", claim.id, ".",
                                      port_urls_.domain, port_urls_.host_port_suffix,
                                      "/?sbx_token=", token));
    }
    ToProto(grant.expires, resp->mutable_expires_at());
    return absl::OkStatus();
  };
  return FinishNow(ctx, run());
}

}  // namespace sbx::server

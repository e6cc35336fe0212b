#include "src/cmd/e2b_wiring.h"

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "src/common/status_macros.h"

namespace sbx::cmd {

// The label whose HMAC under the sandbox key is a sandbox's envd access token (the spaces
// keep it apart from every sandbox's own secret and the port URL key: no sandbox id has
// one).
inline constexpr char kEnvdTokenLabel[] = "sbx e2b envd token ";

void AddE2bFlags(CLI::App& app, E2bFlags* flags) {
  app.add_option("--e2b_listen", flags->front.listen,
                 "host:port of the E2B-compatible API (control plane REST and envd; "
                 "docs/e2b.md; empty: none)");
  app.add_option("--e2b_domain", flags->front.domain,
                 "sandbox domain the E2B API answers (clients reach ports at "
                 "PORT-ID.<domain>; empty: none)");
  app.add_option("--e2b_port_file", flags->port_file, "file to write the E2B API's port to");
  app.add_option("--e2b_default_timeout_s", flags->front.default_timeout_s,
                 "a sandbox's timeout when an E2B create gives none")
      ->capture_default_str();
  app.add_option("--e2b_call_timeout_s", flags->call_timeout_s,
                 "deadline of the calls behind an E2B request (a create waits for a "
                 "sandbox within it)")
      ->capture_default_str();
}

absl::StatusOr<RunningE2b> StartE2b(const E2bFlags& flags,
                                    const server::ServerOptions& server_options,
                                    server::Server& server, const SandboxSecrets& secrets,
                                    gateway::PortProxy* proxy) {
  const server::AuthOptions& auth = server_options.auth;
  RunningE2b out;
  if (flags.front.listen.empty()) return out;
  e2b::FrontOptions options = flags.front;
  if (!(flags.call_timeout_s > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--e2b_call_timeout_s ", flags.call_timeout_s, " is not positive"));
  }
  options.call_timeout = absl::Seconds(flags.call_timeout_s);
  options.tls_cert_file = server_options.tls_cert_file;
  options.tls_key_file = server_options.tls_key_file;
  e2b::FrontDeps deps;
  deps.channel = server.InProcessChannel();
  // A newline separates the id from the tenant: neither may hold one.
  deps.access_token = [secrets](absl::string_view id, absl::string_view tenant) {
    return secrets.For(absl::StrCat(kEnvdTokenLabel, id, "\n", tenant));
  };
  ASSIGN_OR_RETURN(std::unique_ptr<server::Authenticator> authenticator,
                   server::Authenticator::Create(auth));
  out.auth = std::move(authenticator);
  deps.bearer_of = [a = out.auth](absl::string_view tenant) { return a->BearerOf(tenant); };
  deps.tenant_of = [a = out.auth](absl::string_view key) -> std::optional<std::string> {
    absl::StatusOr<server::Caller> caller = a->Authenticate(absl::StrCat("Bearer ", key));
    if (!caller.ok()) return std::nullopt;
    return caller->tenant;
  };
  if (proxy != nullptr) {
    // Port traffic at the E2B listener is served in place by the port proxy.
    deps.hand_port = [proxy](e2b::PortConnection c) {
      gateway::HandOff h;
      h.fd = c.fd;
      h.read = std::move(c.read);
      h.claim_id = std::move(c.sandbox_id);
      h.port = c.port;
      h.tenant = std::move(c.tenant);
      h.strip_headers = std::move(c.strip_headers);
      h.admit_later = std::move(c.admit_later);
      proxy->Adopt(std::move(h));
    };
  }
  ASSIGN_OR_RETURN(out.front, e2b::Front::Start(options, std::move(deps)));
  e2b::Front* front = out.front.get();
  if (!flags.port_file.empty()) {
    const std::string tmp = flags.port_file + ".tmp";
    std::ofstream(tmp) << front->port() << "\n";
    if (std::rename(tmp.c_str(), flags.port_file.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot write --e2b_port_file ", flags.port_file));
    }
  }
  return out;
}

}  // namespace sbx::cmd

#pragma once
// envd, E2B's in-sandbox API, on sbx's SandboxService. Internal to src/gateway/e2b.
//
// A request for a sandbox names it by the header E2b-Sandbox-Id and proves the right to
// it by X-Access-Token, the envdAccessToken the control plane issued for it:
// "<tenant>~<HMAC>" (FrontDeps::access_token of the sandbox id and tenant). The call is
// then made as that tenant (FrontDeps::bearer_of), so sbx checks ownership once more.
//
// Served: process.Process (Start, Connect, List, SendInput, SendSignal, Update,
// CloseStdin) and GET /health. docs/e2b.md has the table.
//
// Thread-safety: Handle may be called concurrently.

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "sbx/v1/sandboxes.grpc.pb.h"
#include "src/gateway/e2b/e2b.h"
#include "src/gateway/e2b/http.h"

namespace sbx::e2b {

// An E2B path as sbx's RPCs take it: /home/user/... and /run/sbx/workspace/... become
// paths relative to the sandbox's workspace, relative paths stay relative to it, other
// absolute paths stay absolute (resolved by sbx in the sandbox's own root). A NUL byte is
// INVALID_ARGUMENT naming `what`.
[[nodiscard]] absl::StatusOr<std::string> WorkspacePath(absl::string_view what,
                                                        absl::string_view path);
// A path sbx answered as E2B shows it: a workspace-relative one under /home/user, an
// absolute one as it is.
std::string E2bPath(absl::string_view relative);
grpc::Status ToGrpc(const absl::Status& s);

// E2B sandbox ids of sbx claims. A claim of a batch, "<batch_id>#<i>" (Fork's forks),
// is neither a DNS label (the host form PORT-ID.DOMAIN) nor a plain path segment: when
// its batch id is 32 lower-case hex digits (the front's own forks) it is shown to E2B
// clients as "<batch_id>-<i>". ClaimIdOf is the inverse; other ids are the same both ways.
std::string E2bSandboxId(absl::string_view claim_id);
std::string ClaimIdOf(absl::string_view sandbox_id);

// The envd access token of sandbox `id` owned by `tenant`.
std::string EnvdAccessToken(const FrontDeps& deps, absl::string_view id, absl::string_view tenant);

// Which sandbox and port a request is for: by the headers E2b-Sandbox-Id and
// E2b-Sandbox-Port (default envd's, 49983), or by a Host of PORT-ID.<domain> (any port;
// `domain` empty: not by host). nullopt: not for a sandbox (a control-plane request).
struct SandboxAddress {
  std::string id;
  int port = 0;
};
inline constexpr int kEnvdPortNumber = 49983;
std::optional<SandboxAddress> AddressOf(const HttpRequest& req, absl::string_view domain);

class Envd {
 public:
  Envd(FrontOptions options, FrontDeps deps);

  // Answers a request for a sandbox: envd's API on its port; for another port, hands the
  // connection to the port proxy (FrontDeps::hand_port), or on a TLS listener redirects
  // to it (the sandbox's port through a URL token, SandboxService.GetPortUrl).
  void Handle(const HttpRequest& req, HttpResponder& out, const SandboxAddress& addr);

 private:
  struct Target {
    std::string sandbox_id;
    std::string bearer;  // "Bearer <token>", or "" (a server without auth)
  };
  // The sandbox and the credential to reach it with; on failure answers a Connect error
  // (unauthenticated) and returns nullopt.
  std::optional<Target> Authorize(const HttpRequest& req, const std::string& id,
                                  HttpResponder& out);
  // The tenant whose access token of sandbox `id` `token` is; nullopt when it is none.
  std::optional<std::string> TenantOfAccessToken(absl::string_view id,
                                                 absl::string_view token) const;
  void PortTraffic(const HttpRequest& req, HttpResponder& out, const SandboxAddress& addr);
  void PortRedirect(const Target& t, int port, const HttpRequest& req, HttpResponder& out);
  void Prepare(const Target& t, absl::Duration timeout, grpc::ClientContext* ctx) const;

  void ProcessStart(const Target& t, const HttpRequest& req, HttpResponder& out);
  void ProcessConnect(const Target& t, const HttpRequest& req, HttpResponder& out);
  void ProcessList(const Target& t, const HttpRequest& req, HttpResponder& out);
  void ProcessSendInput(const Target& t, const HttpRequest& req, HttpResponder& out);
  void ProcessSendSignal(const Target& t, const HttpRequest& req, HttpResponder& out);
  void ProcessUpdate(const Target& t, const HttpRequest& req, HttpResponder& out);
  void ProcessCloseStdin(const Target& t, const HttpRequest& req, HttpResponder& out);

  // files.cc: REST /files and the Filesystem service.
  void FilesGet(const Target& t, const HttpRequest& req, HttpResponder& out);
  void FilesPost(const Target& t, const HttpRequest& req, HttpResponder& out);
  void FsStat(const Target& t, const HttpRequest& req, HttpResponder& out);
  void FsMakeDir(const Target& t, const HttpRequest& req, HttpResponder& out);
  void FsMove(const Target& t, const HttpRequest& req, HttpResponder& out);
  void FsListDir(const Target& t, const HttpRequest& req, HttpResponder& out);
  void FsRemove(const Target& t, const HttpRequest& req, HttpResponder& out);
  void FsWatchDir(const Target& t, const HttpRequest& req, HttpResponder& out);
  // Uploads `reader`'s bytes (or `data`) to `path` (workspace-relative).
  grpc::Status Upload(const Target& t, const std::string& path, BodyReader* reader,
                      absl::string_view data);

  const FrontOptions options_;
  const FrontDeps deps_;
  std::unique_ptr<v1::SandboxService::Stub> sandboxes_;
};

}  // namespace sbx::e2b

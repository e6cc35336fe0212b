// `sbx url`: a signed URL of a port inside a claimed sandbox (SandboxService.GetPortUrl,
// through sbx-server's port proxy).
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "src/cmd/sbx_cli_commands.h"

namespace sbx::cli {
namespace {

struct UrlArgs {
  std::string id;
  int port = 0;
  std::string ttl;
  bool host_form = false;
};

absl::StatusOr<int> RunUrl(Context& ctx, const UrlArgs& a) {
  auto connected = ctx.Connect();
  if (!connected.ok()) return connected.status();
  Client& client = **connected;
  v1::GetPortUrlRequest req;
  req.set_claim_id(a.id);
  req.set_port(a.port);
  if (!a.ttl.empty()) ToProto(ParseDurationFlag(a.ttl), req.mutable_ttl());
  v1::GetPortUrlResponse resp;
  absl::Status status = client.Call(
      [&](grpc::ClientContext* c) { return client.sandboxes().GetPortUrl(c, req, &resp); });
  if (!status.ok()) return status;
  if (ctx.json()) {
    PrintJson(resp);
    return 0;
  }
  if (a.host_form && resp.host_url().empty()) {
    return absl::FailedPreconditionError(
        "no host-form URL: the proxy has no --proxy_domain, or the claim id is not a DNS label");
  }
  std::printf("%s\n", (a.host_form ? resp.host_url() : resp.url()).c_str());
  return 0;
}

}  // namespace

void AddPortCommands(CLI::App& app, Context& ctx, Actions& actions) {
  auto a = std::make_shared<UrlArgs>();
  CLI::App* sub = app.add_subcommand(
      "url",
      "Print a signed URL at which PORT inside a claimed sandbox is reachable through the "
      "server's port proxy, by whoever holds it, until it expires (sbx-server --proxy_listen)");
  sub->add_option("id", a->id, "Claim id")->required();
  sub->add_option("port", a->port, "TCP port inside the sandbox")
      ->required()
      ->check(CLI::Range(1, 65535));
  sub->add_option("--ttl", a->ttl, "How long the URL works, e.g. 10m (default 1h, at most 168h)")
      ->check(DurationCheck());
  sub->add_flag("--host", a->host_form,
                "The host form PORT-CLAIM.DOMAIN (needs the proxy's --proxy_domain)");
  actions[sub] = [&ctx, a] { return RunUrl(ctx, *a); };
}

}  // namespace sbx::cli

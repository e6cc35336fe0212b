#include "src/cmd/proxy_wiring.h"

#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/metric_family.h"
#include "src/common/status_macros.h"
#include "src/server/port_token.h"

namespace sbx::cmd {

// The label whose HMAC under the sandbox key is the key of the port URL tokens (the space
// keeps it apart from every sandbox's secret: no sandbox id has one).
inline constexpr char kPortTokenKeyLabel[] = "sbx port url key";

void AddProxyFlags(CLI::App& app, ProxyFlags* flags) {
  app.add_option("--proxy_listen", flags->proxy.listen,
                 "host:port of the port proxy (HTTP, WebSocket, CONNECT to ports inside "
                 "sandboxes; empty: none)");
  app.add_option("--proxy_domain", flags->proxy.domain,
                 "wildcard DNS domain of the proxy's host form PORT-CLAIM.<domain> (empty: "
                 "path form /_sbx/CLAIM/PORT/ only)");
  app.add_option("--proxy_public_url", flags->public_url,
                 "URL clients reach the proxy at, for GetPortUrl (default http://<listen>)");
  app.add_option("--proxy_port_file", flags->port_file, "file to write the proxy's port to");
  app.add_option("--proxy_header_timeout_s", flags->header_timeout_s,
                 "a request header must arrive within this (slowloris)")
      ->capture_default_str();
  app.add_option("--proxy_idle_timeout_s", flags->idle_timeout_s,
                 "a proxied connection idle this long is closed")
      ->capture_default_str();
  app.add_option("--proxy_max_header_bytes", flags->proxy.max_header_bytes,
                 "largest request header (431 beyond)")
      ->capture_default_str();
  app.add_option("--proxy_max_connections_per_sandbox", flags->proxy.max_connections_per_sandbox,
                 "proxied connections open at once to one sandbox (429 beyond)")
      ->capture_default_str();
  app.add_option("--proxy_max_connections_per_tenant", flags->proxy.max_connections_per_tenant,
                 "proxied connections open at once of one tenant (429 beyond)")
      ->capture_default_str();
  app.add_option("--proxy_max_connections", flags->proxy.max_connections,
                 "client connections the proxy holds at once (more are closed at accept)")
      ->capture_default_str();
  app.add_option("--proxy_max_bytes_per_second", flags->proxy.max_bytes_per_second,
                 "bytes per second one proxied connection may move in each direction, with a "
                 "burst of one second's worth; slowed, not closed (0: no limit)")
      ->capture_default_str();
}

absl::StatusOr<RunningProxy> StartProxy(const ProxyFlags& flags, const server::AuthOptions& auth,
                                        const SandboxSecrets& secrets,
                                        allocator::Allocator* allocator,
                                        server::PortUrlOptions* urls,
                                        gateway::ProxyCounters* counters) {
  RunningProxy out;
  if (flags.proxy.listen.empty()) return out;
  gateway::ProxyOptions options = flags.proxy;
  options.header_timeout = absl::Seconds(flags.header_timeout_s);
  options.idle_timeout = absl::Seconds(flags.idle_timeout_s);
  ASSIGN_OR_RETURN(out.auth, server::Authenticator::Create(auth));
  out.tokens = std::make_shared<server::PortTokens>(secrets.For(kPortTokenKeyLabel));
  gateway::ProxyDeps deps;
  deps.allocator = allocator;
  deps.auth = out.auth.get();
  deps.tokens = out.tokens.get();
  deps.sandbox_secret = [secrets](absl::string_view id) { return secrets.For(id); };
  deps.counters = counters;
  ASSIGN_OR_RETURN(out.proxy, gateway::PortProxy::Start(options, std::move(deps)));
  const std::string port = std::to_string(out.proxy->port());
  urls->tokens = out.tokens;
  urls->domain = options.domain;
  if (flags.public_url.empty()) {
    const std::string host = options.listen.substr(0, options.listen.rfind(':'));
    urls->base_url = absl::StrCat("http://", host.empty() ? "127.0.0.1" : host, ":", port);
    urls->host_port_suffix = absl::StrCat(":", port);
  } else {
    urls->base_url = flags.public_url;
    while (!urls->base_url.empty() && urls->base_url.back() == '/') urls->base_url.pop_back();
    const size_t scheme = urls->base_url.find("://");
    const size_t colon = urls->base_url.rfind(':');
    urls->host_port_suffix =
        colon != std::string::npos && colon > scheme + 2 ? urls->base_url.substr(colon) : "";
  }
  if (!flags.port_file.empty()) {
    const std::string tmp = flags.port_file + ".tmp";
    std::ofstream(tmp) << port << "\n";
    if (std::rename(tmp.c_str(), flags.port_file.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("cannot write --proxy_port_file ", flags.port_file));
    }
  }
  return out;
}

namespace {

class ProxyCollectorImpl final : public prometheus::Collectable {
 public:
  explicit ProxyCollectorImpl(const gateway::ProxyCounters* c) : c_(c) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    auto one = [&](const char* name, const char* help, prometheus::MetricType type, double value) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = type;
      prometheus::ClientMetric m;
      if (type == prometheus::MetricType::Counter) {
        m.counter.value = value;
      } else {
        m.gauge.value = value;
      }
      f.metric.push_back(m);
      out.push_back(std::move(f));
    };
    one("sbx_proxy_connections", "Client connections the port proxy holds open now",
        prometheus::MetricType::Gauge, static_cast<double>(c_->open.load()));
    one("sbx_proxy_accepted_total", "Client connections the port proxy accepted",
        prometheus::MetricType::Counter, static_cast<double>(c_->accepted.load()));
    one("sbx_proxy_forwarded_total",
        "Client connections the port proxy joined to a port inside a sandbox",
        prometheus::MetricType::Counter, static_cast<double>(c_->forwarded.load()));
    prometheus::MetricFamily refused;
    refused.name = "sbx_proxy_refused_total";
    refused.help = "Requests the port proxy answered itself, never reaching a sandbox, by reason";
    refused.type = prometheus::MetricType::Counter;
    for (int i = 0; i < gateway::kProxyRefusals; ++i) {
      prometheus::ClientMetric m;
      m.label.push_back(
          {"reason", gateway::ProxyRefusalName(static_cast<gateway::ProxyRefusal>(i))});
      m.counter.value = static_cast<double>(c_->refused[i].load());
      refused.metric.push_back(std::move(m));
    }
    out.push_back(std::move(refused));
    return out;
  }

 private:
  const gateway::ProxyCounters* const c_;
};

}  // namespace

std::shared_ptr<prometheus::Collectable> ProxyCollector(const gateway::ProxyCounters* counters) {
  return std::make_shared<ProxyCollectorImpl>(counters);
}

}  // namespace sbx::cmd

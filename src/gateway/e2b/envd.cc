#include "src/gateway/e2b/envd.h"

#include <algorithm>
#include <deque>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "e2b/envd/filesystem.pb.h"
#include "e2b/envd/process.pb.h"
#include "src/common/ids.h"
#include "src/gateway/e2b/connect.h"
#include "src/gateway/e2b/control_plane.h"

namespace sbx::e2b {

namespace {

// Output events a relay holds for a slow client before it stops reading from sbx (which
// then keeps the rest in the process's replay ring, dropping the oldest beyond it).
constexpr size_t kRelayQueue = 64;
// The longest a process stream may last when the client sets no timeout.
constexpr absl::Duration kMaxStream = absl::Hours(24);

bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

grpc::Status Unauthenticated(absl::string_view why) {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(why));
}

// envd's selector as sbx's; false for one with neither pid nor tag.
bool ToSelector(const process::ProcessSelector& in, v1::ProcessSelector* out) {
  switch (in.selector_case()) {
    case process::ProcessSelector::kPid:
      out->set_pid(static_cast<int32_t>(in.pid()));
      return true;
    case process::ProcessSelector::kTag:
      out->set_tag(in.tag());
      return true;
    default:
      return false;
  }
}

const grpc::Status kNoSelector(grpc::StatusCode::INVALID_ARGUMENT,
                               "the request names no process (selector: pid or tag)");

// An sbx process event as envd's; false for one envd has no counterpart of (dropped).
bool ToEnvdEvent(const v1::ProcessEvent& in, process::ProcessEvent* out) {
  switch (in.kind_case()) {
    case v1::ProcessEvent::kStarted:
      out->mutable_start()->set_pid(static_cast<uint32_t>(in.started().pid()));
      return true;
    case v1::ProcessEvent::kStdout:
      out->mutable_data()->set_stdout(in.stdout());
      return true;
    case v1::ProcessEvent::kStderr:
      out->mutable_data()->set_stderr(in.stderr());
      return true;
    case v1::ProcessEvent::kPty:
      out->mutable_data()->set_pty(in.pty());
      return true;
    case v1::ProcessEvent::kExit: {
      // As envd reports Go's ProcessState: an exit code, or -1 and the signal.
      auto* end = out->mutable_end();
      if (in.exit().status_case() == v1::ProcessExit::kSignal) {
        end->set_exit_code(-1);
        end->set_exited(false);
        end->set_status(absl::StrCat("signal: ", in.exit().signal()));
      } else {
        end->set_exit_code(in.exit().exit_code());
        end->set_exited(true);
        end->set_status(absl::StrCat("exit status ", in.exit().exit_code()));
      }
      return true;
    }
    default:
      return false;
  }
}

// Relays an sbx process stream to the client as envd's StartResponse / ConnectResponse
// (both are {event}), with a keepalive event whenever `keepalive` passes without one. A
// thread of its own reads from sbx, so that keepalives go out while the process is
// silent, and a client that has gone is noticed (the next write fails) and the call
// cancelled.
template <typename Response, typename Event, typename Convert, typename Keepalive>
void Relay(grpc::ClientContext* ctx, std::unique_ptr<grpc::ClientReader<Event>> reader,
           absl::Duration keepalive, StreamWriter& w, Convert convert, Keepalive set_keepalive) {
  struct Queue {
    absl::Mutex mu;
    std::deque<Event> items ABSL_GUARDED_BY(mu);
    bool done ABSL_GUARDED_BY(mu) = false;
    bool gone ABSL_GUARDED_BY(mu) = false;
    grpc::Status status ABSL_GUARDED_BY(mu);
  } q;
  std::thread producer([&] {
    Event ev;
    while (reader->Read(&ev)) {
      absl::MutexLock lock(&q.mu);
      q.mu.Await(absl::Condition(
          +[](Queue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu) {
            return q->gone || q->items.size() < kRelayQueue;
          },
          &q));
      if (q.gone) break;
      q.items.push_back(std::move(ev));
    }
    grpc::Status s = reader->Finish();
    absl::MutexLock lock(&q.mu);
    q.status = std::move(s);
    q.done = true;
  });
  grpc::Status final_status;
  bool client_gone = !w.Start();
  while (!client_gone) {
    std::optional<Event> ev;
    bool done = false;
    {
      absl::MutexLock lock(&q.mu);
      q.mu.AwaitWithTimeout(absl::Condition(
                                +[](Queue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu) {
                                  return q->done || !q->items.empty();
                                },
                                &q),
                            keepalive);
      if (!q.items.empty()) {
        ev = std::move(q.items.front());
        q.items.pop_front();
      } else if (q.done) {
        done = true;
        final_status = q.status;
      }
    }
    if (done) break;
    Response res;
    if (ev.has_value()) {
      if (!convert(*ev, &res)) continue;
    } else {
      set_keepalive(&res);
    }
    client_gone = !w.Send(res);
  }
  if (client_gone) {
    ctx->TryCancel();
    absl::MutexLock lock(&q.mu);
    q.gone = true;
  }
  producer.join();
  if (!client_gone) w.End(final_status);
}

template <typename Response>
bool ProcessConvert(const v1::ProcessEvent& ev, Response* res) {
  return ToEnvdEvent(ev, res->mutable_event());
}
template <typename Response>
void ProcessKeepalive(Response* res) {
  res->mutable_event()->mutable_keepalive();
}

absl::Duration KeepaliveOf(const HttpRequest& req) {
  int seconds = 0;
  if (auto h = req.Header("keepalive-ping-interval");
      h.has_value() && absl::SimpleAtoi(*h, &seconds)) {
    return absl::Seconds(std::clamp(seconds, 1, 300));
  }
  return absl::Seconds(50);
}

}  // namespace

// E2B clients name absolute paths. sbx's process and file RPCs take a path relative to
// the sandbox's workspace (which is $HOME inside, /run/sbx/workspace), or an absolute path
// resolved in the sandbox's own root as its processes see it, never outside it
// (docs/api.md "Files"). E2B's home of its default user, /home/user, and the workspace's
// own path map onto the workspace (so that E2B programs find their files in the
// workspace that sbx's own calls and tar transfers use); every other absolute path goes
// on as it is.
static constexpr absl::string_view kWorkspaceAliases[] = {"/home/user", "/run/sbx/workspace"};

absl::StatusOr<std::string> WorkspacePath(absl::string_view what, absl::string_view path) {
  if (path.empty() || path.front() != '/') return std::string(path);
  for (absl::string_view alias : kWorkspaceAliases) {
    if (path == alias) return std::string();
    if (absl::StartsWith(path, alias) && path[alias.size()] == '/') {
      absl::string_view rest = path.substr(alias.size());
      while (!rest.empty() && rest.front() == '/') rest.remove_prefix(1);
      return std::string(rest);
    }
  }
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " holds a NUL byte"));
  }
  return std::string(path);
}

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::string E2bPath(absl::string_view relative) {
  if (!relative.empty() && relative.front() == '/') return std::string(relative);
  return relative.empty() ? std::string("/home/user") : absl::StrCat("/home/user/", relative);
}

namespace {

// 32 lower-case hex digits: a batch id the front made (or a claim id the server made).
bool IsHex32(absl::string_view s) {
  return s.size() == 32 && std::all_of(s.begin(), s.end(), [](char c) {
           return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
         });
}

// "<hex32><sep><digits>" split at `sep`; false for anything else.
bool SplitBatchMember(absl::string_view id, char sep, absl::string_view* batch,
                      absl::string_view* index) {
  if (id.size() < 34 || id[32] != sep) return false;
  *batch = id.substr(0, 32);
  *index = id.substr(33);
  return IsHex32(*batch) && !index->empty() && index->size() <= 9 &&
         std::all_of(index->begin(), index->end(), absl::ascii_isdigit);
}

}  // namespace

std::string E2bSandboxId(absl::string_view claim_id) {
  absl::string_view batch, index;
  if (!SplitBatchMember(claim_id, '#', &batch, &index)) return std::string(claim_id);
  return absl::StrCat(batch, "-", index);
}

std::string ClaimIdOf(absl::string_view sandbox_id) {
  absl::string_view batch, index;
  if (!SplitBatchMember(sandbox_id, '-', &batch, &index)) return std::string(sandbox_id);
  return absl::StrCat(batch, "#", index);
}

std::string EnvdAccessToken(const FrontDeps& deps, absl::string_view id, absl::string_view tenant) {
  return absl::StrCat(tenant, "~", deps.access_token(id, tenant));
}

Envd::Envd(FrontOptions options, FrontDeps deps)
    : options_(std::move(options)),
      deps_(std::move(deps)),
      sandboxes_(v1::SandboxService::NewStub(deps_.channel)) {}

std::optional<SandboxAddress> AddressOf(const HttpRequest& req, absl::string_view domain) {
  if (auto id = req.Header("e2b-sandbox-id"); id.has_value()) {
    SandboxAddress a{std::string(*id), kEnvdPortNumber};
    if (auto port = req.Header("e2b-sandbox-port"); port.has_value()) {
      if (!absl::SimpleAtoi(*port, &a.port)) a.port = -1;  // refused by the handler
    }
    return a;
  }
  if (domain.empty()) return std::nullopt;
  absl::string_view host = req.Header("host").value_or("");
  if (const size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  // PORT-ID.<domain>, case-insensitively for the domain (host names are).
  if (host.size() <= domain.size() + 1 || host[host.size() - domain.size() - 1] != '.' ||
      !absl::EqualsIgnoreCase(host.substr(host.size() - domain.size()), domain)) {
    return std::nullopt;
  }
  const absl::string_view label = host.substr(0, host.size() - domain.size() - 1);
  const size_t dash = label.find('-');
  SandboxAddress a;
  if (dash == absl::string_view::npos || !absl::SimpleAtoi(label.substr(0, dash), &a.port)) {
    return std::nullopt;
  }
  a.id = std::string(label.substr(dash + 1));
  return a;
}

namespace {

std::optional<std::string> TenantOfToken(const FrontDeps& deps, absl::string_view id,
                                         absl::string_view token) {
  const size_t sep = token.rfind('~');
  if (token.empty() || sep == absl::string_view::npos) return std::nullopt;
  const absl::string_view tenant = token.substr(0, sep);
  if (!ConstantTimeEqual(token, EnvdAccessToken(deps, id, tenant))) return std::nullopt;
  return std::string(tenant);
}

// The tenant whose right to a port of sandbox `id` the request's credential proves: the
// sandbox's access token (X-Access-Token), or else an API key (X-API-Key; the proxy then
// checks that this tenant owns the claim). UNAUTHENTICATED naming what is wrong.
absl::StatusOr<std::string> PortCaller(const FrontDeps& deps, const HttpRequest& req,
                                       absl::string_view id, int port) {
  if (auto token = req.Header("x-access-token"); token.has_value()) {
    std::optional<std::string> t = TenantOfToken(deps, id, *token);
    if (!t.has_value()) {
      return absl::UnauthenticatedError(
          absl::StrCat("X-Access-Token is not the access token of sandbox \"", id, "\""));
    }
    return *std::move(t);
  }
  if (auto key = req.Header("x-api-key"); key.has_value()) {
    std::optional<std::string> t = deps.tenant_of(*key);
    if (!t.has_value()) return absl::UnauthenticatedError("X-API-Key is not a valid API key");
    return *std::move(t);
  }
  return absl::UnauthenticatedError(
      absl::StrCat("port ", port, " of sandbox \"", id,
                   "\" needs the sandbox's X-Access-Token (its envdAccessToken) or its owner's "
                   "X-API-Key"));
}

}  // namespace

std::optional<std::string> Envd::TenantOfAccessToken(absl::string_view id,
                                                     absl::string_view token) const {
  return TenantOfToken(deps_, id, token);
}

void Envd::PortTraffic(const HttpRequest& req, HttpResponder& out, const SandboxAddress& addr) {
  if (addr.port < 1 || addr.port > 65535) {
    RespondError(out, 400, absl::StrCat("port ", addr.port, " is not 1..65535"));
    return;
  }
  if (!ValidateKey("sandbox id", E2bSandboxId(addr.id)).ok()) {
    RespondError(out, 404, absl::StrCat("sandbox \"", addr.id, "\" not found"));
    return;
  }
  // Who asks: the holder of the sandbox's access token, or a tenant by its API key (the
  // proxy then checks that this tenant owns the claim: another's is a 404).
  absl::StatusOr<std::string> caller = PortCaller(deps_, req, addr.id, addr.port);
  if (!caller.ok()) {
    RespondError(out, 401, caller.status().message());
    return;
  }
  std::string tenant = *std::move(caller);
  if (!req.take_connection) {
    // A TLS listener cannot hand its connection on: redirect to the proxy instead.
    std::optional<std::string> bearer = deps_.bearer_of(tenant);
    if (!bearer.has_value()) {
      RespondError(out, 401, "the sandbox's tenant has no API key any more");
      return;
    }
    return PortRedirect(Target{addr.id, *std::move(bearer)}, addr.port, req, out);
  }
  if (!deps_.hand_port) {
    RespondError(out, 409,
                 "port traffic goes through sbx's port proxy, which is off: start sbx-server "
                 "with --proxy_listen");
    return;
  }
  TakenConnection taken = req.take_connection();
  if (taken.fd < 0) {
    RespondError(out, 500, "the connection could not be handed to the port proxy");
    return;
  }
  PortConnection c;
  c.fd = taken.fd;
  c.read = std::move(taken.read);
  c.sandbox_id = addr.id;
  c.port = addr.port;
  c.tenant = std::move(tenant);
  c.strip_headers = {"x-access-token", "x-api-key"};
  // A later request on the connection must be for this port and prove the same tenant's
  // right to it: a kept-alive connection may carry requests of several callers (a shared
  // client pool), and none may ride on another's credential.
  c.admit_later = [deps = deps_, domain = options_.domain, addr,
                   tenant = c.tenant](const HttpHeaders& fields) {
    HttpRequest next;
    next.headers = fields;
    std::optional<SandboxAddress> a = AddressOf(next, domain);
    if (!a.has_value() || ClaimIdOf(a->id) != addr.id || a->port != addr.port) return false;
    absl::StatusOr<std::string> caller = PortCaller(deps, next, addr.id, addr.port);
    return caller.ok() && *caller == tenant;
  };
  deps_.hand_port(std::move(c));
}

void Envd::PortRedirect(const Target& t, int port, const HttpRequest& req, HttpResponder& out) {
  grpc::ClientContext ctx;
  Prepare(t, options_.call_timeout, &ctx);
  v1::GetPortUrlRequest get;
  get.set_claim_id(t.sandbox_id);
  get.set_port(port);
  get.mutable_ttl()->set_seconds(3600);
  v1::GetPortUrlResponse res;
  grpc::Status s = sandboxes_->GetPortUrl(&ctx, get, &res);
  if (!s.ok()) {
    RespondError(out, HttpStatusOf(s.error_code()), s.error_message());
    return;
  }
  // The proxy's path form, ".../_sbx/ID/PORT/?sbx_token=T": keep the request's own path
  // and query, and the token.
  const std::string& url = res.url();
  const size_t q = url.find("/?sbx_token=");
  if (q == std::string::npos) {
    RespondError(out, 500, "the port proxy's URL has an unexpected form");
    return;
  }
  std::string location = absl::StrCat(url.substr(0, q), req.path.empty() ? "/" : req.path, "?");
  if (!req.query.empty()) absl::StrAppend(&location, req.query, "&");
  absl::StrAppend(&location, "sbx_token=", res.token());
  // 307 keeps the method and body.
  out.Respond(307, "text/plain", "the port is reached through sbx's port proxy\n",
              {{"Location", location}, {"Cache-Control", "no-store"}});
}

std::optional<Envd::Target> Envd::Authorize(const HttpRequest& req, const std::string& id,
                                            HttpResponder& out) {
  if (!ValidateKey("sandbox id", E2bSandboxId(id)).ok()) {
    RespondConnectError(out, grpc::Status(grpc::StatusCode::NOT_FOUND,
                                          absl::StrCat("sandbox \"", id, "\" not found")));
    return std::nullopt;
  }
  const absl::string_view token = req.Header("x-access-token").value_or("");
  if (token.empty() || token.rfind('~') == absl::string_view::npos) {
    RespondConnectError(out, Unauthenticated("missing or malformed X-Access-Token (the sandbox's "
                                             "envdAccessToken)"));
    return std::nullopt;
  }
  const std::optional<std::string> tenant = TenantOfAccessToken(id, token);
  if (!tenant.has_value()) {
    RespondConnectError(out,
                        Unauthenticated(absl::StrCat("X-Access-Token is not the access token of "
                                                     "sandbox \"",
                                                     id, "\"")));
    return std::nullopt;
  }
  std::optional<std::string> bearer = deps_.bearer_of(*tenant);
  if (!bearer.has_value()) {
    RespondConnectError(out, Unauthenticated("the sandbox's tenant has no API key any more"));
    return std::nullopt;
  }
  return Target{id, *std::move(bearer)};
}

void Envd::Prepare(const Target& t, absl::Duration timeout, grpc::ClientContext* ctx) const {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  if (!t.bearer.empty()) ctx->AddMetadata("authorization", t.bearer);
}

void Envd::Handle(const HttpRequest& req, HttpResponder& out, const SandboxAddress& shown) {
  // From here on the sandbox is named by its claim id (E2bSandboxId).
  SandboxAddress addr = shown;
  addr.id = ClaimIdOf(shown.id);
  if (addr.port != kEnvdPortNumber) return PortTraffic(req, out, addr);
  std::optional<Target> t = Authorize(req, addr.id, out);
  if (!t.has_value()) return;
  const std::string& p = req.path;
  if (p == "/health") {
    out.Respond(204, "", "");
    return;
  }
  if (p == "/files" && req.method == "GET") return FilesGet(*t, req, out);
  if (p == "/files" && req.method == "POST") return FilesPost(*t, req, out);
  if (p == "/filesystem.Filesystem/Stat") return FsStat(*t, req, out);
  if (p == "/filesystem.Filesystem/MakeDir") return FsMakeDir(*t, req, out);
  if (p == "/filesystem.Filesystem/Move") return FsMove(*t, req, out);
  if (p == "/filesystem.Filesystem/ListDir") return FsListDir(*t, req, out);
  if (p == "/filesystem.Filesystem/Remove") return FsRemove(*t, req, out);
  if (p == "/filesystem.Filesystem/WatchDir") return FsWatchDir(*t, req, out);
  if (p == "/process.Process/Start") return ProcessStart(*t, req, out);
  if (p == "/process.Process/Connect") return ProcessConnect(*t, req, out);
  if (p == "/process.Process/List") return ProcessList(*t, req, out);
  if (p == "/process.Process/SendInput") return ProcessSendInput(*t, req, out);
  if (p == "/process.Process/SendSignal") return ProcessSendSignal(*t, req, out);
  if (p == "/process.Process/Update") return ProcessUpdate(*t, req, out);
  if (p == "/process.Process/CloseStdin") return ProcessCloseStdin(*t, req, out);
  RespondConnectError(out, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                        absl::StrCat(req.method, " ", p,
                                                     " is not served by sbx's E2B front "
                                                     "(docs/e2b.md)")));
}

void Envd::ProcessStart(const Target& t, const HttpRequest& req, HttpResponder& out) {
  process::StartRequest in;
  if (!ParseStreamRequest(req, out, &in)) return;
  StreamWriter w(out);
  if (in.process().cmd().empty()) {
    w.End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "process.cmd is empty"));
    return;
  }
  v1::StartProcessRequest start;
  start.set_claim_id(t.sandbox_id);
  start.add_argv(in.process().cmd());
  for (const std::string& a : in.process().args()) start.add_argv(a);
  for (const auto& [k, v] : in.process().envs()) (*start.mutable_env())[k] = v;
  if (in.process().has_cwd()) {
    absl::StatusOr<std::string> cwd = WorkspacePath("cwd", in.process().cwd());
    if (!cwd.ok()) return w.End(ToGrpc(cwd.status()));
    start.set_cwd(*cwd);
  }
  if (in.has_tag()) start.set_tag(in.tag());
  if (in.has_pty()) {
    start.mutable_pty()->mutable_size()->set_cols(in.pty().size().cols());
    start.mutable_pty()->mutable_size()->set_rows(in.pty().size().rows());
  }
  // envd's default: stdin open unless the request says otherwise.
  start.set_stdin(!in.has_stdin() || in.stdin());
  grpc::ClientContext ctx;
  Prepare(t, ConnectTimeout(req, kMaxStream), &ctx);
  Relay<process::StartResponse>(&ctx, sandboxes_->StartProcess(&ctx, start), KeepaliveOf(req), w,
                                ProcessConvert<process::StartResponse>,
                                ProcessKeepalive<process::StartResponse>);
}

void Envd::ProcessConnect(const Target& t, const HttpRequest& req, HttpResponder& out) {
  process::ConnectRequest in;
  if (!ParseStreamRequest(req, out, &in)) return;
  StreamWriter w(out);
  v1::ConnectProcessRequest connect;
  connect.set_claim_id(t.sandbox_id);
  if (!ToSelector(in.process(), connect.mutable_process())) return w.End(kNoSelector);
  grpc::ClientContext ctx;
  Prepare(t, ConnectTimeout(req, kMaxStream), &ctx);
  Relay<process::ConnectResponse>(&ctx, sandboxes_->ConnectProcess(&ctx, connect), KeepaliveOf(req),
                                  w, ProcessConvert<process::ConnectResponse>,
                                  ProcessKeepalive<process::ConnectResponse>);
}

void Envd::FsWatchDir(const Target& t, const HttpRequest& req, HttpResponder& out) {
  filesystem::WatchDirRequest in;
  if (!ParseStreamRequest(req, out, &in)) return;
  StreamWriter w(out);
  absl::StatusOr<std::string> rel = WorkspacePath("path", in.path());
  if (!rel.ok()) return w.End(ToGrpc(rel.status()));
  v1::WatchDirRequest watch;
  watch.set_claim_id(t.sandbox_id);
  watch.set_path(*rel);
  watch.set_recursive(in.recursive());
  grpc::ClientContext ctx;
  Prepare(t, ConnectTimeout(req, kMaxStream), &ctx);
  // envd names an event's path relative to the watched folder.
  const std::string prefix = rel->empty() ? "" : *rel + "/";
  auto convert = [&prefix](const v1::WatchDirEvent& ev, filesystem::WatchDirResponse* res) {
    if (ev.ready()) {
      res->mutable_start();
      return true;
    }
    if (ev.overflow() || ev.type() == v1::FILE_EVENT_UNSPECIFIED) return false;
    auto* fs = res->mutable_filesystem();
    absl::string_view name = ev.path();
    if (absl::StartsWith(name, prefix)) name.remove_prefix(prefix.size());
    fs->set_name(std::string(name));
    // sbx's FileEventType values are envd's EventType values.
    fs->set_type(static_cast<filesystem::EventType>(ev.type()));
    return true;
  };
  Relay<filesystem::WatchDirResponse>(
      &ctx, sandboxes_->WatchDir(&ctx, watch), KeepaliveOf(req), w, convert,
      [](filesystem::WatchDirResponse* res) { res->mutable_keepalive(); });
}

void Envd::ProcessList(const Target& t, const HttpRequest& req, HttpResponder& out) {
  process::ListRequest in;
  if (!ParseUnary(req, out, &in)) return;
  grpc::ClientContext ctx;
  Prepare(t, options_.call_timeout, &ctx);
  v1::ListProcessesRequest list;
  list.set_claim_id(t.sandbox_id);
  v1::ListProcessesResponse res;
  grpc::Status s = sandboxes_->ListProcesses(&ctx, list, &res);
  if (!s.ok()) return RespondConnectError(out, s);
  process::ListResponse answer;
  for (const v1::ProcessInfo& p : res.processes()) {
    if (p.has_exit()) continue;  // envd lists running processes only
    process::ProcessInfo* info = answer.add_processes();
    info->set_pid(static_cast<uint32_t>(p.pid()));
    if (!p.tag().empty()) info->set_tag(p.tag());
    if (p.argv_size() > 0) info->mutable_config()->set_cmd(p.argv(0));
    for (int i = 1; i < p.argv_size(); ++i) info->mutable_config()->add_args(p.argv(i));
    if (!p.cwd().empty()) info->mutable_config()->set_cwd(p.cwd());
  }
  RespondUnary(out, answer);
}

void Envd::ProcessSendInput(const Target& t, const HttpRequest& req, HttpResponder& out) {
  process::SendInputRequest in;
  if (!ParseUnary(req, out, &in)) return;
  v1::SendProcessInputRequest send;
  send.set_claim_id(t.sandbox_id);
  if (!ToSelector(in.process(), send.mutable_process()))
    return RespondConnectError(out, kNoSelector);
  send.set_data(in.input().input_case() == process::ProcessInput::kPty ? in.input().pty()
                                                                       : in.input().stdin());
  grpc::ClientContext ctx;
  Prepare(t, options_.call_timeout, &ctx);
  v1::SendProcessInputResponse res;
  grpc::Status s = sandboxes_->SendProcessInput(&ctx, send, &res);
  if (!s.ok()) return RespondConnectError(out, s);
  RespondUnary(out, process::SendInputResponse());
}

void Envd::ProcessSendSignal(const Target& t, const HttpRequest& req, HttpResponder& out) {
  process::SendSignalRequest in;
  if (!ParseUnary(req, out, &in)) return;
  v1::SignalProcessRequest sig;
  sig.set_claim_id(t.sandbox_id);
  if (!ToSelector(in.process(), sig.mutable_process()))
    return RespondConnectError(out, kNoSelector);
  // envd's Signal values are the POSIX numbers, as sbx's are.
  sig.set_signal(static_cast<v1::Signal>(in.signal()));
  grpc::ClientContext ctx;
  Prepare(t, options_.call_timeout, &ctx);
  v1::SignalProcessResponse res;
  grpc::Status s = sandboxes_->SignalProcess(&ctx, sig, &res);
  if (!s.ok()) return RespondConnectError(out, s);
  RespondUnary(out, process::SendSignalResponse());
}

void Envd::ProcessUpdate(const Target& t, const HttpRequest& req, HttpResponder& out) {
  process::UpdateRequest in;
  if (!ParseUnary(req, out, &in)) return;
  v1::ResizeProcessRequest resize;
  resize.set_claim_id(t.sandbox_id);
  if (!ToSelector(in.process(), resize.mutable_process())) {
    return RespondConnectError(out, kNoSelector);
  }
  if (!in.has_pty()) return RespondUnary(out, process::UpdateResponse());  // nothing to change
  resize.mutable_size()->set_cols(in.pty().size().cols());
  resize.mutable_size()->set_rows(in.pty().size().rows());
  grpc::ClientContext ctx;
  Prepare(t, options_.call_timeout, &ctx);
  v1::ResizeProcessResponse res;
  grpc::Status s = sandboxes_->ResizeProcess(&ctx, resize, &res);
  if (!s.ok()) return RespondConnectError(out, s);
  RespondUnary(out, process::UpdateResponse());
}

void Envd::ProcessCloseStdin(const Target& t, const HttpRequest& req, HttpResponder& out) {
  process::CloseStdinRequest in;
  if (!ParseUnary(req, out, &in)) return;
  v1::CloseProcessInputRequest close;
  close.set_claim_id(t.sandbox_id);
  if (!ToSelector(in.process(), close.mutable_process())) {
    return RespondConnectError(out, kNoSelector);
  }
  grpc::ClientContext ctx;
  Prepare(t, options_.call_timeout, &ctx);
  v1::CloseProcessInputResponse res;
  grpc::Status s = sandboxes_->CloseProcessInput(&ctx, close, &res);
  if (!s.ok()) return RespondConnectError(out, s);
  RespondUnary(out, process::CloseStdinResponse());
}

}  // namespace sbx::e2b

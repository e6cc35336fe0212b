#include "src/gateway/e2b/control_plane.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/time_util.h"
#include "nlohmann/json.hpp"
#include "src/common/ids.h"
#include "src/gateway/e2b/envd.h"

namespace sbx::e2b {

using json = nlohmann::json;
using google::protobuf::util::TimeUtil;

namespace {

constexpr absl::string_view kJson = "application/json";
// The longest a sandbox may live by one create/timeout/connect: sbx's own bound on a TTL
// (ClaimRequest.ttl, 100 years) is far above what E2B accepts; int32 seconds bound it here.
constexpr int64_t kMaxTimeoutS = 2147483647;
// GET /sandboxes (v1) returns every sandbox at once: at most this many pages of 1000.
constexpr int kMaxListPages = 100;
// Forks of one /fork call: E2B's bound (SandboxForkRequest.count).
constexpr int64_t kMaxForks = 100;

void RespondJson(HttpResponder& out, int status, const json& body,
                 const HttpHeaders& headers = {}) {
  out.Respond(status, kJson, body.dump(), headers);
}

void RespondGrpcError(HttpResponder& out, const grpc::Status& s) {
  RespondError(out, HttpStatusOf(s.error_code()), s.error_message());
}

std::string Rfc3339(const google::protobuf::Timestamp& t) { return TimeUtil::ToString(t); }

// A claim as E2B's ListedSandbox / SandboxDetail.
json SandboxJson(const v1::Claim& c, const FrontOptions& options) {
  json j;
  j["templateID"] = c.pool();
  j["sandboxID"] = E2bSandboxId(c.claim_id());
  j["clientID"] = "sbx";
  j["startedAt"] = Rfc3339(c.created_at());
  // A claim without a TTL never expires: the end of Timestamp's range says so.
  j["endAt"] = c.has_expires_at() ? Rfc3339(c.expires_at()) : "9999-12-31T23:59:59Z";
  j["state"] = c.sandbox().suspended() ? "paused" : "running";
  j["envdVersion"] = options.envd_version;
  // sbx's templates give limits rather than sizes; 0 says "not reported".
  j["cpuCount"] = 0;
  j["memoryMB"] = 0;
  j["diskSizeMB"] = 0;
  json metadata = json::object();
  for (const auto& [k, v] : c.labels()) metadata[k] = v;
  j["metadata"] = std::move(metadata);
  if (!options.domain.empty()) j["domain"] = options.domain;
  return j;
}

// E2B's Sandbox (the answer of create and connect).
json NewSandboxJson(const v1::Claim& c, const FrontOptions& options, const FrontDeps& deps) {
  json j;
  j["templateID"] = c.pool();
  j["sandboxID"] = E2bSandboxId(c.claim_id());
  j["clientID"] = "sbx";
  j["envdVersion"] = options.envd_version;
  j["envdAccessToken"] = EnvdAccessToken(deps, c.claim_id(), c.owner());
  j["trafficAccessToken"] = nullptr;
  j["domain"] = options.domain.empty() ? json(nullptr) : json(options.domain);
  return j;
}

// The request's JSON object body; an empty body is an empty object. nullopt (answered
// 400) when it is not a JSON object.
std::optional<json> ObjectBody(const HttpRequest& req, HttpResponder& out) {
  if (absl::StripAsciiWhitespace(req.body).empty()) return json::object();
  json body = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    RespondError(out, 400, "the request body is not a JSON object");
    return std::nullopt;
  }
  return body;
}

// The integer field `name` of `body` within [min, max], or `fallback` when absent or null.
// nullopt (answered 400) when it is something else.
std::optional<int64_t> IntField(const json& body, const char* name, int64_t min, int64_t max,
                                int64_t fallback, HttpResponder& out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < min || it->get<int64_t>() > max) {
    RespondError(out, 400,
                 absl::StrCat("\"", name, "\" must be an integer from ", min, " to ", max, ", not ",
                              it->dump()));
    return std::nullopt;
  }
  return it->get<int64_t>();
}

// A JSON object of strings into `out_map` (metadata, envVars). False (answered 400)
// otherwise.
template <typename Map>
bool StringMap(const json& body, const char* name, Map* out_map, HttpResponder& out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_object()) {
    RespondError(out, 400, absl::StrCat("\"", name, "\" must be an object of strings"));
    return false;
  }
  for (const auto& [k, v] : it->items()) {
    if (!v.is_string()) {
      RespondError(out, 400,
                   absl::StrCat("\"", name, "\".\"", k, "\" must be a string, not ", v.dump()));
      return false;
    }
    (*out_map)[k] = v.template get<std::string>();
  }
  return true;
}

// The id sbx gives a snapshot: "sn-" and 16 of [a-z0-9] (snapshots.proto).
bool IsSnapshotId(absl::string_view id) {
  if (id.size() != 19 || !absl::StartsWith(id, "sn-")) return false;
  return std::all_of(id.begin() + 3, id.end(),
                     [](char c) { return absl::ascii_isdigit(c) || absl::ascii_islower(c); });
}

// E2B's SnapshotInfo: the id (used as a template id by Sandbox.create) and its names.
json SnapshotJson(const v1::Snapshot& snap) {
  json j;
  j["snapshotID"] = snap.id();
  j["names"] = json::array();
  if (!snap.name().empty()) j["names"].push_back(snap.name());
  return j;
}

// A sandbox id as it may appear in a path: a claim id. Anything else cannot be one of the
// caller's sandboxes, so it is not found (as E2B answers for unknown ids).
bool ValidSandboxId(absl::string_view id) { return ValidateKey("sandbox id", id).ok(); }

}  // namespace

int HttpStatusOf(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return 200;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      return 400;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return 409;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::CANCELLED:
      return 499;
    case grpc::StatusCode::UNIMPLEMENTED:
      return 501;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    default:
      return 500;
  }
}

void RespondError(HttpResponder& out, int status, absl::string_view message) {
  json body;
  body["code"] = status;
  body["message"] = std::string(message);
  out.Respond(status, kJson, body.dump());
}

std::optional<std::string> PercentDecode(absl::string_view in, bool plus_is_space) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const char c = in[i];
    if (c == '%') {
      int value = 0;
      if (i + 2 >= in.size()) return std::nullopt;
      if (!absl::ascii_isxdigit(in[i + 1]) || !absl::ascii_isxdigit(in[i + 2])) {
        return std::nullopt;
      }
      for (int k = 1; k <= 2; ++k) {
        const char h = absl::ascii_tolower(in[i + k]);
        value = value * 16 + (absl::ascii_isdigit(h) ? h - '0' : h - 'a' + 10);
      }
      out.push_back(static_cast<char>(value));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::optional<std::string> QueryParam(absl::string_view query, absl::string_view name) {
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t eq = pair.find('=');
    std::optional<std::string> key = PercentDecode(pair.substr(0, eq), true);
    if (!key.has_value() || *key != name) continue;
    if (eq == absl::string_view::npos) return std::string();
    return PercentDecode(pair.substr(eq + 1), true);
  }
  return std::nullopt;
}

void PrepareContext(const HttpRequest& req, absl::Duration timeout, grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  if (auto key = req.Header("x-api-key"); key.has_value() && !key->empty()) {
    ctx->AddMetadata("authorization", absl::StrCat("Bearer ", absl::StripAsciiWhitespace(*key)));
  } else if (auto auth = req.Header("authorization"); auth.has_value()) {
    ctx->AddMetadata("authorization", std::string(*auth));
  }
}

ControlPlane::ControlPlane(FrontOptions options, FrontDeps deps)
    : options_(std::move(options)),
      deps_(std::move(deps)),
      claims_(v1::ClaimService::NewStub(deps_.channel)),
      sandboxes_(v1::SandboxService::NewStub(deps_.channel)),
      snapshots_(v1::Snapshots::NewStub(deps_.channel)) {}

void ControlPlane::Handle(const HttpRequest& req, HttpResponder& out) {
  std::vector<absl::string_view> parts = absl::StrSplit(req.path, '/', absl::SkipEmpty());
  const std::string& m = req.method;
  const bool v2 = !parts.empty() && parts[0] == "v2";
  if (v2) parts.erase(parts.begin());
  if (!v2 && parts.size() == 1 && parts[0] == "snapshots" && m == "GET") {
    return ListSnapshots(req, out);
  }
  // Sandbox.deleteSnapshot deletes a "template" by the snapshot's id; other templates are
  // sbx's pools, not served here.
  if (!v2 && parts.size() == 2 && parts[0] == "templates" && m == "DELETE" &&
      IsSnapshotId(parts[1])) {
    return DeleteSnapshot(req, out, std::string(parts[1]));
  }
  if (parts.empty() || parts[0] != "sandboxes") {
    RespondError(
        out,
        absl::StartsWith(req.path, "/templates") || absl::StartsWith(req.path, "/v2/templates") ||
                absl::StartsWith(req.path, "/v3/templates") ||
                absl::StartsWith(req.path, "/snapshots") ||
                absl::StartsWith(req.path, "/volumes") ||
                absl::StartsWith(req.path, "/volumecontent") ||
                absl::StartsWith(req.path, "/secrets") || absl::StartsWith(req.path, "/teams")
            ? 501
            : 404,
        absl::StrCat(m, " ", req.path,
                     " is not served by sbx's E2B front (docs/e2b.md lists what is)"));
    return;
  }
  if (parts.size() == 1) {
    if (m == "POST") return Create(req, out);
    if (m == "GET") return List(req, out, v2);
  } else {
    if (!ValidSandboxId(parts[1])) {
      RespondError(out, 404, absl::StrCat("sandbox \"", parts[1], "\" not found"));
      return;
    }
    const std::string id = ClaimIdOf(parts[1]);  // a fork's id as E2B shows it
    if (parts.size() == 2) {
      if (m == "GET") return Get(req, out, id);
      if (m == "DELETE") return Kill(req, out, id);
    } else if (parts.size() == 3) {
      if (parts[2] == "timeout" && m == "POST") return SetTimeout(req, out, id);
      if (parts[2] == "pause" && m == "POST") return Pause(req, out, id);
      if ((parts[2] == "connect" || parts[2] == "resume") && m == "POST") {
        return Connect(req, out, id);
      }
      if (parts[2] == "refreshes" && m == "POST") {
        // Keep-alive of the old SDKs: extend by the given duration (default 15 s).
        return SetTimeout(req, out, id);
      }
      if (parts[2] == "snapshots" && m == "POST") return CreateSnapshot(req, out, id);
      if (parts[2] == "fork" && m == "POST") return Fork(req, out, id);
      if (parts[2] == "metrics" || parts[2] == "logs" || parts[2] == "network") {
        RespondError(out, 501,
                     absl::StrCat(m, " ", req.path, ": sandbox ", parts[2],
                                  " are not served by sbx's E2B front yet (docs/e2b.md)"));
        return;
      }
    }
  }
  RespondError(out, 404, absl::StrCat(m, " ", req.path, " is not an endpoint of sbx's E2B front"));
}

void ControlPlane::Create(const HttpRequest& req, HttpResponder& out) {
  std::optional<json> body = ObjectBody(req, out);
  if (!body.has_value()) return;
  auto tmpl = body->find("templateID");
  if (tmpl == body->end() || !tmpl->is_string() || tmpl->get<std::string>().empty()) {
    RespondError(out, 400, "\"templateID\" (the pool to claim from) is required");
    return;
  }
  std::optional<int64_t> timeout =
      IntField(*body, "timeout", 1, kMaxTimeoutS, options_.default_timeout_s, out);
  if (!timeout.has_value()) return;
  if (auto it = body->find("autoPause"); it != body->end() && it->is_boolean() && it->get<bool>()) {
    RespondError(out, 400,
                 "\"autoPause\": true is not supported by sbx's E2B front (a sandbox is "
                 "released when its timeout passes)");
    return;
  }
  if (auto it = body->find("volumeMounts"); it != body->end() && it->is_array() && !it->empty()) {
    RespondError(out, 400, "\"volumeMounts\" are not supported by sbx's E2B front");
    return;
  }
  if (auto it = body->find("mcp"); it != body->end() && !it->is_null()) {
    RespondError(out, 400, "\"mcp\" is not supported by sbx's E2B front");
    return;
  }
  v1::ClaimRequest claim;
  claim.set_pool(tmpl->get<std::string>());
  claim.mutable_ttl()->set_seconds(*timeout);
  if (!StringMap(*body, "metadata", claim.mutable_labels(), out)) return;
  if (!StringMap(*body, "envVars", claim.mutable_config()->mutable_env(), out)) return;
  if (IsSnapshotId(claim.pool()) && CreateFromSnapshot(req, out, claim)) return;
  grpc::ClientContext ctx;
  PrepareContext(req, options_.call_timeout, &ctx);
  v1::ClaimResponse res;
  grpc::Status s = claims_->Claim(&ctx, claim, &res);
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      RespondError(out, 404,
                   absl::StrCat("template \"", claim.pool(), "\" not found: ", s.error_message()));
      return;
    }
    return RespondGrpcError(out, s);
  }
  RespondJson(out, 201, NewSandboxJson(res.claim(), options_, deps_));
}

void ControlPlane::List(const HttpRequest& req, HttpResponder& out, bool v2) {
  if (!PercentDecode(req.query, true).has_value()) {
    RespondError(out, 400, absl::StrCat("malformed %-escape in the query \"", req.query, "\""));
    return;
  }
  v1::ListClaimsRequest list;
  list.mutable_filter()->add_states(v1::CLAIM_STATE_ACTIVE);
  if (std::optional<std::string> metadata = QueryParam(req.query, "metadata");
      metadata.has_value()) {
    // "k=v&k2=v2", each key and value URL-encoded once more.
    for (absl::string_view pair : absl::StrSplit(*metadata, '&', absl::SkipEmpty())) {
      const size_t eq = pair.find('=');
      std::optional<std::string> k = PercentDecode(pair.substr(0, eq), true);
      std::optional<std::string> v = PercentDecode(
          eq == absl::string_view::npos ? absl::string_view() : pair.substr(eq + 1), true);
      if (!k.has_value() || !v.has_value() || k->empty()) {
        RespondError(out, 400, absl::StrCat("bad metadata filter \"", *metadata, "\""));
        return;
      }
      (*list.mutable_filter()->mutable_match_labels())[*k] = *v;
    }
  }
  if (std::optional<std::string> tmpl = QueryParam(req.query, "template");
      tmpl.has_value() && !tmpl->empty()) {
    list.mutable_filter()->set_pool(*tmpl);
  }
  bool want_running = true, want_paused = true;
  if (std::optional<std::string> state = QueryParam(req.query, "state");
      state.has_value() && !state->empty()) {
    want_running = want_paused = false;
    for (absl::string_view s : absl::StrSplit(*state, ',', absl::SkipEmpty())) {
      if (s == "running") {
        want_running = true;
      } else if (s == "paused") {
        want_paused = true;
      } else {
        RespondError(out, 400, absl::StrCat("bad state \"", s, "\" (running or paused)"));
        return;
      }
    }
  }
  std::optional<google::protobuf::Timestamp> started_after;
  if (std::optional<std::string> after = QueryParam(req.query, "startedAfter");
      after.has_value() && !after->empty()) {
    google::protobuf::Timestamp t;
    if (!TimeUtil::FromString(*after, &t)) {
      RespondError(out, 400, absl::StrCat("bad startedAfter \"", *after, "\" (RFC 3339)"));
      return;
    }
    started_after = t;
  }
  int limit = 100;
  if (std::optional<std::string> l = QueryParam(req.query, "limit"); l.has_value()) {
    if (!absl::SimpleAtoi(*l, &limit) || limit < 1 || limit > 1000) {
      RespondError(out, 400, absl::StrCat("bad limit \"", *l, "\" (1 to 1000)"));
      return;
    }
  }
  if (std::optional<std::string> token = QueryParam(req.query, "nextToken"); token.has_value()) {
    list.set_page_token(*token);
  }
  list.set_page_size(v2 ? limit : 1000);
  json items = json::array();
  std::string next;
  for (int page = 0; page < (v2 ? 1 : kMaxListPages); ++page) {
    grpc::ClientContext ctx;
    PrepareContext(req, options_.call_timeout, &ctx);
    v1::ListClaimsResponse res;
    grpc::Status s = claims_->ListClaims(&ctx, list, &res);
    if (!s.ok()) return RespondGrpcError(out, s);
    for (const v1::Claim& c : res.claims()) {
      const bool paused = c.sandbox().suspended();
      if (paused ? !want_paused : !want_running) continue;
      if (started_after.has_value() && c.created_at() < *started_after) continue;
      items.push_back(SandboxJson(c, options_));
    }
    next = res.next_page_token();
    if (next.empty()) break;
    list.set_page_token(next);
  }
  HttpHeaders headers;
  if (v2 && !next.empty()) headers.emplace_back("X-Next-Token", next);
  RespondJson(out, 200, items, headers);
}

std::optional<v1::Claim> ControlPlane::ActiveClaim(const HttpRequest& req, HttpResponder& out,
                                                   const std::string& id) {
  grpc::ClientContext ctx;
  PrepareContext(req, options_.call_timeout, &ctx);
  v1::GetClaimRequest get;
  get.set_claim_id(id);
  v1::GetClaimResponse res;
  grpc::Status s = claims_->GetClaim(&ctx, get, &res);
  if (!s.ok()) {
    RespondGrpcError(out, s);
    return std::nullopt;
  }
  if (res.claim().state() != v1::CLAIM_STATE_ACTIVE) {
    RespondError(out, 404, absl::StrCat("sandbox \"", id, "\" not found (its claim has ended)"));
    return std::nullopt;
  }
  return res.claim();
}

void ControlPlane::Get(const HttpRequest& req, HttpResponder& out, const std::string& id) {
  std::optional<v1::Claim> claim = ActiveClaim(req, out, id);
  if (!claim.has_value()) return;
  json j = SandboxJson(*claim, options_);
  j["envdAccessToken"] = EnvdAccessToken(deps_, id, claim->owner());
  RespondJson(out, 200, j);
}

void ControlPlane::Kill(const HttpRequest& req, HttpResponder& out, const std::string& id) {
  if (!ActiveClaim(req, out, id).has_value()) return;
  grpc::ClientContext ctx;
  PrepareContext(req, options_.call_timeout, &ctx);
  v1::ReleaseRequest release;
  release.set_claim_id(id);
  v1::ReleaseResponse res;
  grpc::Status s = claims_->Release(&ctx, release, &res);
  if (!s.ok()) return RespondGrpcError(out, s);
  out.Respond(204, "", "");
}

void ControlPlane::SetTimeout(const HttpRequest& req, HttpResponder& out, const std::string& id) {
  std::optional<json> body = ObjectBody(req, out);
  if (!body.has_value()) return;
  const char* field = body->contains("duration") ? "duration" : "timeout";
  std::optional<int64_t> timeout =
      IntField(*body, field, 1, kMaxTimeoutS, options_.default_timeout_s, out);
  if (!timeout.has_value()) return;
  grpc::ClientContext ctx;
  PrepareContext(req, options_.call_timeout, &ctx);
  v1::RenewRequest renew;
  renew.set_claim_id(id);
  renew.mutable_ttl()->set_seconds(*timeout);
  v1::RenewResponse res;
  grpc::Status s = claims_->Renew(&ctx, renew, &res);
  if (!s.ok()) {
    // A claim that has ended is gone as far as E2B is concerned.
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      RespondError(out, 404, absl::StrCat("sandbox \"", id, "\" not found: ", s.error_message()));
      return;
    }
    return RespondGrpcError(out, s);
  }
  out.Respond(204, "", "");
}

void ControlPlane::Pause(const HttpRequest& req, HttpResponder& out, const std::string& id) {
  std::optional<v1::Claim> claim = ActiveClaim(req, out, id);
  if (!claim.has_value()) return;
  if (claim->sandbox().suspended()) {
    RespondError(out, 409, absl::StrCat("sandbox \"", id, "\" is already paused"));
    return;
  }
  grpc::ClientContext ctx;
  PrepareContext(req, options_.call_timeout, &ctx);
  v1::SuspendRequest suspend;
  suspend.set_claim_id(id);
  v1::SuspendResponse res;
  grpc::Status s = sandboxes_->Suspend(&ctx, suspend, &res);
  if (!s.ok()) return RespondGrpcError(out, s);
  out.Respond(204, "", "");
}

void ControlPlane::Connect(const HttpRequest& req, HttpResponder& out, const std::string& id) {
  std::optional<json> body = ObjectBody(req, out);
  if (!body.has_value()) return;
  std::optional<int64_t> timeout = IntField(*body, "timeout", 0, kMaxTimeoutS, 0, out);
  if (!timeout.has_value()) return;
  std::optional<v1::Claim> claim = ActiveClaim(req, out, id);
  if (!claim.has_value()) return;
  const bool was_paused = claim->sandbox().suspended();
  if (was_paused) {
    grpc::ClientContext ctx;
    PrepareContext(req, options_.call_timeout, &ctx);
    v1::ResumeRequest resume;
    resume.set_claim_id(id);
    v1::ResumeResponse res;
    grpc::Status s = sandboxes_->Resume(&ctx, resume, &res);
    if (!s.ok()) return RespondGrpcError(out, s);
  }
  // E2B's connect only ever extends a sandbox's life: renew when the new end is later.
  if (*timeout > 0) {
    const auto new_end = TimeUtil::GetCurrentTime() + TimeUtil::SecondsToDuration(*timeout);
    if (claim->has_expires_at() && claim->expires_at() < new_end) {
      grpc::ClientContext ctx;
      PrepareContext(req, options_.call_timeout, &ctx);
      v1::RenewRequest renew;
      renew.set_claim_id(id);
      renew.mutable_ttl()->set_seconds(*timeout);
      v1::RenewResponse res;
      grpc::Status s = claims_->Renew(&ctx, renew, &res);
      if (!s.ok()) return RespondGrpcError(out, s);
    }
  }
  RespondJson(out, was_paused ? 201 : 200, NewSandboxJson(*claim, options_, deps_));
}

}  // namespace sbx::e2b

namespace sbx::e2b {

void ControlPlane::CreateSnapshot(const HttpRequest& req, HttpResponder& out,
                                  const std::string& id) {
  std::optional<json> body = ObjectBody(req, out);
  if (!body.has_value()) return;
  v1::CreateSnapshotRequest create;
  create.set_claim_id(id);
  if (auto it = body->find("name"); it != body->end() && !it->is_null()) {
    if (!it->is_string()) {
      RespondError(out, 400, absl::StrCat("\"name\" must be a string, not ", it->dump()));
      return;
    }
    create.set_name(it->get<std::string>());
  }
  grpc::ClientContext ctx;
  PrepareContext(req, options_.call_timeout, &ctx);
  v1::CreateSnapshotResponse res;
  grpc::Status s = snapshots_->CreateSnapshot(&ctx, create, &res);
  if (!s.ok()) return RespondGrpcError(out, s);
  RespondJson(out, 201, SnapshotJson(res.snapshot()));
}

void ControlPlane::ListSnapshots(const HttpRequest& req, HttpResponder& out) {
  if (!PercentDecode(req.query, true).has_value()) {
    RespondError(out, 400, absl::StrCat("malformed %-escape in the query \"", req.query, "\""));
    return;
  }
  const std::string sandbox = ClaimIdOf(QueryParam(req.query, "sandboxID").value_or(""));
  const std::string name = QueryParam(req.query, "name").value_or("");
  const std::string after = QueryParam(req.query, "nextToken").value_or("");
  int limit = 100;
  if (std::optional<std::string> l = QueryParam(req.query, "limit"); l.has_value()) {
    if (!absl::SimpleAtoi(*l, &limit) || limit < 1 || limit > 100) {
      RespondError(out, 400, absl::StrCat("bad limit \"", *l, "\" (1 to 100)"));
      return;
    }
  }
  grpc::ClientContext ctx;
  PrepareContext(req, options_.call_timeout, &ctx);
  v1::ListSnapshotsResponse res;
  grpc::Status s = snapshots_->ListSnapshots(&ctx, v1::ListSnapshotsRequest(), &res);
  if (!s.ok()) return RespondGrpcError(out, s);
  // sbx lists the tenant's snapshots oldest first, whole; a page starts after the id in
  // nextToken (one that is gone: from the start of what follows it is unknown, so empty).
  json items = json::array();
  std::string next;
  bool started = after.empty();
  for (const v1::Snapshot& snap : res.snapshots()) {
    if (!started) {
      started = snap.id() == after;
      continue;
    }
    if (!sandbox.empty() && snap.source_claim_id() != sandbox) continue;
    if (!name.empty() && snap.name() != name && snap.id() != name) continue;
    if (static_cast<int>(items.size()) == limit) {
      next = items.back()["snapshotID"].get<std::string>();
      break;
    }
    items.push_back(SnapshotJson(snap));
  }
  HttpHeaders headers;
  if (!next.empty()) headers.emplace_back("X-Next-Token", next);
  RespondJson(out, 200, items, headers);
}

void ControlPlane::DeleteSnapshot(const HttpRequest& req, HttpResponder& out,
                                  const std::string& id) {
  grpc::ClientContext ctx;
  PrepareContext(req, options_.call_timeout, &ctx);
  v1::DeleteSnapshotRequest del;
  del.set_snapshot_id(id);
  v1::DeleteSnapshotResponse res;
  grpc::Status s = snapshots_->DeleteSnapshot(&ctx, del, &res);
  if (!s.ok()) return RespondGrpcError(out, s);
  out.Respond(204, "", "");
}

bool ControlPlane::CreateFromSnapshot(const HttpRequest& req, HttpResponder& out,
                                      const v1::ClaimRequest& claim) {
  {
    grpc::ClientContext ctx;
    PrepareContext(req, options_.call_timeout, &ctx);
    v1::GetSnapshotRequest get;
    get.set_snapshot_id(claim.pool());
    v1::GetSnapshotResponse res;
    grpc::Status s = snapshots_->GetSnapshot(&ctx, get, &res);
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) return false;  // a pool, perhaps
    if (!s.ok()) {
      RespondGrpcError(out, s);
      return true;
    }
  }
  v1::ForkRequest fork;
  fork.set_snapshot_id(claim.pool());
  fork.set_count(1);
  *fork.mutable_ttl() = claim.ttl();
  *fork.mutable_labels() = claim.labels();
  *fork.mutable_config() = claim.config();
  std::vector<v1::Claim> forks;
  if (!RunFork(req, out, std::move(fork), &forks)) return true;
  RespondJson(out, 201, NewSandboxJson(forks.front(), options_, deps_));
  return true;
}

void ControlPlane::Fork(const HttpRequest& req, HttpResponder& out, const std::string& id) {
  std::optional<json> body = ObjectBody(req, out);
  if (!body.has_value()) return;
  std::optional<int64_t> timeout =
      IntField(*body, "timeout", 1, kMaxTimeoutS, options_.default_timeout_s, out);
  if (!timeout.has_value()) return;
  std::optional<int64_t> count = IntField(*body, "count", 1, kMaxForks, 1, out);
  if (!count.has_value()) return;
  v1::ForkRequest fork;
  fork.set_claim_id(id);
  fork.set_count(static_cast<int32_t>(*count));
  fork.mutable_ttl()->set_seconds(*timeout);
  std::vector<v1::Claim> forks;
  if (!RunFork(req, out, std::move(fork), &forks)) return;
  // All or nothing (sbx's Fork): every entry holds its sandbox.
  json results = json::array();
  for (const v1::Claim& c : forks) {
    json r;
    r["sandbox"] = NewSandboxJson(c, options_, deps_);
    results.push_back(std::move(r));
  }
  RespondJson(out, 201, results);
}

bool ControlPlane::RunFork(const HttpRequest& req, HttpResponder& out, v1::ForkRequest fork,
                           std::vector<v1::Claim>* forks) {
  // The forks' claims are "<batch_id>#<i>"; a batch id of 32 hex digits lets E2B clients
  // address them as "<batch_id>-<i>" (E2bSandboxId).
  fork.set_batch_id(IdGenerator::Random().Next());
  grpc::ClientContext ctx;
  // Forks start cold (a sandbox each from the snapshot's files): the wait is Fork's own
  // (5 minutes by default), within the call's deadline.
  PrepareContext(req, options_.call_timeout, &ctx);
  v1::ForkResponse res;
  grpc::Status s = snapshots_->Fork(&ctx, fork, &res);
  if (!s.ok()) {
    RespondGrpcError(out, s);
    return false;
  }
  if (res.claims().empty()) {
    RespondError(out, 500, "sbx's Fork answered no sandbox");
    return false;
  }
  forks->assign(res.claims().begin(), res.claims().end());
  return true;
}

}  // namespace sbx::e2b

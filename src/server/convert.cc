#include "src/server/convert.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "src/common/hash.h"
#include "src/common/ids.h"
#include "src/common/paths.h"
#include "src/common/status_macros.h"

namespace sbx::server {
namespace {

std::string Quote(absl::string_view s) {
  constexpr size_t kMaxShown = 64;
  if (s.size() > kMaxShown)
    return absl::StrCat("\"", absl::CHexEscape(s.substr(0, kMaxShown)), "...\"");
  return absl::StrCat("\"", absl::CHexEscape(s), "\"");
}

bool IsAlnum(char c) { return absl::ascii_isalnum(static_cast<unsigned char>(c)); }

absl::Status ValidateLabelKey(absl::string_view field, absl::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": label key is empty"));
  if (key.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": label key ", Quote(key), " is longer than 128 characters"));
  }
  for (char c : key) {
    if (!IsAlnum(c) && c != '.' && c != '_' && c != '/' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": label key ", Quote(key), " may contain only letters, digits and . _ / -"));
    }
  }
  if (!IsAlnum(key.front()) || !IsAlnum(key.back())) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": label key ", Quote(key),
                                                   " must start and end with a letter or digit"));
  }
  return absl::OkStatus();
}

absl::Status ValidateLabelValue(absl::string_view field, absl::string_view key,
                                absl::string_view value) {
  if (value.size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": value of label ", Quote(key), " is longer than 256 characters"));
  }
  for (char c : value) {
    if (!IsAlnum(c) && c != '.' && c != '_' && c != '/' && c != ':' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": value ", Quote(value), " of label ", Quote(key),
                       " may contain only letters, digits and . _ / : -"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMaxTtl(absl::string_view name, absl::Duration value, absl::Duration max_ttl,
                         absl::string_view what) {
  if (max_ttl > absl::ZeroDuration() && value > max_ttl) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool \"", name, "\": ", what, " ", absl::FormatDuration(value),
                     " is above max_ttl ", absl::FormatDuration(max_ttl)));
  }
  return absl::OkStatus();
}

absl::Status ValidateLocalSpec(absl::string_view name, const v1::LocalSpec& s) {
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("template \"", name, "\": local.", parts...));
  };
  if (s.mounts_size() > 64) return bad("mounts has ", s.mounts_size(), " entries; at most 64");
  for (int i = 0; i < s.mounts_size(); ++i) {
    const v1::BindMount& m = s.mounts(i);
    const std::string mount = absl::StrCat("template \"", name, "\": local.mounts[", i, "]");
    RETURN_IF_ERROR(CheckNormalAbsolutePath(mount + ".source", m.source()));
    // An empty target is the source's path inside the sandbox (admin.proto).
    RETURN_IF_ERROR(m.target().empty()
                        ? CheckSandboxMountTarget(mount + ".target (empty: the source)", m.source())
                        : CheckSandboxMountTarget(mount + ".target", m.target()));
  }
  if (s.env_size() > 256) return bad("env has ", s.env_size(), " entries; at most 256");
  for (const auto& [k, v] : s.env()) {
    bool ok =
        !k.empty() && k.size() <= 256 && !absl::ascii_isdigit(static_cast<unsigned char>(k[0]));
    for (char c : k) ok = ok && (IsAlnum(c) || c == '_');
    if (!ok) return bad("env name ", Quote(k), " does not match [A-Za-z_][A-Za-z0-9_]*");
    if (v.size() > 32 * 1024) return bad("env value of ", Quote(k), " is longer than 32 KiB");
  }
  if (s.memory_limit_bytes() < 0 ||
      (s.memory_limit_bytes() > 0 && s.memory_limit_bytes() < 16 * 1024 * 1024)) {
    return bad("memory_limit_bytes ", s.memory_limit_bytes(), " must be 0 or at least 16 MiB");
  }
  if (s.pids_limit() < 0) return bad("pids_limit ", s.pids_limit(), " is negative");
  if (s.workspace_size_bytes() < 0) {
    return bad("workspace_size_bytes ", s.workspace_size_bytes(), " is negative");
  }
  if (s.layer_size_bytes() < 0) {
    return bad("layer_size_bytes ", s.layer_size_bytes(), " is negative");
  }
  if (s.layer_size_bytes() > 0 && s.image().empty()) {
    return bad(
        "layer_size_bytes is set without an image (the host's root has no layer of "
        "the sandbox's own)");
  }
  if (!s.snapshot().empty()) {
    bool ok = s.snapshot().size() <= 64;
    for (char c : s.snapshot())
      ok = ok && (absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-');
    if (!ok) return bad("snapshot ", Quote(s.snapshot()), " is not a snapshot id (sn-...)");
  }
  return absl::OkStatus();
}

absl::Status ValidateKubernetesSpec(absl::string_view name, const v1::KubernetesSpec& s) {
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("template \"", name, "\": kubernetes.", parts...));
  };
  if (s.pod_template().empty()) return bad("pod_template is empty");
  if (s.pod_template().size() > 1024 * 1024) {
    return bad("pod_template is ", s.pod_template().size(), " bytes; at most 1 MiB");
  }
  if (!s.namespace_().empty()) {
    RETURN_IF_ERROR(ValidateName(absl::StrCat("template \"", name, "\": kubernetes.namespace"),
                                 s.namespace_()));
  }
  if (s.sandboxd_port() < 0 || s.sandboxd_port() > 65535) {
    return bad("sandboxd_port ", s.sandboxd_port(), " is outside 0..65535");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<absl::Duration> FromProto(absl::string_view field,
                                         const google::protobuf::Duration& d) {
  const int64_t s = d.seconds();
  const int32_t n = d.nanos();
  if (n <= -1000000000 || n >= 1000000000 || (s > 0 && n < 0) || (s < 0 && n > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " {seconds: ", s, ", nanos: ", n, "} is not a valid duration"));
  }
  const absl::Duration out = absl::Seconds(s) + absl::Nanoseconds(n);
  if (out < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", absl::FormatDuration(out), " is negative"));
  }
  return out;
}

void ToProto(absl::Duration d, google::protobuf::Duration* out) {
  const int64_t seconds = absl::IDivDuration(d, absl::Seconds(1), &d);
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(d)));
}

absl::StatusOr<absl::Duration> TtlFromProto(absl::string_view field,
                                            const google::protobuf::Duration& d) {
  ASSIGN_OR_RETURN(absl::Duration ttl, FromProto(field, d));
  RETURN_IF_ERROR(allocator::CheckMaxTtl(field, ttl));
  return ttl;
}

void ToProto(absl::Time t, google::protobuf::Timestamp* out) {
  // The ends of google/protobuf/timestamp.proto's range.
  static constexpr int64_t kMinSeconds = -62135596800;  // 0001-01-01T00:00:00Z
  static constexpr int64_t kMaxSeconds = 253402300799;  // 9999-12-31T23:59:59Z
  if (t < absl::FromUnixSeconds(kMinSeconds)) {
    out->set_seconds(kMinSeconds);
    out->set_nanos(0);
    return;
  }
  if (t >= absl::FromUnixSeconds(kMaxSeconds + 1)) {
    out->set_seconds(kMaxSeconds);
    out->set_nanos(999999999);
    return;
  }
  const absl::Duration since = t - absl::UnixEpoch();
  const int64_t seconds = absl::ToInt64Seconds(since);
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(since - absl::Seconds(seconds))));
}

absl::StatusOr<std::optional<store::EmptyPoolPolicy>> FromProto(absl::string_view field,
                                                                v1::EmptyPoolPolicy p) {
  switch (p) {
    case v1::EMPTY_POOL_POLICY_UNSPECIFIED:
      return std::nullopt;
    case v1::EMPTY_POOL_POLICY_WAIT:
      return store::EmptyPoolPolicy::kWait;
    case v1::EMPTY_POOL_POLICY_COLD:
      return store::EmptyPoolPolicy::kCold;
    case v1::EMPTY_POOL_POLICY_FAIL:
      return store::EmptyPoolPolicy::kFail;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " ", static_cast<int>(p), " is not a known EmptyPoolPolicy"));
}

absl::StatusOr<allocator::ClaimPriority> FromProto(absl::string_view field, v1::ClaimPriority p) {
  switch (p) {
    case v1::CLAIM_PRIORITY_UNSPECIFIED:
    case v1::CLAIM_PRIORITY_NORMAL:
      return allocator::ClaimPriority::kNormal;
    case v1::CLAIM_PRIORITY_BATCH:
      return allocator::ClaimPriority::kBatch;
    case v1::CLAIM_PRIORITY_INTERACTIVE:
      return allocator::ClaimPriority::kInteractive;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, " ", static_cast<int>(p), " is not a known ClaimPriority"));
}

v1::EmptyPoolPolicy ToProto(store::EmptyPoolPolicy p) {
  switch (p) {
    case store::EmptyPoolPolicy::kWait:
      return v1::EMPTY_POOL_POLICY_WAIT;
    case store::EmptyPoolPolicy::kCold:
      return v1::EMPTY_POOL_POLICY_COLD;
    case store::EmptyPoolPolicy::kFail:
      return v1::EMPTY_POOL_POLICY_FAIL;
  }
  return v1::EMPTY_POOL_POLICY_UNSPECIFIED;
}

v1::ClaimState ToProto(store::ClaimState s) {
  switch (s) {
    case store::ClaimState::kActive:
      return v1::CLAIM_STATE_ACTIVE;
    case store::ClaimState::kReleased:
      return v1::CLAIM_STATE_RELEASED;
    case store::ClaimState::kExpired:
      return v1::CLAIM_STATE_EXPIRED;
    case store::ClaimState::kLost:
      return v1::CLAIM_STATE_LOST;
  }
  return v1::CLAIM_STATE_UNSPECIFIED;
}

v1::LaunchType ToProto(store::LaunchType t) {
  switch (t) {
    case store::LaunchType::kWarm:
      return v1::LAUNCH_TYPE_WARM;
    case store::LaunchType::kCold:
      return v1::LAUNCH_TYPE_COLD;
  }
  return v1::LAUNCH_TYPE_UNSPECIFIED;
}

absl::StatusOr<std::map<std::string, std::string>> LabelsFromProto(
    absl::string_view field, const google::protobuf::Map<std::string, std::string>& labels) {
  if (labels.size() > static_cast<size_t>(kMaxLabels)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", labels.size(), " entries; at most ", kMaxLabels));
  }
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : labels) {
    RETURN_IF_ERROR(ValidateLabelKey(field, k));
    RETURN_IF_ERROR(ValidateLabelValue(field, k, v));
    out.emplace(k, v);
  }
  return out;
}

absl::StatusOr<std::vector<LabelRequirement>> ParseLabelSelector(absl::string_view selector) {
  std::vector<LabelRequirement> out;
  if (selector.size() > kMaxSelectorBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("label_selector is ", selector.size(), " bytes; at most ", kMaxSelectorBytes));
  }
  if (absl::StripAsciiWhitespace(selector).empty()) return out;
  for (absl::string_view raw : absl::StrSplit(selector, ',')) {
    const absl::string_view term = absl::StripAsciiWhitespace(raw);
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("label_selector term ", Quote(term), " ", why,
                                                     " (want key=value, key!=value, key or !key)"));
    };
    if (term.empty()) return bad("is empty");
    LabelRequirement r;
    absl::string_view key, value;
    if (const size_t ne = term.find("!="); ne != absl::string_view::npos) {
      r.op = LabelRequirement::Op::kNotEquals;
      key = term.substr(0, ne);
      value = term.substr(ne + 2);
    } else if (const size_t eq = term.find('='); eq != absl::string_view::npos) {
      r.op = LabelRequirement::Op::kEquals;
      key = term.substr(0, eq);
      value = term.substr(eq + 1);
      if (!value.empty() && value[0] == '=') value.remove_prefix(1);  // "k==v" as in k8s
    } else if (term[0] == '!') {
      r.op = LabelRequirement::Op::kNotExists;
      key = term.substr(1);
    } else {
      r.op = LabelRequirement::Op::kExists;
      key = term;
    }
    key = absl::StripAsciiWhitespace(key);
    value = absl::StripAsciiWhitespace(value);
    if (absl::Status s = ValidateLabelKey("label_selector", key); !s.ok()) {
      return bad(absl::StrCat("has a bad key: ", s.message()));
    }
    if (absl::Status s = ValidateLabelValue("label_selector", key, value); !s.ok()) {
      return bad(absl::StrCat("has a bad value: ", s.message()));
    }
    r.key = std::string(key);
    r.value = std::string(value);
    out.push_back(std::move(r));
  }
  return out;
}

bool Matches(const std::vector<LabelRequirement>& requirements,
             const std::map<std::string, std::string>& labels) {
  for (const LabelRequirement& r : requirements) {
    auto it = labels.find(r.key);
    const bool present = it != labels.end();
    switch (r.op) {
      case LabelRequirement::Op::kEquals:
        if (!present || it->second != r.value) return false;
        break;
      case LabelRequirement::Op::kNotEquals:
        if (present && it->second == r.value) return false;
        break;
      case LabelRequirement::Op::kExists:
        if (!present) return false;
        break;
      case LabelRequirement::Op::kNotExists:
        if (present) return false;
        break;
    }
  }
  return true;
}

void ToProto(const store::ClaimRecord& r, v1::Claim* out) {
  out->set_claim_id(r.id);
  out->set_pool(r.pool);
  out->set_owner(r.owner);
  out->mutable_sandbox()->set_id(r.sandbox_id);
  out->mutable_sandbox()->set_endpoint(r.endpoint);
  out->mutable_sandbox()->set_suspended(r.suspended);
  out->set_launch_type(ToProto(r.launch_type));
  out->set_state(ToProto(r.state));
  for (const auto& [k, v] : r.labels) (*out->mutable_labels())[k] = v;
  ToProto(r.created, out->mutable_created_at());
  if (r.expires != absl::InfiniteFuture()) ToProto(r.expires, out->mutable_expires_at());
  if (r.state != store::ClaimState::kActive) ToProto(r.ended, out->mutable_ended_at());
  // Batch claims are named "<batch_id>#<i>" (ClaimBatch); '#' is never part of a claim id
  // chosen by a client, so its presence identifies a batch member.
  if (const size_t hash = r.id.rfind('#'); hash != std::string::npos) {
    out->set_batch_id(r.id.substr(0, hash));
  }
  out->set_revision(static_cast<int64_t>(r.revision));
}

bool ClaimQuery::Matches(const store::ClaimRecord& r) const {
  if (!server::Matches(selector, r.labels)) return false;
  return states.empty() || std::find(states.begin(), states.end(), r.state) != states.end();
}

absl::StatusOr<ClaimQuery> ClaimQueryFromProto(const v1::ClaimFilter& filter, const Caller& caller,
                                               absl::string_view verb,
                                               absl::string_view default_ns) {
  ClaimQuery q;
  allocator::ClaimFilter& f = q.filter;
  f.owner = caller.tenant;
  if (!filter.owner().empty() && filter.owner() != caller.tenant) {
    if (!caller.admin) {
      return absl::PermissionDeniedError(absl::StrCat("tenant \"", caller.tenant, "\" may not ",
                                                      verb, " claims of owner \"", filter.owner(),
                                                      "\" (only its own, unless it is an admin)"));
    }
    RETURN_IF_ERROR(ValidateKey("filter.owner", filter.owner()));
    f.owner = filter.owner();
  }
  if (!filter.pool().empty()) {
    ASSIGN_OR_RETURN(f.pool, CanonicalQualifiedName("filter.pool", filter.pool(), default_ns));
  }
  ASSIGN_OR_RETURN(f.labels, LabelsFromProto("filter.match_labels", filter.match_labels()));
  ASSIGN_OR_RETURN(q.selector, ParseLabelSelector(filter.label_selector()));
  for (int s : filter.states()) {
    switch (s) {
      case v1::CLAIM_STATE_UNSPECIFIED:
        break;  // "any state"
      case v1::CLAIM_STATE_ACTIVE:
        q.states.push_back(store::ClaimState::kActive);
        break;
      case v1::CLAIM_STATE_RELEASED:
        q.states.push_back(store::ClaimState::kReleased);
        break;
      case v1::CLAIM_STATE_EXPIRED:
        q.states.push_back(store::ClaimState::kExpired);
        break;
      case v1::CLAIM_STATE_LOST:
        q.states.push_back(store::ClaimState::kLost);
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("filter.states: ", s, " is not a known ClaimState"));
    }
  }
  f.include_ended = q.states.empty() || std::any_of(q.states.begin(), q.states.end(), [](auto s) {
                      return s != store::ClaimState::kActive;
                    });
  return q;
}

absl::StatusOr<store::TemplateRecord> TemplateFromProto(const v1::Template& t,
                                                        absl::string_view default_ns) {
  store::TemplateRecord r;
  ASSIGN_OR_RETURN(r.name, CanonicalQualifiedName("template.name", t.name(), default_ns));
  r.runtime = t.runtime();
  if (t.runtime() == "local") {
    if (!t.has_local()) {
      return absl::InvalidArgumentError(
          absl::StrCat("template \"", t.name(), "\": runtime \"local\" needs template.local"));
    }
    if (t.has_kubernetes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "template \"", t.name(), "\": template.kubernetes is set, but runtime is \"local\""));
    }
    RETURN_IF_ERROR(ValidateLocalSpec(t.name(), t.local()));
    r.spec = SerializeSpec(t.local());
  } else if (t.runtime() == "kubernetes") {
    if (!t.has_kubernetes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "template \"", t.name(), "\": runtime \"kubernetes\" needs template.kubernetes"));
    }
    if (t.has_local()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "template \"", t.name(), "\": template.local is set, but runtime is \"kubernetes\""));
    }
    RETURN_IF_ERROR(ValidateKubernetesSpec(t.name(), t.kubernetes()));
    r.spec = SerializeSpec(t.kubernetes());
  } else {
    return absl::InvalidArgumentError(absl::StrCat("template \"", t.name(), "\": runtime ",
                                                   Quote(t.runtime()),
                                                   " is not one of \"local\", \"kubernetes\""));
  }
  return r;
}

std::string SerializeSpec(const google::protobuf::MessageLite& spec) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    (void)spec.SerializeToCodedStream(&coded);
    // `coded` flushes into `out` when destroyed, at the end of this scope.
  }
  return out;
}

void ToProto(const store::TemplateRecord& r, v1::Template* out) {
  out->set_name(r.name);
  out->set_runtime(r.runtime);
  out->set_generation(static_cast<int64_t>(r.generation));
  if (r.runtime == "local") {
    (void)out->mutable_local()->ParseFromString(r.spec);
  } else if (r.runtime == "kubernetes") {
    (void)out->mutable_kubernetes()->ParseFromString(r.spec);
  }
}

absl::StatusOr<store::PoolRecord> PoolFromProto(const v1::Pool& p, absl::string_view default_ns) {
  ASSIGN_OR_RETURN(const std::string name,
                   CanonicalQualifiedName("pool.name", p.name(), default_ns));
  ASSIGN_OR_RETURN(const std::string template_name,
                   CanonicalQualifiedName(absl::StrCat("pool \"", p.name(), "\": template"),
                                          p.template_(), default_ns));
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("pool \"", p.name(), "\": ", parts...));
  };
  if (p.min_warm() < 0) return bad("min_warm ", p.min_warm(), " is negative");
  if (p.max_warm() < p.min_warm()) {
    return bad("max_warm ", p.max_warm(), " is below min_warm ", p.min_warm());
  }
  if (p.max_sandboxes() < 0) return bad("max_sandboxes ", p.max_sandboxes(), " is negative");
  if (p.max_sandboxes() > 0 && p.max_sandboxes() < p.max_warm()) {
    return bad("max_sandboxes ", p.max_sandboxes(), " is below max_warm ", p.max_warm());
  }
  store::PoolRecord r;
  r.name = name;
  r.template_name = template_name;
  r.min_warm = p.min_warm();
  r.max_warm = p.max_warm();
  ASSIGN_OR_RETURN(
      std::optional<store::EmptyPoolPolicy> policy,
      FromProto(absl::StrCat("pool \"", p.name(), "\": empty_pool_policy"), p.empty_pool_policy()));
  r.empty_pool_policy = policy.value_or(store::EmptyPoolPolicy::kWait);
  const std::string prefix = absl::StrCat("pool \"", p.name(), "\": ");
  ASSIGN_OR_RETURN(absl::Duration wait, FromProto(prefix + "default_wait", p.default_wait()));
  RETURN_IF_ERROR(allocator::CheckWait(prefix + "default_wait", wait));
  r.default_wait = wait == absl::ZeroDuration() ? absl::Seconds(30) : wait;
  ASSIGN_OR_RETURN(r.default_ttl, TtlFromProto(prefix + "default_ttl", p.default_ttl()));
  ASSIGN_OR_RETURN(r.max_ttl, TtlFromProto(prefix + "max_ttl", p.max_ttl()));
  RETURN_IF_ERROR(CheckMaxTtl(p.name(), r.default_ttl, r.max_ttl, "default_ttl"));
  r.selection_policy = p.selection_policy().empty() ? "fifo" : p.selection_policy();
  if (!allocator::IsSelectionPolicy(r.selection_policy)) {
    return bad("selection_policy ", Quote(p.selection_policy()),
               " is not known (known: ", allocator::KnownSelectionPolicies(), ")");
  }
  switch (p.sizing()) {
    case v1::POOL_SIZING_UNSPECIFIED:
    case v1::POOL_SIZING_STATIC:
      r.sizing = store::PoolSizing::kStatic;
      break;
    case v1::POOL_SIZING_DEMAND:
      r.sizing = store::PoolSizing::kDemand;
      break;
    default:
      return bad("sizing ", static_cast<int>(p.sizing()), " is not a PoolSizing");
  }
  if (p.max_sandboxes() != 0) {
    return absl::UnimplementedError(
        absl::StrCat(prefix, "max_sandboxes ", p.max_sandboxes(),
                     " cannot be enforced by this server yet; leave it 0 (no cap)"));
  }
  return r;
}

void ToProto(const store::PoolRecord& r, v1::Pool* out) {
  out->set_name(r.name);
  out->set_template_(r.template_name);
  out->set_min_warm(r.min_warm);
  out->set_max_warm(r.max_warm);
  out->set_empty_pool_policy(ToProto(r.empty_pool_policy));
  ToProto(r.default_wait, out->mutable_default_wait());
  if (r.default_ttl != absl::ZeroDuration()) ToProto(r.default_ttl, out->mutable_default_ttl());
  if (r.max_ttl != absl::ZeroDuration()) ToProto(r.max_ttl, out->mutable_max_ttl());
  out->set_selection_policy(r.selection_policy);
  out->set_generation(static_cast<int64_t>(r.generation));
  out->set_sizing(r.sizing == store::PoolSizing::kDemand ? v1::POOL_SIZING_DEMAND
                                                         : v1::POOL_SIZING_STATIC);
}

void ToProto(const allocator::PoolStatus& s, uint64_t template_generation, absl::Time now,
             v1::PoolStatus* out) {
  out->set_warm(static_cast<int32_t>(s.warm));
  out->set_claimed(static_cast<int32_t>(s.claimed));
  out->set_target(static_cast<int32_t>(s.target));
  out->set_waiting_claims(static_cast<int32_t>(s.waiting));
  out->set_target_reason(allocator::TargetReasonName(s.target_reason));
  out->set_arrival_rate(s.demand.rate_short);
  out->set_arrival_rate_long(s.demand.rate_long);
  ToProto(s.demand.create_latency, out->mutable_create_latency());
  out->set_demand(static_cast<int32_t>(std::min<int64_t>(s.demand.demand, INT32_MAX)));
  out->set_template_generation(static_cast<int64_t>(template_generation));
  out->set_last_error(s.last_error);
  ToProto(now, out->mutable_updated_at());
}

absl::Status FillPool(const allocator::Allocator& a, const std::string& name, v1::Pool* out,
                      const images::Images* images) {
  ASSIGN_OR_RETURN(store::PoolRecord pool, a.GetPool(name));
  ToProto(pool, out);
  absl::StatusOr<allocator::PoolStatus> status = a.GetPoolStatus(name);
  if (status.ok()) {
    absl::StatusOr<store::TemplateRecord> t = a.GetTemplate(pool.template_name);
    ToProto(*status, t.ok() ? t->generation : 0, absl::Now(), out->mutable_status());
    // A local template's spec is its sbx.v1.LocalSpec, serialized.
    v1::LocalSpec local;
    if (t.ok() && t->runtime == "local" && local.ParseFromString(t->spec)) {
      if (!local.image().empty()) {
        out->mutable_status()->set_image(local.image());
        if (images != nullptr) {
          out->mutable_status()->set_image_state(images->State(local.image()));
        }
      }
      out->mutable_status()->set_snapshot(local.snapshot());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> PageSize(int32_t page_size) {
  if (page_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat("page_size ", page_size, " is negative"));
  }
  if (page_size > kMaxPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size ", page_size, " is above ", kMaxPageSize));
  }
  return page_size == 0 ? kDefaultPageSize : page_size;
}

std::string EncodePageToken(absl::string_view kind, uint64_t fingerprint, absl::string_view last) {
  return absl::WebSafeBase64Escape(absl::StrCat(kind, "|", absl::Hex(fingerprint), "|", last));
}

absl::StatusOr<std::string> DecodePageToken(absl::string_view kind, uint64_t fingerprint,
                                            absl::string_view token) {
  if (token.empty()) return std::string();
  std::string raw;
  std::vector<std::string> parts;
  if (absl::WebSafeBase64Unescape(token, &raw))
    parts = absl::StrSplit(raw, absl::MaxSplits('|', 2));
  uint64_t got = 0;
  if (parts.size() != 3 || parts[0] != kind || parts[2].empty() ||
      !absl::SimpleHexAtoi(parts[1], &got)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token ", Quote(token), " is malformed; start over with an empty one"));
  }
  if (got != fingerprint) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token ", Quote(token),
                     " was issued for a different filter; use the same filter, or start over"));
  }
  return parts[2];
}

uint64_t Fingerprint(const std::vector<std::string>& parts) {
  uint64_t h = kFnv1a64Offset;
  for (const std::string& p : parts) {
    h = Fnv1a64(p, h);
    h = Fnv1a64("\xff", h);  // separator: never a byte of UTF-8 text
  }
  return h;
}

absl::Status RequireClaimId(const std::string& id) {
  const size_t hash = id.rfind('#');
  if (hash == std::string::npos) return ValidateKey("claim_id", id);
  const absl::string_view index = absl::string_view(id).substr(hash + 1);
  const bool digits =
      !index.empty() && index.size() <= 4 &&
      std::all_of(index.begin(), index.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) {
    return absl::InvalidArgumentError(
        absl::StrCat("claim_id \"", id, "\" is neither a claim id nor \"<batch_id>#<index>\""));
  }
  return ValidateKey("claim_id", absl::string_view(id).substr(0, hash));
}

}  // namespace sbx::server

#include "src/store/record_codec.h"

#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "absl/base/internal/raw_logging.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "src/store/records.pb.h"

namespace sbx::store::codec {
namespace {

constexpr int64_t kInfiniteSeconds = std::numeric_limits<int64_t>::max();
constexpr int64_t kMinusInfiniteSeconds = std::numeric_limits<int64_t>::min();
constexpr int64_t kNanosPerSecond = 1'000'000'000;

template <typename Int64, typename Int32>
void EncodeTime(absl::Time t, Int64 set_s, Int32 set_ns) {
  if (t == absl::InfiniteFuture()) {
    set_s(kInfiniteSeconds);
    return;
  }
  if (t == absl::InfinitePast()) {
    set_s(kMinusInfiniteSeconds);
    return;
  }
  // ToUnixSeconds rounds toward the infinite past, so the remainder is in [0, 1s).
  const int64_t s = absl::ToUnixSeconds(t);
  set_s(s);
  set_ns(static_cast<int32_t>(absl::ToInt64Nanoseconds(t - absl::FromUnixSeconds(s))));
}

template <typename Int64, typename Int32>
void EncodeDuration(absl::Duration d, Int64 set_s, Int32 set_ns) {
  if (d == absl::InfiniteDuration()) {
    set_s(kInfiniteSeconds);
    return;
  }
  if (d == -absl::InfiniteDuration()) {
    set_s(kMinusInfiniteSeconds);
    return;
  }
  absl::Duration rem;
  const int64_t s = absl::IDivDuration(d, absl::Seconds(1), &rem);  // truncates toward 0
  set_s(s);
  set_ns(static_cast<int32_t>(absl::ToInt64Nanoseconds(rem)));
}

absl::Status Corrupt(absl::string_view key, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("record \"", absl::CHexEscape(key), "\": ", what));
}

absl::Status DecodeTime(absl::string_view key, absl::string_view field, int64_t s, int32_t ns,
                        absl::Time* out) {
  if (s == kInfiniteSeconds || s == kMinusInfiniteSeconds) {
    if (ns != 0) {
      return Corrupt(key, absl::StrCat(field, ": infinite time with nanoseconds ", ns));
    }
    *out = s == kInfiniteSeconds ? absl::InfiniteFuture() : absl::InfinitePast();
    return absl::OkStatus();
  }
  if (ns < 0 || ns >= kNanosPerSecond) {
    return Corrupt(key, absl::StrCat(field, ": nanoseconds ", ns, " out of range"));
  }
  *out = absl::FromUnixSeconds(s) + absl::Nanoseconds(ns);
  return absl::OkStatus();
}

absl::Status DecodeDuration(absl::string_view key, absl::string_view field, int64_t s, int32_t ns,
                            absl::Duration* out) {
  if (s == kInfiniteSeconds || s == kMinusInfiniteSeconds) {
    if (ns != 0) {
      return Corrupt(key, absl::StrCat(field, ": infinite duration with nanoseconds ", ns));
    }
    *out = s == kInfiniteSeconds ? absl::InfiniteDuration() : -absl::InfiniteDuration();
    return absl::OkStatus();
  }
  if (ns <= -kNanosPerSecond || ns >= kNanosPerSecond || (s > 0 && ns < 0) || (s < 0 && ns > 0)) {
    return Corrupt(key, absl::StrCat(field, ": nanoseconds ", ns, " out of range"));
  }
  *out = absl::Seconds(s) + absl::Nanoseconds(ns);
  return absl::OkStatus();
}

// Checks an enum's stored number against [lo, hi] (the values records.h defines).
template <typename Enum>
absl::Status DecodeEnum(absl::string_view key, absl::string_view field, uint32_t v, Enum lo,
                        Enum hi, Enum* out) {
  using U = std::underlying_type_t<Enum>;
  if (v < static_cast<U>(lo) || v > static_cast<U>(hi)) {
    return Corrupt(key, absl::StrCat("unknown ", field, " ", v));
  }
  *out = static_cast<Enum>(v);
  return absl::OkStatus();
}

template <typename Enum>
uint32_t EnumValue(Enum e) {
  return static_cast<uint32_t>(e);
}

void Serialize(const google::protobuf::MessageLite& msg, std::string* out) {
  out->push_back(static_cast<char>(kFormatVersion));
  // SerializeToString would replace `out`; AppendToString keeps the version byte.
  ABSL_RAW_CHECK(msg.AppendToString(out), "serializing a store record failed");
}

}  // namespace

std::string MarkerValue() {
  std::string v(1, static_cast<char>(kFormatVersion));
  v += "sbx.store";
  return v;
}

std::string EncodeReplicaMarker(const ReplicaMarker& marker) {
  Replica msg;
  msg.set_leader(marker.leader);
  msg.set_term(marker.term);
  msg.set_self(marker.self);
  msg.set_complete(marker.complete);
  std::string out;
  Serialize(msg, &out);
  return out;
}

absl::StatusOr<ReplicaMarker> DecodeReplicaMarker(absl::string_view value) {
  Replica msg;
  if (value.empty() || static_cast<uint8_t>(value[0]) != kFormatVersion ||
      !msg.ParseFromArray(value.data() + 1, static_cast<int>(value.size() - 1))) {
    return Corrupt(kReplicaKey, "value does not parse");
  }
  ReplicaMarker marker;
  marker.leader = msg.leader();
  marker.term = msg.term();
  marker.self = msg.self();
  marker.complete = msg.complete();
  return marker;
}

bool IsReplicatedKey(absl::string_view key) {
  if (key == kRevisionKey) return true;
  if (key.size() < 3) return false;
  const absl::string_view prefix = key.substr(0, 2);
  return prefix == kTemplatePrefix || prefix == kPoolPrefix || prefix == kSandboxPrefix ||
         prefix == kClaimPrefix || prefix == kSnapshotPrefix;
}

void AppendKey(Mutation::Kind kind, absl::string_view key, std::string* out) {
  absl::string_view prefix;
  switch (kind) {
    case Mutation::Kind::kTemplate:
      prefix = kTemplatePrefix;
      break;
    case Mutation::Kind::kPool:
      prefix = kPoolPrefix;
      break;
    case Mutation::Kind::kSandbox:
      prefix = kSandboxPrefix;
      break;
    case Mutation::Kind::kClaim:
      prefix = kClaimPrefix;
      break;
    case Mutation::Kind::kRevision:
      prefix = kMetaPrefix;
      break;
    case Mutation::Kind::kSnapshot:
      prefix = kSnapshotPrefix;
      break;
  }
  ABSL_RAW_CHECK(!prefix.empty(), "unknown mutation kind");
  out->append(prefix.data(), prefix.size());
  out->append(key.data(), key.size());
}

std::string EncodeKey(Mutation::Kind kind, absl::string_view key) {
  std::string out;
  AppendKey(kind, key, &out);
  return out;
}

void EncodeValue(const Mutation& m, std::string* out) {
  std::visit(
      [out](const auto& r) {
        using R = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<R, std::monostate>) {
          ABSL_RAW_LOG(FATAL, "EncodeValue called for a delete");
        } else if constexpr (std::is_same_v<R, TemplateRecord>) {
          Template msg;
          msg.set_runtime(r.runtime);
          msg.set_spec(r.spec);
          msg.set_generation(r.generation);
          Serialize(msg, out);
        } else if constexpr (std::is_same_v<R, PoolRecord>) {
          Pool msg;
          msg.set_template_name(r.template_name);
          msg.set_min_warm(r.min_warm);
          msg.set_max_warm(r.max_warm);
          msg.set_empty_pool_policy(EnumValue(r.empty_pool_policy));
          EncodeDuration(
              r.default_wait, [&](int64_t s) { msg.set_default_wait_s(s); },
              [&](int32_t ns) { msg.set_default_wait_ns(ns); });
          EncodeDuration(
              r.default_ttl, [&](int64_t s) { msg.set_default_ttl_s(s); },
              [&](int32_t ns) { msg.set_default_ttl_ns(ns); });
          EncodeDuration(
              r.max_ttl, [&](int64_t s) { msg.set_max_ttl_s(s); },
              [&](int32_t ns) { msg.set_max_ttl_ns(ns); });
          msg.set_selection_policy(r.selection_policy);
          msg.set_generation(r.generation);
          msg.set_sizing(static_cast<uint32_t>(r.sizing));
          Serialize(msg, out);
        } else if constexpr (std::is_same_v<R, SandboxRecord>) {
          Sandbox msg;
          msg.set_pool(r.pool);
          msg.set_endpoint(r.endpoint);
          msg.set_node(r.node);
          for (const auto& [k, v] : r.node_labels) {
            Label* label = msg.add_node_labels();
            label->set_key(k);
            label->set_value(v);
          }
          EncodeTime(
              r.created, [&](int64_t s) { msg.set_created_s(s); },
              [&](int32_t ns) { msg.set_created_ns(ns); });
          Serialize(msg, out);
        } else if constexpr (std::is_same_v<R, ClaimRecord>) {
          Claim msg;
          msg.set_owner(r.owner);
          msg.set_pool(r.pool);
          msg.set_sandbox_id(r.sandbox_id);
          msg.set_endpoint(r.endpoint);
          for (const auto& [k, v] : r.labels) {
            Label* label = msg.add_labels();
            label->set_key(k);
            label->set_value(v);
          }
          msg.set_launch_type(EnumValue(r.launch_type));
          msg.set_state(EnumValue(r.state));
          EncodeTime(
              r.created, [&](int64_t s) { msg.set_created_s(s); },
              [&](int32_t ns) { msg.set_created_ns(ns); });
          EncodeTime(
              r.expires, [&](int64_t s) { msg.set_expires_s(s); },
              [&](int32_t ns) { msg.set_expires_ns(ns); });
          EncodeTime(
              r.ended, [&](int64_t s) { msg.set_ended_s(s); },
              [&](int32_t ns) { msg.set_ended_ns(ns); });
          msg.set_revision(r.revision);
          msg.set_suspended(r.suspended);
          msg.set_batch_count(r.batch_count);
          for (const auto& [k, v] : r.env) {
            Label* label = msg.add_env();
            label->set_key(k);
            label->set_value(v);
          }
          Serialize(msg, out);
        } else if constexpr (std::is_same_v<R, SnapshotRecord>) {
          Snapshot msg;
          msg.set_owner(r.owner);
          msg.set_name(r.name);
          for (const auto& [k, v] : r.labels) {
            Label* label = msg.add_labels();
            label->set_key(k);
            label->set_value(v);
          }
          msg.set_source_claim(r.source_claim);
          msg.set_parent_image_digest(r.parent_image_digest);
          msg.set_parent_image(r.parent_image);
          msg.set_parent_snapshot(r.parent_snapshot);
          msg.set_size_bytes(r.size_bytes);
          EncodeTime(
              r.created, [&](int64_t s) { msg.set_created_s(s); },
              [&](int32_t ns) { msg.set_created_ns(ns); });
          msg.set_template_name(r.template_name);
          msg.set_template_runtime(r.template_runtime);
          msg.set_template_spec(r.template_spec);
          Serialize(msg, out);
        } else {
          static_assert(std::is_same_v<R, RevisionRecord>);
          Revision msg;
          msg.set_revision(r.revision);
          Serialize(msg, out);
        }
      },
      m.record);
}

// One message of each kind, reused across records: ParseFromArray clears a message but
// keeps its allocated capacity (repeated fields, string buffers), which matters when a
// million records are decoded at start-up.
struct RecordDecoder::Messages {
  Template template_msg;
  Pool pool_msg;
  Sandbox sandbox_msg;
  Claim claim_msg;
  Snapshot snapshot_msg;
  Revision revision_msg;
};

RecordDecoder::RecordDecoder() : messages_(std::make_unique<Messages>()) {}
RecordDecoder::~RecordDecoder() = default;

absl::Status RecordDecoder::Decode(absl::string_view key, absl::string_view value, Contents* out) {
  if (key.size() < 2) return Corrupt(key, "key has no kind prefix");
  const absl::string_view prefix = key.substr(0, 2);
  const absl::string_view name = key.substr(2);

  if (prefix == kMetaPrefix) {
    if (key == kRevisionKey) {
      if (value.empty()) return Corrupt(key, "empty value (no format version byte)");
      if (static_cast<uint8_t>(value[0]) != kFormatVersion) {
        return Corrupt(key, absl::StrCat("unknown format version ", static_cast<uint8_t>(value[0]),
                                         " (this build reads ", kFormatVersion, ")"));
      }
      Revision& msg = messages_->revision_msg;
      if (!msg.ParseFromArray(value.data() + 1, static_cast<int>(value.size() - 1))) {
        return Corrupt(key, "value does not parse");
      }
      out->revision = msg.revision();
      return absl::OkStatus();
    }
    if (key == kReplicaKey) return absl::OkStatus();  // ReadMarker's, not a record
    if (key != kMarkerKey) return Corrupt(key, "unknown metadata key");
    if (value != MarkerValue()) {
      return Corrupt(key,
                     absl::StrCat("unrecognized store marker \"", absl::CHexEscape(value), "\""));
    }
    return absl::OkStatus();
  }
  if (prefix != kTemplatePrefix && prefix != kPoolPrefix && prefix != kSandboxPrefix &&
      prefix != kClaimPrefix && prefix != kSnapshotPrefix) {
    return Corrupt(key, "unknown key prefix (not t/, p/, s/, c/, n/ or m/)");
  }
  if (name.empty()) return Corrupt(key, "empty name");
  if (value.empty()) return Corrupt(key, "empty value (no format version byte)");
  const auto version = static_cast<uint8_t>(value[0]);
  if (version != kFormatVersion) {
    return Corrupt(key, absl::StrCat("unknown format version ", version, " (this build reads ",
                                     kFormatVersion, ")"));
  }
  const char* data = value.data() + 1;
  const int size = static_cast<int>(value.size() - 1);
  auto parse_error = [&] { return Corrupt(key, "value does not parse"); };

  if (prefix == kClaimPrefix) {
    Claim& msg = messages_->claim_msg;
    if (!msg.ParseFromArray(data, size)) return parse_error();
    // The key is "<owner>/<id>"; the owner is also in the value, and the two must agree.
    const std::string& owner = msg.owner();
    if (name.size() <= owner.size() + 1 || name.substr(0, owner.size()) != owner ||
        name[owner.size()] != '/') {
      return Corrupt(key, absl::StrCat("claim key does not start with its owner \"",
                                       absl::CHexEscape(owner), "/\""));
    }
    ClaimRecord& r = out->claims.emplace_back();
    const absl::string_view id = name.substr(owner.size() + 1);
    r.id.assign(id.data(), id.size());
    r.owner = std::move(*msg.mutable_owner());
    r.pool = std::move(*msg.mutable_pool());
    r.sandbox_id = std::move(*msg.mutable_sandbox_id());
    r.endpoint = std::move(*msg.mutable_endpoint());
    for (Label& label : *msg.mutable_labels()) {
      r.labels.insert_or_assign(std::move(*label.mutable_key()), std::move(*label.mutable_value()));
    }
    absl::Status s = DecodeEnum(key, "launch type", msg.launch_type(), LaunchType::kWarm,
                                LaunchType::kCold, &r.launch_type);
    if (s.ok()) {
      s = DecodeEnum(key, "claim state", msg.state(), ClaimState::kActive, ClaimState::kLost,
                     &r.state);
    }
    if (s.ok()) s = DecodeTime(key, "created", msg.created_s(), msg.created_ns(), &r.created);
    if (s.ok()) s = DecodeTime(key, "expires", msg.expires_s(), msg.expires_ns(), &r.expires);
    if (s.ok()) s = DecodeTime(key, "ended", msg.ended_s(), msg.ended_ns(), &r.ended);
    r.revision = msg.revision();
    r.suspended = msg.suspended();
    r.batch_count = msg.batch_count();
    for (Label& label : *msg.mutable_env()) {
      r.env.insert_or_assign(std::move(*label.mutable_key()), std::move(*label.mutable_value()));
    }
    if (!s.ok()) out->claims.pop_back();
    return s;
  }
  if (prefix == kSnapshotPrefix) {
    Snapshot& msg = messages_->snapshot_msg;
    if (!msg.ParseFromArray(data, size)) return parse_error();
    SnapshotRecord& r = out->snapshots.emplace_back();
    r.id.assign(name.data(), name.size());
    r.owner = std::move(*msg.mutable_owner());
    r.name = std::move(*msg.mutable_name());
    for (Label& label : *msg.mutable_labels()) {
      r.labels.insert_or_assign(std::move(*label.mutable_key()), std::move(*label.mutable_value()));
    }
    r.source_claim = std::move(*msg.mutable_source_claim());
    r.parent_image_digest = std::move(*msg.mutable_parent_image_digest());
    r.parent_image = std::move(*msg.mutable_parent_image());
    r.parent_snapshot = std::move(*msg.mutable_parent_snapshot());
    r.size_bytes = msg.size_bytes();
    r.template_name = std::move(*msg.mutable_template_name());
    r.template_runtime = std::move(*msg.mutable_template_runtime());
    r.template_spec = std::move(*msg.mutable_template_spec());
    absl::Status s = DecodeTime(key, "created", msg.created_s(), msg.created_ns(), &r.created);
    if (!s.ok()) out->snapshots.pop_back();
    return s;
  }
  if (prefix == kSandboxPrefix) {
    Sandbox& msg = messages_->sandbox_msg;
    if (!msg.ParseFromArray(data, size)) return parse_error();
    SandboxRecord& r = out->sandboxes.emplace_back();
    r.id.assign(name.data(), name.size());
    r.pool = std::move(*msg.mutable_pool());
    r.endpoint = std::move(*msg.mutable_endpoint());
    r.node = std::move(*msg.mutable_node());
    for (Label& label : *msg.mutable_node_labels()) {
      r.node_labels.insert_or_assign(std::move(*label.mutable_key()),
                                     std::move(*label.mutable_value()));
    }
    absl::Status s = DecodeTime(key, "created", msg.created_s(), msg.created_ns(), &r.created);
    if (!s.ok()) out->sandboxes.pop_back();
    return s;
  }
  if (prefix == kPoolPrefix) {
    Pool& msg = messages_->pool_msg;
    if (!msg.ParseFromArray(data, size)) return parse_error();
    PoolRecord& r = out->pools.emplace_back();
    r.name.assign(name.data(), name.size());
    r.template_name = std::move(*msg.mutable_template_name());
    r.min_warm = msg.min_warm();
    r.max_warm = msg.max_warm();
    r.selection_policy = std::move(*msg.mutable_selection_policy());
    r.generation = msg.generation();
    absl::Status s =
        DecodeEnum(key, "empty pool policy", msg.empty_pool_policy(), EmptyPoolPolicy::kWait,
                   EmptyPoolPolicy::kFail, &r.empty_pool_policy);
    if (s.ok()) {
      s = DecodeEnum(key, "pool sizing", msg.sizing(), PoolSizing::kStatic, PoolSizing::kDemand,
                     &r.sizing);
    }
    if (s.ok()) {
      s = DecodeDuration(key, "default_wait", msg.default_wait_s(), msg.default_wait_ns(),
                         &r.default_wait);
    }
    if (s.ok()) {
      s = DecodeDuration(key, "default_ttl", msg.default_ttl_s(), msg.default_ttl_ns(),
                         &r.default_ttl);
    }
    if (s.ok()) {
      s = DecodeDuration(key, "max_ttl", msg.max_ttl_s(), msg.max_ttl_ns(), &r.max_ttl);
    }
    if (!s.ok()) out->pools.pop_back();
    return s;
  }
  Template& msg = messages_->template_msg;
  if (!msg.ParseFromArray(data, size)) return parse_error();
  TemplateRecord& r = out->templates.emplace_back();
  r.name.assign(name.data(), name.size());
  r.runtime = std::move(*msg.mutable_runtime());
  r.spec = std::move(*msg.mutable_spec());
  r.generation = msg.generation();
  return absl::OkStatus();
}

}  // namespace sbx::store::codec

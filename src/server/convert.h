#pragma once
// Conversions between the sbx.v1 wire messages and the allocator's records, and the
// request checks that belong to the wire format: durations, enums, labels, label
// selectors and page tokens. Every error is INVALID_ARGUMENT naming the field and value.
//
// Template specs: TemplateRecord.spec holds the serialized bytes (SerializeAsString) of
// the runtime's spec message, sbx.v1.LocalSpec for runtime "local" and
// sbx.v1.KubernetesSpec for "kubernetes"; the runtime decodes it.
//
// Thread-safety: free functions without shared state.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/map.h"
#include "google/protobuf/message_lite.h"
#include "google/protobuf/timestamp.pb.h"
#include "sbx/v1/admin.pb.h"
#include "sbx/v1/claims.pb.h"
#include "src/allocator/allocator.h"
#include "src/images/images.h"
#include "src/server/auth.h"

namespace sbx::server {

// Limits of the API (types.proto, admin.proto, claims.proto).
inline constexpr int kMaxLabels = 64;
inline constexpr int kMaxPageSize = 1000;
inline constexpr int kDefaultPageSize = 100;
inline constexpr size_t kMaxSelectorBytes = 1024;

// --- Scalars ---

// A wire Duration as absl::Duration. INVALID_ARGUMENT for a negative or malformed one
// (seconds and nanos of different signs, nanos out of range). Unset is zero.
[[nodiscard]] absl::StatusOr<absl::Duration> FromProto(absl::string_view field,
                                                       const google::protobuf::Duration& d);
// A TTL (a claim's, or a pool's default_ttl / max_ttl): as FromProto, and
// INVALID_ARGUMENT above allocator::kMaxTtl (100 years), naming the TTL and the maximum.
[[nodiscard]] absl::StatusOr<absl::Duration> TtlFromProto(absl::string_view field,
                                                          const google::protobuf::Duration& d);
void ToProto(absl::Duration d, google::protobuf::Duration* out);
// Times outside google.protobuf.Timestamp's range (0001-01-01T00:00:00Z to
// 9999-12-31T23:59:59.999999999Z) are clamped to its ends; sbx makes none (TTLs are
// bounded), but a store may hold one from before that bound.
void ToProto(absl::Time t, google::protobuf::Timestamp* out);

// UNSPECIFIED is nullopt (the pool's default). INVALID_ARGUMENT for unknown numbers.
[[nodiscard]] absl::StatusOr<std::optional<store::EmptyPoolPolicy>> FromProto(
    absl::string_view field, v1::EmptyPoolPolicy p);
v1::EmptyPoolPolicy ToProto(store::EmptyPoolPolicy p);
// UNSPECIFIED is NORMAL; INVALID_ARGUMENT naming `field` for a value that is not a
// ClaimPriority.
[[nodiscard]] absl::StatusOr<allocator::ClaimPriority> FromProto(absl::string_view field,
                                                                 v1::ClaimPriority p);
v1::ClaimState ToProto(store::ClaimState s);
v1::LaunchType ToProto(store::LaunchType t);

// --- Labels ---

// Checks keys, values and count against types.proto and copies them.
[[nodiscard]] absl::StatusOr<std::map<std::string, std::string>> LabelsFromProto(
    absl::string_view field, const google::protobuf::Map<std::string, std::string>& labels);

// A parsed label selector (claims.proto, ClaimFilter.label_selector).
struct LabelRequirement {
  enum class Op : uint8_t { kEquals, kNotEquals, kExists, kNotExists };
  Op op;
  std::string key;
  std::string value;
};
// INVALID_ARGUMENT naming the bad term, e.g. `label_selector term "a=b=c" ...`.
[[nodiscard]] absl::StatusOr<std::vector<LabelRequirement>> ParseLabelSelector(
    absl::string_view selector);
bool Matches(const std::vector<LabelRequirement>& requirements,
             const std::map<std::string, std::string>& labels);

// --- Claims ---

void ToProto(const store::ClaimRecord& r, v1::Claim* out);

// A ClaimFilter (claims.proto) as ListClaims and WatchClaims apply it for one caller: the
// part the allocator applies (owner, pool, equality labels, whether ended claims count)
// and the part the server applies itself (the label selector and the exact states).
struct ClaimQuery {
  // owner: the filter's, else the caller's own tenant. `after` and `limit` are unset.
  allocator::ClaimFilter filter;
  std::vector<LabelRequirement> selector;
  // Empty: any state.
  std::vector<store::ClaimState> states;
  // The selector and the states (the allocator applied the rest).
  bool Matches(const store::ClaimRecord& r) const;
};
// INVALID_ARGUMENT naming a malformed field; PERMISSION_DENIED when a non-admin names
// another owner (`verb`, "list" or "watch", says what it may not do). filter.pool is
// made canonical with `default_ns`.
[[nodiscard]] absl::StatusOr<ClaimQuery> ClaimQueryFromProto(const v1::ClaimFilter& filter,
                                                             const Caller& caller,
                                                             absl::string_view verb,
                                                             absl::string_view default_ns);

// --- Templates and pools ---

// Checks a template (name, runtime, the matching spec) and encodes it as a record.
// Names are canonical (CanonicalQualifiedName with `default_ns`, src/common/ids.h).
[[nodiscard]] absl::StatusOr<store::TemplateRecord> TemplateFromProto(const v1::Template& t,
                                                                      absl::string_view default_ns);
// The bytes TemplateFromProto stores for a spec: deterministic (map entries sorted), so
// equal specs give equal bytes and an identical Put can be recognised.
std::string SerializeSpec(const google::protobuf::MessageLite& spec);
// Decodes the record; a spec that does not parse is left empty.
void ToProto(const store::TemplateRecord& r, v1::Template* out);

// Checks a pool against admin.proto's limits and makes a record (generation 0).
// UNIMPLEMENTED for max_sandboxes != 0, which this server cannot enforce yet.
[[nodiscard]] absl::StatusOr<store::PoolRecord> PoolFromProto(const v1::Pool& p,
                                                              absl::string_view default_ns);
void ToProto(const store::PoolRecord& r, v1::Pool* out);
void ToProto(const allocator::PoolStatus& s, uint64_t template_generation, absl::Time now,
             v1::PoolStatus* out);
// Fills `out` with pool `name` and its status now (GetPool, ListPools, WatchPools), with
// where its template's image stands in `images` (status.image_state) when given.
// NOT_FOUND when the pool does not exist.
[[nodiscard]] absl::Status FillPool(const allocator::Allocator& a, const std::string& name,
                                    v1::Pool* out, const images::Images* images = nullptr);

// --- Pagination ---

// page_size: 0 -> 100; INVALID_ARGUMENT below 0 or above 1000.
[[nodiscard]] absl::StatusOr<int> PageSize(int32_t page_size);
// Page tokens are opaque to clients: web-safe base64 of "<kind>|<fingerprint>|<last key>",
// where the fingerprint ties the token to the listing's filter.
std::string EncodePageToken(absl::string_view kind, uint64_t fingerprint, absl::string_view last);
// The last key of the previous page; "" for an empty token. INVALID_ARGUMENT when the
// token is malformed or was issued for another kind of list or another filter.
[[nodiscard]] absl::StatusOr<std::string> DecodePageToken(absl::string_view kind,
                                                          uint64_t fingerprint,
                                                          absl::string_view token);
// A stable 64-bit hash (FNV-1a) of a sequence of strings, for fingerprints.
uint64_t Fingerprint(const std::vector<std::string>& parts);

// A claim id as Get/Release/Renew and SandboxService accept it: a client's key, or
// "<batch_id>#<i>" of a ClaimBatch member. INVALID_ARGUMENT naming the id.
[[nodiscard]] absl::Status RequireClaimId(const std::string& id);

}  // namespace sbx::server

#pragma once
// Records with every field set to a non-default value, and field-by-field comparison, for
// the store tests.

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "src/store/records.h"
#include "src/store/store.h"

namespace sbx::store::testing_records {

// A string with the literal's bytes, embedded NULs included.
template <size_t N>
std::string Bytes(const char (&s)[N]) {
  return std::string(s, N - 1);
}

inline TemplateRecord FullTemplate(const std::string& name) {
  TemplateRecord r;
  r.name = name;
  r.runtime = "kubernetes";
  r.spec = Bytes("{\"image\":\"python:3.12\"}\0binary\xff");
  r.generation = 0xFFFF'FFFF'FFFF'FFF0ULL;
  return r;
}

inline PoolRecord FullPool(const std::string& name) {
  PoolRecord r;
  r.name = name;
  r.template_name = "tpl-" + name;
  r.min_warm = 3;
  r.max_warm = -7;  // nonsense, but the store keeps what it is given
  r.empty_pool_policy = EmptyPoolPolicy::kCold;
  r.default_wait = absl::Milliseconds(1500) + absl::Nanoseconds(7);
  r.default_ttl = absl::InfiniteDuration();
  r.max_ttl = -absl::Seconds(3) - absl::Nanoseconds(250);
  r.selection_policy = "spread";
  r.generation = 42;
  return r;
}

inline SandboxRecord FullSandbox(const std::string& id) {
  SandboxRecord r;
  r.id = id;
  r.pool = "py";
  r.endpoint = "unix:///run/sbx/" + id + ".sock";
  r.node = "node-7";
  r.node_labels = {{"kubernetes.io/hostname", "node-7"},
                   {"topology.kubernetes.io/zone", "europe-west1-b"}};
  r.created = absl::FromUnixNanos(1'700'000'123'456'789'012LL);
  return r;
}

inline ClaimRecord FullClaim(const std::string& id) {
  ClaimRecord r;
  r.id = id;
  r.owner = "tenant-a";
  r.pool = "py";
  r.sandbox_id = "sbx-" + id;
  r.endpoint = "10.0.0.7:7000";
  r.labels = {{"team", "rl"}, {"run", "42"}, {"", "empty key"}, {"bin\xff", Bytes("\0v")}};
  r.launch_type = LaunchType::kCold;
  r.state = ClaimState::kExpired;
  r.created = absl::FromUnixNanos(1'700'000'000'000'000'001LL);
  r.expires = absl::InfiniteFuture();
  r.ended = absl::FromUnixSeconds(-86'400) + absl::Nanoseconds(999'999'999);  // before 1970
  r.revision = 0xFFFF'FFFF'FFFF'FFF1ULL;
  r.suspended = true;
  r.batch_count = 1000;
  r.env = {{"API_KEY", "secret"}, {"EMPTY", ""}};
  return r;
}

// A claim as the claim path writes it.
inline ClaimRecord SmallClaim(const std::string& id) {
  ClaimRecord r;
  r.id = id;
  r.owner = "tenant";
  r.pool = "py";
  r.sandbox_id = "s-" + id;
  r.endpoint = "unix:///run/sbx/s.sock";
  r.created = absl::FromUnixSeconds(1'700'000'000);
  return r;
}

#define SBX_CMP_FIELD(field)                                                               \
  if (!(a.field == b.field)) {                                                             \
    return ::testing::AssertionFailure() << #field << " differs for \"" << Key(a) << "\""; \
  }

inline std::string Key(const TemplateRecord& r) { return r.name; }
inline std::string Key(const PoolRecord& r) { return r.name; }
inline std::string Key(const SandboxRecord& r) { return r.id; }
inline std::string Key(const ClaimRecord& r) { return ClaimKey(r.owner, r.id); }

inline ::testing::AssertionResult Same(const TemplateRecord& a, const TemplateRecord& b) {
  SBX_CMP_FIELD(name);
  SBX_CMP_FIELD(runtime);
  SBX_CMP_FIELD(spec);
  SBX_CMP_FIELD(generation);
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult Same(const PoolRecord& a, const PoolRecord& b) {
  SBX_CMP_FIELD(name);
  SBX_CMP_FIELD(template_name);
  SBX_CMP_FIELD(min_warm);
  SBX_CMP_FIELD(max_warm);
  SBX_CMP_FIELD(empty_pool_policy);
  SBX_CMP_FIELD(default_wait);
  SBX_CMP_FIELD(default_ttl);
  SBX_CMP_FIELD(max_ttl);
  SBX_CMP_FIELD(selection_policy);
  SBX_CMP_FIELD(generation);
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult Same(const SandboxRecord& a, const SandboxRecord& b) {
  SBX_CMP_FIELD(id);
  SBX_CMP_FIELD(pool);
  SBX_CMP_FIELD(endpoint);
  SBX_CMP_FIELD(node);
  SBX_CMP_FIELD(node_labels);
  SBX_CMP_FIELD(created);
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult Same(const ClaimRecord& a, const ClaimRecord& b) {
  SBX_CMP_FIELD(id);
  SBX_CMP_FIELD(owner);
  SBX_CMP_FIELD(pool);
  SBX_CMP_FIELD(sandbox_id);
  SBX_CMP_FIELD(endpoint);
  SBX_CMP_FIELD(labels);
  SBX_CMP_FIELD(launch_type);
  SBX_CMP_FIELD(state);
  SBX_CMP_FIELD(created);
  SBX_CMP_FIELD(expires);
  SBX_CMP_FIELD(ended);
  SBX_CMP_FIELD(revision);
  SBX_CMP_FIELD(suspended);
  SBX_CMP_FIELD(batch_count);
  SBX_CMP_FIELD(env);
  return ::testing::AssertionSuccess();
}

#undef SBX_CMP_FIELD

template <typename R>
::testing::AssertionResult SameList(const char* kind, const std::vector<R>& a,
                                    const std::vector<R>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << kind << ": " << a.size() << " records vs " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    ::testing::AssertionResult r = Same(a[i], b[i]);
    if (!r) return ::testing::AssertionFailure() << kind << "[" << i << "]: " << r.message();
  }
  return ::testing::AssertionSuccess();
}

// Same records, in the same order (each kind sorted by key).
inline ::testing::AssertionResult SameContents(const Contents& a, const Contents& b) {
  if (auto r = SameList("templates", a.templates, b.templates); !r) return r;
  if (auto r = SameList("pools", a.pools, b.pools); !r) return r;
  if (auto r = SameList("sandboxes", a.sandboxes, b.sandboxes); !r) return r;
  if (a.revision != b.revision) {
    return ::testing::AssertionFailure() << "revision mark: " << a.revision << " vs " << b.revision;
  }
  return SameList("claims", a.claims, b.claims);
}

}  // namespace sbx::store::testing_records

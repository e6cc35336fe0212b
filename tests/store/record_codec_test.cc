// The documented on-disk layout (records.proto): key = kind prefix + name, value = format
// version byte + message; decoding reproduces the record exactly.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/store/record_codec.h"
#include "src/store/store.h"
#include "tests/store/test_records.h"

namespace sbx::store::codec {
namespace {

using ::testing::HasSubstr;
using testing_records::Bytes;
using testing_records::FullClaim;
using testing_records::FullPool;
using testing_records::FullSandbox;
using testing_records::FullTemplate;
using testing_records::Same;

TEST(RecordCodecTest, KeysArePrefixedByKind) {
  EXPECT_EQ(EncodeKey(Mutation::Kind::kTemplate, "a"), "t/a");
  EXPECT_EQ(EncodeKey(Mutation::Kind::kPool, "a"), "p/a");
  EXPECT_EQ(EncodeKey(Mutation::Kind::kSandbox, "a"), "s/a");
  EXPECT_EQ(EncodeKey(Mutation::Kind::kClaim, "a/b"), "c/a/b");
  EXPECT_EQ(EncodeKey(Mutation::Kind::kRevision, kRevisionRecordKey), kRevisionKey);
  EXPECT_EQ(EncodeKey(Mutation::Kind::kSnapshot, "sn-1"), "n/sn-1");
}

// Snapshot records (issue 37) round-trip field by field, are replicated like the other
// records, and a value that does not parse is DATA_LOSS naming its key.
TEST(RecordCodecTest, SnapshotsRoundTrip) {
  SnapshotRecord r;
  r.id = "sn-0123456789abcdef";
  r.owner = "tenant-a";
  r.name = "prepared repo";
  r.labels = {{"stage", "ready"}, {"k", ""}};
  r.source_claim = "claim-1";
  r.parent_image_digest = "sha256:abc";
  r.parent_snapshot = "sn-parent";
  r.size_bytes = int64_t{5} << 40;
  r.created = absl::FromUnixNanos(1700000000123456789);
  r.template_name = "py";
  r.template_runtime = "local";
  r.template_spec = std::string("\x0a\x00spec", 6);
  WriteBatch b;
  b.Put(r);
  ASSERT_EQ(b.mutations()[0].kind, Mutation::Kind::kSnapshot);
  std::string value;
  EncodeValue(b.mutations()[0], &value);
  const std::string key = EncodeKey(Mutation::Kind::kSnapshot, r.id);
  EXPECT_TRUE(IsReplicatedKey(key));
  Contents out;
  RecordDecoder decoder;
  ASSERT_TRUE(decoder.Decode(key, value, &out).ok());
  ASSERT_EQ(out.snapshots.size(), 1u);
  const SnapshotRecord& got = out.snapshots[0];
  EXPECT_EQ(got.id, r.id);
  EXPECT_EQ(got.owner, r.owner);
  EXPECT_EQ(got.name, r.name);
  EXPECT_EQ(got.labels, r.labels);
  EXPECT_EQ(got.source_claim, r.source_claim);
  EXPECT_EQ(got.parent_image_digest, r.parent_image_digest);
  EXPECT_EQ(got.parent_snapshot, r.parent_snapshot);
  EXPECT_EQ(got.size_bytes, r.size_bytes);
  EXPECT_EQ(got.created, r.created);
  EXPECT_EQ(got.template_name, r.template_name);
  EXPECT_EQ(got.template_runtime, r.template_runtime);
  EXPECT_EQ(got.template_spec, r.template_spec);
  absl::Status bad = decoder.Decode(key, Bytes("\x01\xff\xff"), &out);
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.message(), HasSubstr("n/sn-0123456789abcdef"));
  EXPECT_EQ(out.snapshots.size(), 1u);
}

TEST(RecordCodecTest, RevisionMarkRoundTrips) {
  WriteBatch b;
  b.Put(RevisionRecord{0xFFFF'FFFF'FFFF'FFFEULL});
  std::string value;
  EncodeValue(b.mutations()[0], &value);
  EXPECT_EQ(static_cast<uint8_t>(value[0]), kFormatVersion);
  Contents out;
  RecordDecoder decoder;
  ASSERT_TRUE(
      decoder.Decode(EncodeKey(b.mutations()[0].kind, b.mutations()[0].key), value, &out).ok());
  EXPECT_EQ(out.revision, 0xFFFF'FFFF'FFFF'FFFEULL);
  EXPECT_EQ(decoder.Decode(kRevisionKey, "", &out).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(decoder.Decode(kRevisionKey, Bytes("\x02\x08\x01"), &out).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(decoder.Decode("m/other", value, &out).code(), absl::StatusCode::kDataLoss);
}

// A claim written before revisions existed (fields 1-13 only) still decodes: revision 0,
// not suspended, no batch count. The bytes are what the previous build wrote for this claim.
TEST(RecordCodecTest, ClaimsFromBeforeRevisionsDecode) {
  // owner "o" (1), pool "py" (2), sandbox_id "s" (3), launch_type 1 (6), state 1 (7),
  // created_s 1 (8, zigzag 2), expires_s INT64_MAX (10, zigzag), ended_s 0.
  const std::string old_value = Bytes(
      "\x01"
      "\x0a\x01o"
      "\x12\x02py"
      "\x1a\x01s"
      "\x30\x01"
      "\x38\x01"
      "\x40\x02"
      "\x50\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01");
  Contents out;
  RecordDecoder decoder;
  absl::Status s = decoder.Decode("c/o/old", old_value, &out);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(out.claims.size(), 1u);
  const ClaimRecord& c = out.claims[0];
  EXPECT_EQ(c.id, "old");
  EXPECT_EQ(c.pool, "py");
  EXPECT_EQ(c.sandbox_id, "s");
  EXPECT_EQ(c.created, absl::FromUnixSeconds(1));
  EXPECT_EQ(c.expires, absl::InfiniteFuture());
  EXPECT_EQ(c.revision, 0u);
  EXPECT_FALSE(c.suspended);
  EXPECT_EQ(c.batch_count, 0);
  EXPECT_EQ(out.revision, 0u);
}

TEST(RecordCodecTest, ValuesStartWithTheFormatVersionAndDecodeExactly) {
  WriteBatch b;
  b.Put(FullTemplate("t"));
  b.Put(FullPool("p"));
  b.Put(FullSandbox("s"));
  b.Put(FullClaim("c"));
  Contents out;
  RecordDecoder decoder;
  for (const Mutation& m : b.mutations()) {
    std::string value;
    EncodeValue(m, &value);
    ASSERT_FALSE(value.empty());
    EXPECT_EQ(static_cast<uint8_t>(value[0]), kFormatVersion);
    ASSERT_TRUE(decoder.Decode(EncodeKey(m.kind, m.key), value, &out).ok());
  }
  ASSERT_EQ(out.claims.size(), 1u);
  EXPECT_TRUE(Same(out.templates.at(0), FullTemplate("t")));
  EXPECT_TRUE(Same(out.pools.at(0), FullPool("p")));
  EXPECT_TRUE(Same(out.sandboxes.at(0), FullSandbox("s")));
  EXPECT_TRUE(Same(out.claims.at(0), FullClaim("c")));
}

TEST(RecordCodecTest, DecoderReuseDoesNotLeakFieldsBetweenRecords) {
  WriteBatch b;
  b.Put(FullClaim("full"));
  ClaimRecord bare;
  bare.id = "bare";
  b.Put(bare);
  Contents out;
  RecordDecoder decoder;
  for (const Mutation& m : b.mutations()) {
    std::string value;
    EncodeValue(m, &value);
    ASSERT_TRUE(decoder.Decode(EncodeKey(m.kind, m.key), value, &out).ok());
  }
  ASSERT_EQ(out.claims.size(), 2u);
  EXPECT_TRUE(Same(out.claims[1], bare));
}

TEST(RecordCodecTest, MarkerDecodesToNothingAndAFailedDecodeAddsNothing) {
  Contents out;
  RecordDecoder decoder;
  EXPECT_TRUE(decoder.Decode(kMarkerKey, MarkerValue(), &out).ok());
  // owner "o" (field 1), launch_type 5 (field 6): the key matches the owner, the enum fails.
  absl::Status s = decoder.Decode("c/o/x", std::string("\x01\x0a\x01o\x30\x05", 6), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("\"c/o/x\""));
  EXPECT_THAT(s.message(), HasSubstr("launch type 5"));
  EXPECT_TRUE(out.claims.empty());
}

TEST(RecordCodecTest, ClaimKeysAreOwnerSlashId) {
  ClaimRecord other_owner = FullClaim("c");
  other_owner.owner = "tenant-b";
  WriteBatch b;
  b.Put(FullClaim("c"));
  b.Put(other_owner);
  std::vector<std::string> keys;
  Contents out;
  RecordDecoder decoder;
  for (const Mutation& m : b.mutations()) {
    keys.push_back(EncodeKey(m.kind, m.key));
    std::string value;
    EncodeValue(m, &value);
    ASSERT_TRUE(decoder.Decode(keys.back(), value, &out).ok());
  }
  EXPECT_EQ(keys, (std::vector<std::string>{"c/tenant-a/c", "c/tenant-b/c"}));
  // Same id, different owners: two records, each with its own owner and the bare id.
  ASSERT_EQ(out.claims.size(), 2u);
  EXPECT_TRUE(Same(out.claims[0], FullClaim("c")));
  EXPECT_TRUE(Same(out.claims[1], other_owner));
}

TEST(RecordCodecTest, AClaimKeyThatDoesNotStartWithItsOwnerIsDataLoss) {
  WriteBatch b;
  b.Put(FullClaim("c"));  // owner "tenant-a"
  std::string value;
  EncodeValue(b.mutations()[0], &value);
  RecordDecoder decoder;
  Contents out;
  ASSERT_TRUE(decoder.Decode("c/tenant-a/c", value, &out).ok());
  out = Contents{};
  const std::string keys[] = {
      "c/tenant-b/c",          // another owner
      "c/c",                   // the bare id: the layout before claims were keyed by owner
      "c/tenant-ab/c",         // the owner is a prefix, but not followed by '/'
      "c/tenant-a",            // the owner alone
      "c/tenant/a/c",          // the owner's bytes, split differently
      "c/xtenant-a/c",         // the owner, but not at the start
      Bytes("c/tenant-a\0c"),  // a NUL where the '/' should be
  };
  for (const std::string& key : keys) {
    SCOPED_TRACE(absl::CHexEscape(key));
    absl::Status s = decoder.Decode(key, value, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(s.message(), HasSubstr("\"" + absl::CHexEscape(key) + "\""));
    EXPECT_THAT(s.message(), HasSubstr("claim key does not start with its owner \"tenant-a/\""));
  }
  // The owner and '/' with no id after them.
  absl::Status s = decoder.Decode("c/tenant-a/", value, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("\"c/tenant-a/\""));
  EXPECT_TRUE(out.claims.empty());
}

}  // namespace
}  // namespace sbx::store::codec

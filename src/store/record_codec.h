#pragma once
// The on-disk encoding of store records (see records.proto for the format and its rules).
// Internal to sbx::store_rocksdb; names no protobuf or RocksDB type so that the store,
// its tests and benchmarks can use it without seeing either.
//
// Thread-safety: the free functions are safe from any thread; a RecordDecoder is used by
// one thread at a time.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/store/replication.h"
#include "src/store/store.h"

namespace sbx::store::codec {

// The first byte of every value. A value whose first byte is anything else is refused
// with DATA_LOSS rather than guessed at.
inline constexpr uint8_t kFormatVersion = 1;

// Key prefixes, one per record kind, plus "m/" for the store's own metadata.
inline constexpr absl::string_view kTemplatePrefix = "t/";
inline constexpr absl::string_view kPoolPrefix = "p/";
inline constexpr absl::string_view kSandboxPrefix = "s/";
inline constexpr absl::string_view kClaimPrefix = "c/";
inline constexpr absl::string_view kSnapshotPrefix = "n/";
inline constexpr absl::string_view kMetaPrefix = "m/";

// Written when a store is created; an existing RocksDB database without it (and with other
// keys) is not an sbx store and is refused.
inline constexpr absl::string_view kMarkerKey = "m/store";
// The claim revision mark (RevisionRecord): kMetaPrefix + kRevisionRecordKey.
inline constexpr absl::string_view kRevisionKey = "m/revision";
std::string MarkerValue();
// Whose acknowledged commits the store holds (replication.h); skipped by RecordDecoder.
inline constexpr absl::string_view kReplicaKey = "m/replica";
std::string EncodeReplicaMarker(const ReplicaMarker& marker);
// DATA_LOSS naming the key for a value that does not decode.
[[nodiscard]] absl::StatusOr<ReplicaMarker> DecodeReplicaMarker(absl::string_view value);
// Whether a replicated entry may be written by a standby: records and the revision mark,
// never the store's marker or its replica marker.
bool IsReplicatedKey(absl::string_view key);

// The RocksDB key of a record of `kind` named `key`; AppendKey appends it to `*out`.
std::string EncodeKey(Mutation::Kind kind, absl::string_view key);
void AppendKey(Mutation::Kind kind, absl::string_view key, std::string* out);

// Appends the encoded value (version byte + message) of the record in `m` to `*out`.
// `m` must hold a record (not a delete).
void EncodeValue(const Mutation& m, std::string* out);

// Decodes stored entries into a Contents, reusing its buffers between records.
class RecordDecoder {
 public:
  RecordDecoder();
  ~RecordDecoder();
  RecordDecoder(const RecordDecoder&) = delete;
  RecordDecoder& operator=(const RecordDecoder&) = delete;

  // Decodes one entry and appends the record to the matching vector of `*out` (the marker
  // is checked and appended nowhere; the revision mark sets out->revision). Errors: DATA_LOSS
  // naming the key for an unknown prefix, an empty value, an unknown format version, bytes that do
  // not parse, or a field out of range (an unknown enum value, nanoseconds >= 1e9).
  [[nodiscard]] absl::Status Decode(absl::string_view key, absl::string_view value, Contents* out);

 private:
  struct Messages;
  std::unique_ptr<Messages> messages_;
};

}  // namespace sbx::store::codec

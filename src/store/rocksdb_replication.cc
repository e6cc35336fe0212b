// The store's replication hooks (rocksdb_replication.h).

#include "src/store/rocksdb_replication.h"

#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "rocksdb/db.h"
#include "rocksdb/iterator.h"
#include "rocksdb/options.h"
#include "src/common/status_macros.h"
#include "src/store/record_codec.h"
#include "src/store/rocksdb_common.h"

namespace sbx::store::internal {

absl::Status ReplicationHooks::ShipThenWrite(const rocksdb::WriteBatch& group,
                                             absl::FunctionRef<void()> write,
                                             GroupShipper** shipper, uint64_t* ticket) {
  absl::MutexLock ship_lock(&ship_mu_);
  *shipper = shipper_;
  *ticket = 0;
  // Shipped before the write: the standby's write and sync overlap with ours.
  if (*shipper != nullptr) {
    absl::StatusOr<uint64_t> shipped = (*shipper)->Ship(std::string(View(group.Data())));
    if (!shipped.ok()) {
      // Not acknowledgeable now (a leader that keeps two copies and has no standby in
      // sync): not written either, so this store holds nothing its callers were told
      // failed, as with a refusal for want of space.
      *shipper = nullptr;
      return shipped.status();
    }
    *ticket = *shipped;
  }
  write();
  return absl::OkStatus();
}

void ReplicationHooks::SetShipper(GroupShipper* shipper) {
  absl::MutexLock lock(&ship_mu_);
  shipper_ = shipper;
}

absl::Status ReplicationHooks::Snapshot(
    absl::FunctionRef<void()> at,
    absl::FunctionRef<void(absl::string_view, absl::string_view)> each) {
  ship_mu_.Lock();
  absl::ReaderMutexLock lock(&database_->mu());
  if (database_->get() == nullptr) {
    ship_mu_.Unlock();
    return database_->Closed("Snapshot");
  }
  const rocksdb::Snapshot* snapshot = database_->get()->GetSnapshot();
  at();
  ship_mu_.Unlock();
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot;
  ro.verify_checksums = true;
  ro.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(database_->get()->NewIterator(ro));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (codec::IsReplicatedKey(View(it->key()))) each(View(it->key()), View(it->value()));
  }
  absl::Status status =
      FromRocks(it->status(), absl::StrCat("reading a snapshot of ", Quoted(database_->path())));
  it.reset();
  database_->get()->ReleaseSnapshot(snapshot);
  return status;
}

absl::StatusOr<std::optional<ReplicaMarker>> ReplicationHooks::ReadMarker() {
  absl::ReaderMutexLock lock(&database_->mu());
  if (database_->get() == nullptr) return database_->Closed("ReadMarker");
  std::string value;
  rocksdb::Status s = database_->get()->Get(
      rocksdb::ReadOptions(), rocksdb::Slice(codec::kReplicaKey.data(), codec::kReplicaKey.size()),
      &value);
  if (s.IsNotFound()) return std::optional<ReplicaMarker>();
  RETURN_IF_ERROR(
      FromRocks(s, absl::StrCat("reading the replica marker of ", Quoted(database_->path()))));
  absl::StatusOr<ReplicaMarker> marker = codec::DecodeReplicaMarker(value);
  if (!marker.ok()) {
    return absl::DataLossError(
        absl::StrCat("store at ", Quoted(database_->path()), ": ", marker.status().message()));
  }
  return std::optional<ReplicaMarker>(*std::move(marker));
}

absl::Status ReplicationHooks::WriteMarker(const ReplicaMarker& marker) {
  rocksdb::WriteBatch batch;
  batch.Put(Key(codec::kReplicaKey), codec::EncodeReplicaMarker(marker));
  return WriteSynced(batch, "writing the replica marker");
}

absl::Status ReplicationHooks::BeginLoad(const ReplicaMarker& marker) {
  rocksdb::WriteBatch batch;
  for (absl::string_view prefix :
       {codec::kTemplatePrefix, codec::kPoolPrefix, codec::kSandboxPrefix, codec::kClaimPrefix,
        codec::kSnapshotPrefix}) {
    std::string end(prefix);
    end.back() = static_cast<char>(end.back() + 1);  // "c/" .. "c0": every key of the kind
    batch.DeleteRange(Key(prefix), end);
  }
  batch.Delete(Key(codec::kRevisionKey));
  ReplicaMarker loading = marker;
  loading.complete = false;
  batch.Put(Key(codec::kReplicaKey), codec::EncodeReplicaMarker(loading));
  return WriteSynced(batch, "clearing the store for a snapshot");
}

absl::Status ReplicationHooks::LoadEntries(
    const std::vector<std::pair<std::string, std::string>>& entries) {
  rocksdb::WriteBatch batch;
  for (const auto& [key, value] : entries) {
    if (!codec::IsReplicatedKey(key)) {
      return absl::InvalidArgumentError(absl::StrCat("snapshot entry \"", absl::CHexEscape(key),
                                                     "\" is not a record of an sbx store"));
    }
    batch.Put(key, value);
  }
  absl::ReaderMutexLock lock(&database_->mu());
  if (database_->get() == nullptr) return database_->Closed("LoadEntries");
  return FromRocks(database_->get()->Write(rocksdb::WriteOptions(), &batch),
                   absl::StrCat("loading a snapshot into ", Quoted(database_->path())));
}

absl::Status ReplicationHooks::ApplyGroup(absl::string_view group) {
  rocksdb::WriteBatch batch{std::string(group)};
  // Only puts and deletes of records, in the default column family: what a leader's
  // committer writes. Anything else (another store's marker, a range delete, bytes that
  // are no write batch) is refused whole.
  class Check final : public rocksdb::WriteBatch::Handler {
   public:
    rocksdb::Status PutCF(uint32_t cf, const rocksdb::Slice& key, const rocksdb::Slice&) override {
      return Allowed(cf, key);
    }
    rocksdb::Status DeleteCF(uint32_t cf, const rocksdb::Slice& key) override {
      return Allowed(cf, key);
    }
    static rocksdb::Status Allowed(uint32_t cf, const rocksdb::Slice& key) {
      if (cf == 0 && codec::IsReplicatedKey(View(key))) return rocksdb::Status::OK();
      return rocksdb::Status::InvalidArgument(
          absl::StrCat("entry \"", absl::CHexEscape(View(key)), "\" is not a record"));
    }
  } check;
  if (rocksdb::Status s = batch.Iterate(&check); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("shipped group refused: ", s.ToString()));
  }
  return WriteSynced(batch, "applying a shipped group");
}

absl::Status ReplicationHooks::WriteSynced(rocksdb::WriteBatch& batch, absl::string_view what) {
  absl::ReaderMutexLock lock(&database_->mu());
  if (database_->get() == nullptr) return database_->Closed(what);
  rocksdb::WriteOptions synced;
  synced.sync = true;
  return FromRocks(database_->get()->Write(synced, &batch),
                   absl::StrCat(what, " in ", Quoted(database_->path())));
}

}  // namespace sbx::store::internal

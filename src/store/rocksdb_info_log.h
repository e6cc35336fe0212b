#pragma once
// Private to sbx::store_rocksdb: RocksDB's info log for the store (the LOG file in the
// database directory, rolled over to LOG.old at 4 MiB).
//
// It replaces RocksDB's own file logger, which aborts the process on the line after a
// failed write when the disk is full (docs/architecture.md, "A full disk"): here each line
// is one write(2) to an O_APPEND file, and a line the file system refuses is dropped.
// Lines at ERROR and above also go to sbx's log, where an operator sees them even when
// the disk is full.
//
// Thread-safety: the logger may be called from any thread (RocksDB's background threads
// log concurrently). Lifetime: shared by the rocksdb::Options of every database the store
// opens (reopens included); it must not outlive the directory it writes into being valid
// for writes, which it only needs best effort.

#include <memory>
#include <string>

#include "rocksdb/env.h"

namespace sbx::store::internal {

std::shared_ptr<rocksdb::Logger> NewInfoLog(std::string dir);

}  // namespace sbx::store::internal

# Store benchmarks: group commit throughput and latency, and recovery of 1,000,000 records.
# The un-grouped baseline writes through RocksDB directly, so this binary links it too.
sbx_add_bench(NAME store_bench SOURCES store_bench.cc
              LIBS sbx::store sbx::store_rocksdb RocksDB::rocksdb absl::strings absl::time)

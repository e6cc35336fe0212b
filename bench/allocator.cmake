# Allocator core benchmarks: pool claim+release and the ready set against a mutex-guarded
# deque, the whole Allocator without disk, recovery from RocksDB, memory per sandbox.
sbx_add_bench(
  NAME allocator_bench
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/allocator_bench.cc
  LIBS sbx::allocator sbx::store sbx::store_rocksdb)

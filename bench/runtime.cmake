# Local runtime benchmarks against real bubblewrap and sbx-sandboxd: cold create until
# ready, and `true` run through a warm sandbox's daemon; on the host's root and (--image)
# on an image's copy-on-write root.
sbx_add_bench(NAME runtime_bench SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/runtime_bench.cc
              LIBS sbx::runtime_local sbx::images sbx::proto gRPC::grpc++)
add_dependencies(runtime_bench sbx-sandboxd sbx-rootfs)

# The Kubernetes client against the API emulator: creates/s and watch events/s.
# Run with --emulator PATH (the emulator is built with the tests: build/clang).
sbx_add_bench(NAME k8s_client_bench SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/k8s_client_bench.cc
              LIBS sbx::k8s)

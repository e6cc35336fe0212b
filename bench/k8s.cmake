# The Kubernetes client against the API emulator: creates/s and watch events/s.
# Run with --emulator PATH (the emulator is built with the tests: build/clang).
sbx_add_bench(NAME k8s_client_bench SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/k8s_client_bench.cc
              LIBS sbx::k8s_client)

# N Sandboxes at once: time until all Ready, writes per Sandbox, controller CPU and RSS.
# Run with --emulator PATH --server PATH/sbx-server --crds charts/sbx/crds.
add_executable(k8s_sandbox_bench ${CMAKE_CURRENT_SOURCE_DIR}/k8s_sandbox_bench.cc)
target_link_libraries(k8s_sandbox_bench PRIVATE sbx::k8s_sandbox_controller yaml-cpp sbx_warnings)

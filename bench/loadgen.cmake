# sbx-loadgen: open- and closed-loop gRPC load on a running sbx server (Ping, Claim,
# Claim+Release, Claim+Exec), with a Ping baseline; see docs/benchmarks.md.
add_executable(sbx-loadgen
  ${CMAKE_CURRENT_SOURCE_DIR}/loadgen/sbx_loadgen_main.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/loadgen/loadgen.cc
  ${CMAKE_CURRENT_SOURCE_DIR}/loadgen/report.cc)
target_link_libraries(sbx-loadgen PRIVATE
  sbx::proto gRPC::grpc++ absl::status absl::statusor absl::strings absl::str_format
  absl::synchronization absl::time CLI11::CLI11 nlohmann_json::nlohmann_json sbx_warnings)

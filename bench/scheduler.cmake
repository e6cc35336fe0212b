# The pool sizing simulation: the real allocator and refill on a simulated clock, sizing
# strategies side by side on synthetic traces (docs/benchmarks.md, "Pool sizing").
add_executable(scheduler_sim ${CMAKE_CURRENT_SOURCE_DIR}/scheduler_sim.cc)
target_link_libraries(scheduler_sim PRIVATE sbx::allocator sbx::store CLI11::CLI11 sbx_warnings)

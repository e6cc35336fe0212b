#pragma once
// How sbx-loadgen prints a run: a human-readable table, or one JSON object for scripts.
// Both carry the settings, the workload's numbers, the Ping baseline when one was run,
// and the ratio of the two (throughput for closed loop, latency for open loop).
//
// Thread-safety: pure functions.

#include <optional>
#include <string>

#include "bench/loadgen/loadgen.h"

namespace sbx::loadgen {

struct Report {
  LoadOptions options;
  RunResult result;
  // The Ping run with the same settings, when --baseline was given.
  std::optional<RunResult> baseline;
};

// Several lines, ending in a newline.
std::string FormatText(const Report& report);
// One JSON object on one line, ending in a newline. Every number is a JSON number.
std::string FormatJson(const Report& report);

}  // namespace sbx::loadgen

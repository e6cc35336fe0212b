#pragma once
// Process-wide logging setup (spdlog). Components log with spdlog::info/warn/error; this
// header only configures the sink once in main().

#include <string>

#include "absl/status/status.h"

namespace sbx {

struct LogOptions {
  // One of trace, debug, info, warn, error, critical, off.
  std::string level = "info";
  // "text": one human-readable line per event; "json": one JSON object per line.
  std::string format = "text";

  // INVALID_ARGUMENT naming the bad level or format.
  absl::Status Validate() const;
};

// Installs the stderr logger. Returns INVALID_ARGUMENT for bad options.
absl::Status InitLogging(const LogOptions& options);

}  // namespace sbx

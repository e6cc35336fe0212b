#pragma once
// RunTool: runs one of the image tools (skopeo, umoci) as a child process with a bounded
// run time and bounded captured output, for the image cache. The child gets no standard
// input, a clean environment (PATH, HOME and TMPDIR only) and its own process group, so
// that a timeout or a watchdog kills everything it started.
//
// Thread-safety: free functions; each call owns its child.

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sbx::images {

struct ToolRun {
  std::vector<std::string> argv;  // argv[0] is the program (a path, or a name on PATH)
  absl::Duration timeout = absl::Minutes(10);
  // Asked every 100 ms while the child runs: an error kills it and is the result (a
  // budget watchdog). Null: none.
  std::function<absl::Status()> watchdog;
  // At most this much of stdout is kept (the rest is read and dropped); stderr's last
  // 4 KiB are kept for the error message.
  size_t max_stdout = size_t{16} << 20;
  // Folder for TMPDIR and HOME ("" = /tmp).
  std::string scratch;
};

// The child's stdout when it exits 0. Errors: NOT_FOUND when the program cannot be run
// (naming it), DEADLINE_EXCEEDED after the timeout, the watchdog's error, or UNKNOWN with
// the exit status and the end of its stderr.
[[nodiscard]] absl::StatusOr<std::string> RunTool(const ToolRun& run);

}  // namespace sbx::images

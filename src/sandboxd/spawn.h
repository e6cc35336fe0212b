#pragma once
// Starting a command's first process, shared by Exec (exec.h) and processes
// (process_table.h): where it starts (OpenWorkingDirectory), which program (ResolveProgram)
// and the posix_spawn itself, in a new session and process group, its stdio on pipes,
// /dev/null or a pseudo-terminal (SpawnChild).
//
// Thread-safety: the functions may be called from any thread; they do filesystem I/O and
// must not run on a gRPC thread.

#include <sys/types.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/sandboxd/unique_fd.h"
#include "src/sandboxd/workspace.h"

namespace sbx::sandboxd {

// RESOURCE_EXHAUSTED for EAGAIN, ENOMEM, EMFILE and ENFILE, else INTERNAL: "what: error".
[[nodiscard]] absl::Status OsError(absl::string_view what, int err);

// The working directory of a command: `cwd` relative to the workspace, or `default_cwd`
// (absolute, as the daemon sees it) when cwd is empty and it is set, else the workspace.
// NOT_FOUND / FAILED_PRECONDITION naming the folder.
[[nodiscard]] absl::StatusOr<UniqueFd> OpenWorkingDirectory(const Workspace& workspace,
                                                            const std::string& cwd,
                                                            const std::string& default_cwd);

// argv[0] as the program to execute: looked up in the PATH of `env` (or a default PATH)
// relative to `cwd_fd` unless it contains a '/'. FAILED_PRECONDITION when not found.
[[nodiscard]] absl::StatusOr<std::string> ResolveProgram(
    int cwd_fd, const std::string& argv0, const std::map<std::string, std::string>& env);

// Where the child's standard descriptors come from: three descriptors, or a terminal.
struct ChildStdio {
  int in = -1;
  int out = -1;
  int err = -1;
  // Set: the path of a pseudo-terminal's slave side, opened in the child (after setsid)
  // as descriptor 0, duplicated to 1 and 2; it becomes the controlling terminal of the
  // child's new session. in/out/err are then ignored.
  std::string terminal;
};

// Starts `program` with `argv` and exactly `env`, in `cwd_fd`, in a new session and
// process group, every signal at its default and none blocked, every descriptor beyond
// 0-2 closed. `on_exit(wait_status)` runs on the reaper thread once it is reaped
// (ChildReaper). FAILED_PRECONDITION when it cannot be executed, RESOURCE_EXHAUSTED
// when the system is out of processes or memory.
[[nodiscard]] absl::StatusOr<pid_t> SpawnChild(const std::string& program,
                                               const std::vector<std::string>& argv,
                                               const std::map<std::string, std::string>& env,
                                               int cwd_fd, const ChildStdio& stdio,
                                               std::function<void(int)> on_exit);

}  // namespace sbx::sandboxd

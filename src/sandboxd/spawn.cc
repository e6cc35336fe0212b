#include "src/sandboxd/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "src/common/errno_text.h"
#include "src/sandboxd/child_reaper.h"

namespace sbx::sandboxd {
namespace {

constexpr char kDefaultPath[] = "/usr/local/bin:/usr/bin:/bin";

// posix_spawn's file actions and attributes, destroyed with the object.
struct SpawnActions {
  SpawnActions() {
    posix_spawn_file_actions_init(&files);
    posix_spawnattr_init(&attr);
  }
  ~SpawnActions() {
    posix_spawn_file_actions_destroy(&files);
    posix_spawnattr_destroy(&attr);
  }
  SpawnActions(const SpawnActions&) = delete;
  SpawnActions& operator=(const SpawnActions&) = delete;
  posix_spawn_file_actions_t files;
  posix_spawnattr_t attr;
};

}  // namespace

absl::Status OsError(absl::string_view what, int err) {
  if (err == EAGAIN || err == ENOMEM || err == EMFILE || err == ENFILE) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": ", sbx::ErrnoText(err)));
  }
  return absl::InternalError(absl::StrCat(what, ": ", sbx::ErrnoText(err)));
}

absl::StatusOr<UniqueFd> OpenWorkingDirectory(const Workspace& workspace, const std::string& cwd,
                                              const std::string& default_cwd) {
  if (cwd.empty() && !default_cwd.empty()) {
    // The daemon runs in the sandbox: its root is the sandbox's, nothing beyond it.
    UniqueFd fd(::open(default_cwd.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the sandbox's working folder \"", default_cwd, "\": ", sbx::ErrnoText(errno)));
    }
    return fd;
  }
  return workspace.OpenDirectory("cwd", cwd);
}

absl::StatusOr<std::string> ResolveProgram(int cwd_fd, const std::string& argv0,
                                           const std::map<std::string, std::string>& env) {
  // Resolved here, not in the child: the child may only make async-signal-safe calls.
  if (argv0.find('/') != std::string::npos) return argv0;
  auto it = env.find("PATH");
  const std::string search = it != env.end() ? it->second : std::string(kDefaultPath);
  for (absl::string_view dir : absl::StrSplit(search, ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", argv0);
    struct stat st;
    if (::fstatat(cwd_fd, candidate.c_str(), &st, 0) == 0 && S_ISREG(st.st_mode) &&
        ::faccessat(cwd_fd, candidate.c_str(), X_OK, 0) == 0) {
      return candidate;
    }
  }
  return absl::FailedPreconditionError(
      absl::StrCat("argv[0] \"", argv0, "\" not found in PATH \"", search, "\""));
}

absl::StatusOr<pid_t> SpawnChild(const std::string& program, const std::vector<std::string>& argv,
                                 const std::map<std::string, std::string>& env, int cwd_fd,
                                 const ChildStdio& stdio, std::function<void(int)> on_exit) {
  std::vector<std::string> env_strings;
  env_strings.reserve(env.size());
  for (const auto& [name, value] : env) env_strings.push_back(absl::StrCat(name, "=", value));
  std::vector<char*> argv_c, envp_c;
  for (const std::string& a : argv) argv_c.push_back(const_cast<char*>(a.c_str()));
  argv_c.push_back(nullptr);
  for (std::string& e : env_strings) envp_c.push_back(e.data());
  envp_c.push_back(nullptr);

  // posix_spawn, not fork: glibc starts the child with clone(CLONE_VM | CLONE_VFORK), so
  // this multi-threaded daemon's page tables are not copied and no thread of it takes
  // copy-on-write faults until the child has exec'd (fork was most of an Exec's cost).
  // The child: a new session and process group (setsid), every signal at its default
  // and none blocked, cwd and stdio set, every other descriptor (gRPC's sockets, other
  // commands' pipes) closed. A failure in the child (fchdir, open, exec) comes back as
  // the return value.
  SpawnActions actions;
  posix_spawn_file_actions_addfchdir_np(&actions.files, cwd_fd);
  if (!stdio.terminal.empty()) {
    // glibc's child runs setsid before the file actions, so this open (without
    // O_NOCTTY) by a session leader without a terminal makes the terminal its
    // controlling one, as login_tty's TIOCSCTTY would.
    posix_spawn_file_actions_addopen(&actions.files, STDIN_FILENO, stdio.terminal.c_str(), O_RDWR,
                                     0);
    posix_spawn_file_actions_adddup2(&actions.files, STDIN_FILENO, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions.files, STDIN_FILENO, STDERR_FILENO);
  } else {
    posix_spawn_file_actions_adddup2(&actions.files, stdio.in, STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions.files, stdio.out, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions.files, stdio.err, STDERR_FILENO);
  }
  posix_spawn_file_actions_addclosefrom_np(&actions.files, 3);
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&actions.attr, &all);
  posix_spawnattr_setsigmask(&actions.attr, &none);
  posix_spawnattr_setflags(&actions.attr,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  int spawn_error = 0;
  auto spawn_fn = [&]() -> pid_t {
    pid_t pid = -1;
    spawn_error = ::posix_spawn(&pid, program.c_str(), &actions.files, &actions.attr, argv_c.data(),
                                envp_c.data());
    return spawn_error == 0 ? pid : -1;
  };
  const pid_t pid = ChildReaper::Get().Spawn(spawn_fn, std::move(on_exit));
  if (pid < 0) {
    if (spawn_error == EAGAIN || spawn_error == ENOMEM) return OsError("spawn", spawn_error);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot execute \"", program, "\": ", sbx::ErrnoText(spawn_error)));
  }
  return pid;
}

}  // namespace sbx::sandboxd

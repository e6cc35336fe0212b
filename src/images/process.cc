#include "src/images/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "src/common/errno_text.h"

extern char** environ;

namespace sbx::images {
namespace {

class Pipe {
 public:
  Pipe() {
    if (pipe2(fds_, O_CLOEXEC) != 0) fds_[0] = fds_[1] = -1;
  }
  ~Pipe() {
    Close(0);
    Close(1);
  }
  bool ok() const { return fds_[0] >= 0; }
  int read_end() const { return fds_[0]; }
  int write_end() const { return fds_[1]; }
  void Close(int i) {
    if (fds_[i] >= 0) close(fds_[i]);
    fds_[i] = -1;
  }

 private:
  int fds_[2];
};

std::string Tail(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(s.size() - n);
}

}  // namespace

absl::StatusOr<std::string> RunTool(const ToolRun& run) {
  if (run.argv.empty()) return absl::InvalidArgumentError("RunTool: no program");
  Pipe out, err;
  if (!out.ok() || !err.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("pipe: ", sbx::ErrnoText(errno)));
  }
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (devnull >= 0) posix_spawn_file_actions_adddup2(&actions, devnull, 0);
  posix_spawn_file_actions_adddup2(&actions, out.write_end(), 1);
  posix_spawn_file_actions_adddup2(&actions, err.write_end(), 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);

  const std::string scratch = run.scratch.empty() ? "/tmp" : run.scratch;
  std::vector<std::string> env_strings = {"PATH=/usr/local/bin:/usr/bin:/bin",
                                          absl::StrCat("HOME=", scratch),
                                          absl::StrCat("TMPDIR=", scratch)};
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = run.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (devnull >= 0) close(devnull);
  out.Close(1);
  err.Close(1);
  if (spawned != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot run \"", run.argv[0], "\": ", sbx::ErrnoText(spawned)));
  }

  std::string stdout_text, stderr_text;
  absl::Status stopped;  // why the child was killed, when it was
  const absl::Time deadline = absl::Now() + run.timeout;
  absl::Time next_watch = absl::Now() + absl::Milliseconds(100);
  bool out_open = true, err_open = true;
  auto kill_group = [pid] { kill(-pid, SIGKILL); };
  while (out_open || err_open) {
    pollfd fds[2];
    int n = 0;
    if (out_open) fds[n++] = {out.read_end(), POLLIN, 0};
    if (err_open) fds[n++] = {err.read_end(), POLLIN, 0};
    const int ready = poll(fds, n, 100);
    if (ready < 0 && errno != EINTR) break;
    for (int i = 0; i < n && ready > 0; ++i) {
      if (fds[i].revents == 0) continue;
      char buf[65536];
      const ssize_t got = read(fds[i].fd, buf, sizeof buf);
      const bool is_out = fds[i].fd == out.read_end();
      if (got <= 0) {
        (is_out ? out_open : err_open) = false;
        continue;
      }
      if (is_out) {
        if (stdout_text.size() < run.max_stdout) {
          stdout_text.append(
              buf, std::min(static_cast<size_t>(got), run.max_stdout - stdout_text.size()));
        }
      } else {
        stderr_text = Tail(stderr_text + std::string(buf, static_cast<size_t>(got)), 4096);
      }
    }
    const absl::Time now = absl::Now();
    if (stopped.ok() && now >= deadline) {
      stopped = absl::DeadlineExceededError(absl::StrCat(
          "\"", run.argv[0], "\" did not finish within ", absl::FormatDuration(run.timeout)));
      kill_group();
    }
    if (stopped.ok() && run.watchdog && now >= next_watch) {
      next_watch = now + absl::Milliseconds(100);
      if (absl::Status w = run.watchdog(); !w.ok()) {
        stopped = w;
        kill_group();
      }
    }
  }
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  kill_group();  // whatever it left behind in its group
  if (!stopped.ok()) return stopped;
  if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) return stdout_text;
  return absl::UnknownError(
      absl::StrCat("\"", absl::StrJoin(run.argv, " "), "\" ",
                   WIFEXITED(wstatus) ? absl::StrCat("exited with status ", WEXITSTATUS(wstatus))
                                      : absl::StrCat("was killed by signal ", WTERMSIG(wstatus)),
                   stderr_text.empty() ? "" : ": ", Tail(stderr_text, 1024)));
}

}  // namespace sbx::images

#include "src/runtime/probe.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "src/common/errno_text.h"
#include "src/common/status_macros.h"
#include "src/runtime/bwrap_args.h"
#include "src/runtime/proc.h"
#include "src/runtime/seccomp_filter.h"
#include "src/runtime/spawn.h"

namespace sbx::runtime::local {
namespace {

namespace fs = std::filesystem;

// Runs `argv` once as a sandbox would be run (same user, descriptors, no_new_privs) and
// waits for it: OK when it exits 0, else FAILED_PRECONDITION with its output.
absl::Status Probe(const std::vector<std::string>& argv, const Isolation& iso, uid_t uid) {
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  char* envp[] = {const_cast<char*>(kPathEnv), nullptr};
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  Fd out_r(out[0]), out_w(out[1]);
  Fd null(open("/dev/null", O_RDONLY | O_CLOEXEC));
  absl::StatusOr<Fd> seccomp = PipeWith(iso.seccomp);
  if (!seccomp.ok()) return seccomp.status();
  const std::vector<std::string> no_cgroups;
  SpawnPlan plan;
  plan.argv = cargv.data();
  plan.envp = envp;
  plan.cgroup_tasks = &no_cgroups;
  plan.Give(STDIN_FILENO, null.get());
  plan.Give(STDOUT_FILENO, out_w.get());
  plan.Give(STDERR_FILENO, out_w.get());
  plan.Give(kSeccompFd, seccomp->get());
  plan.Give(kSandboxdFd, iso.sandboxd.get());
  plan.switch_user = iso.own_uids;
  plan.uid = uid;
  plan.gid = uid;
  const pid_t pid = SpawnDetached(plan);
  out_w.Reset();
  if (pid < 0) return absl::FailedPreconditionError(absl::StrCat("spawn: ", sbx::ErrnoText(errno)));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(out_r.get(), buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  if (plan.error != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(plan.failed_step, ": ", sbx::ErrnoText(plan.error)));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return absl::FailedPreconditionError(
      absl::StrCat(DescribeExit(status), ": ", text.empty() ? "(no output)" : text));
}

}  // namespace

absl::StatusOr<Isolation> FindIsolation(const BubblewrapRuntimeOptions& options,
                                        const std::string& root) {
  std::error_code ec;
  Isolation iso;
  iso.sandboxd.Reset(open(options.sandboxd_path.c_str(), O_PATH | O_CLOEXEC));
  if (!iso.sandboxd.valid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sandboxd \"", options.sandboxd_path, "\" cannot be opened: ", sbx::ErrnoText(errno)));
  }
  for (const std::string& h : options.hidden_paths) {
    iso.hidden.push_back(fs::absolute(h).lexically_normal().string());
    while (iso.hidden.back().size() > 1 && iso.hidden.back().back() == '/') {
      iso.hidden.back().pop_back();
    }
    iso.hidden.push_back(fs::weakly_canonical(h, ec).string());
  }
  iso.hidden.push_back(root);
  iso.hidden.push_back(fs::weakly_canonical(root, ec).string());
  std::sort(iso.hidden.begin(), iso.hidden.end());
  iso.hidden.erase(std::unique(iso.hidden.begin(), iso.hidden.end()), iso.hidden.end());
  iso.own_uids = geteuid() == 0;
  // Where the server's files are masked, or why they cannot be: the true reason, before
  // any probe (whose failure would otherwise read as missing bubblewrap).
  ASSIGN_OR_RETURN(iso.masks, SystemMasks(iso.hidden, iso.own_uids));
  absl::Status why;
  if (options.bwrap_path.empty()) {
    why = absl::FailedPreconditionError("no bubblewrap given");
  } else if (access(options.bwrap_path.c_str(), X_OK) != 0) {
    why = absl::FailedPreconditionError(absl::StrCat("not installed: ", sbx::ErrnoText(errno)));
  } else if (absl::StatusOr<std::string> program = SeccompProgram(); !program.ok()) {
    why = program.status();
  } else {
    iso.seccomp = *std::move(program);
    // bubblewrap may be installed yet unusable (no user namespaces for this uid, seccomp
    // refused): run the daemon's --version in a sandbox made as the real ones are.
    iso.isolated = true;
    auto probe = [&](const std::vector<std::string>& masks) {
      return Probe(ProbeArgv(options.bwrap_path, masks), iso, options.sandbox_uid_base);
    };
    why = probe(iso.masks);
    if (!why.ok() && probe({}).ok()) {
      // bubblewrap isolates; it is the masks of the server's files that it cannot make.
      return absl::FailedPreconditionError(absl::StrCat(
          "bubblewrap works here, but cannot mask the server's own files in the folders "
          "every sandbox sees (masks: ",
          absl::StrJoin(iso.masks, ", "), "): ", why.message(),
          ". Move the data dir, key, tokens file and TLS key out of /usr, /etc and /lib*, or "
          "into folders of their own there"));
    }
    iso.isolated = why.ok();
  }
  if (!iso.isolated) {
    if (!options.allow_unisolated) {
      return absl::FailedPreconditionError(absl::StrCat(
          "bubblewrap (\"", options.bwrap_path, "\") cannot isolate sandboxes here (",
          why.message(),
          "). Install it (apt-get install bubblewrap) and allow user namespaces "
          "(sysctl user.max_user_namespaces > 0, and kernel.unprivileged_userns_clone=1 or "
          "kernel.apparmor_restrict_unprivileged_userns=0 where those exist); or, for "
          "development only, run sandboxes as plain processes with "
          "--insecure_local_no_isolation"));
    }
    iso.own_uids = false;
    spdlog::error(
        "*** bubblewrap (\"{}\") cannot isolate sandboxes here ({}): sandboxes are PLAIN "
        "PROCESSES with NO ISOLATION (same user, filesystem and network as sbx), as "
        "--insecure_local_no_isolation asked ***",
        options.bwrap_path, std::string(why.message()));
  }
  return iso;
}

}  // namespace sbx::runtime::local

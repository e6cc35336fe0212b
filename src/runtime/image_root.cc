#include "src/runtime/image_root.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "src/common/errno_text.h"
#include "src/runtime/proc.h"

extern char** environ;

namespace sbx::runtime::local {
namespace {

constexpr size_t kMaxAccountsFile = size_t{4} << 20;

// The file at `path` (relative to the image's root) read beneath it: absolute links and
// ".." resolve inside the image, never out of it. Empty when it is missing or not a file.
std::string ReadInImage(const std::string& rootfs, const char* path) {
  const Fd root(open(rootfs.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return "";
  struct open_how how;
  std::memset(&how, 0, sizeof(how));
  how.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
  const Fd fd(static_cast<int>(syscall(SYS_openat2, root.get(), path, &how, sizeof(how))));
  struct stat st;
  if (!fd.valid() || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  std::string out;
  char buf[65536];
  while (out.size() < kMaxAccountsFile) {
    const ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct Account {
  std::string name;
  uint32_t id = 0;
  uint32_t gid = 0;  // passwd only
  std::string home;  // passwd only
};

// The entries of a passwd (7 fields) or group (4 fields) file.
std::vector<Account> Accounts(const std::string& text, bool passwd) {
  std::vector<Account> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ':');
    if (f.size() < (passwd ? 7u : 4u)) continue;
    Account a;
    a.name = std::string(f[0]);
    if (!absl::SimpleAtoi(f[2], &a.id)) continue;
    if (passwd) {
      if (!absl::SimpleAtoi(f[3], &a.gid)) continue;
      a.home = std::string(f[5]);
    }
    out.push_back(std::move(a));
  }
  return out;
}

bool ValidId(absl::string_view text, uint32_t* id) {
  return absl::SimpleAtoi(text, id) && *id < 0xfffffffeu;
}

}  // namespace

absl::StatusOr<ImageRun> ResolveImageRun(const std::string& digest, const std::string& rootfs,
                                         const std::vector<std::string>& env,
                                         const std::string& user, const std::string& working_dir) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("image ", digest, ": ", why));
  };
  ImageRun run;
  run.digest = digest;
  run.rootfs = rootfs;
  const std::vector<Account> users = Accounts(ReadInImage(rootfs, "/etc/passwd"), true);
  std::string user_part = user, group_part;
  if (const size_t colon = user.find(':'); colon != std::string::npos) {
    user_part = user.substr(0, colon);
    group_part = user.substr(colon + 1);
  }
  const Account* account = nullptr;
  uint32_t id = 0;
  if (user_part.empty()) {
    run.uid = 0;
  } else if (ValidId(user_part, &id)) {
    run.uid = id;
  } else {
    for (const Account& a : users) {
      if (a.name == user_part) {
        account = &a;
        break;
      }
    }
    if (account == nullptr) {
      return bad(absl::StrCat("its User \"", user_part, "\" is not in its /etc/passwd"));
    }
    run.uid = account->id;
  }
  if (account == nullptr) {
    for (const Account& a : users) {
      if (a.id == run.uid) {
        account = &a;
        break;
      }
    }
  }
  run.gid = account != nullptr ? account->gid : 0;
  if (!group_part.empty()) {
    if (ValidId(group_part, &id)) {
      run.gid = id;
    } else {
      bool found = false;
      for (const Account& g : Accounts(ReadInImage(rootfs, "/etc/group"), false)) {
        if (g.name == group_part) {
          run.gid = g.id;
          found = true;
          break;
        }
      }
      if (!found) {
        return bad(absl::StrCat("its User's group \"", group_part, "\" is not in its /etc/group"));
      }
    }
  }
  if (run.uid >= 0xfffffffeu || run.gid >= 0xfffffffeu) return bad("its User is out of range");
  bool has_home = false;
  for (const std::string& kv : env) {
    const size_t eq = kv.find('=');
    if (eq == 0 || eq == std::string::npos) continue;
    run.env.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
    if (run.env.back().first == "HOME") has_home = true;
  }
  if (!has_home) {
    run.env.emplace_back("HOME",
                         account != nullptr && !account->home.empty() && account->home[0] == '/'
                             ? account->home
                             : "/");
  }
  if (!working_dir.empty()) {
    if (working_dir[0] != '/') {
      return bad(absl::StrCat("its WorkingDir \"", working_dir, "\" is not absolute"));
    }
    run.working_dir = working_dir;
  }
  return run;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> DaemonLibraries(
    const std::string& sandboxd_path) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("pipe: ", sbx::ErrnoText(errno)));
  }
  Fd r(out[0]), w(out[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, w.get(), STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::string ldd = "ldd";
  std::vector<char*> argv = {ldd.data(), const_cast<char*>(sandboxd_path.c_str()), nullptr};
  pid_t pid = -1;
  const int err = posix_spawnp(&pid, "ldd", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  w.Reset();
  if (err != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot run ldd (package libc-bin) for the daemon's libraries: ", sbx::ErrnoText(err)));
  }
  std::string text;
  char buf[4096];
  while (true) {
    const ssize_t n = read(r.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::vector<std::pair<std::string, std::string>> libs;
  if (text.find("not a dynamic executable") != std::string::npos ||
      text.find("statically linked") != std::string::npos) {
    return libs;
  }
  std::string loader;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    if (line.find("not found") != absl::string_view::npos) {
      return absl::FailedPreconditionError(
          absl::StrCat("the daemon \"", sandboxd_path, "\" needs a library not found: ", line));
    }
    std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (parts.size() >= 3 && parts[1] == "=>" && absl::StartsWith(parts[2], "/")) {
      libs.emplace_back(std::string(parts[2]), std::string(parts[0]));
    } else if (!parts.empty() && absl::StartsWith(parts[0], "/")) {
      loader = std::string(parts[0]);
    }
  }
  if (loader.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("ldd named no loader for the daemon \"",
                                                      sandboxd_path, "\": ", text.substr(0, 400)));
  }
  libs.insert(libs.begin(), {loader, "ld.so"});
  for (auto& [path, name] : libs) {
    char real[PATH_MAX];
    if (realpath(path.c_str(), real) == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the daemon's library \"", path, "\" cannot be resolved: ", sbx::ErrnoText(errno)));
    }
    path = real;
  }
  return libs;
}

absl::Status MakeDaemonLibDir(const std::string& dir,
                              const std::vector<std::pair<std::string, std::string>>& libs) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!std::filesystem::create_directory(dir, ec) || chmod(dir.c_str(), 0755) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot make \"", dir, "\": ", ec ? ec.message() : std::string(sbx::ErrnoText(errno))));
  }
  for (const auto& [host, name] : libs) {
    const std::string to = absl::StrCat(dir, "/", name);
    if (!std::filesystem::copy_file(host, to, ec) || chmod(to.c_str(), 0755) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot copy the daemon's library \"", host, "\" to \"", to,
                       "\": ", ec ? ec.message() : std::string(sbx::ErrnoText(errno))));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> ImageRootPrefix(const std::string& helper, const ImageRun& image,
                                         const std::string& dir, bool own_uids, uid_t host_uid,
                                         int64_t layer_bytes,
                                         const std::vector<std::string>& strict_targets,
                                         const std::string& snapshot_dir, int64_t workspace_bytes) {
  std::vector<std::string> a = {
      helper, "--lower", image.rootfs, "--dir", dir, "--layer_bytes", absl::StrCat(layer_bytes)};
  if (!snapshot_dir.empty()) {
    a.insert(a.end(),
             {"--snapshot", snapshot_dir, "--workspace_bytes", absl::StrCat(workspace_bytes)});
  }
  if (own_uids) a.insert(a.end(), {"--idmap", absl::StrCat(host_uid, ":", host_uid)});
  for (const char* t : {"/dev", "/proc", "/tmp", "/run"}) a.insert(a.end(), {"--reset_target", t});
  for (const std::string& t : strict_targets) a.insert(a.end(), {"--strict_target", t});
  a.emplace_back("--");
  return a;
}

std::string WorkspaceMount(const std::string& dir) { return dir + "/ws"; }

namespace {

// Makes every folder under the open folder `dir` (not following links) searchable,
// readable and writable by its owner where it is not, as far as this process may.
void OpenUp(int dir, int depth) {
  if (depth > 4096) return;
  DIR* d = fdopendir(dup(dir));
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {  // NOLINT(concurrency-mt-unsafe): own DIR stream
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (fstatat(dir, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) {
      continue;
    }
    if ((st.st_mode & 0700) != 0700) fchmodat(dir, name.c_str(), (st.st_mode & 07777) | 0700, 0);
    const int sub = openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0) continue;
    OpenUp(sub, depth + 1);
    close(sub);
  }
  closedir(d);
}

}  // namespace

bool RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (!ec) return true;
  const Fd dir(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (dir.valid()) OpenUp(dir.get(), 0);
  ec.clear();
  std::filesystem::remove_all(path, ec);
  return !ec;
}

}  // namespace sbx::runtime::local

#include "src/runtime/bubblewrap_runtime.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "src/common/ids.h"

namespace sbx::runtime {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kDefaultWorkspaceBytes = int64_t{256} << 20;
constexpr char kSockDirInside[] = "/run/sbx/sock";
constexpr char kWorkspaceInside[] = "/run/sbx/workspace";
constexpr char kSandboxdInside[] = "/run/sbx/bin/sbx-sandboxd";

// cgroup v1 controllers this runtime uses for limits, when the machine has them.
struct Cgroups {
  std::string memory;  // e.g. /sys/fs/cgroup/memory/sbx, empty if unusable
  std::string pids;

  static Cgroups Detect() {
    Cgroups c;
    auto usable = [](const std::string& base) {
      std::error_code ec;
      fs::create_directories(base, ec);
      return !ec && access(base.c_str(), W_OK) == 0 ? base : std::string();
    };
    if (fs::exists("/sys/fs/cgroup/memory/memory.limit_in_bytes")) {
      c.memory = usable("/sys/fs/cgroup/memory/sbx");
    }
    if (fs::exists("/sys/fs/cgroup/pids/cgroup.procs")) c.pids = usable("/sys/fs/cgroup/pids/sbx");
    return c;
  }
};

bool WriteFile(const std::string& path, const std::string& value) {
  std::ofstream out(path);
  out << value;
  out.close();
  return static_cast<bool>(out);
}

struct Running {
  pid_t pid = -1;
  std::string dir;
  std::vector<std::string> cgroup_dirs;
};

class BubblewrapRuntimeImpl final : public BubblewrapRuntime {
 public:
  BubblewrapRuntimeImpl(BubblewrapRuntimeOptions options, bool isolated, Cgroups cgroups)
      : options_(std::move(options)),
        isolated_(isolated),
        cgroups_(std::move(cgroups)),
        root_args_(RootArgs()) {
    for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { Work(); });
    reaper_ = std::thread([this] { Reap(); });
  }

  ~BubblewrapRuntimeImpl() override {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (auto& t : workers_) t.join();
    reaper_.join();
    // Tasks never started get CANCELLED; every sandbox still running is killed.
    std::deque<Task> left;
    {
      absl::MutexLock lock(&mu_);
      left.swap(tasks_);
    }
    for (Task& t : left) std::move(t)(/*cancelled=*/true);
    absl::flat_hash_map<std::string, Running> all;
    {
      absl::MutexLock lock(&mu_);
      all.swap(running_);
    }
    for (auto& [id, r] : all) Kill(r);
  }

  bool isolated() const override { return isolated_; }
  size_t running() const override {
    absl::MutexLock lock(&mu_);
    return running_.size();
  }

  void Create(CreateRequest request, CreateCallback done) override {
    Enqueue([this, request = std::move(request), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      std::move(done)(Start(request));
    });
  }

  void Delete(std::string id, DeleteCallback done) override {
    Enqueue([this, id = std::move(id), done = std::move(done)](bool cancelled) mutable {
      if (cancelled) return std::move(done)(absl::CancelledError("the runtime is stopping"));
      Running r;
      {
        absl::MutexLock lock(&mu_);
        auto it = running_.find(id);
        if (it == running_.end()) {
          return std::move(done)(
              absl::NotFoundError(absl::StrCat("sandbox \"", id, "\" is not running here")));
        }
        r = std::move(it->second);
        running_.erase(it);
      }
      Kill(r);
      std::move(done)(absl::OkStatus());
    });
  }

  // TODO(runtime helper): freezer cgroup, adoption of sandboxes of an earlier run.
  void Suspend(std::string, DoneCallback done) override {
    std::move(done)(absl::UnimplementedError("the local runtime cannot suspend yet"));
  }
  void Resume(std::string, DoneCallback done) override {
    std::move(done)(absl::UnimplementedError("the local runtime cannot resume yet"));
  }
  absl::StatusOr<std::vector<SandboxInfo>> List() override {
    std::vector<SandboxInfo> out;
    absl::MutexLock lock(&mu_);
    for (const auto& [id, r] : running_) out.push_back(SandboxInfo{id, "", "", "", false});
    return out;
  }

 private:
  using Task = absl::AnyInvocable<void(bool cancelled) &&>;

  void Enqueue(Task t) {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(t));
  }

  void Work() {
    while (true) {
      Task t;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !tasks_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (stopping_) return;
        t = std::move(tasks_.front());
        tasks_.pop_front();
      }
      std::move(t)(false);
    }
  }

  // Kills the sandbox's process tree, reaps it and removes its folder and cgroups.
  static void Kill(const Running& r) {
    if (r.pid > 0) {
      kill(-r.pid, SIGKILL);  // the group (plain-process fallback)
      kill(r.pid, SIGKILL);   // bwrap; its pid namespace dies with it (--die-with-parent)
      while (waitpid(r.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    std::error_code ec;
    fs::remove_all(r.dir, ec);
    for (const std::string& cg : r.cgroup_dirs) {
      // The cgroup empties as the killed processes go; retry briefly.
      for (int i = 0; i < 50 && rmdir(cg.c_str()) != 0 && errno == EBUSY; ++i) {
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
  }

  std::vector<std::string> Argv(const std::string& id, const std::string& dir,
                                const LocalSpec& spec) const {
    const std::string socket_inside = absl::StrCat(kSockDirInside, "/sandboxd.sock");
    if (!isolated_) {
      return {options_.sandboxd_path, "--socket", dir + "/sandboxd.sock", "--workspace",
              dir + "/workspace"};
    }
    // The root is bubblewrap's own tmpfs with every top-level entry of the host bound
    // read-only onto it (symlinks recreated), so that template mounts can add new
    // top-level paths while the host stays read-only.
    std::vector<std::string> a = {
        options_.bwrap_path, "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        "--die-with-parent", "--new-session", "--hostname",    id};
    a.insert(a.end(), root_args_.begin(), root_args_.end());
    for (const char* x :
         {"--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run"}) {
      a.emplace_back(x);
    }
    if (!spec.network) a.push_back("--unshare-net");
    const int64_t ws =
        spec.workspace_size_bytes > 0 ? spec.workspace_size_bytes : kDefaultWorkspaceBytes;
    for (const char* s : {"--size", "", "--tmpfs", kWorkspaceInside}) a.emplace_back(s);
    a[a.size() - 3] = std::to_string(ws);
    for (const char* s : {"--bind", "", kSockDirInside}) a.emplace_back(s);
    a[a.size() - 2] = dir;
    for (const auto& m : spec.mounts) {
      a.push_back(m.read_only ? "--ro-bind" : "--bind");
      a.push_back(m.source);
      a.push_back(m.target);
    }
    for (const auto& [k, v] : spec.env) {
      a.push_back("--setenv");
      a.push_back(k);
      a.push_back(v);
    }
    for (const char* s : {"--chdir", kWorkspaceInside}) a.emplace_back(s);
    // The daemon is bound in at a fixed path: its host path may be under /tmp, which the
    // sandbox replaces with its own tmpfs.
    for (const char* x : {"--ro-bind", "", kSandboxdInside}) a.emplace_back(x);
    a[a.size() - 2] = options_.sandboxd_path;
    a.push_back(kSandboxdInside);
    for (const std::string& s : {std::string("--socket"), socket_inside, std::string("--workspace"),
                                 std::string(kWorkspaceInside)}) {
      a.push_back(s);
    }
    return a;
  }

  // Makes the sandbox's cgroups and sets their limits; returns the folders made. What
  // cannot be applied is logged, not fatal (the machine may not delegate cgroups).
  std::vector<std::string> MakeCgroups(const std::string& id, const LocalSpec& spec) const {
    std::vector<std::string> dirs;
    auto make = [&](const std::string& base, const std::string& file, int64_t value,
                    const char* what) {
      if (value <= 0) return;
      if (base.empty()) {
        spdlog::warn("sandbox {}: {} limit {} not applied: no writable cgroup controller", id, what,
                     value);
        return;
      }
      const std::string dir = base + "/" + id;
      if (mkdir(dir.c_str(), 0755) != 0 || !WriteFile(dir + "/" + file, std::to_string(value))) {
        spdlog::warn("sandbox {}: {} limit {} not applied: cannot write {}/{}", id, what, value,
                     dir, file);
        rmdir(dir.c_str());
        return;
      }
      dirs.push_back(dir);
    };
    make(cgroups_.memory, "memory.limit_in_bytes", spec.memory_limit_bytes, "memory");
    make(cgroups_.pids, "pids.max", spec.pids_limit, "pids");
    return dirs;
  }

  absl::StatusOr<SandboxInfo> Start(const CreateRequest& request) {
    LocalSpec spec;
    if (!request.template_spec.empty()) {
      absl::StatusOr<LocalSpec> parsed = ParseLocalSpec(request.template_spec);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("template \"", request.template_name, "\": ", parsed.status().message()));
      }
      spec = std::move(*parsed);
    }
    const std::string id = absl::StrCat("lb-", IdGenerator::Random().Next().substr(0, 16));
    Running r;
    r.dir = fs::absolute(fs::path(options_.root_dir) / id).string();
    const std::string socket = r.dir + "/sandboxd.sock";
    std::error_code ec;
    fs::create_directories(r.dir, ec);
    if (!isolated_) fs::create_directories(r.dir + "/workspace", ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("cannot create \"", r.dir, "\": ", ec.message()));
    }
    r.cgroup_dirs = MakeCgroups(id, spec);

    const std::vector<std::string> argv = Argv(id, r.dir, spec);
    std::vector<char*> cargv;
    for (const std::string& s : argv) cargv.push_back(const_cast<char*>(s.c_str()));
    cargv.push_back(nullptr);
    std::vector<std::string> procs;
    for (const std::string& cg : r.cgroup_dirs) procs.push_back(cg + "/cgroup.procs");
    const std::string log_path = r.dir + "/sandboxd.log";
    const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      setpgid(0, 0);
      // Die with sbx: bubblewrap's --die-with-parent ties the sandboxed command to bwrap,
      // not bwrap to us. (The signal comes when the forking thread ends: a worker, which
      // lives as long as the runtime, and the runtime kills its sandboxes anyway.)
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);  // sbx died before the prctl
      for (const std::string& p : procs) {
        const int fd = open(p.c_str(), O_WRONLY);
        if (fd >= 0) {
          (void)!write(fd, "0", 1);
          close(fd);
        }
      }
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      if (log_fd >= 0) {
        dup2(log_fd, STDOUT_FILENO);
        dup2(log_fd, STDERR_FILENO);
      }
      const int null_fd = open("/dev/null", O_RDONLY);
      if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
      execv(cargv[0], cargv.data());
      _exit(127);
    }
    if (log_fd >= 0) close(log_fd);
    if (pid < 0) {
      Running failed = r;
      Kill(failed);
      return absl::UnavailableError(absl::StrCat("fork failed: ", std::strerror(errno)));
    }
    r.pid = pid;

    // Ready when the daemon accepts connections on its socket.
    const absl::Time deadline = absl::Now() + options_.ready_timeout;
    while (true) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        r.pid = -1;
        const std::string log = Tail(log_path);
        Kill(r);
        return absl::UnavailableError(absl::StrCat("sandbox ", id, " exited while starting (",
                                                   DescribeExit(status), "): ", log));
      }
      if (Connects(socket)) break;
      if (absl::Now() > deadline) {
        const std::string log = Tail(log_path);
        Kill(r);
        return absl::DeadlineExceededError(
            absl::StrCat("sandbox ", id, " did not listen on ", socket, " within ",
                         absl::FormatDuration(options_.ready_timeout), ": ", log));
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    {
      absl::MutexLock lock(&mu_);
      running_.emplace(id, std::move(r));
    }
    SandboxInfo info;
    info.id = id;
    info.pool = request.pool;
    info.endpoint = absl::StrCat("unix:", socket);
    return info;
  }

  static bool Connects(const std::string& path) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) return false;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    return ok;
  }

  static std::string Tail(const std::string& path) {
    std::ifstream in(path);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (all.size() > 400) all = "..." + all.substr(all.size() - 400);
    while (!all.empty() && all.back() == '\n') all.pop_back();
    return all.empty() ? "(no output)" : all;
  }

  static std::string DescribeExit(int status) {
    if (WIFEXITED(status)) return absl::StrCat("exit code ", WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return absl::StrCat("signal ", WTERMSIG(status));
    return "unknown status";
  }

  // Notices sandboxes whose process tree ended by itself.
  void Reap() {
    while (true) {
      std::vector<std::pair<std::string, Running>> gone;
      {
        absl::MutexLock lock(&mu_);
        auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
        if (mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(50))) return;
        for (auto it = running_.begin(); it != running_.end();) {
          int status = 0;
          if (waitpid(it->second.pid, &status, WNOHANG) == it->second.pid) {
            spdlog::warn("sandbox {} ended by itself ({})", it->first, DescribeExit(status));
            it->second.pid = -1;
            gone.emplace_back(it->first, std::move(it->second));
            running_.erase(it++);
          } else {
            ++it;
          }
        }
      }
      for (auto& [id, r] : gone) {
        Kill(r);
        if (options_.on_gone) options_.on_gone(id);
      }
    }
  }

  // bwrap arguments that rebuild the host's top level read-only.
  static std::vector<std::string> RootArgs() {
    std::vector<std::string> args;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator("/", ec)) {
      const std::string path = entry.path().string();
      if (path == "/proc" || path == "/dev" || path == "/tmp" || path == "/run") continue;
      if (entry.is_symlink(ec)) {
        const fs::path target = fs::read_symlink(entry.path(), ec);
        if (ec) continue;
        args.insert(args.end(), {"--symlink", target.string(), path});
      } else if (entry.is_directory(ec)) {
        args.insert(args.end(), {"--ro-bind", path, path});
      }
    }
    return args;
  }

  const BubblewrapRuntimeOptions options_;
  const bool isolated_;
  const Cgroups cgroups_;
  const std::vector<std::string> root_args_;
  std::vector<std::thread> workers_;
  std::thread reaper_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Running> running_ ABSL_GUARDED_BY(mu_);
};

// Sandboxes of an earlier run in this root are unknown to this runtime: bubblewrap can
// outlive a killed sbx when the kill lands while it is still starting (it changes
// credentials, which clears the parent-death signal, before it arms its own). Kill every
// process whose command line names a sandbox folder under `root`, and remove the folders.
void KillStrays(const std::string& root) {
  const std::string marker = root + "/lb-";
  int killed = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    const std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid != getpid() && cmd.find(marker) != std::string::npos && kill(pid, SIGKILL) == 0) {
      ++killed;
    }
  }
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (entry.path().filename().string().rfind("lb-", 0) == 0) fs::remove_all(entry.path(), ec);
  }
  if (killed > 0)
    spdlog::warn("local runtime: killed {} stray sandbox processes under {}", killed, root);
}

}  // namespace

std::string EncodeLocalSpec(const LocalSpec& spec) {
  nlohmann::json j;
  j["env"] = spec.env;
  j["mounts"] = nlohmann::json::array();
  for (const auto& m : spec.mounts) {
    j["mounts"].push_back({{"source", m.source}, {"target", m.target}, {"read_only", m.read_only}});
  }
  j["network"] = spec.network;
  j["memory_limit_bytes"] = spec.memory_limit_bytes;
  j["pids_limit"] = spec.pids_limit;
  j["workspace_size_bytes"] = spec.workspace_size_bytes;
  return j.dump();
}

absl::StatusOr<LocalSpec> ParseLocalSpec(const std::string& json) {
  // nlohmann throws on bad input; the exception stops here and becomes a Status.
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    if (!j.is_object()) return absl::InvalidArgumentError("local spec is not a JSON object");
    LocalSpec s;
    if (j.contains("env")) s.env = j.at("env").get<std::map<std::string, std::string>>();
    if (j.contains("mounts")) {
      for (const auto& m : j.at("mounts")) {
        LocalSpec::Mount mount;
        mount.source = m.at("source").get<std::string>();
        mount.target = m.at("target").get<std::string>();
        mount.read_only = m.value("read_only", true);
        if (mount.source.empty() || mount.source[0] != '/' || mount.target.empty() ||
            mount.target[0] != '/') {
          return absl::InvalidArgumentError(absl::StrCat("mount \"", mount.source, "\" -> \"",
                                                         mount.target,
                                                         "\": both paths must be absolute"));
        }
        s.mounts.push_back(std::move(mount));
      }
    }
    s.network = j.value("network", false);
    s.memory_limit_bytes = j.value("memory_limit_bytes", int64_t{0});
    s.pids_limit = j.value("pids_limit", int64_t{0});
    s.workspace_size_bytes = j.value("workspace_size_bytes", int64_t{0});
    if (s.memory_limit_bytes < 0 || s.pids_limit < 0 || s.workspace_size_bytes < 0) {
      return absl::InvalidArgumentError("local spec limits must not be negative");
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("local spec: ", e.what()));
  }
}

absl::Status BubblewrapRuntimeOptions::Validate() const {
  if (root_dir.empty()) return absl::InvalidArgumentError("runtime root_dir is empty");
  if (sandboxd_path.empty() || sandboxd_path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("sandboxd_path \"", sandboxd_path, "\" must be an absolute path"));
  }
  if (workers < 1) return absl::InvalidArgumentError(absl::StrCat("workers ", workers, " < 1"));
  if (ready_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ready_timeout must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BubblewrapRuntime>> BubblewrapRuntime::Make(
    BubblewrapRuntimeOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  if (access(options.sandboxd_path.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("sandboxd \"", options.sandboxd_path, "\" is not an executable file"));
  }
  std::error_code ec;
  fs::create_directories(options.root_dir, ec);
  if (ec || access(options.root_dir.c_str(), W_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("runtime root \"", options.root_dir, "\" is not a writable folder"));
  }
  const std::string longest =
      (fs::absolute(options.root_dir) / "lb-0123456789abcdef" / "sandboxd.sock").string();
  if (longest.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("runtime root \"", options.root_dir, "\" is too long for unix socket paths (",
                     longest.size(), " of at most ", sizeof(sockaddr_un::sun_path) - 1, " bytes)"));
  }
  bool isolated = !options.bwrap_path.empty() && access(options.bwrap_path.c_str(), X_OK) == 0;
  if (isolated) {
    // bubblewrap may be installed yet unusable (no user namespaces, seccomp): try it.
    const std::string probe =
        absl::StrCat(options.bwrap_path,
                     " --unshare-pid --unshare-net --ro-bind / / --dev /dev --proc /proc "
                     "/bin/true >/dev/null 2>&1");
    isolated = std::system(probe.c_str()) == 0;
  }
  if (!isolated) {
    spdlog::error(
        "*** bubblewrap (\"{}\") is missing or cannot run here: sandboxes will be PLAIN "
        "PROCESSES with NO ISOLATION (same user, filesystem and network as sbx) ***",
        options.bwrap_path);
  }
  KillStrays(fs::absolute(options.root_dir).string());
  Cgroups cgroups = Cgroups::Detect();
  spdlog::info("local runtime: root \"{}\", {}, memory limits {}, pids limits {}", options.root_dir,
               isolated ? "bubblewrap isolation" : "NO isolation",
               cgroups.memory.empty() ? "unavailable" : "cgroup v1",
               cgroups.pids.empty() ? "unavailable" : "cgroup v1");
  return std::unique_ptr<BubblewrapRuntime>(
      new BubblewrapRuntimeImpl(std::move(options), isolated, std::move(cgroups)));
}

}  // namespace sbx::runtime

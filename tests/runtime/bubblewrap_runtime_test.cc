// The local runtime against the real sbx-sandboxd and the machine's bubblewrap.

#include "src/runtime/bubblewrap_runtime.h"

#include "src/common/sandbox_secret.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sbx/sandboxd/v1/sandboxd.grpc.pb.h"

namespace sbx::runtime {
namespace {

namespace fs = std::filesystem;
namespace pb = ::sbx::sandboxd::v1;

// Lists the network interfaces of the calling process's network namespace.
constexpr char kInterfaces[] = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort";

// The content of `path`, empty or short if it cannot be read: /proc/<pid>/ files of a
// process that exits meanwhile fail with ESRCH, which std::ifstream turns into a throw.
std::string ReadFile(const std::string& path) {
  std::string out;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// Pids of processes naming `text` on their command line or working in a folder that names
// it (bwrap names its sandbox's id and folder on its command line; a sandbox's top process
// works in its host folder).
std::vector<pid_t> ProcessesNaming(const std::string& text) {
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmd = ReadFile(entry.path() / "cmdline");
    std::error_code ec;
    const std::string cwd = fs::read_symlink(entry.path() / "cwd", ec).string();
    const pid_t pid = std::stoi(name);
    if ((cmd.find(text) != std::string::npos || cwd.find(text) != std::string::npos) &&
        pid != getpid()) {
      pids.push_back(pid);
    }
  }
  return pids;
}

constexpr char kFreezer[] = "/sys/fs/cgroup/freezer/sbx";

bool HaveFreezer() { return fs::exists("/sys/fs/cgroup/freezer/cgroup.procs"); }

// Every process of sandbox `id`: the members of its freezer cgroup (which holds the whole
// tree), or those naming it on their command line.
std::vector<pid_t> SandboxProcesses(const std::string& id) {
  const std::string procs = absl::StrCat(kFreezer, "/", id, "/cgroup.procs");
  if (!fs::exists(procs)) return ProcessesNaming(id);
  std::vector<pid_t> pids;
  std::istringstream in(ReadFile(procs));
  for (pid_t p; in >> p;) pids.push_back(p);
  return pids;
}

class BubblewrapRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = "/tmp/sbx-rt-" + std::to_string(getpid());
    share_ = "/tmp/sbx-rt-share-" + std::to_string(getpid());
    fs::create_directories(share_);
    fs::permissions(share_, fs::perms::all);
    fs::remove_all(root_);
  }
  void TearDown() override {
    runtime_.reset();
    // Tests that leave sandboxes running for adoption: a last runtime adopts and kills
    // whatever is left, then nothing of this test may run.
    BubblewrapRuntimeOptions o = Options();
    o.delete_on_exit = true;
    o.on_gone = nullptr;
    if (auto rt = BubblewrapRuntime::Make(o); rt.ok()) rt->reset();
    for (pid_t p : ProcessesNaming(root_)) kill(p, SIGKILL);
    fs::remove_all(root_);
    fs::remove_all(share_);
  }

  BubblewrapRuntimeOptions Options() {
    BubblewrapRuntimeOptions o;
    o.root_dir = root_;
    o.sandboxd_path = SBX_SANDBOXD;
    o.secret_for = [](const std::string& id) { return "secret-of-" + id; };
    o.delete_on_exit = true;
    o.on_gone = [this](const std::string& id) {
      absl::MutexLock lock(&mu_);
      gone_.push_back(id);
    };
    return o;
  }

  void StartRuntime() { StartRuntime(Options()); }
  void StartRuntime(BubblewrapRuntimeOptions o) {
    auto rt = BubblewrapRuntime::Make(o);
    ASSERT_TRUE(rt.ok()) << rt.status();
    runtime_ = std::move(*rt);
  }

  absl::StatusOr<SandboxInfo> CreateNow(const std::string& spec = "") {
    absl::Notification done;
    absl::StatusOr<SandboxInfo> out = absl::InternalError("no answer");
    CreateRequest req;
    req.pool = "py";
    req.template_name = "t";
    req.template_spec = spec;
    runtime_->Create(req, [&](absl::StatusOr<SandboxInfo> info) {
      out = std::move(info);
      done.Notify();
    });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    return out;
  }

  absl::Status DeleteNow(const std::string& id) {
    absl::Notification done;
    absl::Status out;
    runtime_->Delete(id, [&](absl::Status s) {
      out = s;
      done.Notify();
    });
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    return out;
  }

  // Runs argv in the sandbox through its daemon; returns stdout, or the exit as text.
  std::string Exec(const SandboxInfo& info, std::vector<std::string> argv, int* exit_code) {
    auto channel = grpc::CreateChannel(info.endpoint, grpc::InsecureChannelCredentials());
    auto stub = pb::Sandboxd::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    ctx.AddMetadata(kSandboxSecretMetadata, "secret-of-" + info.id);
    auto stream = stub->Exec(&ctx);
    pb::ExecRequest start;
    for (auto& a : argv) start.mutable_start()->add_argv(a);
    EXPECT_TRUE(stream->Write(start));
    stream->WritesDone();
    std::string out;
    pb::ExecResponse r;
    *exit_code = -1;
    while (stream->Read(&r)) {
      if (r.has_stdout_chunk()) out += r.stdout_chunk();
      if (r.has_exit()) *exit_code = r.exit().has_exit_code() ? r.exit().exit_code() : -2;
    }
    EXPECT_TRUE(stream->Finish().ok());
    return out;
  }

  absl::Status SuspendNow(const std::string& id, bool suspend = true) {
    absl::Notification done;
    absl::Status out;
    auto cb = [&](absl::Status s) {
      out = s;
      done.Notify();
    };
    if (suspend) {
      runtime_->Suspend(id, cb);
    } else {
      // Thawed in place: it answers the endpoint the sandbox had.
      const std::optional<SandboxInfo> before = Listed(id);
      runtime_->Resume(id, [&](absl::StatusOr<SandboxInfo> s) {
        if (s.ok()) {
          EXPECT_EQ(s->id, id);
          if (before.has_value()) EXPECT_EQ(s->endpoint, before->endpoint);
        }
        cb(s.status());
      });
    }
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
    return out;
  }
  absl::Status ResumeNow(const std::string& id) { return SuspendNow(id, false); }

  std::optional<SandboxInfo> Listed(const std::string& id) {
    auto all = runtime_->List();
    EXPECT_TRUE(all.ok()) << all.status();
    if (!all.ok()) return std::nullopt;
    for (const SandboxInfo& s : *all) {
      if (s.id == id) return s;
    }
    return std::nullopt;
  }

  // A spec that binds share_ (a host folder anyone may write) at /share.
  std::string SharedSpec() const {
    LocalSpec spec;
    spec.mounts.push_back({share_, "/share", false});
    return EncodeLocalSpec(spec);
  }

  // Starts a busy loop in the sandbox (made with SharedSpec) that counts in a file of the
  // shared host folder, and returns that file's host path.
  std::string StartCounter(const SandboxInfo& info) {
    const std::string host_file = absl::StrCat(share_, "/count-", info.id);
    const std::string file = runtime_->isolated() ? "/share/count-" + info.id : host_file;
    int code = -1;
    Exec(info,
         {"/bin/sh", "-c",
          absl::StrCat("(i=0; while :; do i=$((i+1)); echo $i > ", file,
                       "; done) </dev/null >/dev/null 2>&1 &")},
         &code);
    EXPECT_EQ(code, 0);
    return host_file;
  }

  // The counter's value (the writer truncates before it writes: retry an empty read).
  static int64_t Count(const std::string& file) {
    for (int i = 0; i < 1000; ++i) {
      int64_t n = 0;
      std::istringstream in(ReadFile(file));
      if (in >> n) return n;
      absl::SleepFor(absl::Microseconds(200));
    }
    return -1;
  }

  // Waits until the counter exceeds `than`; returns the value seen (or -1 on timeout).
  static int64_t CountAbove(const std::string& file, int64_t than) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      const int64_t n = Count(file);
      if (n > than) return n;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return -1;
  }

  // Checks that a suspended sandbox's counter stands still and runs again after Resume.
  void CheckSuspendAndResume(const SandboxInfo& info) {
    const std::string counter = StartCounter(info);
    const int64_t before = CountAbove(counter, 10);
    ASSERT_GT(before, 10) << "the counter never ran";
    ASSERT_TRUE(SuspendNow(info.id).ok());
    auto listed = Listed(info.id);
    ASSERT_TRUE(listed.has_value());
    EXPECT_TRUE(listed->suspended);
    // The writer may be frozen between truncating and writing: compare the bytes.
    const std::string frozen = ReadFile(counter);
    // That a frozen process does nothing can only be shown by waiting: 300 ms is many
    // times the counter's period, and a fault shows as a change, never as a false pass.
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_EQ(ReadFile(counter), frozen) << "the counter ran while suspended";
    EXPECT_TRUE(SuspendNow(info.id).ok());  // idempotent
    EXPECT_EQ(ReadFile(counter), frozen);
    ASSERT_TRUE(ResumeNow(info.id).ok());
    int64_t frozen_count = before;
    std::istringstream(frozen) >> frozen_count;
    EXPECT_GT(CountAbove(counter, frozen_count), frozen_count) << "the counter did not run again";
    EXPECT_FALSE(Listed(info.id)->suspended);
    EXPECT_TRUE(ResumeNow(info.id).ok());  // idempotent
    int code = -1;
    EXPECT_EQ(Exec(info, {"/bin/echo", "awake"}, &code), "awake\n");
  }

  std::vector<std::string> Gone() {
    absl::MutexLock lock(&mu_);
    return gone_;
  }

  void WaitGone(size_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (Gone().size() < n && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  }

  std::string root_;
  // A host folder outside root_ (which sandboxes may not see) that they may write.
  std::string share_;
  std::unique_ptr<BubblewrapRuntime> runtime_;
  absl::Mutex mu_;
  std::vector<std::string> gone_ ABSL_GUARDED_BY(mu_);
};

TEST_F(BubblewrapRuntimeTest, StartsServesAndDeletes) {
  StartRuntime();
  auto info = CreateNow();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->pool, "py");
  ASSERT_TRUE(absl::StartsWith(info->endpoint, "unix:")) << info->endpoint;
  EXPECT_EQ(runtime_->running(), 1u);
  int code = 0;
  EXPECT_EQ(Exec(*info, {"/bin/echo", "hello"}, &code), "hello\n");
  EXPECT_EQ(code, 0);
  const std::string dir = root_ + "/" + info->id;
  EXPECT_TRUE(fs::exists(dir));
  ASSERT_TRUE(DeleteNow(info->id).ok());
  EXPECT_EQ(runtime_->running(), 0u);
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_EQ(DeleteNow(info->id).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Gone().empty());  // deleted, not gone by itself
}

TEST_F(BubblewrapRuntimeTest, SandboxesAreIsolated) {
  StartRuntime();
  if (!runtime_->isolated()) GTEST_SKIP() << "bubblewrap cannot run on this machine";
  auto info = CreateNow();
  ASSERT_TRUE(info.ok()) << info.status();
  int code = 0;
  // Its own pid namespace: the daemon's tree starts near pid 1, and our pid is invisible.
  std::string out =
      Exec(*info,
           {"/bin/sh", "-c",
            absl::StrCat("test -e /proc/", getpid(), " && echo visible || echo hidden")},
           &code);
  EXPECT_EQ(out, "hidden\n");
  // Read-only host filesystem, writable workspace.
  out = Exec(*info, {"/bin/sh", "-c", "touch /etc/sbx-probe 2>/dev/null && echo rw || echo ro"},
             &code);
  EXPECT_EQ(out, "ro\n");
  out = Exec(*info, {"/bin/sh", "-c", "echo x > f && cat f"}, &code);
  EXPECT_EQ(out, "x\n");
  // Own network namespace: loopback only.
  out = Exec(*info, {"/bin/sh", "-c", kInterfaces}, &code);
  EXPECT_EQ(out, "lo\n");
  // Its hostname is its id.
  out = Exec(*info, {"/bin/hostname"}, &code);
  EXPECT_EQ(out, info->id + "\n");
  // Two sandboxes do not share the workspace.
  auto other = CreateNow();
  ASSERT_TRUE(other.ok()) << other.status();
  out = Exec(*other, {"/bin/sh", "-c", "cat f 2>/dev/null || echo absent"}, &code);
  EXPECT_EQ(out, "absent\n");
}

TEST_F(BubblewrapRuntimeTest, NetworkAndMountsFollowTheSpec) {
  StartRuntime();
  if (!runtime_->isolated()) GTEST_SKIP() << "bubblewrap cannot run on this machine";
  std::ofstream(share_ + "/data.txt") << "from host";
  LocalSpec spec;
  spec.network = true;
  spec.env["GREETING"] = "hi";
  spec.mounts.push_back({share_, "/data", true});
  auto info = CreateNow(EncodeLocalSpec(spec));
  ASSERT_TRUE(info.ok()) << info.status();
  int code = 0;
  EXPECT_EQ(Exec(*info, {"/bin/cat", "/data/data.txt"}, &code), "from host");
  EXPECT_EQ(Exec(*info, {"/bin/sh", "-c", "echo $GREETING"}, &code), "hi\n");
  std::string nets = Exec(*info, {"/bin/sh", "-c", kInterfaces}, &code);
  EXPECT_NE(nets, "lo\n");  // the host's interfaces
  EXPECT_THAT(nets, ::testing::HasSubstr("lo\n"));
}

TEST_F(BubblewrapRuntimeTest, ReportsASandboxThatDies) {
  StartRuntime();
  auto info = CreateNow();
  ASSERT_TRUE(info.ok()) << info.status();
  // Find the sandbox's top process by its command line and kill it behind the runtime.
  pid_t victim = -1;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string cmd = ReadFile(entry.path() / "cmdline");
    if (cmd.find(info->id) != std::string::npos && std::stoi(name) != getpid()) {
      victim = std::stoi(name);
      break;
    }
  }
  ASSERT_GT(victim, 0);
  kill(victim, SIGKILL);
  WaitGone(1);
  EXPECT_THAT(Gone(), ::testing::ElementsAre(info->id));
  EXPECT_EQ(runtime_->running(), 0u);
  EXPECT_FALSE(fs::exists(root_ + "/" + info->id));
  // Nothing of it is left: not bwrap's pid 1 inside, nor the daemon.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!ProcessesNaming(info->id).empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_THAT(ProcessesNaming(info->id), ::testing::IsEmpty());
}

// A sandbox left running under the root by an earlier run is killed when a runtime starts.
TEST_F(BubblewrapRuntimeTest, StraySandboxesOfAnEarlierRunAreKilled) {
  const std::string stray_dir = fs::absolute(root_).string() + "/lb-0000000000000000";
  fs::create_directories(stray_dir);
  // A stand-in for a stray bwrap: a process working in the sandbox folder, blocked
  // reading a pipe this test holds open.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t stray = fork();
  if (stray == 0) {
    dup2(fds[0], STDIN_FILENO);
    close(fds[1]);
    if (chdir(stray_dir.c_str()) != 0) _exit(126);
    execl("/bin/cat", "/bin/cat", "-", nullptr);
    _exit(127);
  }
  close(fds[0]);
  ASSERT_GT(stray, 0);
  absl::SleepFor(absl::Milliseconds(100));  // let it exec
  StartRuntime();
  int status = 0;
  ASSERT_EQ(waitpid(stray, &status, 0), stray);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_FALSE(fs::exists(stray_dir));
  close(fds[1]);
}

// Fail closed (issue 17: at 660dada a runtime without bubblewrap ran plain processes and
// only logged it): without isolation Make() refuses, naming the way out; plain processes
// only when asked for, and then they still take calls only with the secret.
TEST_F(BubblewrapRuntimeTest, PlainProcessesOnlyWhenAskedFor) {
  BubblewrapRuntimeOptions o = Options();
  o.bwrap_path = "/nonexistent/bwrap";
  auto refused = BubblewrapRuntime::Make(o);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("--insecure_local_no_isolation"));
  o.allow_unisolated = true;
  StartRuntime(o);
  EXPECT_FALSE(runtime_->isolated());
  auto info = CreateNow();
  ASSERT_TRUE(info.ok()) << info.status();
  int code = -1;
  EXPECT_EQ(Exec(*info, {"/bin/sh", "-c", "echo plain"}, &code), "plain\n");
  EXPECT_EQ(code, 0);
  ASSERT_TRUE(DeleteNow(info->id).ok());
}

// Template mounts are normalized and keep off the runtime's own paths; a mount source
// holding the runtime's root (which sandboxes may not see) is refused.
TEST_F(BubblewrapRuntimeTest, TemplateMountsAreChecked) {
  StartRuntime();
  if (!runtime_->isolated()) GTEST_SKIP() << "bubblewrap cannot run on this machine";
  for (const char* mount :
       {R"({"source":"/usr/../etc","target":"/x"})",
        R"({"source":"/usr","target":"/run/sbx/workspace"})",
        R"({"source":"/usr","target":"/a/../b"})", R"({"source":"/usr","target":"/"})",
        R"({"source":"/usr","target":"/proc/x"})"}) {
    SCOPED_TRACE(mount);
    auto info = CreateNow(absl::StrCat(R"({"mounts":[)", mount, "]}"));
    EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  }
  LocalSpec inside_root;
  inside_root.mounts.push_back({root_, "/sandboxes", true});
  auto refused = CreateNow(EncodeLocalSpec(inside_root));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), ::testing::HasSubstr("no sandbox may see"));
  EXPECT_EQ(runtime_->running(), 0u);
  // A mount that holds the root (it lies in /tmp), or / itself, is refused naming it, at
  // create and by CheckSpec (what PutTemplate asks); a mount beside it is fine.
  for (const char* source : {"/tmp", "/"}) {
    SCOPED_TRACE(source);
    LocalSpec holding_root;
    holding_root.mounts.push_back({source, "/host", true});
    auto held = CreateNow(EncodeLocalSpec(holding_root));
    EXPECT_EQ(held.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(held.status().message()), ::testing::HasSubstr(root_));
    const absl::Status checked = runtime_->CheckSpec(holding_root);
    EXPECT_EQ(checked.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(checked.message()), ::testing::HasSubstr("holds \"" + root_));
  }
  LocalSpec beside;
  beside.mounts.push_back({share_, "/share", true});
  EXPECT_TRUE(runtime_->CheckSpec(beside).ok());
  auto info = CreateNow(EncodeLocalSpec(beside));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(runtime_->running(), 1u);
}

// The server's files in a folder every sandbox sees (/etc): each file's folder is masked,
// so a file replaced by rename (the tokens reload) stays hidden; a key inside a hidden
// data dir is no second mask; a file right in /etc stops Make with that reason.
TEST_F(BubblewrapRuntimeTest, ServerFilesInSystemFoldersStayHiddenAcrossARename) {
  const std::string etc = "/etc/sbx-rt-" + std::to_string(getpid());
  if (access("/etc", W_OK) != 0) GTEST_SKIP() << "needs to write /etc";
  fs::create_directories(etc + "/auth");
  fs::create_directories(etc + "/data");
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
    fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                              fs::perms::others_read);
  };
  write(etc + "/auth/tokens", "tok-old\n");
  write(etc + "/data/sandbox.key", "the-key-bytes\n");
  write(etc + "/beside", "visible\n");
  // A file deeper in a folder the sandbox's uid may not pass through (as root: 0700): the
  // mask goes on that folder, which bubblewrap can reach.
  fs::create_directories(etc + "/private/deep");
  write(etc + "/private/deep/tls.key", "the-tls-key\n");
  fs::permissions(etc + "/private", fs::perms::owner_all);
  BubblewrapRuntimeOptions o = Options();
  o.hidden_paths = {etc + "/data", etc + "/data/sandbox.key", etc + "/auth/tokens",
                    etc + "/private/deep/tls.key"};
  StartRuntime(o);
  if (!runtime_->isolated()) {
    fs::remove_all(etc);
    GTEST_SKIP() << "bubblewrap cannot run on this machine";
  }
  auto info = CreateNow();
  ASSERT_TRUE(info.ok()) << info.status();
  int code = -1;
  const std::string look = "cat " + etc + "/auth/tokens " + etc + "/data/sandbox.key " + etc +
                           "/private/deep/tls.key " + etc + "/beside 2>&1; ls -A " + etc +
                           "/auth " + etc + "/data " + etc + "/private";
  std::string out = Exec(*info, {"/bin/sh", "-c", look}, &code);
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("tok-old")));
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("the-key-bytes")));
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("the-tls-key")));
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("deep\n")));
  EXPECT_THAT(out, ::testing::HasSubstr("visible"));
  write(etc + "/auth/tokens.new", "tok-new\n");
  fs::rename(etc + "/auth/tokens.new", etc + "/auth/tokens");
  out = Exec(*info, {"/bin/sh", "-c", look}, &code);
  EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("tok-new")));
  runtime_.reset();

  write(etc + "-tokens", "bare\n");
  o.hidden_paths = {etc + "-tokens"};
  auto refused = BubblewrapRuntime::Make(o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::HasSubstr("\"" + etc + "-tokens\" (one of the server's own files"));
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::Not(::testing::HasSubstr("apt-get install bubblewrap")));
  fs::remove(etc + "-tokens");
  fs::remove_all(etc);
}

// Nothing a sandbox writes to its stdout/stderr (what bubblewrap's init holds, reachable
// at /proc/1/fd/1 and /2) reaches a host file without a bound: its output FIFO is drained
// into a log of at most 2 x 1 MiB, by this runtime and by the next one that adopts it.
TEST_F(BubblewrapRuntimeTest, SandboxOutputReachesTheHostBounded) {
  BubblewrapRuntimeOptions o = Options();
  o.delete_on_exit = false;
  StartRuntime(o);
  auto info = CreateNow();
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string dir = root_ + "/" + info->id;
  // What the sandbox's pid 1 writes to, written from here (as the host's root may, which
  // the sandbox may not when its uid is another): 6 MiB.
  struct stat st;
  ASSERT_EQ(lstat((dir + "/output").c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  {
    const int fd = open((dir + "/output").c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const std::string mib(1 << 20, 'x');
    for (int i = 0; i < 6; ++i) ASSERT_EQ(write(fd, mib.data(), mib.size()), 1 << 20);
    const std::string last = "the-last-words\n";
    ASSERT_EQ(write(fd, last.data(), last.size()), static_cast<ssize_t>(last.size()));
    close(fd);
  }
  auto log_bytes = [&] {
    uint64_t total = 0;
    for (const char* name : {"/sandboxd.log", "/sandboxd.log.1"}) {
      std::error_code ec;
      const uint64_t n = fs::file_size(dir + name, ec);
      if (!ec) total += n;
    }
    return total;
  };
  // The writes above returned once the runtime had read all but the pipe's buffer.
  // What is kept is the latest output: the last words are in the current log.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (ReadFile(dir + "/sandboxd.log").find("the-last-words") == std::string::npos &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_THAT(ReadFile(dir + "/sandboxd.log"), ::testing::HasSubstr("the-last-words"));
  EXPECT_LE(log_bytes(), uint64_t{2} << 20);
  EXPECT_GE(log_bytes(), uint64_t{1} << 20);
  // Everything written beyond the two files is counted (6 MiB and the daemon's own lines).
  EXPECT_GE(runtime_->output_dropped_bytes() + log_bytes(), uint64_t{6} << 20);
  EXPECT_LE(runtime_->output_dropped_bytes(), uint64_t{5} << 20);
  int code = -1;
  EXPECT_EQ(Exec(*info, {"/bin/echo", "alive"}, &code), "alive\n");

  // While no runtime runs, writes wait in the pipe; the next runtime drains them.
  runtime_.reset();
  {
    const int fd = open((dir + "/output").c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const std::string marker = "written-while-no-runtime-ran\n";
    ASSERT_EQ(write(fd, marker.data(), marker.size()), static_cast<ssize_t>(marker.size()));
    close(fd);
  }
  StartRuntime(o);
  EXPECT_EQ(runtime_->adopted(), 1u);
  const absl::Time again = absl::Now() + absl::Seconds(10);
  while (ReadFile(dir + "/sandboxd.log").find("written-while-no-runtime-ran") ==
             std::string::npos &&
         absl::Now() < again) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_THAT(ReadFile(dir + "/sandboxd.log"),
              ::testing::HasSubstr("written-while-no-runtime-ran"));
  EXPECT_LE(log_bytes(), uint64_t{2} << 20);
  EXPECT_EQ(Exec(*info, {"/bin/echo", "adopted"}, &code), "adopted\n");
}

TEST_F(BubblewrapRuntimeTest, BadSpecsAndOptionsAreRefused) {
  StartRuntime();
  auto info = CreateNow("{not json");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(info.status().message()), ::testing::HasSubstr("template \"t\""));
  info = CreateNow(R"({"mounts":[{"source":"relative","target":"/x"}]})");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_->running(), 0u);

  BubblewrapRuntimeOptions o = Options();
  o.sandboxd_path = "/nonexistent/sbx-sandboxd";
  EXPECT_EQ(BubblewrapRuntime::Make(o).status().code(), absl::StatusCode::kFailedPrecondition);
  o.sandboxd_path = "relative/sbx-sandboxd";
  EXPECT_EQ(BubblewrapRuntime::Make(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.sandboxd_path = SBX_SANDBOXD;
  o.root_dir = "/tmp/" + std::string(120, 'x');
  EXPECT_EQ(BubblewrapRuntime::Make(o).status().code(), absl::StatusCode::kInvalidArgument);
  // One runtime per root.
  o.root_dir = root_;
  auto second = BubblewrapRuntime::Make(o);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()), ::testing::HasSubstr("in use"));
}

TEST_F(BubblewrapRuntimeTest, MemoryLimitGoesToTheCgroup) {
  StartRuntime();
  if (!fs::exists("/sys/fs/cgroup/memory/memory.limit_in_bytes")) {
    GTEST_SKIP() << "no cgroup v1 memory controller here";
  }
  LocalSpec spec;
  spec.memory_limit_bytes = 64 << 20;
  auto info = CreateNow(EncodeLocalSpec(spec));
  ASSERT_TRUE(info.ok()) << info.status();
  std::ifstream in("/sys/fs/cgroup/memory/sbx/" + info->id + "/memory.limit_in_bytes");
  int64_t limit = 0;
  in >> limit;
  EXPECT_EQ(limit, 64 << 20);
  ASSERT_TRUE(DeleteNow(info->id).ok());
  EXPECT_FALSE(fs::exists("/sys/fs/cgroup/memory/sbx/" + info->id));
}

TEST_F(BubblewrapRuntimeTest, SuspendFreezesAndResumeContinues) {
  StartRuntime();
  auto info = CreateNow(SharedSpec());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(Listed(info->id)->suspended);
  CheckSuspendAndResume(*info);
  if (HaveFreezer()) {
    // The freezer cgroup did it.
    ASSERT_TRUE(SuspendNow(info->id).ok());
    EXPECT_EQ(ReadFile(absl::StrCat(kFreezer, "/", info->id, "/freezer.state")), "FROZEN\n");
    ASSERT_TRUE(ResumeNow(info->id).ok());
    EXPECT_EQ(ReadFile(absl::StrCat(kFreezer, "/", info->id, "/freezer.state")), "THAWED\n");
  }
  EXPECT_EQ(SuspendNow("lb-nope").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ResumeNow("lb-nope").code(), absl::StatusCode::kNotFound);
}

TEST_F(BubblewrapRuntimeTest, SuspendWithSignalsWithoutTheFreezer) {
  BubblewrapRuntimeOptions o = Options();
  o.use_freezer = false;
  StartRuntime(o);
  auto info = CreateNow(SharedSpec());
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(fs::exists(absl::StrCat(kFreezer, "/", info->id)));
  CheckSuspendAndResume(*info);
}

TEST_F(BubblewrapRuntimeTest, DeletingASuspendedSandboxKillsIt) {
  for (bool freezer : {true, false}) {
    SCOPED_TRACE(freezer ? "freezer" : "signals");
    BubblewrapRuntimeOptions o = Options();
    o.use_freezer = freezer;
    StartRuntime(o);
    auto info = CreateNow(SharedSpec());
    ASSERT_TRUE(info.ok()) << info.status();
    StartCounter(*info);
    const std::vector<pid_t> pids = SandboxProcesses(info->id);
    ASSERT_FALSE(pids.empty());
    ASSERT_TRUE(SuspendNow(info->id).ok());
    const absl::Time start = absl::Now();
    ASSERT_TRUE(DeleteNow(info->id).ok());
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    for (pid_t p : pids) {
      // Gone, or a zombie on its way (not ours to reap).
      std::string stat = ReadFile(absl::StrCat("/proc/", p, "/stat"));
      EXPECT_TRUE(stat.empty() || stat.find(") Z") != std::string::npos) << p << ": " << stat;
    }
    EXPECT_FALSE(fs::exists(root_ + "/" + info->id));
    EXPECT_FALSE(fs::exists(absl::StrCat(kFreezer, "/", info->id)));
    EXPECT_EQ(SuspendNow(info->id).code(), absl::StatusCode::kNotFound);
    runtime_.reset();
  }
}

// Sandboxes outlive their runtime; the next runtime on the same root adopts the live ones
// and cleans up the dead.
TEST_F(BubblewrapRuntimeTest, ANewRuntimeAdoptsTheSandboxesOfTheLastOne) {
  BubblewrapRuntimeOptions o = Options();
  o.delete_on_exit = false;
  StartRuntime(o);
  auto kept = CreateNow();
  auto frozen = CreateNow();
  auto killed = CreateNow();
  ASSERT_TRUE(kept.ok() && frozen.ok() && killed.ok());
  ASSERT_TRUE(SuspendNow(frozen->id).ok());
  runtime_.reset();  // detaches
  int code = -1;
  EXPECT_EQ(Exec(*kept, {"/bin/echo", "still here"}, &code), "still here\n");

  // One dies while no runtime runs: every process of it, as a crash or an OOM kill would.
  const std::vector<pid_t> victims = SandboxProcesses(killed->id);
  ASSERT_FALSE(victims.empty());
  for (pid_t p : victims) kill(p, SIGKILL);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!ProcessesNaming(killed->id).empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  // A stray half-made folder (no state file) goes too.
  fs::create_directories(root_ + "/lb-00000000000000ff");

  StartRuntime(o);
  EXPECT_EQ(runtime_->running(), 2u);
  EXPECT_EQ(runtime_->adopted(), 2u);
  auto listed = runtime_->List();
  ASSERT_TRUE(listed.ok());
  std::set<std::string> ids;
  for (const SandboxInfo& s : *listed) ids.insert(s.id);
  EXPECT_THAT(ids, ::testing::UnorderedElementsAre(kept->id, frozen->id));
  auto k = Listed(kept->id);
  ASSERT_TRUE(k.has_value());
  EXPECT_EQ(k->pool, "py");
  EXPECT_EQ(k->endpoint, kept->endpoint);
  EXPECT_FALSE(k->suspended);
  EXPECT_TRUE(Listed(frozen->id)->suspended);
  EXPECT_FALSE(fs::exists(root_ + "/" + killed->id));
  EXPECT_FALSE(fs::exists(absl::StrCat(kFreezer, "/", killed->id)));
  EXPECT_FALSE(fs::exists(root_ + "/lb-00000000000000ff"));

  // Adopted sandboxes work like own ones: exec, resume, delete.
  EXPECT_EQ(Exec(*kept, {"/bin/echo", "adopted"}, &code), "adopted\n");
  ASSERT_TRUE(ResumeNow(frozen->id).ok());
  EXPECT_EQ(Exec(*frozen, {"/bin/echo", "thawed"}, &code), "thawed\n");
  const std::vector<pid_t> kept_pids = SandboxProcesses(kept->id);
  ASSERT_TRUE(DeleteNow(kept->id).ok());
  EXPECT_FALSE(fs::exists(root_ + "/" + kept->id));
  for (pid_t p : kept_pids) {
    std::string stat = ReadFile(absl::StrCat("/proc/", p, "/stat"));
    EXPECT_TRUE(stat.empty() || stat.find(") Z") != std::string::npos) << p << ": " << stat;
  }
  EXPECT_EQ(runtime_->running(), 1u);
  EXPECT_TRUE(Gone().empty());

  // The end of an adopted sandbox, killed from outside, is reported like an own one's.
  const std::vector<pid_t> top = ProcessesNaming(frozen->id);
  ASSERT_FALSE(top.empty());
  for (pid_t p : top) kill(p, SIGKILL);
  WaitGone(1);
  EXPECT_THAT(Gone(), ::testing::ElementsAre(frozen->id));
  EXPECT_EQ(runtime_->running(), 0u);
  EXPECT_FALSE(fs::exists(root_ + "/" + frozen->id));
}

TEST_F(BubblewrapRuntimeTest, DeleteOnExitLeavesNothingRunning) {
  StartRuntime();  // delete_on_exit, as in every other test here
  auto a = CreateNow();
  auto b = CreateNow();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(SuspendNow(b->id).ok());
  EXPECT_FALSE(ProcessesNaming(root_).empty());
  runtime_.reset();
  EXPECT_THAT(ProcessesNaming(root_), ::testing::IsEmpty());
  EXPECT_FALSE(fs::exists(root_ + "/" + a->id));
  EXPECT_FALSE(fs::exists(absl::StrCat(kFreezer, "/", b->id)));
  EXPECT_TRUE(Gone().empty());
}

// Without delete_on_exit the runtime leaves its sandboxes running when it goes.
TEST_F(BubblewrapRuntimeTest, WithoutDeleteOnExitSandboxesKeepRunning) {
  BubblewrapRuntimeOptions o = Options();
  o.delete_on_exit = false;
  StartRuntime(o);
  auto a = CreateNow();
  ASSERT_TRUE(a.ok());
  runtime_.reset();
  int code = -1;
  EXPECT_EQ(Exec(*a, {"/bin/echo", "alive"}, &code), "alive\n");
  EXPECT_TRUE(fs::exists(root_ + "/" + a->id + "/state.json"));
  EXPECT_TRUE(Gone().empty());
}

}  // namespace
}  // namespace sbx::runtime

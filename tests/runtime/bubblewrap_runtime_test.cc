// The local runtime against the real sbx-sandboxd and the machine's bubblewrap.

#include "src/runtime/bubblewrap_runtime.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>

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

class BubblewrapRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = "/tmp/sbx-rt-" + std::to_string(getpid());
    fs::remove_all(root_);
  }
  void TearDown() override {
    runtime_.reset();
    fs::remove_all(root_);
  }

  void StartRuntime() {
    BubblewrapRuntimeOptions o;
    o.root_dir = root_;
    o.sandboxd_path = SBX_SANDBOXD;
    o.on_gone = [this](const std::string& id) {
      absl::MutexLock lock(&mu_);
      gone_.push_back(id);
    };
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

  std::vector<std::string> Gone() {
    absl::MutexLock lock(&mu_);
    return gone_;
  }

  std::string root_;
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
  fs::create_directories(root_ + "/shared");
  std::ofstream(root_ + "/shared/data.txt") << "from host";
  LocalSpec spec;
  spec.network = true;
  spec.env["GREETING"] = "hi";
  spec.mounts.push_back({fs::absolute(root_ + "/shared").string(), "/data", true});
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
    std::ifstream in(entry.path() / "cmdline");
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find(info->id) != std::string::npos && std::stoi(name) != getpid()) {
      victim = std::stoi(name);
      break;
    }
  }
  ASSERT_GT(victim, 0);
  kill(victim, SIGKILL);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (Gone().empty() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_THAT(Gone(), ::testing::ElementsAre(info->id));
  EXPECT_EQ(runtime_->running(), 0u);
  EXPECT_FALSE(fs::exists(root_ + "/" + info->id));
}

// A sandbox left running under the root by an earlier run is killed when a runtime starts.
TEST_F(BubblewrapRuntimeTest, StraySandboxesOfAnEarlierRunAreKilled) {
  const std::string stray_dir = fs::absolute(root_).string() + "/lb-0000000000000000";
  fs::create_directories(stray_dir);
  // A stand-in for a stray bwrap: a process naming the sandbox folder on its command
  // line, blocked reading a pipe this test holds open.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t stray = fork();
  if (stray == 0) {
    dup2(fds[0], STDIN_FILENO);
    close(fds[1]);
    execl("/bin/cat", "/bin/cat", "-", stray_dir.c_str(), nullptr);
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

TEST_F(BubblewrapRuntimeTest, BadSpecsAndOptionsAreRefused) {
  StartRuntime();
  auto info = CreateNow("{not json");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(info.status().message()), ::testing::HasSubstr("template \"t\""));
  info = CreateNow(R"({"mounts":[{"source":"relative","target":"/x"}]})");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runtime_->running(), 0u);

  BubblewrapRuntimeOptions o;
  o.root_dir = root_;
  o.sandboxd_path = "/nonexistent/sbx-sandboxd";
  EXPECT_EQ(BubblewrapRuntime::Make(o).status().code(), absl::StatusCode::kFailedPrecondition);
  o.sandboxd_path = "relative/sbx-sandboxd";
  EXPECT_EQ(BubblewrapRuntime::Make(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.sandboxd_path = SBX_SANDBOXD;
  o.root_dir = "/tmp/" + std::string(120, 'x');
  EXPECT_EQ(BubblewrapRuntime::Make(o).status().code(), absl::StatusCode::kInvalidArgument);
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

}  // namespace
}  // namespace sbx::runtime

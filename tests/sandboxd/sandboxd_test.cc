// End-to-end tests of sbx-sandboxd: the real daemon (sbx::sandboxd::Daemon) on a unix
// socket in a temporary directory, driven by a real gRPC client.

#include "src/sandboxd/sandboxd.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sbx/sandboxd/v1/sandboxd.grpc.pb.h"
#include "src/common/port_dial.h"

namespace sbx::sandboxd {
namespace {

using ::testing::HasSubstr;
namespace pb = ::sbx::sandboxd::v1;

// Generous bound for "did it end at all"; nothing asserts speed.
constexpr auto kEventually = std::chrono::seconds(20);

// True once no process of group `pgid` (and, if given, process `pid`) exists any more.
bool GoneEventually(pid_t pgid, pid_t pid = -1) {
  const auto until = std::chrono::steady_clock::now() + kEventually;
  while (std::chrono::steady_clock::now() < until) {
    const bool group_gone = kill(-pgid, 0) != 0 && errno == ESRCH;
    const bool pid_gone = pid < 0 || (kill(pid, 0) != 0 && errno == ESRCH);
    if (group_gone && pid_gone) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

struct ExecOutcome {
  grpc::Status status;
  pid_t pid = -1;
  std::string out;
  std::string err;
  std::optional<pb::ExecExit> exit;
  // Messages in arrival order ('s' started, 'o' stdout, 'e' stderr, 'x' exit).
  std::string order;
};

void Record(const pb::ExecResponse& resp, ExecOutcome& outcome) {
  switch (resp.kind_case()) {
    case pb::ExecResponse::kStarted:
      outcome.pid = resp.started().pid();
      outcome.order += 's';
      break;
    case pb::ExecResponse::kStdoutChunk:
      outcome.out += resp.stdout_chunk();
      outcome.order += 'o';
      break;
    case pb::ExecResponse::kStderrChunk:
      outcome.err += resp.stderr_chunk();
      outcome.order += 'e';
      break;
    case pb::ExecResponse::kExit:
      outcome.exit = resp.exit();
      outcome.order += 'x';
      break;
    default:
      outcome.order += '?';
      break;
  }
}

pb::ExecStart Sh(const std::string& script) {
  pb::ExecStart start;
  start.add_argv("/bin/sh");
  start.add_argv("-c");
  start.add_argv(script);
  return start;
}

pb::ExecRequest StdinChunk(const std::string& data) {
  pb::ExecRequest r;
  r.set_stdin_chunk(data);
  return r;
}

pb::ExecRequest CloseStdin() {
  pb::ExecRequest r;
  r.mutable_close_stdin();
  return r;
}

pb::ExecRequest SignalRequest(int signal) {
  pb::ExecRequest r;
  r.mutable_signal()->set_signal(signal);
  return r;
}

// A running Exec call driven message by message.
class LiveExec {
 public:
  LiveExec(pb::Sandboxd::Stub* stub, const pb::ExecStart& start) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stream_ = stub->Exec(&ctx_);
    pb::ExecRequest req;
    *req.mutable_start() = start;
    stream_->Write(req);
  }
  bool ReadOne() {
    pb::ExecResponse resp;
    if (!stream_->Read(&resp)) return false;
    Record(resp, outcome_);
    return true;
  }
  // Reads until `done()` holds; false if the stream ended first.
  bool ReadUntil(const std::function<bool(const ExecOutcome&)>& done) {
    while (!done(outcome_)) {
      if (!ReadOne()) return false;
    }
    return true;
  }
  bool Send(const pb::ExecRequest& req) { return stream_->Write(req); }
  void WritesDone() { stream_->WritesDone(); }
  void Cancel() { ctx_.TryCancel(); }
  ExecOutcome& Finish() {
    while (ReadOne()) {
    }
    outcome_.status = stream_->Finish();
    return outcome_;
  }
  const ExecOutcome& outcome() const { return outcome_; }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::ExecRequest, pb::ExecResponse>> stream_;
  ExecOutcome outcome_;
};

class SandboxdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-sd-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    workspace_ = dir_ + "/ws";
    ASSERT_EQ(mkdir(workspace_.c_str(), 0755), 0);
    ASSERT_EQ(mkdir((dir_ + "/outside").c_str(), 0755), 0);
    options_.socket_path = dir_ + "/sd.sock";
    options_.workspace = workspace_;
    options_.env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"BASE", "base"}};
    // The calls of these tests carry no secret; SecretTest covers the secret.
    options_.allow_unauthenticated = true;
  }

  void TearDown() override {
    if (daemon_ != nullptr) daemon_->Shutdown(absl::Seconds(5));
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Start() {
    auto daemon = Daemon::Start(options_);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    channel_ =
        grpc::CreateChannel("unix:" + options_.socket_path, grpc::InsecureChannelCredentials());
    stub_ = pb::Sandboxd::NewStub(channel_);
  }

  static void SetDeadline(grpc::ClientContext& ctx) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  }

  // Runs `start` to the end: sends `input` (with attach_stdin), close_stdin, half-closes
  // and reads everything.
  ExecOutcome Exec(const pb::ExecStart& start, const std::vector<std::string>& input = {}) {
    LiveExec exec(stub_.get(), start);
    for (const std::string& chunk : input) {
      if (!exec.Send(StdinChunk(chunk))) break;
    }
    if (start.attach_stdin()) exec.Send(CloseStdin());
    exec.WritesDone();
    return exec.Finish();
  }

  grpc::Status Write(const std::string& path, const std::string& content,
                     bool create_parents = false, bool append = false, uint32_t mode = 0,
                     int64_t* size = nullptr) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    pb::WriteFileRequest req;
    req.set_path(path);
    req.set_content(content);
    req.set_create_parents(create_parents);
    req.set_append(append);
    req.set_mode(mode);
    pb::WriteFileResponse resp;
    grpc::Status s = stub_->WriteFile(&ctx, req, &resp);
    if (size != nullptr) *size = resp.size();
    return s;
  }

  grpc::Status Read(const std::string& path, pb::ReadFileResponse* resp, int64_t offset = 0,
                    int64_t limit = 0) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    pb::ReadFileRequest req;
    req.set_path(path);
    req.set_offset(offset);
    req.set_limit(limit);
    return stub_->ReadFile(&ctx, req, resp);
  }

  grpc::Status List(const std::string& path, bool recursive, pb::ListFilesResponse* resp) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    pb::ListFilesRequest req;
    req.set_path(path);
    req.set_recursive(recursive);
    return stub_->ListFiles(&ctx, req, resp);
  }

  grpc::Status Configure(const pb::ConfigureRequest& req) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    pb::ConfigureResponse resp;
    return stub_->Configure(&ctx, req, &resp);
  }

  std::string dir_;
  std::string workspace_;
  DaemonOptions options_;
  std::unique_ptr<Daemon> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Sandboxd::Stub> stub_;
};

// ---- Exec ----

TEST_F(SandboxdTest, EchoThroughShell) {
  Start();
  ExecOutcome r = Exec(Sh("echo hello sandbox"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, "hello sandbox\n");
  EXPECT_EQ(r.err, "");
  ASSERT_TRUE(r.exit.has_value());
  EXPECT_EQ(r.exit->status_case(), pb::ExecExit::kExitCode);
  EXPECT_EQ(r.exit->exit_code(), 0);
  EXPECT_GT(r.pid, 0);
  EXPECT_EQ(r.order.front(), 's');
  EXPECT_EQ(r.order.back(), 'x');
  EXPECT_EQ(r.exit->stdout_bytes(), 14);
  EXPECT_FALSE(r.exit->truncated());
  EXPECT_FALSE(r.exit->timed_out());
}

// With a sandbox root (the local runtime and pods pass "/"), a cwd may be absolute: a
// folder of that root, resolved as file paths are (a link cannot lead out of it, ".." is
// refused); without one it is refused, naming the cwd.
TEST_F(SandboxdTest, AnAbsoluteCwdIsAFolderOfTheSandboxsRoot) {
  namespace fs = std::filesystem;
  const std::string root = dir_ + "/root";
  fs::create_directories(root + "/srv/app");
  fs::create_symlink(dir_ + "/outside", root + "/srv/out");  // the host's path, absolute
  std::ofstream(dir_ + "/outside/secret") << "host";
  options_.sandbox_root = root;
  Start();
  ExecOutcome r = Exec(Sh("pwd"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  pb::ExecStart in_root = Sh("pwd");
  in_root.set_cwd("/srv/app");
  r = Exec(in_root);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, root + "/srv/app\n");
  // The absolute link is read inside the root, where that host path does not exist.
  pb::ExecStart through_link = Sh("cat secret");
  through_link.set_cwd("/srv/out");
  r = Exec(through_link);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND) << r.out;
  pb::ExecStart dotdot = Sh("pwd");
  dotdot.set_cwd("/srv/../..");
  r = Exec(dotdot);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(SandboxdTest, AnAbsoluteCwdIsRefusedWithoutASandboxRoot) {
  Start();
  pb::ExecStart start = Sh("pwd");
  start.set_cwd("/tmp");
  ExecOutcome r = Exec(start);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(), HasSubstr("\"/tmp\" is absolute"));
}

TEST_F(SandboxdTest, ArgvZeroIsResolvedViaPath) {
  Start();
  pb::ExecStart start;
  start.add_argv("echo");
  start.add_argv("via path");
  ExecOutcome r = Exec(start);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, "via path\n");
}

TEST_F(SandboxdTest, ExitCodesAreReported) {
  Start();
  for (int code : {0, 1, 7, 255}) {
    ExecOutcome r = Exec(Sh(absl::StrCat("exit ", code)));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_TRUE(r.exit.has_value());
    EXPECT_EQ(r.exit->status_case(), pb::ExecExit::kExitCode);
    EXPECT_EQ(r.exit->exit_code(), code);
  }
}

TEST_F(SandboxdTest, StderrIsSeparateFromStdout) {
  Start();
  ExecOutcome r = Exec(Sh("echo out; echo error >&2; echo more"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, "out\nmore\n");
  EXPECT_EQ(r.err, "error\n");
  ASSERT_TRUE(r.exit.has_value());
  EXPECT_EQ(r.exit->stdout_bytes(), 9);
  EXPECT_EQ(r.exit->stderr_bytes(), 6);
}

TEST_F(SandboxdTest, StdinIsPipedToTheCommand) {
  Start();
  pb::ExecStart start;
  start.add_argv("cat");
  start.set_attach_stdin(true);
  ExecOutcome r = Exec(start, {"hello ", "world"});
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, "hello world");
  EXPECT_EQ(r.exit->exit_code(), 0);
}

TEST_F(SandboxdTest, LargeStdinGoesThroughWithBackpressure) {
  Start();
  pb::ExecStart start = Sh("sleep 0.2; wc -c");
  start.set_attach_stdin(true);
  std::vector<std::string> input(6, std::string(512 << 10, 'z'));  // 3 MiB
  ExecOutcome r = Exec(start, input);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(std::string(absl::StripAsciiWhitespace(r.out)), absl::StrCat(3 << 20));
}

TEST_F(SandboxdTest, HalfCloseClosesStdin) {
  Start();
  pb::ExecStart start;
  start.add_argv("cat");
  start.set_attach_stdin(true);
  LiveExec exec(stub_.get(), start);
  exec.Send(StdinChunk("abc"));
  exec.WritesDone();  // no close_stdin: half-closing must be enough for cat to end
  ExecOutcome& r = exec.Finish();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, "abc");
}

TEST_F(SandboxdTest, WithoutAttachStdinIsDevNull) {
  Start();
  ExecOutcome r = Exec(Sh("cat; echo done"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, "done\n");
}

TEST_F(SandboxdTest, OutputIsStreamedAsProduced) {
  Start();
  LiveExec exec(stub_.get(), Sh("echo first; sleep 0.3; echo second"));
  ASSERT_TRUE(exec.ReadUntil([](const ExecOutcome& o) { return !o.out.empty(); }));
  // The first chunk arrived on its own, before the process printed the rest or exited.
  EXPECT_EQ(exec.outcome().out, "first\n");
  EXPECT_FALSE(exec.outcome().exit.has_value());
  ExecOutcome& r = exec.Finish();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, "first\nsecond\n");
  EXPECT_EQ(r.order, "soox");
}

TEST_F(SandboxdTest, TimeoutKillsTheWholeGroup) {
  Start();
  pb::ExecStart start = Sh("sleep 100 & echo $!; sleep 100");
  start.mutable_timeout()->set_nanos(500'000'000);
  ExecOutcome r = Exec(start);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_TRUE(r.exit.has_value());
  EXPECT_TRUE(r.exit->timed_out());
  EXPECT_EQ(r.exit->status_case(), pb::ExecExit::kSignal);
  EXPECT_EQ(r.exit->signal(), SIGKILL);
  pid_t background = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(r.out), &background)) << r.out;
  EXPECT_TRUE(GoneEventually(r.pid, background))
      << "a process of group " << r.pid << " survived the timeout";
}

TEST_F(SandboxdTest, SignalIsDeliveredToTheGroup) {
  Start();
  LiveExec exec(stub_.get(), Sh("trap 'echo got INT; exit 3' INT; echo ready; "
                                "while :; do sleep 0.05; done"));
  ASSERT_TRUE(exec.ReadUntil([](const ExecOutcome& o) { return o.out == "ready\n"; }));
  ASSERT_TRUE(exec.Send(SignalRequest(SIGINT)));
  ExecOutcome& r = exec.Finish();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, "ready\ngot INT\n");
  ASSERT_TRUE(r.exit.has_value());
  EXPECT_EQ(r.exit->exit_code(), 3);
  EXPECT_FALSE(r.exit->timed_out());
}

TEST_F(SandboxdTest, SigtermKillsTheCommand) {
  Start();
  // `exec`: the shell becomes sleep. With a fork instead, a SIGTERM sent to the group while
  // the shell is starting its child can miss the child (about 1 run in 100 here: the shell
  // dies, `sleep` lives on), a race between the shell and the group signal, not sandboxd's.
  LiveExec exec(stub_.get(), Sh("echo ready; exec sleep 100"));
  ASSERT_TRUE(exec.ReadUntil([](const ExecOutcome& o) { return !o.out.empty(); }));
  ASSERT_TRUE(exec.Send(SignalRequest(SIGTERM)));
  ExecOutcome& r = exec.Finish();
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_TRUE(r.exit.has_value());
  EXPECT_EQ(r.exit->status_case(), pb::ExecExit::kSignal);
  EXPECT_EQ(r.exit->signal(), SIGTERM);
  EXPECT_TRUE(GoneEventually(r.pid));
}

TEST_F(SandboxdTest, OutputBeyondTheCapIsDroppedAndCounted) {
  Start();
  pb::ExecStart start = Sh("head -c 100000 /dev/zero; head -c 10 /dev/zero >&2");
  start.set_max_output_bytes(1000);
  ExecOutcome r = Exec(start);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out.size(), 1000u);
  EXPECT_EQ(r.err.size(), 10u);
  ASSERT_TRUE(r.exit.has_value());
  EXPECT_TRUE(r.exit->truncated());
  EXPECT_EQ(r.exit->stdout_bytes(), 100000);
  EXPECT_EQ(r.exit->stderr_bytes(), 10);
  EXPECT_EQ(r.exit->exit_code(), 0);
}

TEST_F(SandboxdTest, CwdIsRelativeToTheWorkspace) {
  Start();
  ASSERT_TRUE(Write("sub/f", "x", true).ok());
  pb::ExecStart start;
  start.add_argv("pwd");
  start.set_cwd("sub");
  ExecOutcome r = Exec(start);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, workspace_ + "/sub\n");
  start.clear_cwd();
  r = Exec(start);
  EXPECT_EQ(r.out, workspace_ + "\n");
}

TEST_F(SandboxdTest, BadStartsAreRefused) {
  Start();
  pb::ExecStart start;
  start.add_argv("no-such-program-sbx");
  ExecOutcome r = Exec(start);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(r.status.error_message(), HasSubstr("no-such-program-sbx"));
  EXPECT_FALSE(r.exit.has_value());

  r = Exec(pb::ExecStart());
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  pb::ExecStart bad_cwd = Sh("true");
  bad_cwd.set_cwd("../outside");
  r = Exec(bad_cwd);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(r.status.error_message(), HasSubstr("../outside"));

  bad_cwd.set_cwd("missing");
  r = Exec(bad_cwd);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::NOT_FOUND);

  pb::ExecStart big = Sh("true");
  big.set_max_output_bytes(int64_t{65} << 20);
  r = Exec(big);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // First message not a start.
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  auto stream = stub_->Exec(&ctx);
  stream->Write(StdinChunk("x"));
  stream->WritesDone();
  pb::ExecResponse resp;
  EXPECT_FALSE(stream->Read(&resp));
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("start"));
}

TEST_F(SandboxdTest, StdinWithoutAttachEndsTheCallAndKillsTheCommand) {
  Start();
  LiveExec exec(stub_.get(), Sh("echo ready; sleep 100"));
  ASSERT_TRUE(exec.ReadUntil([](const ExecOutcome& o) { return !o.out.empty(); }));
  exec.Send(StdinChunk("x"));
  ExecOutcome& r = exec.Finish();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(GoneEventually(r.pid));
}

TEST_F(SandboxdTest, ClientCancelKillsTheCommand) {
  Start();
  LiveExec exec(stub_.get(), Sh("sleep 100 & echo $!; sleep 100"));
  ASSERT_TRUE(
      exec.ReadUntil([](const ExecOutcome& o) { return o.out.find('\n') != std::string::npos; }));
  const pid_t pgid = exec.outcome().pid;
  pid_t background = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(exec.outcome().out), &background));
  ASSERT_EQ(kill(-pgid, 0), 0) << "the command should still run";
  exec.Cancel();
  ExecOutcome& r = exec.Finish();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(GoneEventually(pgid, background)) << "group " << pgid << " survived the cancel";
}

TEST_F(SandboxdTest, ConcurrencyLimitGivesResourceExhausted) {
  options_.max_concurrent_execs = 2;
  Start();
  auto a = std::make_unique<LiveExec>(stub_.get(), Sh("sleep 100"));
  auto b = std::make_unique<LiveExec>(stub_.get(), Sh("sleep 100"));
  ASSERT_TRUE(a->ReadUntil([](const ExecOutcome& o) { return o.pid > 0; }));
  ASSERT_TRUE(b->ReadUntil([](const ExecOutcome& o) { return o.pid > 0; }));
  ExecOutcome third = Exec(Sh("echo never"));
  EXPECT_EQ(third.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(third.status.error_message(), HasSubstr("2"));
  EXPECT_EQ(third.out, "");
  a->Cancel();
  b->Cancel();
  EXPECT_EQ(a->Finish().status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(b->Finish().status.error_code(), grpc::StatusCode::CANCELLED);
  const auto until = std::chrono::steady_clock::now() + kEventually;
  while (daemon_->running_execs() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ExecOutcome again = Exec(Sh("echo again"));
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.out, "again\n");
}

TEST_F(SandboxdTest, ManyConcurrentCommandsAllComplete) {
  Start();
  std::vector<std::future<ExecOutcome>> results;
  for (int i = 0; i < 8; ++i) {
    results.push_back(std::async(std::launch::async, [this, i] {
      return Exec(Sh(absl::StrCat("head -c 300000 /dev/zero | tr '\\0' x; echo ", i)));
    }));
  }
  for (int i = 0; i < 8; ++i) {
    ExecOutcome r = results[i].get();
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.out.size(), 300000u + absl::StrCat(i).size() + 1);
    EXPECT_EQ(r.exit->stdout_bytes(), static_cast<int64_t>(r.out.size()));
  }
}

// ---- Configure ----

TEST_F(SandboxdTest, ConfigureEnvIsSeenByLaterExecs) {
  Start();
  pb::ConfigureRequest req;
  (*req.mutable_env())["FOO"] = "from-claim";
  (*req.mutable_env())["BASE"] = "overridden";
  auto* file = req.add_files();
  file->set_path("conf/settings.txt");
  file->set_content("x=1");
  ASSERT_TRUE(Configure(req).ok());
  ASSERT_TRUE(Configure(req).ok()) << "Configure must be idempotent";

  ExecOutcome r = Exec(Sh("printf '%s %s' \"$FOO\" \"$BASE\""));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, "from-claim overridden");

  pb::ExecStart start = Sh("printf %s \"$FOO\"");
  (*start.mutable_env())["FOO"] = "per-exec";
  r = Exec(start);
  EXPECT_EQ(r.out, "per-exec");

  pb::ReadFileResponse read;
  ASSERT_TRUE(Read("conf/settings.txt", &read).ok());
  EXPECT_EQ(read.content(), "x=1");

  // A later Configure replaces the env (the daemon's own env stays).
  ASSERT_TRUE(Configure(pb::ConfigureRequest()).ok());
  r = Exec(Sh("printf '%s|%s' \"$FOO\" \"$BASE\""));
  EXPECT_EQ(r.out, "|base");
}

TEST_F(SandboxdTest, ConfigureRefusesBadEnvAndEscapingFiles) {
  Start();
  pb::ConfigureRequest req;
  (*req.mutable_env())["A=B"] = "x";
  EXPECT_EQ(Configure(req).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  pb::ConfigureRequest escape;
  escape.add_files()->set_path("../escaped");
  grpc::Status s = Configure(escape);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  struct stat st;
  EXPECT_NE(stat((dir_ + "/escaped").c_str(), &st), 0);
}

// ---- Files ----

TEST_F(SandboxdTest, WriteReadListRoundTrip) {
  Start();
  int64_t size = 0;
  ASSERT_TRUE(Write("dir/a.txt", "hello world", true, false, 0600, &size).ok());
  EXPECT_EQ(size, 11);
  ASSERT_TRUE(Write("top.txt", "t").ok());
  ASSERT_TRUE(Write("dir/a.txt", "!", false, true, 0, &size).ok());
  EXPECT_EQ(size, 12);

  pb::ReadFileResponse read;
  ASSERT_TRUE(Read("dir/a.txt", &read).ok());
  EXPECT_EQ(read.content(), "hello world!");
  EXPECT_EQ(read.size(), 12);
  EXPECT_TRUE(read.eof());
  EXPECT_EQ(read.mode(), 0600u);
  ASSERT_TRUE(Read("dir/a.txt", &read, 6, 5).ok());
  EXPECT_EQ(read.content(), "world");
  EXPECT_FALSE(read.eof());

  // The command sees the same files.
  ExecOutcome r = Exec(Sh("cat dir/a.txt"));
  EXPECT_EQ(r.out, "hello world!");

  pb::ListFilesResponse list;
  ASSERT_TRUE(List("", true, &list).ok());
  ASSERT_EQ(list.entries_size(), 3);
  EXPECT_EQ(list.entries(0).path(), "dir");
  EXPECT_TRUE(list.entries(0).is_dir());
  EXPECT_EQ(list.entries(1).path(), "dir/a.txt");
  EXPECT_EQ(list.entries(1).size(), 12);
  EXPECT_EQ(list.entries(1).mode(), 0600u);
  EXPECT_FALSE(list.entries(1).is_dir());
  EXPECT_EQ(list.entries(1).type(), pb::FILE_TYPE_REGULAR);
  EXPECT_GT(list.entries(1).mtime().seconds(), 0);
  EXPECT_EQ(list.entries(2).path(), "top.txt");

  ASSERT_TRUE(List("", false, &list).ok());
  ASSERT_EQ(list.entries_size(), 2);
  ASSERT_TRUE(List("dir", false, &list).ok());
  ASSERT_EQ(list.entries_size(), 1);
  EXPECT_EQ(list.entries(0).path(), "dir/a.txt");
}

TEST_F(SandboxdTest, FileErrorsHaveTheRightCodes) {
  Start();
  ASSERT_TRUE(Write("d/f", "x", true).ok());
  pb::ReadFileResponse read;
  EXPECT_EQ(Read("missing", &read).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::Status s = Read("d", &read);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("directory"));
  EXPECT_EQ(Write("nope/f", "x").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Write("d", "x").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Write("d/f/g", "x").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  pb::ListFilesResponse list;
  EXPECT_EQ(List("d/f", false, &list).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(List("nothing", false, &list).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Write("", "x").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Write("m", "x", false, false, 010000).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(SandboxdTest, TooBigFilesAreRefusedWithTheNumbers) {
  options_.max_file_bytes = 1000;
  Start();
  grpc::Status s = Write("big", std::string(1001, 'b'));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("1001"));
  EXPECT_THAT(s.error_message(), HasSubstr("1000"));
  ASSERT_TRUE(Write("grow", std::string(600, 'g')).ok());
  s = Write("grow", std::string(600, 'g'), false, true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("1000"));
  pb::ReadFileResponse read;
  EXPECT_EQ(Read("grow", &read, 0, 2000).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Read("grow", &read).ok());
  EXPECT_EQ(read.size(), 600) << "the refused append must not have written anything";
}

// Every escape attempt, with openat2 and with the component walk.
class EscapeTest : public SandboxdTest, public ::testing::WithParamInterface<bool> {};

TEST_P(EscapeTest, EscapesAreRefused) {
  options_.use_openat2 = GetParam();
  Start();
  if (!GetParam()) EXPECT_FALSE(daemon_->uses_openat2());
  ASSERT_EQ(symlink("/etc", (workspace_ + "/etc").c_str()), 0);
  ASSERT_EQ(symlink((dir_ + "/outside").c_str(), (workspace_ + "/out").c_str()), 0);
  ASSERT_EQ(symlink("../outside", (workspace_ + "/up").c_str()), 0);
  ASSERT_EQ(mkdir((workspace_ + "/a").c_str(), 0755), 0);
  {
    FILE* f = fopen((dir_ + "/outside/secret").c_str(), "w");
    ASSERT_NE(f, nullptr);
    fputs("secret", f);
    fclose(f);
  }

  // Reads may aim at real system files; writes never do (if confinement were broken, a
  // test run as root must not clobber the host): they aim at dir_/outside instead.
  pb::ReadFileResponse read;
  pb::ListFilesResponse list;
  const std::vector<std::string> read_paths = {
      "../x",       "/etc/passwd", "a/../../x",         "etc/passwd",
      "out/secret", "up/secret",   "../outside/secret", dir_ + "/outside/secret"};
  for (const std::string& path : read_paths) {
    SCOPED_TRACE(path);
    grpc::Status s = Read(path, &read);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(path));
    EXPECT_EQ(read.content(), "");
  }
  const std::vector<std::string> write_paths = {
      "../x", "a/../../x", dir_ + "/outside/x", "out/x",
      "up/x", "out/sub/x", "../outside/x",      "a/../../outside/x"};
  for (const std::string& path : write_paths) {
    SCOPED_TRACE(path);
    grpc::Status s = Write(path, "pwned", true);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(path));
    s = Write(path, "pwned", false, true);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  for (const std::string dir : {"etc", "out", "up", "..", "/", "a/../.."}) {
    SCOPED_TRACE(dir);
    EXPECT_EQ(List(dir, false, &list).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    pb::ExecStart start = Sh("pwd");
    start.set_cwd(dir);
    ExecOutcome r = Exec(start);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_FALSE(r.exit.has_value());
  }
  struct stat st;
  EXPECT_NE(stat((dir_ + "/x").c_str(), &st), 0);
  EXPECT_NE(stat((dir_ + "/outside/x").c_str(), &st), 0);
  EXPECT_NE(stat((dir_ + "/outside/sub").c_str(), &st), 0);
  // Nothing outside changed.
  FILE* f = fopen((dir_ + "/outside/secret").c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[16] = {};
  ASSERT_NE(fgets(buf, sizeof(buf), f), nullptr);
  fclose(f);
  EXPECT_STREQ(buf, "secret");

  // The listing reports the links without following them.
  ASSERT_TRUE(List("", true, &list).ok());
  for (const auto& e : list.entries()) {
    EXPECT_THAT(e.path(), ::testing::Not(HasSubstr("passwd")));
    if (e.path() == "etc") EXPECT_EQ(e.type(), pb::FILE_TYPE_SYMLINK);
  }
}

TEST_P(EscapeTest, LinksInsideTheWorkspaceFollowOnlyWithOpenat2) {
  options_.use_openat2 = GetParam();
  Start();
  ASSERT_TRUE(Write("real/f", "inside", true).ok());
  ASSERT_EQ(symlink("real", (workspace_ + "/link").c_str()), 0);
  pb::ReadFileResponse read;
  grpc::Status s = Read("link/f", &read);
  if (daemon_->uses_openat2()) {
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(read.content(), "inside");
  } else {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
}

INSTANTIATE_TEST_SUITE_P(Resolution, EscapeTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "openat2" : "walk"; });

// ---- Health, socket, shutdown ----

TEST_F(SandboxdTest, HealthIsServing) {
  Start();
  grpc::GenericStub generic(channel_);
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  grpc::ByteBuffer request;  // HealthCheckRequest{service: ""} encodes to no bytes
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                    [&done](grpc::Status s) { done.set_value(s); });
  grpc::Status s = done.get_future().get();
  ASSERT_TRUE(s.ok()) << s.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& slice : slices) bytes += std::string(slice.begin(), slice.end());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // status: SERVING
}

TEST_F(SandboxdTest, StaleSocketIsReplacedButOtherFilesAreNot) {
  // A socket file left by a dead daemon.
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, options_.socket_path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
  Start();
  ExecOutcome r = Exec(Sh("echo up"));
  EXPECT_EQ(r.out, "up\n");
  daemon_->Shutdown(absl::Seconds(5));
  struct stat st;
  EXPECT_NE(lstat(options_.socket_path.c_str(), &st), 0) << "shutdown removes the socket";

  FILE* f = fopen(options_.socket_path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  auto other = Daemon::Start(options_);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(lstat(options_.socket_path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST_F(SandboxdTest, ShutdownKillsRunningCommands) {
  Start();
  LiveExec exec(stub_.get(), Sh("echo ready; sleep 100"));
  ASSERT_TRUE(exec.ReadUntil([](const ExecOutcome& o) { return !o.out.empty(); }));
  const pid_t pgid = exec.outcome().pid;
  daemon_->Shutdown(absl::Seconds(5));
  ExecOutcome& r = exec.Finish();
  // Either the exit (killed by SIGKILL) made it out before the server stopped, or the call
  // was cut off; in both cases the command is gone.
  if (r.status.ok()) {
    ASSERT_TRUE(r.exit.has_value());
    EXPECT_EQ(r.exit->signal(), SIGKILL);
  }
  EXPECT_TRUE(GoneEventually(pgid));
  EXPECT_EQ(daemon_->running_execs(), 0);
}

TEST(DaemonOptionsTest, ValidateNamesTheBadField) {
  DaemonOptions options;
  EXPECT_THAT(std::string(options.Validate().message()), HasSubstr("socket_path"));
  options.socket_path = "/tmp/x.sock";
  options.listen_fd = 4;
  EXPECT_THAT(std::string(options.Validate().message()), HasSubstr("exactly one"));
  options.listen_fd = -1;
  EXPECT_THAT(std::string(options.Validate().message()), HasSubstr("no secret"));
  options.secret = "short";
  EXPECT_THAT(std::string(options.Validate().message()), HasSubstr("at least 16"));
  options.secret = std::string(64, 'a');
  EXPECT_THAT(std::string(options.Validate().message()), HasSubstr("workspace"));
  options.workspace = "/tmp";
  EXPECT_TRUE(options.Validate().ok());
  options.max_concurrent_execs = 0;
  EXPECT_THAT(std::string(options.Validate().message()), HasSubstr("max_concurrent_execs 0"));
  options.max_concurrent_execs = 16;
  options.max_file_bytes = 0;
  EXPECT_THAT(std::string(options.Validate().message()), HasSubstr("max_file_bytes 0"));
  options.max_file_bytes = 1;
  options.socket_path = "/" + std::string(200, 's');
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
}

// Only a caller with the sandbox's secret may drive the daemon (issue 17: at 660dada any
// process that reached the socket could exec and write files). Health stays open.
class SecretTest : public SandboxdTest {
 protected:
  void SetUp() override {
    SandboxdTest::SetUp();
    options_.allow_unauthenticated = false;
    options_.secret = std::string(64, 'k');
  }
};

TEST_F(SecretTest, CallsWithoutTheRightSecretAreRefusedAndDoNothing) {
  Start();
  for (const char* given :
       {"", "kkkk", "x", "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkj",
        "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"}) {
    SCOPED_TRACE(given);
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      if (*given != '\0') ctx.AddMetadata(kSecretMetadata, given);
      pb::WriteFileRequest req;
      req.set_path("pwned");
      req.set_content("x");
      pb::WriteFileResponse resp;
      EXPECT_EQ(stub_->WriteFile(&ctx, req, &resp).error_code(), grpc::UNAUTHENTICATED);
    }
    {
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      if (*given != '\0') ctx.AddMetadata(kSecretMetadata, given);
      auto stream = stub_->Exec(&ctx);
      pb::ExecRequest req;
      req.mutable_start()->add_argv("/bin/sh");
      req.mutable_start()->add_argv("-c");
      req.mutable_start()->add_argv("touch pwned-by-exec");
      stream->Write(req);
      stream->WritesDone();
      pb::ExecResponse resp;
      while (stream->Read(&resp)) {
      }
      EXPECT_EQ(stream->Finish().error_code(), grpc::UNAUTHENTICATED);
    }
    for (int call = 0; call < 3; ++call) {
      grpc::ClientContext ctx;
      SetDeadline(ctx);
      if (*given != '\0') ctx.AddMetadata(kSecretMetadata, given);
      grpc::Status status;
      if (call == 0) {
        pb::ReadFileRequest req;
        req.set_path("x");
        pb::ReadFileResponse resp;
        status = stub_->ReadFile(&ctx, req, &resp);
      } else if (call == 1) {
        pb::ListFilesRequest req;
        pb::ListFilesResponse resp;
        status = stub_->ListFiles(&ctx, req, &resp);
      } else {
        pb::ConfigureRequest req;
        pb::ConfigureResponse resp;
        status = stub_->Configure(&ctx, req, &resp);
      }
      EXPECT_EQ(status.error_code(), grpc::UNAUTHENTICATED) << "call " << call;
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(std::filesystem::exists(workspace_ + "/pwned"));
  EXPECT_FALSE(std::filesystem::exists(workspace_ + "/pwned-by-exec"));
}

TEST_F(SecretTest, TheRightSecretWorksAndHealthNeedsNone) {
  Start();
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  ctx.AddMetadata(kSecretMetadata, options_.secret);
  pb::WriteFileRequest req;
  req.set_path("ok");
  req.set_content("fine");
  pb::WriteFileResponse resp;
  ASSERT_TRUE(stub_->WriteFile(&ctx, req, &resp).ok());
  EXPECT_TRUE(std::filesystem::exists(workspace_ + "/ok"));
  grpc::GenericStub generic(channel_);
  grpc::ClientContext hctx;
  SetDeadline(hctx);
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&hctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                    [&done](grpc::Status s) { done.set_value(s); });
  EXPECT_TRUE(done.get_future().get().ok());
}

// The local runtime binds the socket outside the sandbox and hands it over.
TEST_F(SecretTest, ServesAnInheritedListeningSocket) {
  const std::string path = dir_ + "/inherited.sock";
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  options_.socket_path.clear();
  options_.listen_fd = fd;
  auto daemon = Daemon::Start(options_);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  daemon_ = std::move(*daemon);
  auto channel = grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  auto stub = pb::Sandboxd::NewStub(channel);
  for (int i = 0; i < 3; ++i) {  // several calls, on one connection and on new ones
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    ctx.AddMetadata(kSecretMetadata, options_.secret);
    pb::WriteFileRequest req;
    req.set_path("via-fd-" + std::to_string(i));
    req.set_content("x");
    pb::WriteFileResponse resp;
    ASSERT_TRUE(stub->WriteFile(&ctx, req, &resp).ok());
  }
  EXPECT_TRUE(std::filesystem::exists(workspace_ + "/via-fd-2"));
}

// The port dial (src/common/port_dial.h) on the same inherited socket as gRPC: with the
// secret, the daemon connects to 127.0.0.1:PORT and passes the socket back; without it, or
// to a closed port, it answers an error and passes nothing. gRPC keeps working beside it.
struct DialAnswer {
  uint8_t code = 255;
  int fd = -1;
  std::string message;
};

DialAnswer Dial(const std::string& path, const std::string& secret, uint16_t port) {
  DialAnswer out;
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return out;
  const std::string req = EncodePortDial(secret, port);
  if (write(s, req.data(), req.size()) != static_cast<ssize_t>(req.size())) return out;
  char buf[600];
  iovec iov{buf, sizeof(buf)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
  close(s);
  if (n <= 0) return out;
  out.code = static_cast<uint8_t>(buf[0]);
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_type == SCM_RIGHTS) std::memcpy(&out.fd, CMSG_DATA(cm), sizeof(int));
  }
  if (n > 3) out.message.assign(buf + 3, static_cast<size_t>(n) - 3);
  return out;
}

TEST_F(SecretTest, DialsAPortAndPassesTheSocket) {
  const std::string path = dir_ + "/dial.sock";
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  options_.socket_path.clear();
  options_.listen_fd = fd;
  auto daemon = Daemon::Start(options_);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  daemon_ = std::move(*daemon);
  // A server on the loopback of this (the daemon's) network namespace.
  const int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(ls, reinterpret_cast<sockaddr*>(&in), sizeof(in)), 0);
  ASSERT_EQ(listen(ls, 4), 0);
  socklen_t len = sizeof(in);
  ASSERT_EQ(getsockname(ls, reinterpret_cast<sockaddr*>(&in), &len), 0);
  const uint16_t port = ntohs(in.sin_port);

  DialAnswer ok = Dial(path, options_.secret, port);
  ASSERT_EQ(ok.code, kPortDialOk) << ok.message;
  ASSERT_GE(ok.fd, 0);
  const int peer = accept(ls, nullptr, nullptr);
  ASSERT_GE(peer, 0);
  ASSERT_EQ(write(ok.fd, "hi", 2), 2);
  char got[2];
  ASSERT_EQ(read(peer, got, 2), 2);
  EXPECT_EQ(std::string(got, 2), "hi");
  close(ok.fd);
  close(peer);

  DialAnswer wrong = Dial(path, std::string(options_.secret.size(), 'x'), port);
  EXPECT_EQ(wrong.code, kPortDialError);
  EXPECT_EQ(wrong.fd, -1);
  EXPECT_THAT(wrong.message, HasSubstr("wrong sandbox secret"));
  close(ls);  // nothing listens on the port now
  DialAnswer closed = Dial(path, options_.secret, port);
  EXPECT_EQ(closed.code, kPortDialError);
  EXPECT_EQ(closed.fd, -1);
  EXPECT_THAT(closed.message, HasSubstr("refused"));

  // gRPC on the same socket still works.
  auto stub = pb::Sandboxd::NewStub(
      grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  SetDeadline(ctx);
  ctx.AddMetadata(kSecretMetadata, options_.secret);
  pb::WriteFileRequest req;
  req.set_path("after-dial");
  req.set_content("x");
  pb::WriteFileResponse resp;
  EXPECT_TRUE(stub->WriteFile(&ctx, req, &resp).ok());
}

TEST(DaemonStartTest, MissingWorkspaceIsNotFound) {
  DaemonOptions options;
  options.allow_unauthenticated = true;
  options.socket_path = "/tmp/sbx-sd-never.sock";
  options.workspace = "/nonexistent/sbx-workspace";
  auto daemon = Daemon::Start(options);
  EXPECT_EQ(daemon.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(daemon.status().message()), HasSubstr("/nonexistent/sbx-workspace"));
}

// A sandbox of an image starts commands in the image's WorkingDir (default_cwd) when they
// name no cwd; a cwd given is still relative to the workspace.
TEST_F(SandboxdTest, CommandsNamingNoCwdStartInTheDefaultCwd) {
  const std::string app = dir_ + "/app";
  ASSERT_EQ(mkdir(app.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((workspace_ + "/sub").c_str(), 0755), 0);
  options_.default_cwd = app;
  Start();
  ExecOutcome r = Exec(Sh("pwd"));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, app + "\n");
  pb::ExecStart start = Sh("pwd");
  start.set_cwd("sub");
  r = Exec(start);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.out, workspace_ + "/sub\n");
  // A default_cwd that is gone fails the command with the folder named.
  ASSERT_EQ(rmdir(app.c_str()), 0);
  r = Exec(Sh("pwd"));
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.error_message().find(app), std::string::npos) << r.status.error_message();
}

}  // namespace
}  // namespace sbx::sandboxd

// Processes of sbx-sandboxd (StartProcess, ConnectProcess, ListProcesses, input, signals,
// PTYs, waits, limits): the real daemon on a unix socket in a temporary directory, driven
// by real gRPC clients, running real programs.

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sbx/sandboxd/v1/sandboxd.grpc.pb.h"
#include "src/sandboxd/sandboxd.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SBX_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SBX_TEST_ASAN 1
#endif
#ifdef SBX_TEST_ASAN
// AddressSanitizer keeps freed memory in a quarantine (256 MiB by default), which the
// flood test's bound on resident memory would count as the daemon's; without it, what is
// measured is what the daemon holds.
extern "C" const char* __asan_default_options() {
  return "quarantine_size_mb=0:thread_local_quarantine_size_kb=0";
}
#endif

namespace sbx::sandboxd {
namespace {

using ::testing::HasSubstr;
namespace pb = ::sbx::sandboxd::v1;

// Generous bound for "did it happen at all"; nothing asserts speed.
constexpr auto kEventually = std::chrono::seconds(20);

bool Eventually(const std::function<bool()>& condition) {
  const auto until = std::chrono::steady_clock::now() + kEventually;
  while (std::chrono::steady_clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return condition();
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

// This process's resident memory (the daemon runs in it), in bytes.
int64_t ResidentBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      int64_t kb = 0;
      if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::StripSuffix(
                                absl::StripAsciiWhitespace(line.substr(6)), "kB")),
                            &kb)) {
        return -1;
      }
      return kb * 1024;
    }
  }
  return -1;
}

pb::StartProcessRequest Sh(const std::string& script) {
  pb::StartProcessRequest req;
  req.add_argv("/bin/sh");
  req.add_argv("-c");
  req.add_argv(script);
  return req;
}

pb::ProcessSelector Pid(int pid) {
  pb::ProcessSelector s;
  s.set_pid(pid);
  return s;
}

pb::ProcessSelector Tag(const std::string& tag) {
  pb::ProcessSelector s;
  s.set_tag(tag);
  return s;
}

// What a process stream brought.
struct Events {
  grpc::Status status;
  std::optional<pb::ProcessStarted> started;
  std::string out, err, pty;
  int64_t dropped = 0;
  int dropped_events = 0;
  std::optional<pb::ProcessExit> exit;
  // Events in arrival order: 's' started, 'o' stdout, 'e' stderr, 'p' pty, 'd' dropped,
  // 'x' exit.
  std::string order;

  void Record(const pb::ProcessEvent& e) {
    switch (e.kind_case()) {
      case pb::ProcessEvent::kStarted:
        started = e.started();
        order += 's';
        break;
      case pb::ProcessEvent::kStdout:
        out += e.stdout();
        order += 'o';
        break;
      case pb::ProcessEvent::kStderr:
        err += e.stderr();
        order += 'e';
        break;
      case pb::ProcessEvent::kPty:
        pty += e.pty();
        order += 'p';
        break;
      case pb::ProcessEvent::kDropped:
        dropped += e.dropped().bytes();
        ++dropped_events;
        order += 'd';
        break;
      case pb::ProcessEvent::kExit:
        exit = e.exit();
        order += 'x';
        break;
      default:
        order += '?';
        break;
    }
  }
};

// A StartProcess or ConnectProcess call read event by event.
class Stream {
 public:
  Stream(pb::Sandboxd::Stub* stub, const pb::StartProcessRequest& start) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    reader_ = stub->StartProcess(&ctx_, start);
  }
  Stream(pb::Sandboxd::Stub* stub, const pb::ProcessSelector& which) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    pb::ConnectProcessRequest req;
    *req.mutable_process() = which;
    reader_ = stub->ConnectProcess(&ctx_, req);
  }
  bool ReadOne() {
    pb::ProcessEvent e;
    if (!reader_->Read(&e)) return false;
    events_.Record(e);
    return true;
  }
  // Reads until `done()` holds; false if the stream ended first.
  bool ReadUntil(const std::function<bool(const Events&)>& done) {
    while (!done(events_)) {
      if (!ReadOne()) return false;
    }
    return true;
  }
  void Cancel() { ctx_.TryCancel(); }
  Events& Finish() {
    while (ReadOne()) {
    }
    events_.status = reader_->Finish();
    return events_;
  }
  const Events& events() const { return events_; }
  int pid() const { return events_.started ? events_.started->pid() : -1; }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<pb::ProcessEvent>> reader_;
  Events events_;
};

class ProcessesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-procs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    workspace_ = dir_ + "/ws";
    ASSERT_EQ(mkdir(workspace_.c_str(), 0755), 0);
    options_.socket_path = dir_ + "/sd.sock";
    options_.workspace = workspace_;
    options_.env = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}};
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
    stub_ = NewClient();
  }

  // A client of its own (its own channel and connection).
  std::unique_ptr<pb::Sandboxd::Stub> NewClient() {
    grpc::ChannelArguments args;
    args.SetInt("sbx-client-id", ++clients_);  // a distinct channel, not a shared subchannel
    return pb::Sandboxd::NewStub(grpc::CreateCustomChannel(
        "unix:" + options_.socket_path, grpc::InsecureChannelCredentials(), args));
  }

  static void SetDeadline(grpc::ClientContext& ctx, int seconds = 60) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  }

  // Starts `req` detached; returns its pid (or -1, failing the test).
  int StartDetached(pb::StartProcessRequest req) {
    req.set_detach(true);
    Stream s(stub_.get(), req);
    Events& e = s.Finish();
    EXPECT_TRUE(e.status.ok()) << e.status.error_message();
    EXPECT_EQ(e.order, "s") << "a detached start sends `started` only";
    return e.started ? e.started->pid() : -1;
  }

  grpc::Status Input(const pb::ProcessSelector& which, const std::string& data) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    pb::SendProcessInputRequest req;
    *req.mutable_process() = which;
    req.set_data(data);
    pb::SendProcessInputResponse resp;
    return stub_->SendProcessInput(&ctx, req, &resp);
  }

  grpc::Status CloseInput(const pb::ProcessSelector& which) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    pb::CloseProcessInputRequest req;
    *req.mutable_process() = which;
    pb::CloseProcessInputResponse resp;
    return stub_->CloseProcessInput(&ctx, req, &resp);
  }

  grpc::Status Signal(const pb::ProcessSelector& which, int signal) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    pb::SignalProcessRequest req;
    *req.mutable_process() = which;
    req.set_signal(signal);
    pb::SignalProcessResponse resp;
    return stub_->SignalProcess(&ctx, req, &resp);
  }

  grpc::Status Resize(const pb::ProcessSelector& which, int cols, int rows) {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    pb::ResizeProcessRequest req;
    *req.mutable_process() = which;
    req.mutable_size()->set_cols(cols);
    req.mutable_size()->set_rows(rows);
    pb::ResizeProcessResponse resp;
    return stub_->ResizeProcess(&ctx, req, &resp);
  }

  grpc::Status Wait(pb::Sandboxd::Stub* stub, const pb::ProcessSelector& which,
                    pb::WaitProcessResponse* resp, int seconds = 60) {
    grpc::ClientContext ctx;
    SetDeadline(ctx, seconds);
    pb::WaitProcessRequest req;
    *req.mutable_process() = which;
    return stub->WaitProcess(&ctx, req, resp);
  }

  std::vector<pb::ProcessInfo> List() {
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    pb::ListProcessesResponse resp;
    grpc::Status s = stub_->ListProcesses(&ctx, pb::ListProcessesRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {resp.processes().begin(), resp.processes().end()};
  }

  std::optional<pb::ProcessInfo> Info(int pid) {
    for (pb::ProcessInfo& p : List()) {
      if (p.pid() == pid) return p;
    }
    return std::nullopt;
  }

  std::string dir_;
  std::string workspace_;
  DaemonOptions options_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<pb::Sandboxd::Stub> stub_;
  int clients_ = 0;
};

// ---- Lifetime, replay, live output ----

TEST_F(ProcessesTest, ABackgroundProcessOutlivesTheCallThatStartedIt) {
  Start();
  const int pid = StartDetached(Sh("echo early; sleep 100"));
  ASSERT_GT(pid, 0);
  // The call is over; the process runs on, listed, and its output waits in its ring.
  EXPECT_TRUE(Alive(pid));
  std::optional<pb::ProcessInfo> info = Info(pid);
  ASSERT_TRUE(info.has_value());
  EXPECT_FALSE(info->has_exit());
  EXPECT_THAT(info->argv(), ::testing::ElementsAre("/bin/sh", "-c", "echo early; sleep 100"));
  EXPECT_EQ(daemon_->running_processes(), 1);
  ASSERT_TRUE(Eventually([&] { return Info(pid)->output_bytes() == 6; }));
  Stream later(stub_.get(), Pid(pid));
  ASSERT_TRUE(later.ReadUntil([](const Events& e) { return e.out == "early\n"; }));
  EXPECT_EQ(later.events().started->pid(), pid);
  EXPECT_EQ(later.events().order, "so");
  later.Cancel();
  EXPECT_EQ(later.Finish().status.error_code(), grpc::StatusCode::CANCELLED);
  // Detaching a reader does not stop the process either.
  EXPECT_TRUE(Alive(pid));
  ASSERT_TRUE(Signal(Pid(pid), SIGKILL).ok());
  EXPECT_TRUE(Eventually([&] { return !Alive(pid); }));
}

TEST_F(ProcessesTest, AnAttachedStartFollowsToTheExitAndCancellingOnlyDetaches) {
  Start();
  Stream run(stub_.get(), Sh("echo out; echo err >&2; exit 4"));
  Events& e = run.Finish();
  ASSERT_TRUE(e.status.ok()) << e.status.error_message();
  EXPECT_EQ(e.out, "out\n");
  EXPECT_EQ(e.err, "err\n");
  ASSERT_TRUE(e.exit.has_value());
  EXPECT_EQ(e.exit->exit_code(), 4);
  EXPECT_EQ(e.exit->output_bytes(), 8);
  EXPECT_EQ(e.order.front(), 's');
  EXPECT_EQ(e.order.back(), 'x');

  Stream attached(stub_.get(), Sh("echo ready; sleep 100"));
  ASSERT_TRUE(attached.ReadUntil([](const Events& e) { return e.out == "ready\n"; }));
  const int pid = attached.pid();
  attached.Cancel();
  attached.Finish();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(Alive(pid)) << "cancelling the starting call killed the process";
  EXPECT_TRUE(Signal(Pid(pid), SIGKILL).ok());
}

TEST_F(ProcessesTest, ConnectReplaysThenFollowsLiveThenEndsWithTheExit) {
  Start();
  pb::StartProcessRequest req =
      Sh("echo one; read a; echo \"got $a\"; read b; echo \"got $b\"; exit 3");
  req.set_stdin(true);
  const int pid = StartDetached(req);
  ASSERT_TRUE(Eventually([&] { return Info(pid)->output_bytes() == 4; }));
  Stream s(stub_.get(), Pid(pid));
  ASSERT_TRUE(s.ReadUntil([](const Events& e) { return e.out == "one\n"; }));  // the replay
  ASSERT_TRUE(Input(Pid(pid), "live\n").ok());
  ASSERT_TRUE(s.ReadUntil([](const Events& e) { return e.out == "one\ngot live\n"; }));
  ASSERT_TRUE(Input(Pid(pid), "end\n").ok());
  Events& e = s.Finish();
  ASSERT_TRUE(e.status.ok()) << e.status.error_message();
  EXPECT_EQ(e.out, "one\ngot live\ngot end\n");
  ASSERT_TRUE(e.exit.has_value());
  EXPECT_EQ(e.exit->exit_code(), 3);
  EXPECT_EQ(e.order.back(), 'x');
  EXPECT_EQ(e.dropped, 0);

  // An ended process still answers: what is left in its ring (nothing: all was sent),
  // then its exit.
  Stream after(stub_.get(), Pid(pid));
  Events& a = after.Finish();
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.order, "sx");
  EXPECT_EQ(a.exit->exit_code(), 3);
}

TEST_F(ProcessesTest, TheReplayIsWhatWasWrittenSinceTheLastReader) {
  Start();
  pb::StartProcessRequest req = Sh("while read line; do echo \"$line\"; done");
  req.set_stdin(true);
  const int pid = StartDetached(req);
  ASSERT_TRUE(Input(Pid(pid), "first\n").ok());
  {
    Stream s(stub_.get(), Pid(pid));
    ASSERT_TRUE(s.ReadUntil([](const Events& e) { return e.out == "first\n"; }));
    s.Cancel();
    s.Finish();
  }
  // The daemon learns of the cancel on its own time; output it hands a reader before then
  // counts as sent to it.
  ASSERT_TRUE(Eventually([&] { return Info(pid)->readers() == 0; }));
  ASSERT_TRUE(Input(Pid(pid), "second\n").ok());
  ASSERT_TRUE(Eventually([&] { return Info(pid)->output_bytes() == 13; }));
  // Two readers connect one after the other: the first gets what nobody was sent.
  Stream again(stub_.get(), Pid(pid));
  ASSERT_TRUE(again.ReadUntil([](const Events& e) { return !e.out.empty(); }));
  EXPECT_EQ(again.events().out, "second\n");
  Stream third(stub_.get(), Pid(pid));
  ASSERT_TRUE(third.ReadUntil([](const Events& e) { return e.started.has_value(); }));
  // Both attached readers get what comes next.
  ASSERT_TRUE(Input(Pid(pid), "third\n").ok());
  ASSERT_TRUE(again.ReadUntil([](const Events& e) { return e.out == "second\nthird\n"; }));
  ASSERT_TRUE(third.ReadUntil([](const Events& e) { return e.out == "third\n"; }));
  EXPECT_EQ(Info(pid)->readers(), 2);
  ASSERT_TRUE(CloseInput(Pid(pid)).ok());
  EXPECT_EQ(again.Finish().exit->exit_code(), 0);
  EXPECT_EQ(third.Finish().exit->exit_code(), 0);
}

// ---- The replay ring is bounded: a flood costs drops, not memory ----

TEST_F(ProcessesTest, TheReplayIsBoundedAndWhatWasDroppedIsCounted) {
  Start();
  pb::StartProcessRequest req = Sh("head -c 1000000 /dev/zero | tr '\\0' x; echo END");
  req.set_replay_bytes(64 << 10);
  const int pid = StartDetached(req);
  pb::WaitProcessResponse waited;
  ASSERT_TRUE(Wait(stub_.get(), Pid(pid), &waited).ok());
  EXPECT_EQ(waited.exit().exit_code(), 0);
  EXPECT_EQ(waited.exit().output_bytes(), 1000004);
  EXPECT_EQ(waited.exit().dropped_bytes(), 1000004 - (64 << 10));
  std::optional<pb::ProcessInfo> info = Info(pid);
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->buffered_bytes(), 64 << 10);
  EXPECT_EQ(info->dropped_bytes(), 1000004 - (64 << 10));

  Stream s(stub_.get(), Pid(pid));
  Events& e = s.Finish();
  ASSERT_TRUE(e.status.ok()) << e.status.error_message();
  // First the gap, then the newest 64 KiB, the end included, then the exit.
  EXPECT_EQ(e.order.substr(0, 2), "sd");
  EXPECT_EQ(e.dropped, 1000004 - (64 << 10));
  EXPECT_EQ(e.out.size(), size_t{64} << 10);
  EXPECT_TRUE(absl::EndsWith(e.out, "xxxEND\n")) << e.out.substr(e.out.size() - 20);
  EXPECT_EQ(e.order.back(), 'x');
}

// Attack: a process writing faster than anyone reads (here 512 MiB with nobody attached,
// and a reader that takes one event a second). Without the ring's cap the daemon held
// all of it (seen failing: its memory grew by the whole output); with it, the process
// runs at full speed, the daemon's memory stays within a few MiB and the drops are
// counted and reported to the slow reader.
TEST_F(ProcessesTest, AFloodKeepsTheDaemonsMemoryBoundedAndCountsDrops) {
  Start();
  const int64_t before = ResidentBytes();
  pb::StartProcessRequest req = Sh("head -c 536870912 /dev/zero");
  req.set_replay_bytes(1 << 20);
  const int pid = StartDetached(req);
  pb::WaitProcessResponse waited;
  ASSERT_TRUE(Wait(stub_.get(), Pid(pid), &waited).ok());
  EXPECT_EQ(waited.exit().output_bytes(), int64_t{536870912});
  EXPECT_EQ(waited.exit().dropped_bytes(), int64_t{536870912} - (1 << 20));
  const int64_t after = ResidentBytes();
  EXPECT_LT(after - before, int64_t{64} << 20)
      << "the daemon grew from " << before << " to " << after << " bytes";

  // A slow reader attached to a flooding process: it gets gaps, the daemon stays small.
  pb::StartProcessRequest flood = Sh("cat /dev/zero");
  flood.set_replay_bytes(256 << 10);
  Stream slow(stub_.get(), flood);
  ASSERT_TRUE(slow.ReadUntil([](const Events& e) { return e.started.has_value(); }));
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_TRUE(slow.ReadOne());
  }
  ASSERT_TRUE(slow.ReadUntil([](const Events& e) { return e.dropped_events > 0; }));
  const std::optional<pb::ProcessInfo> info = Info(slow.pid());
  ASSERT_TRUE(info.has_value());
  EXPECT_GT(info->dropped_bytes(), 0);
  EXPECT_LE(info->buffered_bytes(), 256 << 10);
  EXPECT_LT(ResidentBytes() - before, int64_t{64} << 20);
  ASSERT_TRUE(Signal(Pid(slow.pid()), SIGKILL).ok());
  Events& e = slow.Finish();
  ASSERT_TRUE(e.status.ok()) << e.status.error_message();
  ASSERT_TRUE(e.exit.has_value());
  EXPECT_EQ(e.exit->signal(), SIGKILL);
  EXPECT_GT(e.exit->dropped_bytes(), 0);
}

// ---- Tags ----

TEST_F(ProcessesTest, TagsFindProcessesAndAreUniqueWhileTheyRun) {
  Start();
  pb::StartProcessRequest web = Sh("echo serving; sleep 100");
  web.set_tag("web-1.a_b");
  const int pid = StartDetached(web);
  ASSERT_GT(pid, 0);
  Stream s(stub_.get(), Tag("web-1.a_b"));
  ASSERT_TRUE(s.ReadUntil([](const Events& e) { return e.out == "serving\n"; }));
  EXPECT_EQ(s.events().started->pid(), pid);
  EXPECT_EQ(s.events().started->tag(), "web-1.a_b");
  EXPECT_EQ(Info(pid)->tag(), "web-1.a_b");

  // A second process with the tag while the first runs: refused.
  Stream twin(stub_.get(), web);
  Events& t = twin.Finish();
  EXPECT_EQ(t.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(t.status.error_message(), HasSubstr("web-1.a_b"));

  ASSERT_TRUE(Signal(Tag("web-1.a_b"), SIGTERM).ok());
  Events& e = s.Finish();
  EXPECT_EQ(e.exit->signal(), SIGTERM);
  // Ended, its tag can be taken again; the tag now names the new process.
  const int second = StartDetached(web);
  ASSERT_GT(second, 0);
  EXPECT_NE(second, pid);
  pb::WaitProcessResponse w;
  ASSERT_TRUE(Signal(Tag("web-1.a_b"), SIGKILL).ok());
  ASSERT_TRUE(Wait(stub_.get(), Tag("web-1.a_b"), &w).ok());
  EXPECT_EQ(w.process().pid(), second);
  EXPECT_FALSE(Info(pid).has_value()) << "the ended entry that gave its tag up is gone";

  pb::StartProcessRequest bad = Sh("true");
  bad.set_tag("no spaces");
  Stream refused(stub_.get(), bad);
  EXPECT_EQ(refused.Finish().status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  pb::WaitProcessResponse none;
  grpc::Status missing = Wait(stub_.get(), Tag("nobody"), &none);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(missing.error_message(), HasSubstr("nobody"));
  EXPECT_EQ(Signal(Pid(999999), SIGTERM).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Signal(pb::ProcessSelector(), SIGTERM).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// ---- Waiting ----

TEST_F(ProcessesTest, TwoClientsWaitForOneProcess) {
  Start();
  pb::StartProcessRequest req = Sh("read x; exit 7");
  req.set_stdin(true);
  const int pid = StartDetached(req);
  auto a = NewClient();
  auto b = NewClient();
  auto wait_on = [&](pb::Sandboxd::Stub* stub) {
    return std::async(std::launch::async, [this, stub, pid] {
      pb::WaitProcessResponse resp;
      grpc::Status s = Wait(stub, Pid(pid), &resp);
      return std::make_pair(s, resp);
    });
  };
  auto first = wait_on(a.get());
  auto second = wait_on(b.get());
  // A wait that gives up does not disturb the process or the other waiters.
  pb::WaitProcessResponse short_wait;
  EXPECT_EQ(Wait(stub_.get(), Pid(pid), &short_wait, 1).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(first.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  EXPECT_TRUE(Alive(pid));
  ASSERT_TRUE(Input(Pid(pid), "go\n").ok());
  for (auto* f : {&first, &second}) {
    auto [status, resp] = f->get();
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(resp.exit().exit_code(), 7);
    EXPECT_EQ(resp.process().pid(), pid);
  }
  // An ended process answers at once.
  pb::WaitProcessResponse late;
  ASSERT_TRUE(Wait(stub_.get(), Pid(pid), &late, 5).ok());
  EXPECT_EQ(late.exit().exit_code(), 7);
}

// ---- Signals, stdin ----

TEST_F(ProcessesTest, SignalsReachTheProcessGroup) {
  Start();
  pb::StartProcessRequest req =
      Sh("trap 'echo got TERM; exit 3' TERM; sleep 100 & echo $!; while :; do sleep 0.05; done");
  Stream s(stub_.get(), req);
  ASSERT_TRUE(s.ReadUntil([](const Events& e) { return e.out.find('\n') != std::string::npos; }));
  int child = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(s.events().out), &child));
  // Until the child has exec'd sleep it runs the shell's TERM trap, which would swallow
  // the signal (a race of the shell, not of sandboxd).
  ASSERT_TRUE(Eventually([&] {
    std::ifstream cmdline(absl::StrCat("/proc/", child, "/cmdline"));
    std::string argv0;
    std::getline(cmdline, argv0, '\0');
    return argv0 == "sleep";
  }));
  ASSERT_TRUE(Signal(Pid(s.pid()), SIGTERM).ok());
  Events& e = s.Finish();
  EXPECT_THAT(e.out, HasSubstr("got TERM\n"));
  EXPECT_EQ(e.exit->exit_code(), 3);
  // The group got it: the background sleep died of it too.
  EXPECT_TRUE(Eventually([&] { return !Alive(child); }));
  grpc::Status after = Signal(Pid(s.pid()), SIGTERM);
  EXPECT_EQ(after.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(after.error_message(), HasSubstr("ended"));
  EXPECT_EQ(Signal(Pid(s.pid()), 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Signal(Pid(s.pid()), 65).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ProcessesTest, StdinIsWrittenInOrderAndClosed) {
  Start();
  pb::StartProcessRequest req;
  req.add_argv("cat");
  req.set_stdin(true);
  const int pid = StartDetached(req);
  ASSERT_TRUE(Input(Pid(pid), "hello ").ok());
  ASSERT_TRUE(Input(Pid(pid), "").ok());
  ASSERT_TRUE(Input(Pid(pid), std::string(300 << 10, 'z')).ok());  // more than a pipe holds
  ASSERT_TRUE(Input(Pid(pid), "world").ok());
  ASSERT_TRUE(CloseInput(Pid(pid)).ok());
  ASSERT_TRUE(CloseInput(Pid(pid)).ok()) << "closing is idempotent";
  grpc::Status closed = Input(Pid(pid), "late");
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // cat may have ended already (its stdin is closed, so it does).
  EXPECT_THAT(closed.error_message(), ::testing::AnyOf(HasSubstr("closed"), HasSubstr("ended")));
  pb::WaitProcessResponse w;
  ASSERT_TRUE(Wait(stub_.get(), Pid(pid), &w).ok());
  EXPECT_EQ(w.exit().exit_code(), 0);
  Stream s(stub_.get(), Pid(pid));
  Events& e = s.Finish();
  EXPECT_EQ(e.out, "hello " + std::string(300 << 10, 'z') + "world");

  const int no_stdin = StartDetached(Sh("sleep 100"));
  grpc::Status refused = Input(Pid(no_stdin), "x");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), HasSubstr("without stdin"));
  EXPECT_EQ(CloseInput(Pid(no_stdin)).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Input(Pid(no_stdin), std::string((1 << 20) + 1, 'x')).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Signal(Pid(no_stdin), SIGKILL).ok());
}

// ---- PTYs ----

TEST_F(ProcessesTest, APtyHasItsSizeResizesAndIsTheControllingTerminal) {
  Start();
  pb::StartProcessRequest req =
      Sh("stty size; tty; echo \"term=$TERM\"; [ -t 0 ] && echo stdin-tty; read x; stty size; "
         "read y; echo \"read $y\"");
  req.mutable_pty()->mutable_size()->set_cols(100);
  req.mutable_pty()->mutable_size()->set_rows(30);
  req.mutable_pty()->set_term("xterm-256color");
  Stream s(stub_.get(), req);
  ASSERT_TRUE(s.ReadUntil([](const Events& e) {
    return e.pty.find("stdin-tty") != std::string::npos;
  })) << s.events().pty;
  EXPECT_THAT(s.events().pty, HasSubstr("30 100\r\n"));
  EXPECT_THAT(s.events().pty, HasSubstr("/dev/pts/"));
  EXPECT_THAT(s.events().pty, HasSubstr("term=xterm-256color"));
  EXPECT_EQ(s.events().out, "") << "a PTY's output comes as pty events";
  std::optional<pb::ProcessInfo> info = Info(s.pid());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->pty().cols(), 100u);
  EXPECT_EQ(info->pty().rows(), 30u);

  ASSERT_TRUE(Resize(Pid(s.pid()), 120, 40).ok());
  ASSERT_TRUE(Input(Pid(s.pid()), "\n").ok());
  ASSERT_TRUE(s.ReadUntil([](const Events& e) {
    return e.pty.find("40 120") != std::string::npos;
  })) << s.events().pty;
  EXPECT_EQ(Info(s.pid())->pty().cols(), 120u);
  // Input goes through the terminal: echoed, and line-edited before the shell reads it.
  ASSERT_TRUE(Input(Pid(s.pid()),
                    "abX\x7f"
                    "c\n")
                  .ok());
  Events& e = s.Finish();
  EXPECT_THAT(e.pty, HasSubstr("read abc"));
  EXPECT_EQ(e.exit->exit_code(), 0);

  // A resize signals the terminal's foreground group (SIGWINCH).
  pb::StartProcessRequest winch =
      Sh("trap 'echo WINCH; exit 9' WINCH; echo ready; while :; do sleep 0.05; done");
  *winch.mutable_pty() = req.pty();
  Stream resized(stub_.get(), winch);
  ASSERT_TRUE(
      resized.ReadUntil([](const Events& e) { return e.pty.find("ready") != std::string::npos; }));
  ASSERT_TRUE(Resize(Tag(""), 1, 1).error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Resize(Pid(resized.pid()), 81, 25).ok());
  Events& we = resized.Finish();
  EXPECT_THAT(we.pty, HasSubstr("WINCH"));
  EXPECT_EQ(we.exit->exit_code(), 9);

  // Closing a PTY's input is refused (send Ctrl-D); resizing a pipe process too.
  pb::StartProcessRequest cat;
  cat.add_argv("cat");
  *cat.mutable_pty() = req.pty();
  const int pid = StartDetached(cat);
  grpc::Status close = CloseInput(Pid(pid));
  EXPECT_EQ(close.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(close.error_message(), HasSubstr("Ctrl-D"));
  ASSERT_TRUE(Input(Pid(pid), "\x04").ok());  // EOF at the start of a line: cat ends
  pb::WaitProcessResponse w;
  ASSERT_TRUE(Wait(stub_.get(), Pid(pid), &w).ok());
  EXPECT_EQ(w.exit().exit_code(), 0);
  const int plain = StartDetached(Sh("sleep 100"));
  EXPECT_EQ(Resize(Pid(plain), 80, 24).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Resize(Pid(plain), 0, 24).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Signal(Pid(plain), SIGKILL).ok());
}

TEST_F(ProcessesTest, CtrlCOnAPtyInterruptsItsForegroundProgram) {
  Start();
  pb::StartProcessRequest req =
      Sh("trap 'echo interrupted; exit 5' INT; echo ready; while :; do sleep 0.05; done");
  req.mutable_pty()->mutable_size()->set_cols(80);
  req.mutable_pty()->mutable_size()->set_rows(24);
  Stream s(stub_.get(), req);
  ASSERT_TRUE(
      s.ReadUntil([](const Events& e) { return e.pty.find("ready") != std::string::npos; }));
  ASSERT_TRUE(Input(Pid(s.pid()), "\x03").ok());
  Events& e = s.Finish();
  EXPECT_THAT(e.pty, HasSubstr("interrupted"));
  EXPECT_EQ(e.exit->exit_code(), 5);
}

// ---- Limits ----

TEST_F(ProcessesTest, LimitsAreRefusedWithResourceExhaustedNamingTheLimit) {
  options_.max_processes = 2;
  options_.max_ptys = 1;
  options_.max_replay_bytes = 1 << 20;
  Start();
  auto refused = [&](pb::StartProcessRequest req, const std::string& limit) {
    Stream s(stub_.get(), req);
    Events& e = s.Finish();
    EXPECT_EQ(e.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << limit << ": " << e.status.error_message();
    EXPECT_THAT(e.status.error_message(), HasSubstr(limit));
    EXPECT_FALSE(e.started.has_value());
  };
  pb::StartProcessRequest small = Sh("sleep 100");
  small.set_replay_bytes(64 << 10);
  pb::StartProcessRequest pty = small;
  pty.mutable_pty()->mutable_size()->set_cols(80);
  pty.mutable_pty()->mutable_size()->set_rows(24);
  const int a = StartDetached(pty);
  refused(pty, "max_ptys");
  const int b = StartDetached(small);
  refused(small, "max_processes");
  ASSERT_TRUE(Signal(Pid(a), SIGKILL).ok());
  ASSERT_TRUE(Signal(Pid(b), SIGKILL).ok());
  ASSERT_TRUE(Eventually([&] { return daemon_->running_processes() == 0; }));

  // The replay budget: 768 KiB fit, 512 KiB more do not.
  pb::StartProcessRequest big = small;
  big.set_replay_bytes(768 << 10);
  const int c = StartDetached(big);
  pb::StartProcessRequest more = small;
  more.set_replay_bytes(512 << 10);
  refused(more, "max_replay_bytes");
  big.set_replay_bytes(2 << 20);
  refused(big, "max_replay_bytes");
  // The server may lower a limit per call.
  pb::StartProcessRequest lowered = small;
  lowered.mutable_limits()->set_max_processes(1);
  refused(lowered, "max_processes");
  ASSERT_TRUE(Signal(Pid(c), SIGKILL).ok());
  pb::WaitProcessResponse w;
  ASSERT_TRUE(Wait(stub_.get(), Pid(c), &w).ok());
  // An ended process holds only what its ring still has: the budget is free again.
  EXPECT_GT(StartDetached(more), 0);
}

TEST_F(ProcessesTest, EndedEntriesAreKeptUpToTheLimitThenEvictedOldestFirst) {
  options_.max_processes = 3;
  Start();
  std::vector<int> pids;
  for (int i = 0; i < 5; ++i) {
    const int pid = StartDetached(Sh(absl::StrCat("exit ", i)));
    pb::WaitProcessResponse w;
    ASSERT_TRUE(Wait(stub_.get(), Pid(pid), &w).ok());
    EXPECT_EQ(w.exit().exit_code(), i);
    pids.push_back(pid);
  }
  std::vector<pb::ProcessInfo> list = List();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].pid(), pids[2]);
  EXPECT_EQ(list[2].pid(), pids[4]);
  pb::WaitProcessResponse gone;
  EXPECT_EQ(Wait(stub_.get(), Pid(pids[0]), &gone).error_code(), grpc::StatusCode::NOT_FOUND);
}

// ---- Start errors, shutdown, the secret ----

TEST_F(ProcessesTest, BadStartsAreRefused) {
  Start();
  auto code = [&](const pb::StartProcessRequest& req) {
    Stream s(stub_.get(), req);
    return s.Finish().status;
  };
  EXPECT_EQ(code(pb::StartProcessRequest()).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  pb::StartProcessRequest missing;
  missing.add_argv("no-such-program-sbx");
  grpc::Status s = code(missing);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("no-such-program-sbx"));
  pb::StartProcessRequest cwd = Sh("true");
  cwd.set_cwd("missing");
  EXPECT_EQ(code(cwd).error_code(), grpc::StatusCode::NOT_FOUND);
  pb::StartProcessRequest pty = Sh("true");
  pty.mutable_pty()->mutable_size()->set_cols(0);
  pty.mutable_pty()->mutable_size()->set_rows(24);
  s = code(pty);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("pty.size"));
  pb::StartProcessRequest term = pty;
  term.mutable_pty()->mutable_size()->set_cols(80);
  term.mutable_pty()->set_term("bad term");
  EXPECT_EQ(code(term).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  pb::StartProcessRequest replay = Sh("true");
  replay.set_replay_bytes(-1);
  EXPECT_EQ(code(replay).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(List().empty()) << "a failed start leaves no entry";
}

TEST_F(ProcessesTest, ShutdownKillsEveryProcessGroup) {
  Start();
  const int a = StartDetached(Sh("sleep 100"));
  pb::StartProcessRequest pty = Sh("sleep 100");
  pty.mutable_pty()->mutable_size()->set_cols(80);
  pty.mutable_pty()->mutable_size()->set_rows(24);
  const int b = StartDetached(pty);
  Stream following(stub_.get(), Pid(a));
  ASSERT_TRUE(following.ReadUntil([](const Events& e) { return e.started.has_value(); }));
  daemon_->Shutdown(absl::Seconds(5));
  EXPECT_TRUE(Eventually([&] { return !Alive(a) && !Alive(b); }));
  Events& e = following.Finish();
  ASSERT_TRUE(e.exit.has_value()) << e.status.error_message();
  EXPECT_EQ(e.exit->signal(), SIGKILL);
}

TEST_F(ProcessesTest, ProcessCallsNeedTheSecret) {
  options_.allow_unauthenticated = false;
  options_.secret = std::string(64, 'k');
  Start();
  for (int call = 0; call < 8; ++call) {
    SCOPED_TRACE(call);
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    ctx.AddMetadata(kSecretMetadata, std::string(64, 'j'));
    grpc::Status status;
    switch (call) {
      case 0: {
        pb::StartProcessRequest req = Sh("touch pwned");
        auto reader = stub_->StartProcess(&ctx, req);
        pb::ProcessEvent e;
        while (reader->Read(&e)) {
        }
        status = reader->Finish();
        break;
      }
      case 1: {
        pb::ConnectProcessRequest req;
        *req.mutable_process() = Pid(1);
        auto reader = stub_->ConnectProcess(&ctx, req);
        pb::ProcessEvent e;
        while (reader->Read(&e)) {
        }
        status = reader->Finish();
        break;
      }
      case 2: {
        pb::ListProcessesResponse resp;
        status = stub_->ListProcesses(&ctx, pb::ListProcessesRequest(), &resp);
        break;
      }
      case 3: {
        pb::SendProcessInputRequest req;
        *req.mutable_process() = Pid(1);
        pb::SendProcessInputResponse resp;
        status = stub_->SendProcessInput(&ctx, req, &resp);
        break;
      }
      case 4: {
        pb::CloseProcessInputRequest req;
        *req.mutable_process() = Pid(1);
        pb::CloseProcessInputResponse resp;
        status = stub_->CloseProcessInput(&ctx, req, &resp);
        break;
      }
      case 5: {
        pb::SignalProcessRequest req;
        *req.mutable_process() = Pid(1);
        req.set_signal(9);
        pb::SignalProcessResponse resp;
        status = stub_->SignalProcess(&ctx, req, &resp);
        break;
      }
      case 6: {
        pb::ResizeProcessRequest req;
        *req.mutable_process() = Pid(1);
        req.mutable_size()->set_cols(1);
        req.mutable_size()->set_rows(1);
        pb::ResizeProcessResponse resp;
        status = stub_->ResizeProcess(&ctx, req, &resp);
        break;
      }
      case 7: {
        pb::WaitProcessRequest req;
        *req.mutable_process() = Pid(1);
        pb::WaitProcessResponse resp;
        status = stub_->WaitProcess(&ctx, req, &resp);
        break;
      }
    }
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(std::filesystem::exists(workspace_ + "/pwned"));
  EXPECT_EQ(daemon_->running_processes(), 0);
}

}  // namespace
}  // namespace sbx::sandboxd

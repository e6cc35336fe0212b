// A standby's relay (src/server/forward.h) between a real gRPC client and a real gRPC
// "leader" over loopback. The leader here is a generic service whose methods script what
// a leader may do (echo a stream, end early, hang, fail with details), so that every path
// of the relay is driven: messages both ways, metadata and status both ways, a leader that
// ends while the client still sends, the client's deadline and cancellation.

#include "src/server/forward.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sbx/v1/diagnostics.grpc.pb.h"
#include "src/server/server.h"

namespace sbx::server {
namespace {

using ::testing::HasSubstr;

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

std::string Text(const grpc::ByteBuffer& b) {
  std::vector<grpc::Slice> slices;
  if (!b.Dump(&slices).ok()) return "";
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

std::string Meta(const std::multimap<grpc::string_ref, grpc::string_ref>& m, const char* key) {
  auto it = m.find(key);
  return it == m.end() ? "" : std::string(it->second.data(), it->second.size());
}

// What the leader saw of the last call.
struct Seen {
  absl::Mutex mu;
  std::string authorization;
  std::string forwarded_by;
  std::chrono::system_clock::time_point deadline;
  absl::Notification cancelled;
};

// The scripted leader: /test.Echo/Bidi echoes each message and, at the client's last,
// ends OK with trailer x-trailer = the client's x-in; /test.Echo/EarlyEnd ends
// FAILED_PRECONDITION after the first message; /test.Echo/Hang never ends by itself;
// /test.Echo/Fail ends RESOURCE_EXHAUSTED with details and a retry hint, reading nothing.
class Leader final : public grpc::CallbackGenericService {
 public:
  explicit Leader(Seen* seen) : seen_(seen) {}

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    {
      absl::MutexLock lock(&seen_->mu);
      seen_->authorization = Meta(ctx->client_metadata(), "authorization");
      seen_->forwarded_by = Meta(ctx->client_metadata(), kForwardedByMetadata);
      seen_->deadline = ctx->deadline();
    }
    return new Call(ctx, seen_);
  }

 private:
  class Call : public grpc::ServerGenericBidiReactor {
   public:
    Call(grpc::GenericCallbackServerContext* ctx, Seen* seen)
        : ctx_(ctx), seen_(seen), method_(ctx->method()) {
      ctx->AddInitialMetadata("x-initial", "yes");
      if (method_ == "/test.Echo/Fail") {
        ctx->AddTrailingMetadata("sbx-retry-after-ms", "1234");
        Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "pool empty", "detail-bytes"));
        return;
      }
      StartRead(&in_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        if (method_ == "/test.Echo/Hang") return;  // waits for the cancel
        ctx_->AddTrailingMetadata("x-trailer", Meta(ctx_->client_metadata(), "x-in"));
        return Finish(grpc::Status::OK);
      }
      if (method_ == "/test.Echo/EarlyEnd") {
        return Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "enough"));
      }
      if (method_ == "/test.Echo/Hang") return StartRead(&in_);
      StartWrite(&in_);
    }
    void OnWriteDone(bool ok) override {
      if (ok) StartRead(&in_);
    }
    void OnCancel() override {
      seen_->cancelled.Notify();
      if (method_ == "/test.Echo/Hang") Finish(grpc::Status::CANCELLED);
    }
    void OnDone() override { delete this; }

   private:
    grpc::GenericCallbackServerContext* const ctx_;
    Seen* const seen_;
    const std::string method_;
    grpc::ByteBuffer in_;
  };
  Seen* const seen_;
};

// A client call: sends `sends` one after the other (then half-closes when `half_close`),
// reads every message, and waits for the status.
class Client final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  Client(grpc::GenericStub* stub, grpc::ClientContext* ctx, const std::string& method,
         std::vector<std::string> sends, bool half_close)
      : sends_(std::move(sends)), half_close_(half_close) {
    stub->PrepareBidiStreamingCall(ctx, method, grpc::StubOptions(), this);
    StartRead(&in_);
    SendNext();
    StartCall();
  }
  grpc::Status Await() {
    done_.WaitForNotification();
    return status_;
  }
  std::vector<std::string> received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    {
      absl::MutexLock lock(&mu_);
      received_.push_back(Text(in_));
    }
    StartRead(&in_);
  }
  void OnWriteDone(bool ok) override {
    if (ok) SendNext();
  }
  void OnDone(const grpc::Status& s) override {
    status_ = s;
    done_.Notify();
  }

 private:
  void SendNext() {
    if (next_ < sends_.size()) {
      out_ = Bytes(sends_[next_++]);
      StartWrite(&out_);
    } else if (half_close_) {
      StartWritesDone();
    }
  }

  std::vector<std::string> sends_;
  const bool half_close_;
  size_t next_ = 0;
  grpc::ByteBuffer out_;
  grpc::ByteBuffer in_;
  absl::Mutex mu_;
  std::vector<std::string> received_ ABSL_GUARDED_BY(mu_);
  grpc::Status status_;
  absl::Notification done_;
};

class ForwardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &leader_port_);
    builder.RegisterCallbackGenericService(&leader_);
    leader_server_ = builder.BuildAndStart();
    ASSERT_NE(leader_server_, nullptr);
    StartStandby([this] { return absl::StrCat("127.0.0.1:", leader_port_); });
  }
  void TearDown() override {
    if (standby_) standby_->Shutdown(absl::Seconds(1));
    if (leader_server_) leader_server_->Shutdown(std::chrono::system_clock::now());
  }

  void StartStandby(std::function<std::string()> leader_address) {
    if (standby_) standby_->Shutdown(absl::ZeroDuration());
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    ForwardOptions forward;
    forward.identity = "standby-1";
    forward.leader_address = std::move(leader_address);
    options.forward = std::move(forward);
    auto started = Server::Start(options);
    ASSERT_TRUE(started.ok()) << started.status();
    standby_ = *std::move(started);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", standby_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = std::make_unique<grpc::GenericStub>(channel_);
  }

  Seen seen_;
  Leader leader_{&seen_};
  int leader_port_ = 0;
  std::unique_ptr<grpc::Server> leader_server_;
  std::unique_ptr<Server> standby_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
};

TEST_F(ForwardTest, MessagesMetadataAndStatusTravelBothWays) {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer t-1");
  ctx.AddMetadata("x-in", "abc");
  Client call(stub_.get(), &ctx, "/test.Echo/Bidi", {"one", "two", "three"}, true);
  grpc::Status s = call.Await();
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  EXPECT_EQ(call.received(), (std::vector<std::string>{"one", "two", "three"}));
  EXPECT_EQ(Meta(ctx.GetServerInitialMetadata(), "x-initial"), "yes");
  EXPECT_EQ(Meta(ctx.GetServerTrailingMetadata(), "x-trailer"), "abc");
  absl::MutexLock lock(&seen_.mu);
  EXPECT_EQ(seen_.authorization, "Bearer t-1");
  EXPECT_EQ(seen_.forwarded_by, "standby-1");
}

TEST_F(ForwardTest, AFailureKeepsItsCodeMessageDetailsAndRetryHint) {
  grpc::ClientContext ctx;
  Client call(stub_.get(), &ctx, "/test.Echo/Fail", {"claim"}, true);
  grpc::Status s = call.Await();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "pool empty");
  EXPECT_EQ(s.error_details(), "detail-bytes");
  EXPECT_EQ(Meta(ctx.GetServerTrailingMetadata(), "sbx-retry-after-ms"), "1234");
}

// The leader ends the call while the client has not half-closed (it would send more):
// the client must hear the leader's status at once, not wait for its own end.
TEST_F(ForwardTest, ALeaderThatEndsEarlyEndsTheCallOfAClientThatStillSends) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  Client call(stub_.get(), &ctx, "/test.Echo/EarlyEnd", {"first"}, false);
  grpc::Status s = call.Await();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_EQ(s.error_message(), "enough");
}

TEST_F(ForwardTest, TheClientsDeadlineReachesTheLeader) {
  grpc::ClientContext ctx;
  const auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(800);
  ctx.set_deadline(deadline);
  Client call(stub_.get(), &ctx, "/test.Echo/Hang", {"x"}, true);
  grpc::Status s = call.Await();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(seen_.cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "the leader's call did not end with the client's deadline";
  absl::MutexLock lock(&seen_.mu);
  // The deadline crosses the wire as a timeout: equal up to the hop's time.
  EXPECT_LT(std::chrono::abs(seen_.deadline - deadline), std::chrono::seconds(1));
}

TEST_F(ForwardTest, AClientsCancelReachesTheLeader) {
  grpc::ClientContext ctx;
  Client call(stub_.get(), &ctx, "/test.Echo/Hang", {"x"}, false);
  // Once the leader has the call, the client gives up.
  for (int i = 0; i < 1000; ++i) {
    {
      absl::MutexLock lock(&seen_.mu);
      if (seen_.forwarded_by == "standby-1") break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  ctx.TryCancel();
  EXPECT_EQ(call.Await().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(seen_.cancelled.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "the client's cancel did not reach the leader";
}

TEST_F(ForwardTest, WithoutALeaderTheCallIsUnavailableAndPingIsStillAnswered) {
  StartStandby([] { return std::string(); });
  grpc::ClientContext ctx;
  Client call(stub_.get(), &ctx, "/sbx.v1.ClaimService/Claim", {"x"}, true);
  grpc::Status s = call.Await();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("knows no leader"));
  // Ping is the standby's own.
  auto ping = sbx::v1::DiagnosticsService::NewStub(channel_);
  grpc::ClientContext ping_ctx;
  sbx::v1::PingRequest req;
  sbx::v1::PingResponse resp;
  grpc::Status p = ping->Ping(&ping_ctx, req, &resp);
  EXPECT_TRUE(p.ok()) << p.error_message();
}

// Replicas that disagree on the leader must not bounce a call between them.
TEST_F(ForwardTest, ARelayedCallIsNotRelayedAgain) {
  grpc::ClientContext ctx;
  ctx.AddMetadata(kForwardedByMetadata, "standby-0");
  Client call(stub_.get(), &ctx, "/test.Echo/Bidi", {"x"}, true);
  grpc::Status s = call.Await();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("relayed to it already by \"standby-0\""));
  absl::MutexLock lock(&seen_.mu);
  EXPECT_EQ(seen_.forwarded_by, "") << "the leader saw the call";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A self-signed certificate for DNS name sbx.test, as "<dir>/<name>.crt" and ".key".
void MakeCertificate(const std::string& dir, const std::string& name) {
  const std::string cmd = absl::StrCat(
      "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=sbx.test -addext "
      "subjectAltName=DNS:sbx.test -keyout ",
      dir, "/", name, ".key -out ", dir, "/", name, ".crt >/dev/null 2>&1");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// A leader serving TLS with certificate `name` of `dir`.
std::unique_ptr<grpc::Server> StartTlsLeader(const std::string& dir, const std::string& name,
                                             Leader* leader, int* port) {
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back(
      {ReadFile(dir + "/" + name + ".key"), ReadFile(dir + "/" + name + ".crt")});
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl), port);
  builder.RegisterCallbackGenericService(leader);
  return builder.BuildAndStart();
}

// Replicas that serve TLS with one shared certificate: the standby's hop is TLS, checked
// against that certificate, though the leader is reached at an address (127.0.0.1) the
// certificate does not name; a leader with another certificate is not relayed to.
TEST(ForwardTlsTest, TheHopIsTlsCheckedAgainstTheSharedCertificateNotTheAddress) {
  char dir_template[] = "/tmp/sbx-forward-tls-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  ASSERT_NO_FATAL_FAILURE(MakeCertificate(dir, "tls"));
  ASSERT_NO_FATAL_FAILURE(MakeCertificate(dir, "other"));
  grpc::SslCredentialsOptions client_ssl;
  client_ssl.pem_root_certs = ReadFile(dir + "/tls.crt");
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride("sbx.test");

  // One round: a leader with certificate `leader_cert`, a standby of the shared one, a
  // client call through the standby; what the leader saw comes back in `seen`.
  auto relay = [&](const std::string& leader_cert, Seen* seen) -> grpc::Status {
    Leader leader(seen);
    int leader_port = 0;
    std::unique_ptr<grpc::Server> leader_server =
        StartTlsLeader(dir, leader_cert, &leader, &leader_port);
    EXPECT_NE(leader_server, nullptr);
    if (leader_server == nullptr) return grpc::Status::CANCELLED;
    ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.tls_cert_file = dir + "/tls.crt";
    options.tls_key_file = dir + "/tls.key";
    ForwardOptions forward;
    forward.identity = "standby-tls";
    forward.leader_address = [leader_port] { return absl::StrCat("127.0.0.1:", leader_port); };
    options.forward = std::move(forward);
    auto standby = Server::Start(options);
    EXPECT_TRUE(standby.ok()) << standby.status();
    if (!standby.ok()) return grpc::Status::CANCELLED;
    auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", (*standby)->port()),
                                             grpc::SslCredentials(client_ssl), args);
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    Client call(&stub, &ctx, "/test.Echo/Bidi", {"over", "tls"}, true);
    grpc::Status s = call.Await();
    if (s.ok()) EXPECT_EQ(call.received(), (std::vector<std::string>{"over", "tls"}));
    (*standby)->Shutdown(absl::Seconds(1));
    leader_server->Shutdown(std::chrono::system_clock::now());
    return s;
  };

  Seen seen;
  grpc::Status s = relay("tls", &seen);
  EXPECT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  {
    absl::MutexLock lock(&seen.mu);
    EXPECT_EQ(seen.forwarded_by, "standby-tls");
  }
  Seen seen_other;
  EXPECT_EQ(relay("other", &seen_other).error_code(), grpc::StatusCode::UNAVAILABLE);
  {
    absl::MutexLock lock(&seen_other.mu);
    EXPECT_EQ(seen_other.forwarded_by, "") << "relayed to a server of another certificate";
  }
  std::system(absl::StrCat("rm -rf ", dir).c_str());
}

}  // namespace
}  // namespace sbx::server

// sbx-server as an object (src/cmd/server_app.h) and its command line (server_flags.h): bad
// flags stop it with an error naming the flag; Create opens the store and the metrics
// endpoint but serves no API, Start serves it (and applies --config), Shutdown(grace)
// stops serving and closes the store last; a shutdown before Start, and a standby's (a
// replica with leader election that never leads), close the store without activating.
// Real parts: a real RocksDB in a temp folder, real gRPC and HTTP servers on loopback
// port 0, a real Kubernetes API emulator for the standby. No sandbox is made (--runtime
// none). No timing is asserted: waits are bounded and wait for a positive marker.

#include "src/cmd/server_app.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "sbx/v1/admin.grpc.pb.h"
#include "sbx/v1/diagnostics.grpc.pb.h"
#include "src/cmd/server_flags.h"
#include "src/common/status_macros.h"
#include "src/k8s/client.h"
#include "src/k8s/resources.h"
#include "src/store/rocksdb_store.h"
#include "tests/k8s/emulator_process.h"
#include "tests/k8s/temp_dir.h"

namespace sbx::cmd {
namespace {

using ::sbx::k8s::testing::TempDir;
using ::testing::HasSubstr;

// What main() does with the command line: the flags, or CLI11's message for bad ones.
struct Parsed {
  ServerFlags flags;
  std::string error;  // "" when the command line parsed
};

Parsed Parse(const std::vector<std::string>& args) {
  Parsed parsed;
  CLI::App app{"sbx-server"};
  AddServerFlags(app, parsed.flags);
  std::vector<const char*> argv = {"sbx-server"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    parsed.error = e.what();
  }
  return parsed;
}

TEST(ServerFlagsTest, DefaultsComeFromTheOptionStructs) {
  Parsed p = Parse({});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.flags.server.listen, server::ServerOptions().listen);
  EXPECT_EQ(p.flags.metrics.listen, server::MetricsOptions().listen);
  EXPECT_EQ(p.flags.refill.qps, allocator::RefillOptions().qps);
  EXPECT_EQ(p.flags.store.path, ".sbx/data");  // the one default ServerFlags sets itself
  EXPECT_EQ(p.flags.runtime, "local");
  EXPECT_TRUE(CheckServerFlags(p.flags).ok()) << CheckServerFlags(p.flags);
}

TEST(ServerFlagsTest, AFlagGivenTwiceTakesItsLastValue) {
  Parsed p = Parse({"--listen=10.0.0.1:1", "--runtime=none", "--listen=127.0.0.1:0"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.flags.server.listen, "127.0.0.1:0");
  EXPECT_EQ(p.flags.runtime, "none");
}

// Values the parser itself refuses: its message names the flag.
TEST(ServerFlagsTest, ParseErrorsNameTheFlag) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--shutdown_grace_seconds=-1", "--shutdown_grace_seconds"},
      {"--replication_copies=two", "--replication_copies"},
      {"--start_max_delete_share=1.5", "--start_max_delete_share"},
      {"--image_cache_bytes=-5", "--image_cache_bytes"},
      {"--snapshot_quota_bytes=lots", "--snapshot_quota_bytes"},
      {"--refill_qps=fast", "--refill_qps"},
      {"--no_such_flag=1", "--no_such_flag"},
  };
  for (const auto& [arg, flag] : cases) {
    Parsed p = Parse({arg});
    EXPECT_THAT(p.error, HasSubstr(flag)) << arg;
  }
  EXPECT_THAT(Parse({"--listen"}).error, HasSubstr("--listen"));  // a value is missing
}

// Values that parse but make no server: INVALID_ARGUMENT naming the flag (and the value).
TEST(ServerFlagsTest, CheckServerFlagsNamesTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"--runtime=bogus"}, {"--runtime", "\"bogus\""}},
      {{"--runtime=kubernetes"}, {"--runtime kubernetes", "--kubeconfig"}},
      {{"--sandbox_key_secret=k"}, {"--sandbox_key_secret \"k\"", "--kubeconfig"}},
      {{"--kubeconfig=/k", "--sandbox_key_secret=k", "--sandbox_key_file=/f"},
       {"--sandbox_key_secret and --sandbox_key_file"}},
      {{"--kubeconfig=/k", "--kube_leader_election"}, {"--kube_leader_election", "sandbox key"}},
      {{"--replication_copies=3"}, {"--replication_copies", "(got 3)"}},
      {{"--replication_copies=2"}, {"--replication_copies=2", "--kube_leader_election"}},
      {{"--replication_ack_timeout_s=0"}, {"--replication_ack_timeout_s", "(got 0)"}},
      {{"--image_claim_template=t", "--runtime=none"}, {"--image_claim_template \"t\""}},
      {{"--refill_qps=0"}, {"--refill_qps", "0"}},
      {{"--refill_max_creating=0"}, {"--refill_max_creating", "0"}},
      {{"--metrics_listen=nowhere"}, {"--metrics_listen", "\"nowhere\""}},
  };
  for (const auto& [args, wanted] : cases) {
    Parsed p = Parse(args);
    ASSERT_EQ(p.error, "") << args[0];
    absl::Status s = CheckServerFlags(p.flags);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << args[0] << ": " << s;
    for (const std::string& w : wanted)
      EXPECT_THAT(std::string(s.message()), HasSubstr(w)) << args[0];
  }
}

// A server on loopback with everything it writes in a temp folder and no sandboxes.
class ServerAppTest : public ::testing::Test {
 protected:
  std::vector<std::string> Args() const {
    return {"--runtime=none",
            "--listen=127.0.0.1:0",
            "--port_file=" + PortFile(),
            "--metrics_listen=127.0.0.1:0",
            "--metrics_port_file=" + dir_.path() + "/metrics_port",
            "--data_dir=" + DataDir(),
            "--config=" + config_,
            "--shutdown_grace_seconds=1",
            "--log_level=warn"};
  }
  ServerFlags Flags(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> args = Args();
    args.insert(args.end(), extra.begin(), extra.end());
    Parsed p = Parse(args);
    EXPECT_EQ(p.error, "");
    return p.flags;
  }
  std::string DataDir() const { return dir_.path() + "/data"; }
  std::string PortFile() const { return dir_.path() + "/port"; }
  bool Exists(const std::string& name) const {
    return std::filesystem::exists(dir_.path() + "/" + name);
  }

  // Waits (bounded) for a port file to hold a port; "" when it never does.
  std::string WaitForPort(const std::string& name) const {
    for (absl::Time deadline = absl::Now() + absl::Seconds(30); absl::Now() < deadline;
         absl::SleepFor(absl::Milliseconds(20))) {
      std::string port = dir_.Read(name);
      if (!port.empty() && port.back() == '\n') port.pop_back();
      if (!port.empty()) return port;
    }
    return "";
  }

  // The API at 127.0.0.1:port.
  static grpc::Status Ping(const std::string& port) {
    auto channel = grpc::CreateChannel("127.0.0.1:" + port, grpc::InsecureChannelCredentials());
    auto stub = v1::DiagnosticsService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::PingRequest req;
    req.set_payload("hello");
    v1::PingResponse resp;
    grpc::Status s = stub->Ping(&ctx, req, &resp);
    if (s.ok() && resp.payload() != "hello") {
      return grpc::Status(grpc::StatusCode::INTERNAL, "payload not returned: " + resp.payload());
    }
    return s;
  }
  static std::vector<std::string> PoolNames(const std::string& port) {
    auto channel = grpc::CreateChannel("127.0.0.1:" + port, grpc::InsecureChannelCredentials());
    auto stub = v1::AdminService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListPoolsResponse resp;
    grpc::Status s = stub->ListPools(&ctx, v1::ListPoolsRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<std::string> names;
    for (const v1::Pool& p : resp.pools()) names.push_back(p.name());
    return names;
  }

  // The store's contents, opened as the next server would (which also shows that the
  // server closed it: RocksDB refuses a second opener of a folder).
  absl::StatusOr<store::Contents> StoredContents() const {
    store::RocksDbStoreOptions options;
    options.path = DataDir();
    ASSIGN_OR_RETURN(std::unique_ptr<store::Store> s, store::OpenRocksDbStore(options));
    absl::StatusOr<store::Contents> contents = s->LoadAll();
    RETURN_IF_ERROR(s->Close());
    return contents;
  }

  TempDir dir_;
  const std::string config_ = dir_.Write("config.yaml", R"(templates:
  - name: t
    runtime: local
    local:
      network: false
pools:
  - name: p
    template: t
    min_warm: 0
    max_warm: 1
    empty_pool_policy: fail
)");
};

TEST_F(ServerAppTest, BadFlagsStopCreateBeforeAnythingIsMade) {
  auto app = ServerApp::Create(Flags({"--replication_copies=3"}));
  ASSERT_FALSE(app.ok());
  EXPECT_EQ(app.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(app.status().message()), HasSubstr("--replication_copies"));
  EXPECT_FALSE(std::filesystem::exists(DataDir()));  // no store was opened
}

TEST_F(ServerAppTest, CreateThenStartThenShutdownInThatOrder) {
  auto app = ServerApp::Create(Flags());
  ASSERT_TRUE(app.ok()) << app.status();
  // Created: the store is open (a second opener is refused) and metrics are served, but
  // no API (its port file is written once it serves) and nothing of --config applied.
  EXPECT_FALSE(StoredContents().ok());
  EXPECT_NE(WaitForPort("metrics_port"), "");
  EXPECT_FALSE(Exists("port"));

  ASSERT_TRUE((*app)->Start().ok());
  const std::string port = WaitForPort("port");
  ASSERT_NE(port, "");
  EXPECT_TRUE(Ping(port).ok()) << Ping(port).error_message();
  EXPECT_THAT(PoolNames(port), ::testing::ElementsAre("p"));  // --config, applied at Start

  EXPECT_TRUE((*app)->Shutdown(absl::Seconds(1)).ok());
  // Stopped: the API answers no more, and the store was closed (the next opener gets it,
  // with what Start committed).
  EXPECT_EQ(Ping(port).error_code(), grpc::StatusCode::UNAVAILABLE);
  absl::StatusOr<store::Contents> stored = StoredContents();
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->pools.size(), 1u);
  EXPECT_EQ(stored->pools[0].name, "p");
  // Once: a second Shutdown (and the destructor) do nothing more.
  EXPECT_TRUE((*app)->Shutdown(absl::Seconds(1)).ok());
  app->reset();
  EXPECT_TRUE(StoredContents().ok());
}

TEST_F(ServerAppTest, AShutdownBeforeStartClosesTheStoreAndServesNothing) {
  {
    auto app = ServerApp::Create(Flags());
    ASSERT_TRUE(app.ok()) << app.status();
    EXPECT_TRUE((*app)->Shutdown(absl::Seconds(1)).ok());
  }
  EXPECT_FALSE(Exists("port"));
  absl::StatusOr<store::Contents> stored = StoredContents();
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(stored->pools.empty());  // never activated: --config was not applied
  EXPECT_TRUE(stored->templates.empty());

  // The same folder serves the next server.
  auto again = ServerApp::Create(Flags());
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->Start().ok());
  const std::string port = WaitForPort("port");
  ASSERT_NE(port, "");
  EXPECT_THAT(PoolNames(port), ::testing::ElementsAre("p"));
  EXPECT_TRUE((*again)->Shutdown(absl::Seconds(1)).ok());
}

// A replica with leader election whose Lease another replica holds: Start leaves it a
// standby (its port relays to the leader), and its shutdown closes the store without ever
// activating (no allocator, --config never applied).
TEST_F(ServerAppTest, AStandbyShutsDownWithoutActivating) {
  k8s::emulator::EmulatorProcess emulator(SBX_KUBE_EMULATOR, {});
  ASSERT_TRUE(emulator.ok()) << emulator.error();
  auto client = k8s::Client::Create(emulator.Cluster());
  ASSERT_TRUE(client.ok()) << client.status();
  // The CRDs of charts/sbx/crds: the Sandbox controller's caches sync before Create ends.
  for (const k8s::Json& crd :
       k8s::emulator::LoadManifests(std::string(SBX_SOURCE_DIR) + "/charts/sbx/crds")) {
    auto created = (*client)->Create(k8s::kCustomResourceDefinitions, "", crd);
    ASSERT_TRUE(created.ok()) << created.status();
  }
  const std::string now =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(), absl::UTCTimeZone());
  k8s::Json lease = {{"metadata", {{"name", "sbx-controller"}}},
                     {"spec",
                      {{"holderIdentity", "the-other-replica"},
                       {"leaseDurationSeconds", 3600},
                       {"acquireTime", now},
                       {"renewTime", now},
                       {"leaseTransitions", 0}}}};
  ASSERT_TRUE((*client)->Create(k8s::kLeases, "default", lease).ok());
  const std::string kubeconfig = dir_.Write("kubeconfig", absl::StrCat(R"(apiVersion: v1
kind: Config
clusters:
  - name: emu
    cluster:
      server: )",
                                                                       emulator.url(), R"(
contexts:
  - name: emu
    context:
      cluster: emu
      user: emu
current-context: emu
users:
  - name: emu
    user: {}
)"));

  auto app = ServerApp::Create(
      Flags({"--kubeconfig=" + kubeconfig, "--kube_leader_election", "--kube_identity=this-one",
             "--sandbox_key_file=" + dir_.path() + "/sandbox.key"}));
  ASSERT_TRUE(app.ok()) << app.status();
  ASSERT_TRUE((*app)->Start().ok());
  // The standby serves its port (a relay to the leader) from Create on.
  const std::string port = WaitForPort("port");
  ASSERT_NE(port, "");
  // The Lease is still the other replica's: this one stayed a standby.
  auto held = (*client)->Get(k8s::kLeases, "default", "sbx-controller");
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->at("spec").at("holderIdentity"), "the-other-replica");

  EXPECT_TRUE((*app)->Shutdown(absl::Seconds(1)).ok());
  EXPECT_EQ(Ping(port).error_code(), grpc::StatusCode::UNAVAILABLE);
  absl::StatusOr<store::Contents> stored = StoredContents();
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(stored->pools.empty());
  EXPECT_TRUE(stored->templates.empty());
}

}  // namespace
}  // namespace sbx::cmd

// The sandbox key in a Secret, against the API emulator: made once with 32 random bytes,
// read back by later loads, one key for concurrent loads (and for a load that loses the
// create race), bad Secrets refused by name, transient API errors waited out until the
// deadline.

#include "src/k8s/sandbox_key.h"

#include <atomic>
#include <functional>
#include <iostream>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "src/common/sandbox_secret.h"
#include "tests/k8s/test_emulator.h"

namespace sbx::k8s {
namespace {

using ::sbx::k8s::testing::TestEmulator;
using ::testing::HasSubstr;

constexpr char kNs[] = "sbx-system";
constexpr char kName[] = "sbx-sandbox-key";

SandboxKeyOptions Options() {
  SandboxKeyOptions options;
  options.ns = kNs;
  options.name = kName;
  options.deadline = absl::Seconds(20);
  options.retry_period = absl::Milliseconds(50);
  return options;
}

std::unique_ptr<Client> NewClient(TestEmulator& emulator, ClientOptions options = {}) {
  auto client = Client::Create(emulator.Cluster(), options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

class SandboxKeyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(emulator_.ok());
    client_ = NewClient(emulator_);
    ASSERT_NE(client_, nullptr);
    absl::StatusOr<Json> ns = client_->Create(kNamespaces, "", Json{{"metadata", {{"name", kNs}}}});
    ASSERT_TRUE(ns.ok()) << ns.status();
  }

  // The key as stored in the Secret (empty, with a failure, when unreadable).
  std::string StoredKey() {
    absl::StatusOr<Json> secret = client_->Get(kSecrets, kNs, kName);
    EXPECT_TRUE(secret.ok()) << secret.status();
    if (!secret.ok()) return "";
    std::string key;
    EXPECT_TRUE(absl::Base64Unescape(secret->at("data").at("key").get<std::string>(), &key));
    return key;
  }

  void PutSecret(const Json& data) {
    absl::StatusOr<Json> made = client_->Create(
        kSecrets, kNs, Json{{"metadata", {{"name", kName}}}, {"type", "Opaque"}, {"data", data}});
    ASSERT_TRUE(made.ok()) << made.status();
  }

  TestEmulator emulator_;
  std::unique_ptr<Client> client_;
};

TEST_F(SandboxKeyTest, FirstLoadMakesTheSecretLaterLoadsReadIt) {
  absl::StatusOr<std::string> first = LoadOrCreateSandboxKey(*client_, Options());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->size(), SandboxSecrets::kKeyBytes);
  EXPECT_NE(*first, std::string(SandboxSecrets::kKeyBytes, '\0'));

  absl::StatusOr<Json> secret = client_->Get(kSecrets, kNs, kName);
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ(secret->value("type", ""), "Opaque");
  EXPECT_EQ(secret->value("immutable", false), true);
  EXPECT_EQ(StoredKey(), *first);
  EXPECT_EQ(emulator_.Requests("create secrets"), 1);

  // A second load (another replica, or this one after a restart) gets the same key and
  // makes nothing.
  auto other = NewClient(emulator_);
  absl::StatusOr<std::string> second = LoadOrCreateSandboxKey(*other, Options());
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, *first);
  EXPECT_EQ(emulator_.Requests("create secrets"), 1);
}

TEST_F(SandboxKeyTest, ConcurrentLoadsAgreeOnOneKey) {
  constexpr int kLoaders = 8;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kLoaders; ++i) clients.push_back(NewClient(emulator_));
  // Every request is slowed down so that the loaders' reads all miss before any create
  // lands: the creates then race.
  emulator_.SetFaults({{"latency_ms", 100}});
  std::vector<absl::StatusOr<std::string>> keys(kLoaders);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kLoaders; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (ready.load() < kLoaders) std::this_thread::yield();
      keys[i] = LoadOrCreateSandboxKey(*clients[i], Options());
    });
  }
  for (std::thread& t : threads) t.join();
  emulator_.ClearFaults();
  std::set<std::string> distinct;
  for (const auto& key : keys) {
    ASSERT_TRUE(key.ok()) << key.status();
    distinct.insert(*key);
  }
  EXPECT_EQ(distinct.size(), 1u);
  EXPECT_EQ(*distinct.begin(), StoredKey());
  // How many creates the race saw (at least the winner's; the others lost with
  // AlreadyExists and read the winner's key).
  std::cerr << "creates attempted by " << kLoaders
            << " concurrent loaders: " << emulator_.Requests("create secrets") << "\n";
  EXPECT_GE(emulator_.Requests("create secrets"), 1);
}

// A transport that, right after the first read of the Secret misses, lets `between` run:
// another replica's create lands between this one's read and its create.
class RaceTransport : public HttpTransport {
 public:
  RaceTransport(std::unique_ptr<HttpTransport> inner, std::function<void()> between)
      : inner_(std::move(inner)), between_(std::move(between)) {}
  absl::StatusOr<HttpResponse> Send(const HttpRequest& request) override {
    absl::StatusOr<HttpResponse> response = inner_->Send(request);
    if (request.method == "GET" && response.ok() && response->status == 404 &&
        !fired_.exchange(true)) {
      between_();
    }
    return response;
  }
  absl::StatusOr<std::unique_ptr<HttpStream>> OpenStream(const HttpRequest& request) override {
    return inner_->OpenStream(request);
  }

 private:
  std::unique_ptr<HttpTransport> inner_;
  std::function<void()> between_;
  std::atomic<bool> fired_{false};
};

TEST_F(SandboxKeyTest, ALoadThatLosesTheCreateRaceUsesTheWinnersKey) {
  const std::string winner(SandboxSecrets::kKeyBytes, 'w');
  TransportOptions transport_options;
  transport_options.server = emulator_.url();
  auto inner = NewSocketTransport(transport_options);
  ASSERT_TRUE(inner.ok()) << inner.status();
  auto loser = Client::Create(emulator_.Cluster(), ClientOptions{},
                              std::make_unique<RaceTransport>(*std::move(inner), [&] {
                                PutSecret({{"key", absl::Base64Escape(winner)}});
                              }));
  ASSERT_TRUE(loser.ok()) << loser.status();
  absl::StatusOr<std::string> key = LoadOrCreateSandboxKey(**loser, Options());
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, winner);
  EXPECT_EQ(StoredKey(), winner);
  EXPECT_EQ(emulator_.Requests("create secrets"), 2);  // the winner's and the lost one
}

TEST_F(SandboxKeyTest, ASecretWithoutAKeyIsRefusedByName) {
  PutSecret({{"other", absl::Base64Escape("x")}});
  absl::StatusOr<std::string> key = LoadOrCreateSandboxKey(*client_, Options());
  ASSERT_EQ(key.status().code(), absl::StatusCode::kFailedPrecondition) << key.status();
  EXPECT_THAT(key.status().message(), HasSubstr("\"sbx-system/sbx-sandbox-key\""));
  EXPECT_THAT(key.status().message(), HasSubstr("no data \"key\""));
  // Nothing was overwritten.
  EXPECT_EQ(emulator_.Requests("update secrets") + emulator_.Requests("patch secrets") +
                emulator_.Requests("delete secrets"),
            0);
}

TEST_F(SandboxKeyTest, AKeyOfTheWrongSizeIsRefusedByName) {
  PutSecret({{"key", absl::Base64Escape(std::string(16, 'k'))}});
  absl::StatusOr<std::string> key = LoadOrCreateSandboxKey(*client_, Options());
  ASSERT_EQ(key.status().code(), absl::StatusCode::kFailedPrecondition) << key.status();
  EXPECT_THAT(key.status().message(), HasSubstr("\"sbx-system/sbx-sandbox-key\""));
  EXPECT_THAT(key.status().message(), HasSubstr("holds 16 bytes, not a key of 32"));
}

TEST_F(SandboxKeyTest, AKeyThatIsNotBase64IsRefusedByName) {
  PutSecret({{"key", "not base64!"}});
  absl::StatusOr<std::string> key = LoadOrCreateSandboxKey(*client_, Options());
  ASSERT_EQ(key.status().code(), absl::StatusCode::kFailedPrecondition) << key.status();
  EXPECT_THAT(key.status().message(), HasSubstr("\"sbx-system/sbx-sandbox-key\""));
  EXPECT_THAT(key.status().message(), HasSubstr("is not base64"));
}

TEST_F(SandboxKeyTest, AnUnansweringServerFailsAtTheDeadlineNamingTheSecret) {
  ClientOptions no_retries;
  no_retries.max_retries = 0;
  auto client = NewClient(emulator_, no_retries);
  emulator_.SetFaults({{"errors", {{"503", 1.0}}}});
  SandboxKeyOptions options = Options();
  options.deadline = absl::Milliseconds(500);
  absl::StatusOr<std::string> key = LoadOrCreateSandboxKey(*client, options);
  ASSERT_EQ(key.status().code(), absl::StatusCode::kDeadlineExceeded) << key.status();
  EXPECT_THAT(key.status().message(), HasSubstr("\"sbx-system/sbx-sandbox-key\""));
  EXPECT_THAT(key.status().message(), HasSubstr("within 500ms"));
  EXPECT_THAT(key.status().message(), HasSubstr("UNAVAILABLE"));
  EXPECT_GT(emulator_.Requests("get secrets"), 1);  // tried more than once
}

TEST_F(SandboxKeyTest, TransientErrorsAreWaitedOut) {
  ClientOptions no_retries;
  no_retries.max_retries = 0;
  auto client = NewClient(emulator_, no_retries);
  emulator_.SetFaults({{"errors", {{"503", 1.0}}}});
  // The faults end once the loader has been refused at least twice (it is waiting them
  // out, not failing at the first), which the emulator's request count shows.
  std::thread heal([&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (emulator_.Requests("get secrets") < 2 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    emulator_.ClearFaults();
  });
  absl::StatusOr<std::string> key = LoadOrCreateSandboxKey(*client, Options());
  heal.join();
  ASSERT_TRUE(key.ok()) << key.status();
  EXPECT_EQ(*key, StoredKey());
}

// An API server that forbids everything (RBAC without the Secret's rules).
class ForbiddingTransport : public HttpTransport {
 public:
  absl::StatusOr<HttpResponse> Send(const HttpRequest& request) override {
    HttpResponse response;
    response.status = 403;
    response.body = Json{{"kind", "Status"},
                         {"status", "Failure"},
                         {"reason", "Forbidden"},
                         {"code", 403},
                         {"message", "secrets \"sbx-sandbox-key\" is forbidden"}}
                        .dump();
    return response;
  }
  absl::StatusOr<std::unique_ptr<HttpStream>> OpenStream(const HttpRequest&) override {
    return absl::UnimplementedError("no streams");
  }
};

TEST(SandboxKeyForbiddenTest, PermissionDeniedSaysWhatRbacIsNeeded) {
  ClusterConfig cluster;
  cluster.server = "http://127.0.0.1:1";
  auto client = Client::Create(cluster, ClientOptions{}, std::make_unique<ForbiddingTransport>());
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::string> key = LoadOrCreateSandboxKey(**client, Options());
  ASSERT_EQ(key.status().code(), absl::StatusCode::kPermissionDenied) << key.status();
  EXPECT_THAT(key.status().message(), HasSubstr("\"sbx-system/sbx-sandbox-key\""));
  EXPECT_THAT(key.status().message(),
              HasSubstr("needs get on this Secret and create on secrets in \"sbx-system\""));
}

TEST(SandboxKeyOptionsTest, ValidateNamesTheBadField) {
  SandboxKeyOptions options;
  options.ns = kNs;
  EXPECT_THAT(options.Validate().message(), HasSubstr("no name"));
  options.name = kName;
  EXPECT_TRUE(options.Validate().ok());
  options.deadline = absl::ZeroDuration();
  EXPECT_THAT(options.Validate().message(), HasSubstr("deadline"));
}

}  // namespace
}  // namespace sbx::k8s

// Two electors against the API emulator: exactly one leads; stopping it hands over.

#include "src/k8s/leader_election.h"

#include <atomic>

#include "gtest/gtest.h"
#include "tests/k8s/test_emulator.h"

namespace sbx::k8s {
namespace {

LeaderElectionOptions Options(const std::string& identity) {
  LeaderElectionOptions options;
  options.identity = identity;
  options.lease_name = "test-lease";
  options.lease_duration = absl::Seconds(3);
  options.renew_deadline = absl::Seconds(2);
  options.retry_period = absl::Milliseconds(100);
  return options;
}

bool WaitFor(const std::function<bool()>& condition) {
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (absl::Now() < deadline) {
    if (condition()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

TEST(LeaderElectionTest, OneLeaderAndHandOver) {
  testing::TestEmulator emulator;
  ASSERT_TRUE(emulator.ok());
  auto client = *Client::Create(emulator.Cluster());
  std::atomic<int> started_a{0}, started_b{0}, stopped_a{0};
  LeaderElector a(
      client.get(), Options("a"), [&] { ++started_a; }, [&] { ++stopped_a; });
  LeaderElector b(
      client.get(), Options("b"), [&] { ++started_b; }, nullptr);
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.IsLeader(); }));
  b.Start();
  // b campaigns for a while without success: a renews.
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_FALSE(b.IsLeader());
  EXPECT_EQ(started_b.load(), 0);
  absl::StatusOr<Json> lease = client->Get(kLeases, "default", "test-lease");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->at("spec").at("holderIdentity"), "a");

  a.Stop();  // releases the lease
  EXPECT_EQ(stopped_a.load(), 1);
  EXPECT_FALSE(a.IsLeader());
  ASSERT_TRUE(WaitFor([&] { return b.IsLeader(); }));
  EXPECT_EQ(started_b.load(), 1);
  lease = client->Get(kLeases, "default", "test-lease");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->at("spec").at("holderIdentity"), "b");
  EXPECT_EQ(lease->at("spec").at("leaseTransitions"), 1);
  b.Stop();
}

TEST(LeaderElectionTest, ALeaderThatCannotRenewStepsDown) {
  testing::TestEmulator emulator;
  ASSERT_TRUE(emulator.ok());
  ClientOptions options;
  options.max_retries = 0;
  auto client = *Client::Create(emulator.Cluster(), options);
  std::atomic<int> stopped{0};
  LeaderElector a(client.get(), Options("a"), nullptr, [&] { ++stopped; });
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.IsLeader(); }));
  // Every request fails now: after renew_deadline a stops acting (before the lease's
  // duration lets anyone else take it).
  emulator.SetFaults({{"errors", {{"500", 1.0}}}});
  ASSERT_TRUE(WaitFor([&] { return !a.IsLeader(); }));
  EXPECT_EQ(stopped.load(), 1);
  emulator.ClearFaults();
  ASSERT_TRUE(WaitFor([&] { return a.IsLeader(); }));  // and campaigns again
  a.Stop();
}

TEST(LeaderElectionTest, OptionsAreChecked) {
  LeaderElectionOptions options = Options("");
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
  options = Options("x");
  options.renew_deadline = options.lease_duration;
  EXPECT_EQ(options.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace sbx::k8s

// Two electors against the API emulator: exactly one leads; stopping it hands over.

#include "src/k8s/leader_election.h"

#include <atomic>
#include <initializer_list>

#include "absl/synchronization/mutex.h"

#include "gtest/gtest.h"
#include "src/common/clock.h"
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

// Waits (bounded) until each elector has made its attempt at the current fake time and
// waits for the next, then moves the clock on by `step`: one round of both.
void Round(FakeClock& clock, absl::Duration step, std::initializer_list<LeaderElector*> electors) {
  ASSERT_TRUE(WaitFor([&] {
    for (LeaderElector* e : electors) {
      if (e->SleepingUntil() <= clock.Now()) return false;
    }
    return true;
  })) << "an elector did not get to its next wait";
  clock.Advance(step);
}

TEST(LeaderElectionTest, OneLeaderAndHandOver) {
  testing::TestEmulator emulator;
  ASSERT_TRUE(emulator.ok());
  auto client = *Client::Create(emulator.Cluster());
  FakeClock clock(absl::Now());
  LeaderElectionOptions options_a = Options("a"), options_b = Options("b");
  options_a.clock = options_b.clock = &clock;
  std::atomic<int> started_a{0}, started_b{0}, stopped_a{0};
  LeaderElector a(
      client.get(), options_a, [&] { ++started_a; }, [&] { ++stopped_a; });
  LeaderElector b(
      client.get(), options_b, [&] { ++started_b; }, nullptr);
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.IsLeader(); }));
  b.Start();
  // b campaigns for longer than the lease's duration (3 s) without success: a renews
  // every round. Each round both have looked at the lease before time moves on.
  for (int i = 0; i < 40; ++i) Round(clock, absl::Milliseconds(100), {&a, &b});
  Round(clock, absl::ZeroDuration(), {&a, &b});
  EXPECT_FALSE(b.IsLeader());
  EXPECT_EQ(started_b.load(), 0);
  absl::StatusOr<Json> lease = client->Get(kLeases, "default", "test-lease");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->at("spec").at("holderIdentity"), "a");

  a.Stop();  // releases the lease
  EXPECT_EQ(stopped_a.load(), 1);
  EXPECT_FALSE(a.IsLeader());
  Round(clock, absl::Milliseconds(100), {&b});  // b's next attempt finds it free
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

// Starts `e` and waits until it leads.
void Lead(LeaderElector& e) {
  e.Start();
  ASSERT_TRUE(WaitFor([&] { return e.IsLeader(); }));
}

Json Annotations(Client& client) {
  absl::StatusOr<Json> lease = client.Get(kLeases, "default", "test-lease");
  EXPECT_TRUE(lease.ok()) << lease.status();
  return lease.ok() ? lease->at("metadata").value("annotations", Json::object()) : Json::object();
}

// Store replication's part of the Lease: the leader of the term and the standby that holds
// everything it acknowledged.
TEST(LeaderElectionTest, TheLeaseNamesTheTermsLeaderAndItsInSyncStandby) {
  testing::TestEmulator emulator;
  ASSERT_TRUE(emulator.ok());
  auto client = *Client::Create(emulator.Cluster());
  LeaderElector a(client.get(), Options("a"), nullptr, nullptr);
  ASSERT_NO_FATAL_FAILURE(Lead(a));
  EXPECT_EQ(Annotations(*client).value(kTermLeaderAnnotation, "?"), "a");
  EXPECT_EQ(Annotations(*client).value(kSyncReplicaAnnotation, "?"), "");
  EXPECT_EQ(a.Term(), 0);
  ASSERT_TRUE(a.PublishSyncReplica("b").ok());
  EXPECT_EQ(Annotations(*client).value(kSyncReplicaAnnotation, "?"), "b");
  absl::StatusOr<Json> lease = client->Get(kLeases, "default", "test-lease");
  ASSERT_TRUE(lease.ok());
  const LeaseTerm term = LeaseTermOf(*lease);
  EXPECT_TRUE(term.replicated);
  EXPECT_EQ(term.leader, "a");
  EXPECT_EQ(term.sync_replica, "b");
  EXPECT_EQ(term.term, 0);
  // Renewals keep what was published.
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_EQ(Annotations(*client).value(kSyncReplicaAnnotation, "?"), "b");

  // Another replica took the Lease (a has not noticed yet): a may not name anyone.
  ASSERT_TRUE(WaitFor([&] {  // a's renewals race with this write: retry on a conflict
    absl::StatusOr<Json> now = client->Get(kLeases, "default", "test-lease");
    if (!now.ok()) return false;
    (*now)["spec"]["holderIdentity"] = "c";
    (*now)["spec"]["leaseTransitions"] = 1;
    return client->Update(kLeases, "default", *now).ok();
  }));
  absl::Status refused = a.PublishSyncReplica("");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_EQ(Annotations(*client).value(kSyncReplicaAnnotation, "?"), "b");
  a.Stop();
}

// A replica whose store is not known to hold what the last leader acknowledged leaves an
// expired Lease alone; once it may, it takes it, naming itself and no standby.
TEST(LeaderElectionTest, AReplicaThatMayNotLeadLeavesTheLeaseAlone) {
  testing::TestEmulator emulator;
  ASSERT_TRUE(emulator.ok());
  auto client = *Client::Create(emulator.Cluster());
  {
    LeaderElector a(client.get(), Options("a"), nullptr, nullptr);
    ASSERT_NO_FATAL_FAILURE(Lead(a));
    ASSERT_TRUE(a.PublishSyncReplica("c").ok());
    a.Stop();  // releases the Lease
  }
  std::atomic<bool> may{false};
  std::atomic<int> asked{0};
  LeaseTerm seen;
  absl::Mutex seen_mu;
  LeaderElectionOptions options = Options("b");
  options.may_lead = [&](const LeaseTerm& t) {
    absl::MutexLock lock(&seen_mu);
    seen = t;
    ++asked;
    return may.load();
  };
  LeaderElector b(client.get(), options, nullptr, nullptr);
  b.Start();
  ASSERT_TRUE(WaitFor([&] { return asked.load() >= 5; }));
  EXPECT_FALSE(b.IsLeader());
  {
    absl::MutexLock lock(&seen_mu);
    EXPECT_TRUE(seen.replicated);
    EXPECT_EQ(seen.leader, "a");
    EXPECT_EQ(seen.sync_replica, "c");
  }
  may = true;
  ASSERT_TRUE(WaitFor([&] { return b.IsLeader(); }));
  EXPECT_EQ(Annotations(*client).value(kTermLeaderAnnotation, "?"), "b");
  EXPECT_EQ(Annotations(*client).value(kSyncReplicaAnnotation, "?"), "");
  EXPECT_EQ(b.Term(), 1);
  const int asked_when_leading = asked.load();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(asked.load(), asked_when_leading) << "asked again while leading";
  b.Stop();
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

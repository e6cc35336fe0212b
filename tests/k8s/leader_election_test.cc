// Two electors against the API emulator: exactly one leads; stopping it hands over.

#include "src/k8s/leader_election.h"

#include <atomic>
#include <initializer_list>
#include <memory>

#include "absl/synchronization/mutex.h"

#include "gtest/gtest.h"
#include "src/common/clock.h"
#include "src/k8s/http.h"
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
  // IsLeader lapses with the window; the elector's thread notices at its next look.
  ASSERT_TRUE(WaitFor([&] { return stopped.load() == 1; }));
  emulator.ClearFaults();
  ASSERT_TRUE(WaitFor([&] { return a.IsLeader(); }));  // and campaigns again
  a.Stop();
}

// Starts `e` and waits until it leads.
void Lead(LeaderElector& e) {
  e.Start();
  ASSERT_TRUE(WaitFor([&] { return e.IsLeader(); }));
}

// Waits (bounded) until the Lease's renewTime has taken `n` new values: the positive marker
// of a test that shows something stays as it is across renewals.
bool WaitForRenewals(Client& client, int n) {
  std::string last;
  int seen = -1;  // the first value read is not new
  return WaitFor([&] {
    absl::StatusOr<Json> lease = client.Get(kLeases, "default", "test-lease");
    if (!lease.ok()) return false;
    const std::string renew = lease->at("spec").value("renewTime", std::string());
    if (renew != last) {
      last = renew;
      ++seen;
    }
    return seen >= n;
  });
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
  ASSERT_TRUE(WaitForRenewals(*client, 3));
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
  ASSERT_TRUE(WaitForRenewals(*client, 3));
  EXPECT_EQ(asked.load(), asked_when_leading) << "asked again while leading";
  b.Stop();
}

// A transport that a test can cut off, as a one-sided partition would: while cut, every
// request fails at once with UNAVAILABLE (nothing reaches the API server).
class Partitionable final : public HttpTransport {
 public:
  explicit Partitionable(std::unique_ptr<HttpTransport> inner) : inner_(std::move(inner)) {}
  void Cut(bool cut) { cut_.store(cut); }
  absl::StatusOr<HttpResponse> Send(const HttpRequest& request) override {
    if (cut_.load()) return absl::UnavailableError("partitioned (test)");
    return inner_->Send(request);
  }
  absl::StatusOr<std::unique_ptr<HttpStream>> OpenStream(const HttpRequest& request) override {
    if (cut_.load()) return absl::UnavailableError("partitioned (test)");
    return inner_->OpenStream(request);
  }

 private:
  std::unique_ptr<HttpTransport> inner_;
  std::atomic<bool> cut_{false};
};

// A client over a Partitionable transport (returned through *cut).
std::unique_ptr<Client> CuttableClient(testing::TestEmulator& emulator, Partitionable** cut) {
  TransportOptions t;
  t.server = emulator.Cluster().server;
  auto inner = NewSocketTransport(t);
  EXPECT_TRUE(inner.ok()) << inner.status();
  auto transport = std::make_unique<Partitionable>(*std::move(inner));
  *cut = transport.get();
  ClientOptions options;
  options.max_retries = 0;
  options.request_timeout = absl::Seconds(1);
  auto client = Client::Create(emulator.Cluster(), options, std::move(transport));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

Json SecretNamed(const std::string& name) {
  return {{"metadata", {{"name", name}}}, {"type", "Opaque"}};
}

// Issue 32: leadership is a window on the elector's clock. A leader that cannot renew
// (here its requests stop reaching the API server) stops writing once renew_deadline has
// passed since its last renewal began, whatever its elector thread is doing, and its
// fenced client sends nothing more: the write fails FAILED_PRECONDITION without reaching
// the API server. The Lease itself stays writable (it is how a replica comes to lead).
TEST(LeaderElectionTest, AFencedClientWritesNothingOnceTheWindowCloses) {
  testing::TestEmulator emulator;
  ASSERT_TRUE(emulator.ok());
  FakeClock clock(absl::Now());
  Partitionable* cut = nullptr;
  std::unique_ptr<Client> election = CuttableClient(emulator, &cut);
  auto writer = *Client::Create(emulator.Cluster());
  LeaderElectionOptions options = Options("a");
  options.clock = &clock;
  LeaderElector a(election.get(), options, nullptr, nullptr);
  writer->SetWriteFence(&a);
  // Before it leads, nothing is written.
  absl::Status early = writer->Create(kSecrets, "default", SecretNamed("early")).status();
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  EXPECT_NE(early.message().find("does not hold Lease"), std::string::npos) << early;
  ASSERT_NO_FATAL_FAILURE(Lead(a));
  ASSERT_TRUE(writer->Create(kSecrets, "default", SecretNamed("while-leading")).ok());
  absl::StatusOr<absl::Duration> window = a.WriteWindow();
  ASSERT_TRUE(window.ok()) << window.status();
  EXPECT_LE(*window, options.renew_deadline);

  // Its renewals stop reaching the API server; time passes beyond the renew deadline.
  cut->Cut(true);
  clock.Advance(options.renew_deadline);
  EXPECT_FALSE(a.IsLeader());
  absl::StatusOr<absl::Duration> closed = a.WriteWindow();
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kFailedPrecondition) << closed.status();
  const int64_t creates = emulator.Requests("create secrets");
  absl::Status late = writer->Create(kSecrets, "default", SecretNamed("late")).status();
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_EQ(emulator.Requests("create secrets"), creates) << "a fenced write was sent";
  EXPECT_TRUE(absl::IsNotFound(writer->Get(kSecrets, "default", "late").status()));
  // Leases are not fenced: the election itself writes them.
  Json lease = {{"metadata", {{"name", "other-lease"}}}, {"spec", Json::object()}};
  EXPECT_TRUE(writer->Create(kLeases, "default", lease).ok());
  writer->SetWriteFence(nullptr);
  cut->Cut(false);
  a.Stop();
}

// Issue 32: a standby that cannot reach its leader (its replication stream broke) takes the
// Lease once it has seen the same renewal for renew_deadline + takeover_margin, long before
// the Lease's duration runs out; and by then the old leader's window has closed.
TEST(LeaderElectionTest, AStandbyThatLostTheLeaderTakesOverAfterTheRenewDeadline) {
  testing::TestEmulator emulator;
  ASSERT_TRUE(emulator.ok());
  Partitionable* cut = nullptr;
  std::unique_ptr<Client> a_client = CuttableClient(emulator, &cut);
  auto b_client = *Client::Create(emulator.Cluster());
  LeaderElectionOptions a_options = Options("a"), b_options = Options("b");
  for (LeaderElectionOptions* o : {&a_options, &b_options}) {
    o->lease_duration = absl::Seconds(60);  // never runs out in this test
    o->renew_deadline = absl::Seconds(1);
    o->retry_period = absl::Milliseconds(100);
    o->takeover_margin = absl::Milliseconds(300);
  }
  std::atomic<bool> unreachable{false};
  b_options.leader_unreachable = [&] { return unreachable.load(); };
  std::atomic<bool> a_leads_when_b_started{false};
  LeaderElector a(a_client.get(), a_options, nullptr, nullptr);
  ASSERT_NO_FATAL_FAILURE(Lead(a));
  LeaderElector b(
      b_client.get(), b_options, [&] { a_leads_when_b_started = a.IsLeader(); }, nullptr);
  b.Start();
  // Reachable: b never takes a live leader's Lease, though it looks at it for longer than
  // its takeover wait (renew deadline + margin, 1.3 s): 20 renewals of a, 100 ms apart.
  ASSERT_TRUE(WaitForRenewals(*b_client, 20));
  EXPECT_FALSE(b.IsLeader());
  // a is cut off (its renewals stop) and b's stream from it broke.
  cut->Cut(true);
  unreachable = true;
  ASSERT_TRUE(WaitFor([&] { return b.IsLeader(); }));
  EXPECT_FALSE(a_leads_when_b_started.load()) << "two leaders: a's window was still open";
  absl::StatusOr<Json> lease = b_client->Get(kLeases, "default", "test-lease");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(lease->at("spec").at("holderIdentity"), "b");
  EXPECT_EQ(lease->at("spec").at("leaseTransitions"), 1);
  b.Stop();
  cut->Cut(false);
  a.Stop();
}

// Issue 32: a missing Lease is made only by a replica that may lead with no Lease (asked
// with LeaseTerm::exists false); an operator's sbx.dev/promote names one replica, which
// takes the Lease and removes the annotation, while the others leave it alone.
TEST(LeaderElectionTest, AMissingLeaseIsMadeOnlyByAReplicaThatMayLead) {
  testing::TestEmulator emulator;
  ASSERT_TRUE(emulator.ok());
  auto client = *Client::Create(emulator.Cluster());
  std::atomic<int> asked_missing{0};
  auto refuse_missing = [&](const LeaseTerm& t) {
    if (!t.exists) {
      ++asked_missing;
      return false;
    }
    return t.promote.empty();
  };
  LeaderElectionOptions options = Options("a");
  options.may_lead = refuse_missing;
  LeaderElector a(client.get(), options, nullptr, nullptr);
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return asked_missing.load() >= 3; }));
  EXPECT_FALSE(a.IsLeader());
  EXPECT_TRUE(absl::IsNotFound(client->Get(kLeases, "default", "test-lease").status()));

  // The operator names b in a Lease held by nobody; a (asked, and not named) stays out.
  Json lease = {
      {"metadata", {{"name", "test-lease"}, {"annotations", {{kPromoteAnnotation, "b"}}}}},
      {"spec", {{"holderIdentity", ""}}}};
  ASSERT_TRUE(client->Create(kLeases, "default", lease).ok());
  LeaderElectionOptions b_options = Options("b");
  b_options.may_lead = [](const LeaseTerm& t) { return t.promote == "b"; };
  LeaderElector b(client.get(), b_options, nullptr, nullptr);
  ASSERT_NO_FATAL_FAILURE(Lead(b));
  EXPECT_FALSE(a.IsLeader());
  EXPECT_FALSE(Annotations(*client).contains(kPromoteAnnotation)) << Annotations(*client);
  EXPECT_EQ(Annotations(*client).value(kTermLeaderAnnotation, "?"), "b");
  b.Stop();
  a.Stop();
}

// A Lease with a field of another type (only a store that skips the API server's
// validation can hold one) is not acted on: the elector decodes it first and leaves it
// alone (the JSON reads before threw out of the elector's thread), and takes it once it is
// well-formed again. The extra annotation survives the typed round trip.
TEST(LeaderElectionTest, ALeaseThatDoesNotDecodeIsLeftAloneUntilItDoes) {
  testing::TestEmulator emulator;
  ASSERT_TRUE(emulator.ok());
  auto client = *Client::Create(emulator.Cluster());
  Json lease = {{"metadata", {{"name", "test-lease"}, {"annotations", {{"team", "infra"}}}}},
                {"spec", {{"holderIdentity", 7}}}};
  ASSERT_TRUE(client->Create(kLeases, "default", lease).ok());
  FakeClock clock(absl::Now());
  LeaderElectionOptions options = Options("a");
  options.clock = &clock;
  LeaderElector a(client.get(), options, nullptr, nullptr);
  a.Start();
  // Three campaign rounds, each seen to end in a wait (the positive marker).
  for (int i = 0; i < 3; ++i) Round(clock, options.retry_period, {&a});
  EXPECT_FALSE(a.IsLeader());
  absl::StatusOr<Json> stored = client->Get(kLeases, "default", "test-lease");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->at("spec").at("holderIdentity"), 7);

  (*stored)["spec"]["holderIdentity"] = "";
  ASSERT_TRUE(client->Update(kLeases, "default", *stored).ok());
  ASSERT_TRUE(WaitFor([&] {
    if (a.IsLeader()) return true;
    if (a.SleepingUntil() > clock.Now()) clock.Advance(options.retry_period);
    return false;
  }));
  EXPECT_EQ(Annotations(*client).value("team", "?"), "infra");
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

// FleetRuntime (src/k8s/fleet_runtime.h) over real runtimes (the instant runtime, one per
// "cluster"): creates placed by the policy, fleet ids and the cluster label, every other
// call routed to the cluster its id names, List as the union, member counts kept.
#include "src/k8s/fleet_runtime.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/runtime/instant_runtime.h"

namespace sbx::k8s {
namespace {

absl::StatusOr<runtime::SandboxInfo> CreateSync(runtime::Runtime& r, const std::string& pool) {
  absl::StatusOr<runtime::SandboxInfo> out = absl::UnknownError("no answer");
  runtime::CreateRequest req;
  req.pool = pool;
  r.Create(req, [&out](absl::StatusOr<runtime::SandboxInfo> got) { out = std::move(got); });
  return out;
}

absl::Status DeleteSync(runtime::Runtime& r, const std::string& id) {
  absl::Status out = absl::UnknownError("no answer");
  r.Delete(id, [&out](absl::Status s) { out = s; });
  return out;
}

// A runtime whose creates fail, as a cluster whose API refuses them does.
class RefusingRuntime final : public runtime::Runtime {
 public:
  void Create(runtime::CreateRequest, runtime::CreateCallback done) override {
    std::move(done)(absl::UnavailableError("the API server answered 503"));
  }
  void Delete(std::string id, runtime::DeleteCallback done) override {
    std::move(done)(absl::NotFoundError(id));
  }
  void Suspend(std::string id, runtime::DoneCallback done) override {
    std::move(done)(absl::NotFoundError(id));
  }
  void Resume(std::string id, runtime::ResumeCallback done) override {
    std::move(done)(absl::NotFoundError(id));
  }
  absl::StatusOr<std::vector<runtime::SandboxInfo>> List() override {
    return absl::UnavailableError("watch not synced");
  }
};

// A runtime whose creates are answered when the test says (by an instant runtime), as a
// cluster that takes a while to make a member.
class HeldRuntime final : public runtime::Runtime {
 public:
  void Create(runtime::CreateRequest request, runtime::CreateCallback done) override {
    held_.emplace_back(std::move(request), std::move(done));
  }
  // Answers the creates held so far.
  void Release() {
    auto held = std::move(held_);
    held_.clear();
    for (auto& [request, done] : held) inner_->Create(std::move(request), std::move(done));
  }
  size_t held() const { return held_.size(); }
  void Delete(std::string id, runtime::DeleteCallback done) override {
    inner_->Delete(std::move(id), std::move(done));
  }
  void Suspend(std::string id, runtime::DoneCallback done) override {
    inner_->Suspend(std::move(id), std::move(done));
  }
  void Resume(std::string id, runtime::ResumeCallback done) override {
    inner_->Resume(std::move(id), std::move(done));
  }
  absl::StatusOr<std::vector<runtime::SandboxInfo>> List() override { return inner_->List(); }

 private:
  std::unique_ptr<runtime::Runtime> inner_ = runtime::NewInstantRuntime();
  std::vector<std::pair<runtime::CreateRequest, runtime::CreateCallback>> held_;
};

class FleetRuntimeTest : public ::testing::Test {
 protected:
  FleetRuntimeTest() {
    for (int i = 0; i < 3; ++i) clusters_.push_back(runtime::NewInstantRuntime());
  }
  FleetRuntimeOptions Options(FleetPlacement placement = FleetPlacement::kSpread) {
    FleetRuntimeOptions o;
    const char* names[] = {"home", "east", "west"};
    for (int i = 0; i < 3; ++i) {
      FleetCluster c;
      c.name = names[i];
      c.runtime = clusters_[i].get();
      o.clusters.push_back(c);
    }
    o.placement = placement;
    o.clock = &clock_;
    return o;
  }
  static size_t Count(runtime::Runtime& r) { return r.List()->size(); }

  FakeClock clock_;
  std::vector<std::unique_ptr<runtime::Runtime>> clusters_;
};

TEST_F(FleetRuntimeTest, SpreadsCreatesAndNamesEachMembersCluster) {
  FleetRuntime fleet(Options());
  std::map<std::string, int> by_label;
  for (int i = 0; i < 9; ++i) {
    absl::StatusOr<runtime::SandboxInfo> made = CreateSync(fleet, "py");
    ASSERT_TRUE(made.ok()) << made.status();
    const std::string cluster = made->node_labels.at(kClusterLabel);
    ++by_label[cluster];
    // Home ids are the cluster's own; the others carry their cluster's name.
    if (cluster == "home") {
      EXPECT_EQ(made->id.find(':'), std::string::npos) << made->id;
    } else {
      EXPECT_EQ(made->id.rfind(cluster + ":inst-", 0), 0u) << made->id;
    }
    EXPECT_EQ(made->pool, "py");
  }
  EXPECT_EQ(by_label, (std::map<std::string, int>{{"east", 3}, {"home", 3}, {"west", 3}}));
  for (auto& c : clusters_) EXPECT_EQ(Count(*c), 3u);
  const std::vector<FleetClusterState> state = fleet.State();
  ASSERT_EQ(state.size(), 3u);
  for (const FleetClusterState& s : state) EXPECT_EQ(s.members.at("py"), 3) << s.name;
}

TEST_F(FleetRuntimeTest, RoutesDeleteSuspendResumeToTheMembersCluster) {
  FleetRuntime fleet(Options());
  std::vector<runtime::SandboxInfo> made;
  for (int i = 0; i < 3; ++i) made.push_back(*CreateSync(fleet, "py"));
  const runtime::SandboxInfo& east = made[1];
  ASSERT_EQ(east.node_labels.at(kClusterLabel), "east");
  // Suspend and resume reach east's runtime, and the answer comes back in fleet terms.
  absl::Status suspended = absl::UnknownError("no answer");
  fleet.Suspend(east.id, [&](absl::Status s) { suspended = s; });
  ASSERT_TRUE(suspended.ok()) << suspended;
  bool east_suspended = false;
  const std::vector<runtime::SandboxInfo> east_list = *clusters_[1]->List();
  for (const runtime::SandboxInfo& s : east_list) east_suspended |= s.suspended;
  EXPECT_TRUE(east_suspended);
  absl::StatusOr<runtime::SandboxInfo> resumed = absl::UnknownError("no answer");
  fleet.Resume(east.id, [&](absl::StatusOr<runtime::SandboxInfo> r) { resumed = std::move(r); });
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->id, east.id);
  EXPECT_EQ(resumed->node_labels.at(kClusterLabel), "east");
  // Delete removes it from east only.
  ASSERT_TRUE(DeleteSync(fleet, east.id).ok());
  EXPECT_EQ(Count(*clusters_[0]), 1u);
  EXPECT_EQ(Count(*clusters_[1]), 0u);
  EXPECT_EQ(Count(*clusters_[2]), 1u);
  // The id without its prefix is not a home sandbox, and a prefix of no cluster is
  // NOT_FOUND naming it.
  EXPECT_EQ(DeleteSync(fleet, east.id.substr(5)).code(), absl::StatusCode::kNotFound);
  const absl::Status unknown = DeleteSync(fleet, "north:inst-1");
  ASSERT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.message().find("\"north\""), std::string::npos) << unknown;
  // East lost its member, so the next create goes there.
  EXPECT_EQ(CreateSync(fleet, "py")->node_labels.at(kClusterLabel), "east");
}

TEST_F(FleetRuntimeTest, GoneReportsAndListKeepTheCountsThePlacementReads) {
  FleetRuntime fleet(Options());
  std::vector<runtime::SandboxInfo> made;
  for (int i = 0; i < 6; ++i) made.push_back(*CreateSync(fleet, "py"));
  // West's runtime reports one of its members gone (by its own id).
  const std::string west_local = made[2].id.substr(std::string("west:").size());
  ASSERT_TRUE(DeleteSync(*clusters_[2], west_local).ok());
  EXPECT_EQ(fleet.Gone(2, west_local), made[2].id);
  EXPECT_EQ(CreateSync(fleet, "py")->node_labels.at(kClusterLabel), "west");
  // Members made behind the fleet's back (another replica, before a restart) are counted
  // once List has seen them.
  for (int i = 0; i < 4; ++i) {
    runtime::CreateRequest req;
    req.pool = "py";
    clusters_[0]->Create(req, [](absl::StatusOr<runtime::SandboxInfo>) {});
  }
  absl::StatusOr<std::vector<runtime::SandboxInfo>> all = fleet.List();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->size(), 10u);
  std::map<std::string, int> by_label;
  for (const runtime::SandboxInfo& s : *all) ++by_label[s.node_labels.at(kClusterLabel)];
  EXPECT_EQ(by_label, (std::map<std::string, int>{{"east", 2}, {"home", 6}, {"west", 2}}));
  // Home holds 6: the next four go to east and west.
  for (int i = 0; i < 4; ++i) {
    EXPECT_NE(CreateSync(fleet, "py")->node_labels.at(kClusterLabel), "home") << i;
  }
  // Pools are counted apart.
  EXPECT_EQ(CreateSync(fleet, "other")->node_labels.at(kClusterLabel), "home");
}

TEST_F(FleetRuntimeTest, MaxMinAndFailedCreates) {
  RefusingRuntime refusing;
  FleetRuntimeOptions o = Options(FleetPlacement::kPack);
  o.clusters[0].max = 2;
  o.clusters[1].runtime = &refusing;
  o.clusters[2].max = 1;
  FleetRuntime fleet(o);
  EXPECT_EQ(CreateSync(fleet, "py")->node_labels.at(kClusterLabel), "home");
  EXPECT_EQ(CreateSync(fleet, "py")->node_labels.at(kClusterLabel), "home");
  // Home is full: east is next, and its refusal names the cluster.
  absl::StatusOr<runtime::SandboxInfo> refused = CreateSync(fleet, "py");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("cluster \"east\""), std::string::npos)
      << refused.status();
  // East backs off: the next create goes to west (its last place)...
  EXPECT_EQ(CreateSync(fleet, "py")->node_labels.at(kClusterLabel), "west");
  // ...and then none is left, the message says why of each.
  absl::StatusOr<runtime::SandboxInfo> none = CreateSync(fleet, "py");
  ASSERT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("east backing off after 1 failed creates"),
            std::string::npos)
      << none.status();
  EXPECT_NE(none.status().message().find("west at its max of 1"), std::string::npos)
      << none.status();
  // Once the backoff (500 ms) has passed, east is tried again (a failed create holds no
  // place), fails again and backs off twice as long.
  clock_.Advance(absl::Milliseconds(500));
  EXPECT_EQ(CreateSync(fleet, "py").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fleet.State()[1].failures, 2);
  EXPECT_EQ(fleet.State()[1].backoff_until, clock_.Now() + absl::Seconds(1));
  clock_.Advance(absl::Milliseconds(999));
  EXPECT_EQ(CreateSync(fleet, "py").status().code(), absl::StatusCode::kResourceExhausted);
  // List fails while a cluster cannot tell what it holds.
  absl::StatusOr<std::vector<runtime::SandboxInfo>> listed = fleet.List();
  ASSERT_EQ(listed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(listed.status().message().find("\"east\""), std::string::npos) << listed.status();
}

TEST_F(FleetRuntimeTest, AnUnhealthyClusterTakesNoCreatesAndItsMembersAreListed) {
  bool west_healthy = true;
  FleetRuntimeOptions o = Options();
  o.clusters[2].healthy = [&west_healthy] { return west_healthy; };
  FleetRuntime fleet(o);
  std::vector<std::string> west;
  for (int i = 0; i < 6; ++i) {
    runtime::SandboxInfo made = *CreateSync(fleet, "py");
    if (made.node_labels.at(kClusterLabel) == "west") west.push_back(made.id);
  }
  ASSERT_EQ(west.size(), 2u);
  std::vector<std::string> members = fleet.MembersOf(2);
  std::sort(members.begin(), members.end());
  std::sort(west.begin(), west.end());
  EXPECT_EQ(members, west);
  west_healthy = false;
  for (int i = 0; i < 6; ++i) {
    EXPECT_NE(CreateSync(fleet, "py")->node_labels.at(kClusterLabel), "west") << i;
  }
  EXPECT_EQ(Count(*clusters_[2]), 2u);
  // Back: it is the emptiest, so it is next.
  west_healthy = true;
  EXPECT_EQ(CreateSync(fleet, "py")->node_labels.at(kClusterLabel), "west");
}

TEST_F(FleetRuntimeTest, WeightedSplitsByWeightWhenRatesAreEqual) {
  FleetRuntimeOptions o = Options(FleetPlacement::kWeighted);
  o.clusters[0].weight = 2;
  FleetRuntime fleet(o);
  std::map<std::string, int> by_label;
  for (int i = 0; i < 8; ++i) {
    ++by_label[CreateSync(fleet, "py")->node_labels.at(kClusterLabel)];
    clock_.Advance(absl::Milliseconds(100));
  }
  // Equal rates so far (every instant create answers at once): by weight 2:1:1.
  EXPECT_EQ(by_label, (std::map<std::string, int>{{"east", 2}, {"home", 4}, {"west", 2}}));
  for (const FleetClusterState& s : fleet.State()) EXPECT_GT(s.create_rate, 0) << s.name;
}

TEST(FleetRuntimeWeightedTest, SendsMoreToTheClusterThatMakesMembersFaster) {
  FakeClock clock;
  HeldRuntime fast, slow;
  FleetRuntimeOptions o;
  o.clusters = {FleetCluster{"fast", &fast}, FleetCluster{"slow", &slow}};
  o.placement = FleetPlacement::kWeighted;
  o.clock = &clock;
  FleetRuntime fleet(o);
  int answered = 0;
  auto create = [&] {
    runtime::CreateRequest req;
    req.pool = "py";
    fleet.Create(req, [&answered](absl::StatusOr<runtime::SandboxInfo> got) {
      EXPECT_TRUE(got.ok()) << got.status();
      ++answered;
    });
  };
  // Nothing measured: one each (equal weights). Fast answers after 1 s, slow after 4 s.
  create();
  create();
  ASSERT_EQ(fast.held(), 1u);
  ASSERT_EQ(slow.held(), 1u);
  clock.Advance(absl::Seconds(1));
  fast.Release();
  clock.Advance(absl::Seconds(3));
  slow.Release();
  EXPECT_EQ(answered, 2);
  const std::vector<FleetClusterState> state = fleet.State();
  EXPECT_DOUBLE_EQ(state[0].create_rate, 1.0);
  EXPECT_DOUBLE_EQ(state[1].create_rate, 0.25);
  // Ten more, in flight together: members in proportion 1 : 0.25, so 9 and 3 of 12. (A
  // rate counted as completions per second would have starved slow entirely.)
  for (int i = 0; i < 10; ++i) create();
  EXPECT_EQ(fast.held(), 8u);
  EXPECT_EQ(slow.held(), 2u);
  fast.Release();
  slow.Release();
  EXPECT_EQ(answered, 12);
}

TEST(FleetRuntimeOptionsTest, ValidateNamesWhatIsWrong) {
  auto instant = runtime::NewInstantRuntime();
  FleetRuntimeOptions o;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.clusters.push_back(FleetCluster{"home", instant.get()});
  EXPECT_TRUE(o.Validate().ok());
  o.clusters.push_back(FleetCluster{"home", instant.get()});
  EXPECT_NE(o.Validate().message().find("named twice"), std::string::npos) << o.Validate();
  o.clusters[1].name = "East_1";
  EXPECT_NE(o.Validate().message().find("East_1"), std::string::npos) << o.Validate();
  o.clusters[1].name = "east";
  o.clusters[1].weight = 0;
  EXPECT_NE(o.Validate().message().find("weight 0"), std::string::npos) << o.Validate();
  o.clusters[1].weight = 1;
  o.clusters[1].min = 5;
  o.clusters[1].max = 2;
  EXPECT_NE(o.Validate().message().find("min 5 and max 2"), std::string::npos) << o.Validate();
  o.clusters[1].max = 0;
  EXPECT_TRUE(o.Validate().ok());
  o.clusters[1].runtime = nullptr;
  EXPECT_NE(o.Validate().message().find("no runtime"), std::string::npos) << o.Validate();
}

}  // namespace
}  // namespace sbx::k8s

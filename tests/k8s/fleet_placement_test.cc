// The fleet's placement of creates (src/k8s/fleet_placement.h), as pure functions: given
// each cluster's members, min, max, weight, measured rate and health, which cluster gets
// the next member of a pool.
#include "src/k8s/fleet_placement.h"

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sbx::k8s {
namespace {

ClusterLoad Load(std::string name, int64_t members, int64_t min = 0, int64_t max = 0,
                 double weight = 1, double rate = 0, bool healthy = true) {
  ClusterLoad c;
  c.name = std::move(name);
  c.members = members;
  c.min = min;
  c.max = max;
  c.weight = weight;
  c.create_rate = rate;
  c.healthy = healthy;
  return c;
}

// Places `n` creates one after another (each counted where it went) and answers the
// members each cluster ends with.
std::map<std::string, int64_t> PlaceMany(std::vector<ClusterLoad> clusters, int n,
                                         FleetPlacement placement) {
  for (int i = 0; i < n; ++i) {
    absl::StatusOr<size_t> at = PlaceCreate("py", clusters, placement);
    EXPECT_TRUE(at.ok()) << at.status();
    if (!at.ok()) break;
    ++clusters[*at].members;
  }
  std::map<std::string, int64_t> out;
  for (const ClusterLoad& c : clusters) out[c.name] = c.members;
  return out;
}

TEST(FleetPlacementTest, ParsesTheThreePoliciesAndNamesABadOne) {
  EXPECT_EQ(*ParseFleetPlacement("spread"), FleetPlacement::kSpread);
  EXPECT_EQ(*ParseFleetPlacement("pack"), FleetPlacement::kPack);
  EXPECT_EQ(*ParseFleetPlacement("weighted"), FleetPlacement::kWeighted);
  absl::StatusOr<FleetPlacement> bad = ParseFleetPlacement("random");
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("\"random\""), std::string::npos) << bad.status();
  EXPECT_EQ(FleetPlacementName(FleetPlacement::kWeighted), "weighted");
}

TEST(FleetPlacementTest, SpreadTakesTheFewestMembersAndTiesGoToTheEarlierCluster) {
  EXPECT_EQ(*PlaceCreate("py", {Load("a", 3), Load("b", 1), Load("c", 2)}, FleetPlacement::kSpread),
            1u);
  EXPECT_EQ(*PlaceCreate("py", {Load("a", 2), Load("b", 2), Load("c", 2)}, FleetPlacement::kSpread),
            0u);
  EXPECT_EQ(PlaceMany({Load("a", 0), Load("b", 0), Load("c", 0)}, 9, FleetPlacement::kSpread),
            (std::map<std::string, int64_t>{{"a", 3}, {"b", 3}, {"c", 3}}));
  // An uneven start evens out before the clusters take turns.
  EXPECT_EQ(PlaceMany({Load("a", 5), Load("b", 0), Load("c", 1)}, 7, FleetPlacement::kSpread),
            (std::map<std::string, int64_t>{{"a", 5}, {"b", 4}, {"c", 4}}));
}

TEST(FleetPlacementTest, MinimumsComeFirstLargestDeficitFirst) {
  // b lacks 1 of its min, c lacks 3: c first, though spread would pick a.
  EXPECT_EQ(
      *PlaceCreate("py", {Load("a", 0), Load("b", 1, 2), Load("c", 2, 5)}, FleetPlacement::kSpread),
      2u);
  EXPECT_EQ(PlaceMany({Load("a", 0), Load("b", 0, 4)}, 5, FleetPlacement::kSpread),
            (std::map<std::string, int64_t>{{"a", 1}, {"b", 4}}));
}

TEST(FleetPlacementTest, MaximumsAndUnhealthyClustersArePassedOver) {
  EXPECT_EQ(PlaceMany({Load("a", 0, 0, 2), Load("b", 0), Load("c", 0, 0, 0, 1, 0, false)}, 6,
                      FleetPlacement::kSpread),
            (std::map<std::string, int64_t>{{"a", 2}, {"b", 4}, {"c", 0}}));
  // An unhealthy cluster's min is not served either.
  EXPECT_EQ(
      *PlaceCreate("py", {Load("a", 3), Load("b", 0, 5, 0, 1, 0, false)}, FleetPlacement::kSpread),
      0u);
}

TEST(FleetPlacementTest, NoClusterCanTakeOneNamesThePoolAndWhy) {
  absl::StatusOr<size_t> none = PlaceCreate(
      "team-a/py", {Load("a", 2, 0, 2), Load("b", 0, 0, 0, 1, 0, false)}, FleetPlacement::kPack);
  ASSERT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string m(none.status().message());
  EXPECT_NE(m.find("pool \"team-a/py\""), std::string::npos) << m;
  EXPECT_NE(m.find("a at its max of 2"), std::string::npos) << m;
  EXPECT_NE(m.find("b unhealthy"), std::string::npos) << m;
  EXPECT_EQ(PlaceCreate("py", {}, FleetPlacement::kSpread).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(FleetPlacementTest, PackFillsTheFirstClusterToItsMaxThenTheNext) {
  EXPECT_EQ(
      PlaceMany({Load("a", 0, 0, 3), Load("b", 0, 0, 2), Load("c", 0)}, 7, FleetPlacement::kPack),
      (std::map<std::string, int64_t>{{"a", 3}, {"b", 2}, {"c", 2}}));
  // A min elsewhere is still served first.
  EXPECT_EQ(PlaceMany({Load("a", 0), Load("b", 0, 1)}, 3, FleetPlacement::kPack),
            (std::map<std::string, int64_t>{{"a", 2}, {"b", 1}}));
}

TEST(FleetPlacementTest, WeightedSplitsByWeightTimesMeasuredRate) {
  // Equal rates: by weight, 2:1:1.
  EXPECT_EQ(
      PlaceMany({Load("a", 0, 0, 0, 2, 10), Load("b", 0, 0, 0, 1, 10), Load("c", 0, 0, 0, 1, 10)},
                8, FleetPlacement::kWeighted),
      (std::map<std::string, int64_t>{{"a", 4}, {"b", 2}, {"c", 2}}));
  // Equal weights: by rate, 90:18.6 (as upstream measured its fastest and slowest
  // clusters), so about 5 to 1 of 12.
  const auto split = PlaceMany({Load("fast", 0, 0, 0, 1, 90), Load("slow", 0, 0, 0, 1, 18.6)}, 12,
                               FleetPlacement::kWeighted);
  EXPECT_EQ(split.at("fast"), 10);
  EXPECT_EQ(split.at("slow"), 2);
  // A cluster without a measured rate counts at the mean of the measured ones (50 here),
  // so it is not starved of the creates that would measure it.
  const auto fresh =
      PlaceMany({Load("a", 0, 0, 0, 1, 90), Load("b", 0, 0, 0, 1, 10), Load("new", 0)}, 15,
                FleetPlacement::kWeighted);
  EXPECT_EQ(fresh.at("a"), 9);
  EXPECT_EQ(fresh.at("b"), 1);
  EXPECT_EQ(fresh.at("new"), 5);
  // Nothing measured: by weight alone.
  EXPECT_EQ(PlaceMany({Load("a", 0, 0, 0, 3), Load("b", 0)}, 8, FleetPlacement::kWeighted),
            (std::map<std::string, int64_t>{{"a", 6}, {"b", 2}}));
}

}  // namespace
}  // namespace sbx::k8s

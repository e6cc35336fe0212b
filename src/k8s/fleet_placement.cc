#include "src/k8s/fleet_placement.h"

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace sbx::k8s {

absl::StatusOr<FleetPlacement> ParseFleetPlacement(absl::string_view name) {
  if (name == "spread") return FleetPlacement::kSpread;
  if (name == "pack") return FleetPlacement::kPack;
  if (name == "weighted") return FleetPlacement::kWeighted;
  return absl::InvalidArgumentError(
      absl::StrCat("fleet placement \"", name, "\" is not one of spread, pack, weighted"));
}

absl::string_view FleetPlacementName(FleetPlacement placement) {
  switch (placement) {
    case FleetPlacement::kSpread:
      return "spread";
    case FleetPlacement::kPack:
      return "pack";
    case FleetPlacement::kWeighted:
      return "weighted";
  }
  return "spread";
}

absl::StatusOr<size_t> PlaceCreate(absl::string_view pool, const std::vector<ClusterLoad>& clusters,
                                   FleetPlacement placement) {
  auto open = [](const ClusterLoad& c) { return c.healthy && (c.max <= 0 || c.members < c.max); };
  // 1. Minimums first, the largest deficit first.
  std::optional<size_t> best;
  for (size_t i = 0; i < clusters.size(); ++i) {
    const ClusterLoad& c = clusters[i];
    if (!open(c) || c.members >= c.min) continue;
    if (!best || c.min - c.members > clusters[*best].min - clusters[*best].members) best = i;
  }
  if (best) return *best;

  // The rate a cluster counts at under kWeighted.
  double measured_sum = 0;
  int measured = 0;
  for (const ClusterLoad& c : clusters) {
    if (c.create_rate > 0) {
      measured_sum += c.create_rate;
      ++measured;
    }
  }
  const double default_rate = measured > 0 ? measured_sum / measured : 1.0;
  auto share = [&](const ClusterLoad& c) {
    const double rate = c.create_rate > 0 ? c.create_rate : default_rate;
    const double w = (c.weight > 0 ? c.weight : 1.0) * rate;
    return static_cast<double>(c.members) / w;
  };

  // 2. The policy among the open clusters.
  for (size_t i = 0; i < clusters.size(); ++i) {
    const ClusterLoad& c = clusters[i];
    if (!open(c)) continue;
    if (!best) {
      best = i;
      if (placement == FleetPlacement::kPack) break;
      continue;
    }
    const ClusterLoad& b = clusters[*best];
    if (placement == FleetPlacement::kSpread && c.members < b.members) best = i;
    if (placement == FleetPlacement::kWeighted && share(c) < share(b)) best = i;
  }
  if (best) return *best;

  std::vector<std::string> why;
  for (const ClusterLoad& c : clusters) {
    why.push_back(c.healthy ? absl::StrCat(c.name, " at its max of ", c.max)
                            : absl::StrCat(c.name, " ", c.unhealthy_reason));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "pool \"", pool, "\": no cluster of the fleet can take another member (",
      why.empty() ? std::string("the fleet has no cluster") : absl::StrJoin(why, "; "), ")"));
}

}  // namespace sbx::k8s

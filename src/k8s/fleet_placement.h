#pragma once
// Fleet placement (docs/kubernetes.md, "Fleet"): which cluster of a fleet gets the next
// member of a pool. Pure functions of what the fleet runtime knows about each cluster for
// that pool, so that the policy is tested without clusters.
//
// Thread-safety: stateless; every function may be called from any thread.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sbx::k8s {

enum class FleetPlacement : uint8_t {
  // The cluster with the fewest members of the pool.
  kSpread,
  // The first cluster (in fleet order: home, then as the flags give them) below its max.
  kPack,
  // Members in proportion to weight x measured create rate.
  kWeighted,
};

// "spread", "pack", "weighted"; INVALID_ARGUMENT naming the value and the known ones.
[[nodiscard]] absl::StatusOr<FleetPlacement> ParseFleetPlacement(absl::string_view name);
absl::string_view FleetPlacementName(FleetPlacement placement);

// One cluster as the placement sees it, for one pool.
struct ClusterLoad {
  std::string name;
  // Members of the pool in the cluster: ready ones and those being made.
  int64_t members = 0;
  // Members kept in the cluster at least (served before any other rule) and at most
  // (0: no maximum).
  int64_t min = 0;
  int64_t max = 0;
  // The operator's weight (> 0) and the measured create rate (1 / the mean time from
  // create to ready over the last minute; <= 0 when not measured yet). Only kWeighted
  // reads them.
  double weight = 1;
  double create_rate = 0;
  // False: the cluster takes no creates now (excluded as lost, or backing off after
  // failed creates); `unhealthy_reason` says which, for the error message.
  bool healthy = true;
  std::string unhealthy_reason = "unhealthy";
};

// The index in `clusters` of the cluster that gets the next member:
// 1. among healthy clusters below their max, one below its min, the largest deficit
//    first;
// 2. otherwise by `placement` among healthy clusters below their max: kSpread the fewest
//    members; kPack the first; kWeighted the smallest members / (weight x rate), a cluster
//    without a measured rate counting at the mean of the measured ones (or 1 when none is
//    measured), so that a new cluster gets members and so a rate.
// Ties go to the earlier cluster. RESOURCE_EXHAUSTED when no cluster can take one, naming
// `pool` and why each cluster was passed over (at its max, unhealthy).
[[nodiscard]] absl::StatusOr<size_t> PlaceCreate(absl::string_view pool,
                                                 const std::vector<ClusterLoad>& clusters,
                                                 FleetPlacement placement);

}  // namespace sbx::k8s

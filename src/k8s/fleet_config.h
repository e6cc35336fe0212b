#pragma once
// The member clusters of a fleet as sbx-server's `--cluster` flag gives them
// (docs/kubernetes.md, "Fleet"): `NAME=KUBECONFIG[,key=value...]`.
//
// Thread-safety: stateless.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace sbx::k8s {

struct ClusterSpec {
  // A DNS-1123 label, the cluster's name in fleet ids and in the sbx.dev/cluster label.
  std::string name;
  // A kubeconfig file ("in-cluster" is refused: a member cluster is another cluster).
  std::string kubeconfig;
  // Keys: context; qps, burst (its API client); write_qps, write_burst (its write
  // scheduler); unset ones take the home cluster's flags.
  std::string context;
  std::optional<double> qps;
  std::optional<int> burst;
  std::optional<double> write_qps;
  std::optional<int> write_burst;
  // Placement (FleetCluster): weight > 0, members per pool at least / at most (0: none).
  double weight = 1;
  int64_t min = 0;
  int64_t max = 0;
};

// Parses one `--cluster` value. INVALID_ARGUMENT quoting the value and naming what is
// wrong: no "NAME=", a bad name, no kubeconfig, an unknown or repeated key, a value that
// is not a number of the key's kind or is out of range (qps, write_qps, weight > 0;
// burst, write_burst >= 1; min, max >= 0; min <= max unless max is 0).
[[nodiscard]] absl::StatusOr<ClusterSpec> ParseClusterSpec(absl::string_view text);

}  // namespace sbx::k8s

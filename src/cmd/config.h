#pragma once
// The server's start-up configuration file (YAML): templates and pools to declare at
// start, in the shape of the sbx.v1 API messages. Example: scripts/example-config.yaml.
//
//   templates:
//     - name: default
//       runtime: local            # local | kubernetes
//       local:
//         network: false
//         env: {LANG: C.UTF-8}
//         mounts: [{source: /opt/data, target: /data, read_only: true}]
//         memory_limit_bytes: 536870912
//         pids_limit: 256
//         workspace_size_bytes: 268435456
//   pools:
//     - name: default
//       template: default
//       min_warm: 2
//       max_warm: 8
//       empty_pool_policy: wait   # wait | cold | fail
//       default_wait: 30s         # durations as "300ms", "30s", "1h"
//       default_ttl: 1h
//       max_ttl: 24h
//
// Unknown keys are errors (a typo must not be silently ignored).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "sbx/v1/admin.pb.h"

namespace sbx::cmd {

struct ServerConfig {
  std::vector<sbx::v1::Template> templates;
  std::vector<sbx::v1::Pool> pools;
};

// INVALID_ARGUMENT naming the file, the entry and the bad key or value; NOT_FOUND when
// the file cannot be read.
[[nodiscard]] absl::StatusOr<ServerConfig> LoadConfig(const std::string& path);

// OK when `text` (JSON or YAML) has the shape of a core/v1 PodTemplateSpec as far as sbx
// uses it: a mapping with an optional "metadata" mapping and a "spec" mapping whose
// "containers" is a non-empty list of mappings, each with a non-empty "name" and
// "image". Otherwise INVALID_ARGUMENT "<field>: <what is wrong>" naming the place.
[[nodiscard]] absl::Status CheckPodTemplateShape(const std::string& field, const std::string& text);

// The `image` of every container (spec.containers, not init containers) of a pod template
// given as JSON or YAML, in order; none when `text` does not parse or has no such list.
// What a claim by image matches a kubernetes template's pod template against.
std::vector<std::string> PodTemplateImages(const std::string& text);

}  // namespace sbx::cmd

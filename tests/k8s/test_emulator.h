#pragma once
// Test side of the API emulator: TestEmulator starts tests/kube_emulator's binary and fails
// the test when it or an admin call does not work; manifests and CRDs for tests.

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/k8s/emulator_process.h"

namespace sbx::k8s::testing {

class TestEmulator : public emulator::EmulatorProcess {
 public:
  explicit TestEmulator(std::vector<std::string> args = {}, std::string ca_pem = "")
      : EmulatorProcess(SBX_KUBE_EMULATOR, std::move(args), std::move(ca_pem)) {
    if (!ok()) ADD_FAILURE() << error();
  }

  // The parsed answer of an admin call (null, with a test failure, when it fails).
  Json Admin(const std::string& method, const std::string& path, const Json& body = nullptr) {
    absl::StatusOr<Json> answer = AdminCall(method, path, body);
    if (!answer.ok()) {
      ADD_FAILURE() << answer.status();
      return nullptr;
    }
    return *std::move(answer);
  }
  void SetFaults(const Json& faults) { Admin("POST", "/emulator/faults", faults); }
  void ClearFaults() {
    SetFaults({{"latency_ms", 0},
               {"errors", {{"429", 0}, {"500", 0}, {"503", 0}, {"409", 0}, {"410", 0}}},
               {"qps_limit", 0},
               {"watch_drop_rate", 0}});
  }
  // How many requests of `key` ("create leases") the emulator has seen.
  int64_t Requests(const std::string& key) {
    Json stats = Admin("GET", "/emulator/stats");
    return stats.is_object() ? stats["requests"].value(key, int64_t{0}) : -1;
  }
};

// Creates the project's CRDs (charts/sbx/crds) through `client`.
inline void InstallCrds(Client& client) {
  for (const Json& crd :
       emulator::LoadManifests(std::string(SBX_SOURCE_DIR) + "/charts/sbx/crds")) {
    absl::StatusOr<Json> created = client.Create(kCustomResourceDefinitions, "", crd);
    ASSERT_TRUE(created.ok()) << created.status();
  }
}

// Polls `done` every 5 ms until it holds (true) or `timeout` passes (false): a bounded
// wait for a positive marker.
inline bool Eventually(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

// Writes Sandbox `name`'s status as the Sandbox controller does once its pod is Ready:
// condition Ready True (changed now) and the pod IP `ip`.
inline absl::Status MarkSandboxReady(Client& client, const std::string& ns, const std::string& name,
                                     const std::string& ip) {
  const std::string now = absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
  return client
      .Patch(kSandboxes, ns, name, PatchType::kMerge,
             {{"status",
               {{"conditions",
                 {{{"type", "Ready"},
                   {"status", "True"},
                   {"reason", "DependenciesReady"},
                   {"message", "the pod is ready"},
                   {"lastTransitionTime", now}}}},
                {"podIPs", {ip}}}}},
             "status")
      .status();
}

}  // namespace sbx::k8s::testing

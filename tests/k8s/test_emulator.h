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
#include "src/k8s/objects_types.h"
#include "tests/k8s/emulator_process.h"

namespace sbx::k8s::testing {

class TestEmulator : public emulator::EmulatorProcess {
 public:
  explicit TestEmulator(std::vector<std::string> args = {}, std::string ca_pem = "")
      : EmulatorProcess(SBX_KUBE_EMULATOR, std::move(args), std::move(ca_pem)) {
    if (!ok()) ADD_FAILURE() << error();
  }
  // Every object the test left in the emulator must survive the typed round trip.
  ~TestEmulator() { ExpectTypedRoundTrip(); }

  // Decodes every object of the kinds src/k8s/objects_types.h types (in every namespace,
  // as the emulator holds it: server-set fields, controllers' writes, the test's own
  // objects) and fails the test when encoding one does not give back the same JSON. A kind
  // that cannot be listed (no CRDs installed, a TLS-only emulator) is skipped.
  void ExpectTypedRoundTrip() {
    if (!ok() || !SetFaultsQuietly()) return;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(Cluster());
    if (!client.ok()) return;
    auto check = [&](const Resource& resource, auto decode) {
      ListOptions options;
      std::string version;
      absl::StatusOr<std::vector<Json>> objects =
          (*client)->ListAll(resource, "", options, &version);
      if (!objects.ok()) return;
      for (Json& object : *objects) {
        // A list's items have no apiVersion and kind; what the test compares is the rest.
        auto decoded = decode(object);
        if (!decoded.ok()) {
          ADD_FAILURE() << "typed decode of a " << resource.kind << " failed: " << decoded.status();
          continue;
        }
        const Json again = types::Encode(*decoded);
        if (again != object) {
          ADD_FAILURE() << resource.kind << " " << object["metadata"].dump()
                        << " changes on a typed round trip: " << Json::diff(object, again).dump();
        }
        ++round_trips_;
      }
    };
    check(kSandboxes, types::DecodeSandbox);
    check(kSandboxClaims, types::DecodeSandboxClaim);
    check(kSandboxWarmPools, types::DecodeSandboxWarmPool);
    check(kSandboxTemplates, types::DecodeSandboxTemplate);
    check(kLeases, types::DecodeLease);
    check(kPods, types::DecodePod);
    check(kServices, types::DecodeService);
    check(kPersistentVolumeClaims, types::DecodePersistentVolumeClaim);
    check(kNetworkPolicies, types::DecodeNetworkPolicy);
  }
  // How many objects ExpectTypedRoundTrip has checked.
  int64_t round_trips() const { return round_trips_; }

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
  void ClearFaults() { SetFaults(kNoFaults()); }
  // How many requests of `key` ("create leases") the emulator has seen.
  int64_t Requests(const std::string& key) {
    Json stats = Admin("GET", "/emulator/stats");
    return stats.is_object() ? stats["requests"].value(key, int64_t{0}) : -1;
  }

 private:
  static Json kNoFaults() {
    return {{"latency_ms", 0},
            {"errors", {{"429", 0}, {"500", 0}, {"503", 0}, {"409", 0}, {"410", 0}}},
            {"qps_limit", 0},
            {"watch_drop_rate", 0}};
  }
  // Clears the faults without failing the test when the emulator no longer answers.
  bool SetFaultsQuietly() { return AdminCall("POST", "/emulator/faults", kNoFaults()).ok(); }

  int64_t round_trips_ = 0;
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

#pragma once
// Test side of the API emulator: TestEmulator starts tests/kube_emulator's binary and fails
// the test when it or an admin call does not work; manifests and CRDs for tests.

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/k8s/emulator_process.h"
#include "yaml-cpp/yaml.h"

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

// YAML (as in a manifest) to JSON, scalars typed the way YAML 1.2's core schema reads them.
inline Json YamlToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      Json out = Json::object();
      for (const auto& entry : node) out[entry.first.as<std::string>()] = YamlToJson(entry.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      Json out = Json::array();
      for (const auto& entry : node) out.push_back(YamlToJson(entry));
      return out;
    }
    case YAML::NodeType::Scalar: {
      const std::string text = node.Scalar();
      if (node.Tag() == "!") return text;  // quoted
      if (text == "true") return true;
      if (text == "false") return false;
      if (text == "null" || text == "~") return nullptr;
      char* end = nullptr;
      long long integer = std::strtoll(text.c_str(), &end, 10);
      if (!text.empty() && end == text.c_str() + text.size()) return integer;
      return text;
    }
    default:
      return nullptr;
  }
}

// Every document of every *.yaml file in `dir`.
inline std::vector<Json> LoadManifests(const std::string& dir) {
  std::vector<Json> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    for (const YAML::Node& doc : YAML::LoadAllFromFile(entry.path().string())) {
      if (doc.IsMap()) out.push_back(YamlToJson(doc));
    }
  }
  return out;
}

// Creates the project's CRDs (charts/sbx/crds) through `client`.
inline void InstallCrds(Client& client) {
  for (const Json& crd : LoadManifests(std::string(SBX_SOURCE_DIR) + "/charts/sbx/crds")) {
    absl::StatusOr<Json> created = client.Create(kCustomResourceDefinitions, "", crd);
    ASSERT_TRUE(created.ok()) << created.status();
  }
}

}  // namespace sbx::k8s::testing

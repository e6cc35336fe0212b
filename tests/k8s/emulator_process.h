#pragma once
// Runs tests/kube_emulator's binary on a free loopback port and talks to its admin
// endpoint (for tests and benchmarks; no gtest here). The emulator prints
// "kube-emulator: serving on <url>" once listening.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "src/k8s/client.h"
#include "src/k8s/http.h"
#include "yaml-cpp/yaml.h"

extern char** environ;

namespace sbx::k8s::emulator {

class EmulatorProcess {
 public:
  // Starts `binary` with `args`; ok() tells whether it came up, error() why not.
  EmulatorProcess(const std::string& binary, std::vector<std::string> args,
                  std::string ca_pem = "") {
    int out[2];
    if (pipe(out) != 0) {
      error_ = "pipe failed";
      return;
    }
    std::vector<std::string> argv = {binary, "--listen", "127.0.0.1:0"};
    for (auto& arg : args) argv.push_back(arg);
    std::vector<char*> cargv;
    for (auto& arg : argv) cargv.push_back(arg.data());
    cargv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    if (posix_spawn(&pid_, binary.c_str(), &actions, nullptr, cargv.data(), environ) != 0) {
      error_ = "cannot start " + binary;
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    std::string line;
    char c;
    while (read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
    close(out[0]);
    const std::string marker = "serving on ";
    auto at = line.find(marker);
    if (at == std::string::npos) {
      if (error_.empty()) error_ = "emulator did not start; it printed: " + line;
      return;
    }
    url_ = line.substr(at + marker.size());
    TransportOptions options;
    options.server = url_;
    options.ca_pem = std::move(ca_pem);
    auto transport = NewCpprestTransport(options);
    if (!transport.ok()) {
      error_ = transport.status().ToString();
      return;
    }
    admin_ = *std::move(transport);
  }

  ~EmulatorProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  const std::string& url() const { return url_; }
  bool ok() const { return admin_ != nullptr; }
  const std::string& error() const { return error_; }

  ClusterConfig Cluster() const {
    ClusterConfig cluster;
    cluster.server = url_;
    return cluster;
  }

  // POST/GET on /emulator/...; the parsed JSON answer.
  absl::StatusOr<Json> AdminCall(const std::string& method, const std::string& path,
                                 const Json& body = nullptr) {
    HttpRequest request;
    request.method = method;
    request.path = path;
    if (!body.is_null()) {
      request.body = body.dump();
      request.headers.emplace_back("Content-Type", "application/json");
    }
    absl::StatusOr<HttpResponse> response = admin_->Send(request);
    if (!response.ok()) return response.status();
    if (response->status != 200) {
      return absl::InternalError(
          absl::StrCat(method, " ", path, ": ", response->status, " ", response->body));
    }
    Json parsed = Json::parse(response->body, nullptr, false);
    if (parsed.is_discarded()) return absl::InternalError(path + ": answer is not JSON");
    return parsed;
  }

 private:
  pid_t pid_ = -1;
  std::string url_;
  std::unique_ptr<HttpTransport> admin_;
  std::string error_;
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

}  // namespace sbx::k8s::emulator

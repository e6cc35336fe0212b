#include "src/cmd/config.h"

#include <fstream>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "src/allocator/allocator.h"
#include "yaml-cpp/yaml.h"

namespace sbx::cmd {
namespace {

// yaml-cpp reports errors by exception; they stop in this file and become Status.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void CheckKeys(const YAML::Node& node, const std::set<std::string>& allowed,
               const std::string& where) {
  if (!node.IsMap()) throw ConfigError(absl::StrCat(where, ": expected a mapping"));
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (!allowed.contains(key))
      throw ConfigError(absl::StrCat(where, ": unknown key \"", key, "\""));
  }
}

void SetDuration(const YAML::Node& node, const std::string& where,
                 google::protobuf::Duration* out) {
  if (!node) return;
  const std::string text = node.as<std::string>();
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d < absl::ZeroDuration()) {
    throw ConfigError(absl::StrCat(where, ": \"", text, "\" is not a duration like 30s or 1h"));
  }
  const int64_t s = absl::ToInt64Seconds(d);
  out->set_seconds(s);
  out->set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(d - absl::Seconds(s))));
}

sbx::v1::Template ParseTemplate(const YAML::Node& n, const std::string& where) {
  CheckKeys(n, {"name", "runtime", "local"}, where);
  sbx::v1::Template t;
  t.set_name(n["name"].as<std::string>(""));
  t.set_runtime(n["runtime"].as<std::string>("local"));
  if (const YAML::Node local = n["local"]) {
    const std::string lw = where + ".local";
    CheckKeys(local,
              {"image", "network", "env", "mounts", "memory_limit_bytes", "pids_limit",
               "workspace_size_bytes", "layer_size_bytes", "command", "snapshot"},
              lw);
    sbx::v1::LocalSpec* spec = t.mutable_local();
    spec->set_image(local["image"].as<std::string>(""));
    spec->set_network(local["network"].as<bool>(false));
    if (const YAML::Node env = local["env"]) {
      for (const auto& kv : env) {
        (*spec->mutable_env())[kv.first.as<std::string>()] = kv.second.as<std::string>();
      }
    }
    if (const YAML::Node command = local["command"]) {
      for (const auto& a : command) spec->add_command(a.as<std::string>());
    }
    if (const YAML::Node mounts = local["mounts"]) {
      int i = 0;
      for (const auto& m : mounts) {
        CheckKeys(m, {"source", "target", "read_only"}, absl::StrCat(lw, ".mounts[", i++, "]"));
        sbx::v1::BindMount* bm = spec->add_mounts();
        bm->set_source(m["source"].as<std::string>(""));
        bm->set_target(m["target"].as<std::string>(""));
        bm->set_read_only(m["read_only"].as<bool>(true));
      }
    }
    spec->set_memory_limit_bytes(local["memory_limit_bytes"].as<int64_t>(0));
    spec->set_pids_limit(local["pids_limit"].as<int64_t>(0));
    spec->set_workspace_size_bytes(local["workspace_size_bytes"].as<int64_t>(0));
    spec->set_layer_size_bytes(local["layer_size_bytes"].as<int64_t>(0));
    spec->set_snapshot(local["snapshot"].as<std::string>(""));
  }
  return t;
}

sbx::v1::Pool ParsePool(const YAML::Node& n, const std::string& where) {
  CheckKeys(n,
            {"name", "template", "min_warm", "max_warm", "empty_pool_policy", "default_wait",
             "default_ttl", "max_ttl", "selection_policy", "sizing"},
            where);
  sbx::v1::Pool p;
  p.set_name(n["name"].as<std::string>(""));
  p.set_template_(n["template"].as<std::string>(""));
  p.set_min_warm(n["min_warm"].as<int32_t>(0));
  p.set_max_warm(n["max_warm"].as<int32_t>(p.min_warm()));
  const std::string policy = n["empty_pool_policy"].as<std::string>("wait");
  if (policy == "wait") {
    p.set_empty_pool_policy(sbx::v1::EMPTY_POOL_POLICY_WAIT);
  } else if (policy == "cold") {
    p.set_empty_pool_policy(sbx::v1::EMPTY_POOL_POLICY_COLD);
  } else if (policy == "fail") {
    p.set_empty_pool_policy(sbx::v1::EMPTY_POOL_POLICY_FAIL);
  } else {
    throw ConfigError(
        absl::StrCat(where, ": empty_pool_policy \"", policy, "\" is not one of wait, cold, fail"));
  }
  SetDuration(n["default_wait"], where + ".default_wait", p.mutable_default_wait());
  SetDuration(n["default_ttl"], where + ".default_ttl", p.mutable_default_ttl());
  SetDuration(n["max_ttl"], where + ".max_ttl", p.mutable_max_ttl());
  p.set_selection_policy(n["selection_policy"].as<std::string>("fifo"));
  const std::string sizing = n["sizing"].as<std::string>("static");
  if (sizing == "static") {
    p.set_sizing(sbx::v1::POOL_SIZING_STATIC);
  } else if (sizing == "demand") {
    p.set_sizing(sbx::v1::POOL_SIZING_DEMAND);
  } else {
    throw ConfigError(
        absl::StrCat(where, ": sizing \"", sizing, "\" is not one of static, demand"));
  }
  if (!sbx::allocator::IsSelectionPolicy(p.selection_policy())) {
    throw ConfigError(absl::StrCat(where, ": selection_policy \"", p.selection_policy(),
                                   "\" is not one of ", sbx::allocator::KnownSelectionPolicies()));
  }
  return p;
}

}  // namespace

absl::StatusOr<ServerConfig> LoadConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config file \"", path, "\" cannot be read"));
  try {
    const YAML::Node root = YAML::Load(in);
    ServerConfig config;
    if (!root || root.IsNull()) return config;
    CheckKeys(root, {"templates", "pools"}, path);
    int i = 0;
    for (const auto& t : root["templates"]) {
      config.templates.push_back(ParseTemplate(t, absl::StrCat(path, ": templates[", i++, "]")));
    }
    i = 0;
    for (const auto& p : root["pools"]) {
      config.pools.push_back(ParsePool(p, absl::StrCat(path, ": pools[", i++, "]")));
    }
    return config;
  } catch (const ConfigError& e) {
    return absl::InvalidArgumentError(e.what());
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config file \"", path, "\": ", e.what()));
  }
}

absl::Status CheckPodTemplateShape(const std::string& field, const std::string& text) {
  auto bad = [&field](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", parts...));
  };
  try {
    const YAML::Node root = YAML::Load(text);
    if (!root.IsMap()) {
      return bad("not a pod template (a core/v1 PodTemplateSpec: a mapping with \"spec\")");
    }
    if (const YAML::Node meta = root["metadata"]; meta && !meta.IsMap()) {
      return bad("metadata is not a mapping");
    }
    const YAML::Node spec = root["spec"];
    if (!spec || !spec.IsMap()) {
      return bad("spec is missing or not a mapping (a pod template has a pod spec)");
    }
    const YAML::Node containers = spec["containers"];
    if (!containers || !containers.IsSequence() || containers.size() == 0) {
      return bad("spec.containers is missing, empty or not a list");
    }
    for (size_t i = 0; i < containers.size(); ++i) {
      const YAML::Node c = containers[i];
      const std::string where = absl::StrCat("spec.containers[", i, "]");
      if (!c.IsMap()) return bad(where, " is not a mapping");
      for (const char* key : {"name", "image"}) {
        const YAML::Node v = c[key];
        if (!v || !v.IsScalar() || v.as<std::string>().empty()) {
          return bad(where, ".", key, " is missing or empty");
        }
      }
    }
    return absl::OkStatus();
  } catch (const YAML::Exception& e) {
    return bad("does not parse as JSON or YAML: ", e.what());
  }
}

std::vector<std::string> PodTemplateImages(const std::string& text) {
  std::vector<std::string> images;
  try {
    const YAML::Node root = YAML::Load(text);
    if (!root.IsMap()) return images;
    const YAML::Node spec = root["spec"];
    if (!spec || !spec.IsMap()) return images;
    const YAML::Node containers = spec["containers"];
    if (!containers || !containers.IsSequence()) return images;
    for (const YAML::Node& c : containers) {
      if (!c.IsMap()) continue;
      const YAML::Node image = c["image"];
      if (image && image.IsScalar() && !image.as<std::string>().empty()) {
        images.push_back(image.as<std::string>());
      }
    }
  } catch (const YAML::Exception&) {
    images.clear();  // not a pod template: it runs no image we can tell
  }
  return images;
}

}  // namespace sbx::cmd

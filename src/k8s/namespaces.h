#pragma once
// Namespaces: which namespaces a controller serves, and the name an object of one of them
// has in the allocator. A SandboxWarmPool "py" of namespace "team-a" is the allocator pool
// "team-a/py" and its member Sandbox "py-x7k2q" the sandbox "team-a/py-x7k2q"; in the
// default namespace they are "py" and "py-x7k2q", as before namespaces were served
// (QualifiedName, src/common/ids.h). Object names never contain '/', so the mapping goes
// both ways.
//
// Thread-safety: immutable after construction.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "src/common/ids.h"
#include "src/k8s/json_fields.h"

namespace sbx::k8s {

struct Namespaces {
  // The namespace served; "" serves every namespace.
  std::string watch;
  // Objects of this namespace have their bare names in the allocator
  // (AllocatorOptions::default_namespace must be the same).
  std::string default_ns = "default";

  bool Serves(absl::string_view ns) const { return watch.empty() || ns == watch; }
  // The allocator's name of object `name` of namespace `ns`.
  std::string Qualify(absl::string_view ns, absl::string_view name) const {
    return QualifiedName(ns, name, default_ns);
  }
  // The allocator's name of `object` (its metadata's namespace and name).
  std::string Qualify(const nlohmann::json& object) const {
    const Json& meta = json_fields::Field(object, "metadata");
    return Qualify(json_fields::Str(meta, "namespace"), json_fields::Str(meta, "name"));
  }
  // The namespace and object name of an allocator name.
  NamespacedName Split(absl::string_view qualified) const {
    return SplitQualifiedName(qualified, default_ns);
  }
  // For messages: "<ns>/<name>" always.
  static std::string Path(const NamespacedName& n) { return absl::StrCat(n.ns, "/", n.name); }

  [[nodiscard]] absl::Status Validate(absl::string_view who) const {
    if (!watch.empty()) {
      if (absl::Status s = ValidateName(absl::StrCat(who, ": namespace"), watch); !s.ok()) return s;
    }
    return ValidateName(absl::StrCat(who, ": default namespace"), default_ns);
  }
};

}  // namespace sbx::k8s

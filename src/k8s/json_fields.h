#pragma once
// Reading fields of Kubernetes objects held as JSON, without exceptions: a missing field
// or one of another type reads as null / "".

#include <string>

#include "nlohmann/json.hpp"

namespace sbx::k8s::json_fields {

// object[key], or a null value when `object` is not a map or has no `key`.
inline const nlohmann::json& Field(const nlohmann::json& object, const char* key) {
  static const nlohmann::json kNull;
  if (!object.is_object()) return kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

// object[key] when it is a string, else "".
inline std::string Str(const nlohmann::json& object, const char* key) {
  const nlohmann::json& value = Field(object, key);
  return value.is_string() ? value.get<std::string>() : std::string();
}

// Whether a Kubernetes object is being deleted (metadata.deletionTimestamp is set).
inline bool BeingDeleted(const nlohmann::json& object) {
  return !Field(Field(object, "metadata"), "deletionTimestamp").is_null();
}

// The condition of type `type` in status.conditions (`status` is the object's status),
// or null.
inline const nlohmann::json* FindCondition(const nlohmann::json& status, const std::string& type) {
  const nlohmann::json& conditions = Field(status, "conditions");
  if (!conditions.is_array()) return nullptr;
  for (const nlohmann::json& c : conditions) {
    if (Str(c, "type") == type) return &c;
  }
  return nullptr;
}

}  // namespace sbx::k8s::json_fields

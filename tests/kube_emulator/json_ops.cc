#include "tests/kube_emulator/json_ops.h"

#include <yaml-cpp/yaml.h>

#include <map>
#include <optional>
#include <regex>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace kube_emulator {
namespace {

std::string Trim(absl::string_view s) { return std::string(absl::StripAsciiWhitespace(s)); }

// Splits on commas that are not inside parentheses.
std::vector<std::string> SplitTopLevel(absl::string_view text) {
  std::vector<std::string> out;
  int depth = 0;
  std::string cur;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  out.push_back(cur);
  return out;
}

std::string FieldString(const json* v) {
  if (v == nullptr || v->is_null()) return "";
  if (v->is_string()) return v->get<std::string>();
  return v->dump();
}

}  // namespace

absl::StatusOr<LabelSelector> ParseLabelSelector(absl::string_view text) {
  LabelSelector sel;
  if (Trim(text).empty()) return sel;
  for (const std::string& raw : SplitTopLevel(text)) {
    std::string term = Trim(raw);
    if (term.empty()) return absl::InvalidArgumentError("empty label selector term");
    LabelRequirement r;
    size_t paren = term.find('(');
    if (paren != std::string::npos) {
      if (term.back() != ')') {
        return absl::InvalidArgumentError(absl::StrCat("bad label selector term \"", term, "\""));
      }
      std::string lhs = Trim(term.substr(0, paren));
      size_t sp = lhs.find_last_of(" \t");
      if (sp == std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat("bad label selector term \"", term, "\""));
      }
      std::string op = Trim(lhs.substr(sp + 1));
      r.key = Trim(lhs.substr(0, sp));
      if (op == "in") {
        r.op = LabelRequirement::Op::kIn;
      } else if (op == "notin") {
        r.op = LabelRequirement::Op::kNotIn;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("unknown label selector operator ", op));
      }
      for (absl::string_view v :
           absl::StrSplit(term.substr(paren + 1, term.size() - paren - 2), ',')) {
        r.values.push_back(Trim(v));
      }
    } else if (term[0] == '!') {
      r.op = LabelRequirement::Op::kNotExists;
      r.key = Trim(term.substr(1));
    } else if (size_t ne = term.find("!="); ne != std::string::npos) {
      r.op = LabelRequirement::Op::kNotEquals;
      r.key = Trim(term.substr(0, ne));
      r.values.push_back(Trim(term.substr(ne + 2)));
    } else if (size_t eq2 = term.find("=="); eq2 != std::string::npos) {
      r.op = LabelRequirement::Op::kEquals;
      r.key = Trim(term.substr(0, eq2));
      r.values.push_back(Trim(term.substr(eq2 + 2)));
    } else if (size_t eq = term.find('='); eq != std::string::npos) {
      r.op = LabelRequirement::Op::kEquals;
      r.key = Trim(term.substr(0, eq));
      r.values.push_back(Trim(term.substr(eq + 1)));
    } else {
      r.op = LabelRequirement::Op::kExists;
      r.key = term;
    }
    if (r.key.empty() || r.key.find_first_of(" \t()!=") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("bad label selector term \"", term, "\""));
    }
    sel.push_back(std::move(r));
  }
  return sel;
}

bool LabelsMatch(const LabelSelector& selector, const json& labels) {
  for (const LabelRequirement& r : selector) {
    const bool has = labels.is_object() && labels.contains(r.key);
    std::string value = has && labels[r.key].is_string() ? labels[r.key].get<std::string>() : "";
    switch (r.op) {
      case LabelRequirement::Op::kEquals:
        if (!has || value != r.values[0]) return false;
        break;
      case LabelRequirement::Op::kNotEquals:
        if (has && value == r.values[0]) return false;
        break;
      case LabelRequirement::Op::kIn:
        if (!has || std::find(r.values.begin(), r.values.end(), value) == r.values.end()) {
          return false;
        }
        break;
      case LabelRequirement::Op::kNotIn:
        if (has && std::find(r.values.begin(), r.values.end(), value) != r.values.end()) {
          return false;
        }
        break;
      case LabelRequirement::Op::kExists:
        if (!has) return false;
        break;
      case LabelRequirement::Op::kNotExists:
        if (has) return false;
        break;
    }
  }
  return true;
}

absl::StatusOr<FieldSelector> ParseFieldSelector(absl::string_view text) {
  FieldSelector sel;
  if (Trim(text).empty()) return sel;
  for (absl::string_view raw : absl::StrSplit(text, ',')) {
    std::string term = Trim(raw);
    FieldRequirement r;
    size_t pos;
    size_t skip;
    if ((pos = term.find("!=")) != std::string::npos) {
      r.negate = true;
      skip = 2;
    } else if ((pos = term.find("==")) != std::string::npos) {
      skip = 2;
    } else if ((pos = term.find('=')) != std::string::npos) {
      skip = 1;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("invalid field selector term \"", term, "\""));
    }
    r.path = Trim(term.substr(0, pos));
    r.value = Trim(term.substr(pos + skip));
    if (r.path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("invalid field selector term \"", term, "\""));
    }
    sel.push_back(std::move(r));
  }
  return sel;
}

bool FieldsMatch(const FieldSelector& selector, const json& object) {
  for (const FieldRequirement& r : selector) {
    bool eq = FieldString(GetPath(object, r.path)) == r.value;
    if (eq == r.negate) return false;
  }
  return true;
}

const json* GetPath(const json& object, absl::string_view dotted) {
  const json* cur = &object;
  for (absl::string_view part : absl::StrSplit(dotted, '.', absl::SkipEmpty())) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(std::string(part));
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur;
}

void SetPath(json& object, absl::string_view dotted, json value) {
  json* cur = &object;
  for (absl::string_view part : absl::StrSplit(dotted, '.', absl::SkipEmpty())) {
    if (!cur->is_object()) *cur = json::object();
    cur = &(*cur)[std::string(part)];
  }
  *cur = std::move(value);
}

namespace {

// MergePatch on `target` in place: each level is patched where it is, not copied.
void MergePatchInto(json& target, const json& patch) {
  if (!patch.is_object()) {
    target = patch;
    return;
  }
  if (!target.is_object()) target = json::object();
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    if (it->is_null()) {
      target.erase(it.key());
    } else {
      MergePatchInto(target[it.key()], *it);
    }
  }
}

}  // namespace

json MergePatch(const json& target, const json& patch) {
  json result = patch.is_object() ? target : json();
  MergePatchInto(result, patch);
  return result;
}

absl::StatusOr<json> JsonPatch(const json& target, const json& patch) {
  if (!patch.is_array()) {
    return absl::InvalidArgumentError("json patch must be an array of operations");
  }
  try {
    return target.patch(patch);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

namespace {

void StripDirectives(json& v) {
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end();) {
      if (absl::StartsWith(it.key(), "$")) {
        it = v.erase(it);
      } else {
        StripDirectives(*it);
        ++it;
      }
    }
  } else if (v.is_array()) {
    for (json& e : v) StripDirectives(e);
  }
}

// The merge key for a list field, judged by its name and first element.
std::string MergeKeyFor(const std::string& field, const json& sample) {
  static const char* kByName[] = {
      "containers",   "initContainers",   "ephemeralContainers", "volumes",      "env",
      "volumeMounts", "imagePullSecrets", "hostAliases__",       "volumeDevices"};
  for (const char* f : kByName) {
    if (field == f) return field == "volumeMounts" ? "mountPath" : "name";
  }
  if (field == "ports") {
    return sample.is_object() && sample.contains("containerPort") ? "containerPort" : "port";
  }
  if (field == "conditions") return "type";
  if (field == "ownerReferences") return "uid";
  if (field == "hostAliases") return "ip";
  if (field == "tolerations" || field == "finalizers") return "";
  return "";
}

json StrategicMergeValue(const json& target, const json& patch);

json StrategicMergeList(const std::string& field, const json& target, const json& patch) {
  if (patch.empty()) return json::array();
  // A whole-list replace directive: [{"$patch":"replace"}, ...items].
  for (const json& e : patch) {
    if (e.is_object() && e.value("$patch", "") == "replace") {
      json out = json::array();
      for (const json& x : patch) {
        if (!(x.is_object() && x.contains("$patch"))) out.push_back(x);
      }
      StripDirectives(out);
      return out;
    }
  }
  std::string key = MergeKeyFor(field, patch[0]);
  if (key.empty() || !target.is_array() || !patch[0].is_object()) {
    json out = patch;
    StripDirectives(out);
    return out;
  }
  json out = target;
  for (const json& e : patch) {
    if (!e.is_object() || !e.contains(key)) {
      json copy = e;
      StripDirectives(copy);
      out.push_back(copy);
      continue;
    }
    auto match = std::find_if(out.begin(), out.end(), [&](const json& x) {
      return x.is_object() && x.contains(key) && x[key] == e[key];
    });
    if (e.value("$patch", "") == "delete") {
      if (match != out.end()) out.erase(match);
      continue;
    }
    if (match != out.end()) {
      *match = StrategicMergeValue(*match, e);
    } else {
      json copy = e;
      StripDirectives(copy);
      out.push_back(copy);
    }
  }
  return out;
}

json StrategicMergeValue(const json& target, const json& patch) {
  if (!patch.is_object()) {
    json copy = patch;
    StripDirectives(copy);
    return copy;
  }
  std::string directive = patch.value("$patch", "");
  if (directive == "replace") {
    json copy = patch;
    StripDirectives(copy);
    return copy;
  }
  if (directive == "delete") return json();  // caller erases
  json result = target.is_object() ? target : json::object();
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    const std::string& k = it.key();
    if (absl::StartsWith(k, "$")) continue;
    if (it->is_null()) {
      result.erase(k);
    } else if (it->is_object()) {
      json merged = StrategicMergeValue(result.contains(k) ? result[k] : json(), *it);
      if (it->value("$patch", "") == "delete") {
        result.erase(k);
      } else {
        result[k] = merged;
      }
    } else if (it->is_array()) {
      result[k] = StrategicMergeList(k, result.contains(k) ? result[k] : json(), *it);
    } else {
      result[k] = *it;
    }
  }
  for (auto it = patch.begin(); it != patch.end(); ++it) {
    const std::string& k = it.key();
    if (absl::StartsWith(k, "$deleteFromPrimitiveList/") && it->is_array()) {
      std::string field = k.substr(strlen("$deleteFromPrimitiveList/"));
      if (result.contains(field) && result[field].is_array()) {
        json kept = json::array();
        for (const json& x : result[field]) {
          if (std::find(it->begin(), it->end(), x) == it->end()) kept.push_back(x);
        }
        result[field] = kept;
      }
    }
  }
  if (patch.contains("$retainKeys") && patch["$retainKeys"].is_array()) {
    const json& keep = patch["$retainKeys"];
    for (auto it = result.begin(); it != result.end();) {
      if (std::find(keep.begin(), keep.end(), json(it.key())) == keep.end()) {
        it = result.erase(it);
      } else {
        ++it;
      }
    }
  }
  return result;
}

std::string TypeOf(const json& v) {
  if (v.is_string()) return "string";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number()) return "number";
  if (v.is_array()) return "array";
  if (v.is_object()) return "object";
  return "null";
}

std::string Join(const std::string& base, const std::string& k) {
  return base.empty() ? k : absl::StrCat(base, ".", k);
}

void PruneAndDefault(json& v, const json& s, bool root, const std::string& path,
                     std::vector<std::string>* pruned, bool defaults = true) {
  if (!s.is_object()) return;
  if (v.is_object()) {
    const json* props = s.contains("properties") ? &s["properties"] : nullptr;
    bool preserve = s.value("x-kubernetes-preserve-unknown-fields", false);
    const json* additional =
        s.contains("additionalProperties") && s["additionalProperties"].is_object()
            ? &s["additionalProperties"]
            : nullptr;
    if (props != nullptr && defaults) {
      for (auto it = props->begin(); it != props->end(); ++it) {
        if (!v.contains(it.key()) && it->is_object() && it->contains("default")) {
          v[it.key()] = (*it)["default"];
        }
      }
    }
    for (auto it = v.begin(); it != v.end();) {
      if (root && (it.key() == "apiVersion" || it.key() == "kind" || it.key() == "metadata")) {
        ++it;
        continue;
      }
      if (props != nullptr && props->contains(it.key())) {
        PruneAndDefault(*it, (*props)[it.key()], false, Join(path, it.key()), pruned, defaults);
        ++it;
      } else if (additional != nullptr) {
        PruneAndDefault(*it, *additional, false, Join(path, it.key()), pruned, defaults);
        ++it;
      } else if (preserve) {
        ++it;
      } else {
        if (pruned != nullptr) pruned->push_back(Join(path, it.key()));
        it = v.erase(it);
      }
    }
  } else if (v.is_array() && s.contains("items")) {
    for (size_t i = 0; i < v.size(); ++i) {
      PruneAndDefault(v[i], s["items"], false, absl::StrCat(path, "[", i, "]"), pruned, defaults);
    }
  }
}

void Validate(const json& v, const json& s, const std::string& path,
              std::vector<SchemaError>& errors) {
  if (!s.is_object()) return;
  if (v.is_null()) {
    if (s.value("nullable", false) || s.empty()) return;
    if (s.contains("type")) {
      errors.push_back({path, "FieldValueTypeMismatch",
                        absl::StrCat("Invalid value: \"null\": ", path, " in body must be of type ",
                                     s["type"].get<std::string>(), ": \"null\"")});
    }
    return;
  }
  const bool int_or_string = s.value("x-kubernetes-int-or-string", false);
  if (int_or_string) {
    if (!v.is_string() && !v.is_number_integer() && !v.is_number_unsigned()) {
      errors.push_back(
          {path, "FieldValueTypeMismatch",
           absl::StrCat("Invalid value: \"", TypeOf(v), "\": ", path,
                        " in body must be of type integer or string: \"", TypeOf(v), "\"")});
    }
    // A string goes on to its pattern and lengths (a Quantity's pattern), as the API
    // server checks them; an integer is done.
    if (!v.is_string()) return;
  }
  if (!int_or_string && s.contains("type") && s["type"].is_string()) {
    std::string want = s["type"].get<std::string>();
    std::string got = TypeOf(v);
    bool ok = want == got || (want == "number" && got == "integer");
    if (!ok) {
      errors.push_back({path, "FieldValueTypeMismatch",
                        absl::StrCat("Invalid value: \"", got, "\": ", path,
                                     " in body must be of type ", want, ": \"", got, "\"")});
      return;
    }
  }
  if (s.contains("enum") && s["enum"].is_array()) {
    if (std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) {
      std::vector<std::string> allowed;
      for (const json& e : s["enum"]) allowed.push_back(QuoteValue(e));
      errors.push_back({path, "FieldValueNotSupported",
                        absl::StrCat("Unsupported value: ", QuoteValue(v),
                                     ": supported values: ", absl::StrJoin(allowed, ", "))});
    }
  }
  if (v.is_number()) {
    double d = v.get<double>();
    if (s.contains("minimum") && d < s["minimum"].get<double>()) {
      errors.push_back(
          {path, "FieldValueInvalid",
           absl::StrCat("Invalid value: ", v.dump(), ": ", path,
                        " in body should be greater than or equal to ", s["minimum"].dump())});
    }
    if (s.contains("maximum") && d > s["maximum"].get<double>()) {
      errors.push_back(
          {path, "FieldValueInvalid",
           absl::StrCat("Invalid value: ", v.dump(), ": ", path,
                        " in body should be less than or equal to ", s["maximum"].dump())});
    }
  }
  if (v.is_string()) {
    std::string str = v.get<std::string>();
    if (s.contains("pattern") && s["pattern"].is_string()) {
      try {
        // Compiling a regex costs far more than matching it: one per pattern and thread.
        thread_local std::map<std::string, std::regex> compiled;
        const std::string& pattern = s["pattern"].get_ref<const std::string&>();
        auto it = compiled.find(pattern);
        if (it == compiled.end()) {
          it = compiled.emplace(pattern, std::regex(pattern, std::regex::ECMAScript)).first;
        }
        if (!std::regex_search(str, it->second)) {
          errors.push_back(
              {path, "FieldValueInvalid",
               absl::StrCat("Invalid value: ", QuoteValue(v), ": ", path, " in body should match '",
                            s["pattern"].get<std::string>(), "'")});
        }
      } catch (const std::regex_error&) {
        // An unsupported pattern is not enforced.
      }
    }
    if (s.contains("maxLength") && str.size() > s["maxLength"].get<size_t>()) {
      errors.push_back({path, "FieldValueTooLong",
                        absl::StrCat("Too long: may not be longer than ", s["maxLength"].dump())});
    }
    if (s.contains("minLength") && str.size() < s["minLength"].get<size_t>()) {
      errors.push_back(
          {path, "FieldValueInvalid",
           absl::StrCat("Invalid value: ", QuoteValue(v), ": ", path,
                        " in body should be at least ", s["minLength"].dump(), " chars long")});
    }
  }
  if (v.is_array()) {
    if (s.contains("items")) {
      for (size_t i = 0; i < v.size(); ++i) {
        Validate(v[i], s["items"], absl::StrCat(path, "[", i, "]"), errors);
      }
    }
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) {
      errors.push_back({path, "FieldValueTooMany",
                        absl::StrCat("Too many: ", v.size(), ": must have at most ",
                                     s["maxItems"].dump(), " items")});
    }
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) {
      errors.push_back(
          {path, "FieldValueInvalid",
           absl::StrCat("Invalid value: ", v.size(), ": ", path, " in body should have at least ",
                        s["minItems"].dump(), " items")});
    }
  }
  if (v.is_object()) {
    if (s.contains("required") && s["required"].is_array()) {
      for (const json& r : s["required"]) {
        if (r.is_string() && !v.contains(r.get<std::string>())) {
          errors.push_back(
              {Join(path, r.get<std::string>()), "FieldValueRequired", "Required value"});
        }
      }
    }
    const json* props = s.contains("properties") ? &s["properties"] : nullptr;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (path.empty() && it.key() == "metadata") continue;
      if (props != nullptr && props->contains(it.key())) {
        Validate(*it, (*props)[it.key()], Join(path, it.key()), errors);
      } else if (s.contains("additionalProperties") && s["additionalProperties"].is_object()) {
        Validate(*it, s["additionalProperties"], Join(path, it.key()), errors);
      }
    }
  }
}

}  // namespace

json StrategicMergePatch(const json& target, const json& patch) {
  return StrategicMergeValue(target, patch);
}

std::vector<SchemaError> ApplySchema(json& object, const json& schema,
                                     std::vector<std::string>* pruned) {
  std::vector<SchemaError> errors;
  if (!schema.is_object() || schema.empty()) return errors;
  PruneAndDefault(object, schema, true, "", pruned);
  Validate(object, schema, "", errors);
  return errors;
}

void PruneToSchema(json& object, const json& schema) {
  if (!schema.is_object() || schema.empty()) return;
  PruneAndDefault(object, schema, true, "", nullptr, /*defaults=*/false);
}

namespace {

// A CEL value of the subset below: a boolean or a JSON value; nullopt for an error (a
// field that is not there), which fails the rule as the API server fails it.
using CelValue = std::optional<json>;

// The subset of CEL that transition rules of CRDs use for immutability: `self` and
// `oldSelf` with field selections (`self.a.b`), `has(self.a.b)`, `==`, `!=`, `!`, `&&`,
// `||` (both commutative over errors, as CEL's), parentheses, `true` and `false`.
class CelSubset {
 public:
  CelSubset(std::string_view text, const json& self, const json& old_self)
      : text_(text), self_(self), old_self_(old_self) {}

  // The rule's verdict; nullopt when the text is outside the subset (not evaluated).
  std::optional<bool> Evaluate() {
    std::optional<CelValue> v = Or();
    Space();
    if (!v || pos_ != text_.size()) return std::nullopt;
    return v->has_value() && (*v)->is_boolean() && (*v)->get<bool>();
  }

 private:
  void Space() {
    while (pos_ < text_.size() && absl::ascii_isspace(text_[pos_])) ++pos_;
  }
  bool Eat(std::string_view token) {
    Space();
    if (text_.substr(pos_, token.size()) != token) return false;
    pos_ += token.size();
    return true;
  }
  std::string Ident() {
    Space();
    size_t start = pos_;
    while (pos_ < text_.size() && (absl::ascii_isalnum(text_[pos_]) || text_[pos_] == '_')) {
      ++pos_;
    }
    return std::string(text_.substr(start, pos_ - start));
  }
  static CelValue Bool(const CelValue& v) {
    if (v && v->is_boolean()) return v;
    return std::nullopt;
  }
  std::optional<CelValue> Or() {
    std::optional<CelValue> left = And();
    while (left && Eat("||")) {
      std::optional<CelValue> right = And();
      if (!right) return std::nullopt;
      CelValue a = Bool(*left), b = Bool(*right);
      if ((a && a->get<bool>()) || (b && b->get<bool>())) {
        left = CelValue(true);
      } else if (a && b) {
        left = CelValue(false);
      } else {
        left = CelValue();
      }
    }
    return left;
  }
  std::optional<CelValue> And() {
    std::optional<CelValue> left = Unary();
    while (left && Eat("&&")) {
      std::optional<CelValue> right = Unary();
      if (!right) return std::nullopt;
      CelValue a = Bool(*left), b = Bool(*right);
      if ((a && !a->get<bool>()) || (b && !b->get<bool>())) {
        left = CelValue(false);
      } else if (a && b) {
        left = CelValue(true);
      } else {
        left = CelValue();
      }
    }
    return left;
  }
  std::optional<CelValue> Unary() {
    if (Eat("!")) {
      std::optional<CelValue> v = Unary();
      if (!v) return std::nullopt;
      CelValue b = Bool(*v);
      return b ? CelValue(!b->get<bool>()) : CelValue();
    }
    std::optional<CelValue> left = Primary();
    if (!left) return std::nullopt;
    Space();
    const bool eq = text_.substr(pos_, 2) == "==";
    const bool ne = text_.substr(pos_, 2) == "!=";
    if (!eq && !ne) return left;
    pos_ += 2;
    std::optional<CelValue> right = Primary();
    if (!right) return std::nullopt;
    if (!left->has_value() || !right->has_value()) return CelValue();
    return CelValue((**left == **right) == eq);
  }
  // `self` or `oldSelf` followed by field selections: the value, or an error when a field
  // is not there; with `exists`, whether the last field is there (has()).
  std::optional<CelValue> Path(bool exists) {
    const std::string root = Ident();
    const json* at = root == "self" ? &self_ : root == "oldSelf" ? &old_self_ : nullptr;
    if (at == nullptr) return std::nullopt;
    bool missing = false;
    int selections = 0;
    while (Eat(".")) {
      const std::string field = Ident();
      if (field.empty()) return std::nullopt;
      ++selections;
      if (missing) continue;
      auto it = at->is_object() ? at->find(field) : at->end();
      if (!at->is_object() || it == at->end()) {
        missing = true;
      } else {
        at = &*it;
      }
    }
    if (exists) {
      if (selections == 0) return std::nullopt;  // has() takes a field selection
      return CelValue(!missing);
    }
    if (missing) return CelValue();
    return CelValue(*at);
  }
  std::optional<CelValue> Primary() {
    if (Eat("(")) {
      std::optional<CelValue> v = Or();
      if (!v || !Eat(")")) return std::nullopt;
      return v;
    }
    Space();
    const size_t start = pos_;
    const std::string word = Ident();
    if (word == "true" || word == "false") return CelValue(word == "true");
    if (word == "has") {
      if (!Eat("(")) return std::nullopt;
      std::optional<CelValue> v = Path(/*exists=*/true);
      if (!v || !Eat(")")) return std::nullopt;
      return v;
    }
    pos_ = start;
    return Path(/*exists=*/false);
  }

  std::string_view text_;
  size_t pos_ = 0;
  const json& self_;
  const json& old_self_;
};

void TransitionRules(const json& object, const json& old, const json& schema,
                     const std::string& path, std::vector<SchemaError>& errors) {
  if (!schema.is_object()) return;
  if (auto rules = schema.find("x-kubernetes-validations");
      rules != schema.end() && rules->is_array()) {
    for (const json& rule : *rules) {
      if (!rule.is_object() || !rule.contains("rule") || !rule["rule"].is_string()) continue;
      const std::string text = rule["rule"].get<std::string>();
      // Only transition rules (those that read oldSelf) are evaluated here.
      if (text.find("oldSelf") == std::string::npos) continue;
      if (CelSubset(text, object, old).Evaluate() == std::optional<bool>(false)) {
        errors.push_back({path, "FieldValueInvalid",
                          absl::StrCat("Invalid value: \"object\": ",
                                       rule.value("message", "Value is immutable"))});
      }
    }
  }
  auto properties = schema.find("properties");
  if (properties == schema.end() || !properties->is_object() || !object.is_object() ||
      !old.is_object()) {
    return;
  }
  for (const auto& [key, sub] : properties->items()) {
    auto now = object.find(key);
    auto before = old.find(key);
    if (now == object.end() || before == old.end()) continue;
    TransitionRules(*now, *before, sub, path.empty() ? key : path + "." + key, errors);
  }
}

}  // namespace

std::vector<SchemaError> CheckTransitionRules(const json& object, const json& old,
                                              const json& schema) {
  std::vector<SchemaError> errors;
  TransitionRules(object, old, schema, "", errors);
  return errors;
}

namespace {

json YamlNodeToJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return json();
    case YAML::NodeType::Sequence: {
      json out = json::array();
      for (const YAML::Node& e : node) out.push_back(YamlNodeToJson(e));
      return out;
    }
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& kv : node) out[kv.first.as<std::string>()] = YamlNodeToJson(kv.second);
      return out;
    }
    case YAML::NodeType::Scalar:
      break;
  }
  const std::string& v = node.Scalar();
  if (node.Tag() == "!") return v;  // quoted
  if (v == "null" || v == "~" || v == "Null" || v == "NULL") return json();
  if (v == "true" || v == "True" || v == "TRUE") return true;
  if (v == "false" || v == "False" || v == "FALSE") return false;
  static const std::regex kInt("^[-+]?[0-9]+$");
  static const std::regex kFloat("^[-+]?([0-9]+\\.[0-9]*|\\.[0-9]+|[0-9]+)([eE][-+]?[0-9]+)?$");
  if (std::regex_match(v, kInt)) {
    try {
      return std::stoll(v);
    } catch (const std::exception&) {
      return v;
    }
  }
  if (std::regex_match(v, kFloat)) return std::stod(v);
  return v;
}

}  // namespace

absl::StatusOr<json> YamlToJson(const std::string& text) {
  try {
    return YamlNodeToJson(YAML::Load(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

std::string QuoteValue(const json& v) { return v.is_string() ? v.dump() : v.dump(); }

}  // namespace kube_emulator

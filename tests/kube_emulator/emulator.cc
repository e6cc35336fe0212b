#include "tests/kube_emulator/emulator.h"

#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/kube_emulator/json_ops.h"
#include "tests/kube_emulator/webhook.h"

namespace kube_emulator {

absl::Status EmulatorOptions::Validate() const {
  if (latency_ms < 0) return absl::InvalidArgumentError("--latency_ms must be >= 0");
  for (const auto& [code, rate] : error_rates) {
    if (code != 429 && code != 500 && code != 503 && code != 409 && code != 410) {
      return absl::InvalidArgumentError(
          absl::StrCat("--error_rate code ", code, " is not one of 429, 500, 503, 409, 410"));
    }
    if (rate < 0 || rate > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--error_rate ", code, "=", rate, " must be within [0, 1]"));
    }
  }
  if (watch_drop_rate < 0 || watch_drop_rate > 1) {
    return absl::InvalidArgumentError("--watch_drop_rate must be within [0, 1]");
  }
  if (bookmark_interval_ms <= 0) {
    return absl::InvalidArgumentError("--bookmark_interval_ms must be > 0");
  }
  if (watch_history < 1) return absl::InvalidArgumentError("--watch_history must be >= 1");
  if (nodes < 1) return absl::InvalidArgumentError("--nodes must be >= 1");
  if (qps_limit < 0) return absl::InvalidArgumentError("--qps_limit must be >= 0");
  if (conversion_webhook_timeout_ms <= 0) {
    return absl::InvalidArgumentError("--conversion_webhook_timeout_ms must be > 0");
  }
  if (max_held_requests < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_held_requests must be >= 0, got ", max_held_requests));
  }
  for (const auto& [service, address] : service_addresses) {
    std::vector<std::string> parts = absl::StrSplit(service, '/');
    size_t colon = address.rfind(':');
    int port = 0;
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty() || colon == std::string::npos ||
        colon == 0 || !absl::SimpleAtoi(address.substr(colon + 1), &port) || port <= 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--service_address wants NAMESPACE/NAME=HOST:PORT, got \"", service, "=", address, "\""));
    }
  }
  return absl::OkStatus();
}

namespace {

// The kubernetes.io/arch label every kubelet sets: Go's GOARCH name of this machine.
std::string NodeArch() {
  struct utsname u;
  if (uname(&u) != 0) return "amd64";
  const std::string machine = u.machine;
  if (machine == "aarch64" || machine == "arm64") return "arm64";
  if (machine == "x86_64") return "amd64";
  if (machine == "ppc64le" || machine == "s390x" || machine == "riscv64") return machine;
  return "amd64";
}

using ObjPtr = std::shared_ptr<const json>;
constexpr char kJson[] = "application/json";
constexpr size_t kWatchQueueLimit = 20000;

// A boolean query parameter as the API server reads it (Go's strconv.ParseBool: 1 t T TRUE
// true True, 0 f F FALSE false False); absent is false, anything else is nullopt.
std::optional<bool> BoolParam(const HttpRequest& req, const std::string& name) {
  if (!req.HasQuery(name)) return false;
  const std::string v = req.Query(name);
  if (v == "1" || v == "t" || v == "T" || v == "TRUE" || v == "true" || v == "True") return true;
  if (v == "0" || v == "f" || v == "F" || v == "FALSE" || v == "false" || v == "False")
    return false;
  return std::nullopt;
}

std::string Now() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone());
}

json MakeStatus(int code, const std::string& reason, const std::string& message,
                json details = json()) {
  json s = {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
            {"status", "Failure"}, {"message", message}, {"reason", reason},
            {"code", code}};
  if (!details.is_null()) s["details"] = details;
  return s;
}

struct CrdInfo;

struct ResourceType {
  std::string group, version, plural, singular, kind;
  bool namespaced = true;
  std::vector<std::string> short_names, categories;
  bool status_sub = false;
  bool scale_sub = false;
  std::string spec_replicas_path, status_replicas_path, label_selector_path;
  json schema;           // openAPIV3Schema, custom resources only
  json printer_columns;  // additionalPrinterColumns
  bool custom = false;
  // Custom resources served by a CRD: the CRD's versions and conversion, shared by the
  // types of all its served versions (null for the CRD's own per-version copies).
  std::shared_ptr<const CrdInfo> crd;
  std::string deprecation_warning;  // non-empty when the version is deprecated

  std::string GroupVersion() const { return group.empty() ? version : group + "/" + version; }
  std::string StoreKey() const { return group + "/" + plural; }
  std::string Qualified() const { return group.empty() ? plural : plural + "." + group; }
  std::string KindQualified() const { return group.empty() ? kind : kind + "." + group; }
};
using TypePtr = std::shared_ptr<const ResourceType>;

// What requests in any version of one CRD share: where objects are stored and how they
// are converted between versions.
struct CrdInfo {
  std::string group, kind;
  std::string storage_version;
  // Every version, served or not (their `crd` is null): the storage version's type stores
  // objects, and each version's schema prunes objects converted to it.
  std::map<std::string, TypePtr> versions;
  bool webhook = false;  // spec.conversion.strategy Webhook; else None (apiVersion only)
  WebhookClientConfig client;
  std::string review_version = "v1";  // ConversionReview version: v1 or v1beta1

  const TypePtr& StorageType() const { return versions.at(storage_version); }
};

// A request in a version of a CRD that has several: objects may be in another version and
// are converted.
bool Converting(const ResourceType& t) { return t.crd != nullptr && t.crd->versions.size() > 1; }

// Kubernetes' version priority (CompareKubeAwareVersionStrings): GA before beta before
// alpha, higher major then higher minor number first (v2 > v1 > v1beta2 > v1beta1 >
// v1alpha1); versions not of that form after them, alphabetically.
bool VersionPriorityBefore(const std::string& a, const std::string& b) {
  struct Parsed {
    bool kube = false;
    int major = 0, stability = 0, minor = 0;  // stability: 2 GA, 1 beta, 0 alpha
  };
  auto parse = [](const std::string& v) {
    Parsed p;
    if (v.size() < 2 || v[0] != 'v' || !absl::ascii_isdigit(v[1])) return p;
    size_t i = 1;
    while (i < v.size() && absl::ascii_isdigit(v[i])) ++i;
    if (!absl::SimpleAtoi(v.substr(1, i - 1), &p.major)) return p;
    if (i == v.size()) {
      p.kube = true;
      p.stability = 2;
      return p;
    }
    std::string rest = v.substr(i);
    for (const auto& [word, stability] : {std::pair<const char*, int>{"alpha", 0}, {"beta", 1}}) {
      absl::string_view r = rest;
      if (absl::ConsumePrefix(&r, word) && !r.empty() &&
          std::all_of(r.begin(), r.end(), [](char c) { return absl::ascii_isdigit(c); }) &&
          absl::SimpleAtoi(r, &p.minor)) {
        p.kube = true;
        p.stability = stability;
      }
    }
    return p;
  };
  Parsed pa = parse(a), pb = parse(b);
  if (pa.kube != pb.kube) return pa.kube;
  if (!pa.kube) return a < b;
  if (pa.stability != pb.stability) return pa.stability > pb.stability;
  if (pa.major != pb.major) return pa.major > pb.major;
  return pa.minor > pb.minor;
}

// Kubernetes' quoting of a Warning header's text.
std::string WarningHeader(const std::string& text) {
  std::string quoted;
  for (char c : text) {
    if (c == '"' || c == '\\') quoted.push_back('\\');
    quoted.push_back(c);
  }
  return absl::StrCat("299 - \"", quoted, "\"");
}

struct ApiError {
  int code = 0;
  json status;
};

ApiError Err(int code, const std::string& reason, const std::string& message,
             json details = json()) {
  return {code, MakeStatus(code, reason, message, std::move(details))};
}

ApiError NotFound(const ResourceType& t, const std::string& name) {
  return Err(404, "NotFound", absl::StrCat(t.Qualified(), " \"", name, "\" not found"),
             {{"name", name}, {"group", t.group}, {"kind", t.plural}});
}

ApiError Conflict(const ResourceType& t, const std::string& name) {
  return Err(409, "Conflict",
             absl::StrCat("Operation cannot be fulfilled on ", t.Qualified(), " \"", name,
                          "\": the object has been modified; please apply your changes to the "
                          "latest version and try again"),
             {{"name", name}, {"group", t.group}, {"kind", t.plural}});
}

ApiError Invalid(const ResourceType& t, const std::string& name,
                 const std::vector<SchemaError>& errors) {
  json causes = json::array();
  std::vector<std::string> parts;
  for (const SchemaError& e : errors) {
    causes.push_back({{"reason", e.reason}, {"message", e.message}, {"field", e.field}});
    parts.push_back(e.field.empty() ? e.message : absl::StrCat(e.field, ": ", e.message));
  }
  std::string joined =
      parts.size() == 1 ? parts[0] : absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
  return Err(422, "Invalid",
             absl::StrCat(t.KindQualified(), " \"", name, "\" is invalid: ", joined),
             {{"name", name}, {"group", t.group}, {"kind", t.kind}, {"causes", causes}});
}

// Checks the JSON types of the metadata fields the emulator reads; returns
// what is wrong, or "" when the shape is fine.
std::string BadMetadata(const json& meta) {
  if (!meta.is_object()) return "metadata must be an object";
  for (const char* f : {"name", "generateName", "namespace", "resourceVersion", "uid"}) {
    if (meta.contains(f) && !meta[f].is_string() && !meta[f].is_null()) {
      return absl::StrCat("metadata.", f, " must be a string");
    }
  }
  for (const char* f : {"labels", "annotations"}) {
    if (!meta.contains(f) || meta[f].is_null()) continue;
    if (!meta[f].is_object()) return absl::StrCat("metadata.", f, " must be an object");
    for (const auto& [k, v] : meta[f].items()) {
      if (!v.is_string()) return absl::StrCat("metadata.", f, ".", k, " must be a string");
    }
  }
  if (meta.contains("finalizers") && !meta["finalizers"].is_null()) {
    if (!meta["finalizers"].is_array()) return "metadata.finalizers must be an array";
    for (const json& v : meta["finalizers"]) {
      if (!v.is_string()) return "metadata.finalizers must hold strings";
    }
  }
  if (meta.contains("ownerReferences") && !meta["ownerReferences"].is_null()) {
    if (!meta["ownerReferences"].is_array()) return "metadata.ownerReferences must be an array";
    for (const json& r : meta["ownerReferences"]) {
      if (!r.is_object()) return "metadata.ownerReferences must hold objects";
      for (const char* f : {"apiVersion", "kind", "name", "uid"}) {
        if (!r.contains(f) || !r[f].is_string()) {
          return absl::StrCat("metadata.ownerReferences.", f, " must be a string");
        }
      }
    }
  }
  return "";
}

bool IsDns1123Label(const std::string& s) {
  if (s.empty() || s.size() > 63) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alnum && c != '-') return false;
    if ((i == 0 || i + 1 == s.size()) && !alnum) return false;
  }
  return true;
}

bool IsDns1123Subdomain(const std::string& s) {
  if (s.empty() || s.size() > 253) return false;
  for (absl::string_view part : absl::StrSplit(s, '.')) {
    if (!IsDns1123Label(std::string(part))) return false;
  }
  return true;
}

const json& Meta(const json& o) {
  static const json kEmpty = json::object();
  auto it = o.find("metadata");
  return it != o.end() && it->is_object() ? *it : kEmpty;
}
std::string MetaStr(const json& o, const char* field) {
  const json& m = Meta(o);
  auto it = m.find(field);
  return it != m.end() && it->is_string() ? it->get<std::string>() : "";
}
json Labels(const json& o) {
  const json& m = Meta(o);
  auto it = m.find("labels");
  return it != m.end() ? *it : json();
}

std::string HumanAge(absl::Duration d) {
  int64_t s = absl::ToInt64Seconds(d);
  if (s < 0) s = 0;
  if (s < 120) return absl::StrCat(s, "s");
  int64_t m = s / 60;
  if (m < 10) return absl::StrCat(m, "m", s % 60 == 0 ? "" : absl::StrCat(s % 60, "s"));
  if (m < 180) return absl::StrCat(m, "m");
  int64_t h = m / 60;
  if (h < 48) return absl::StrCat(h, "h");
  return absl::StrCat(h / 24, "d");
}

// Evaluates the simple JSONPath forms of additionalPrinterColumns:
// .a.b, .a[0].b and .a[?(@.k=="v")].b.
json EvalJsonPath(const json& obj, const std::string& path) {
  const json* cur = &obj;
  std::string p = path;
  if (absl::StartsWith(p, "{") && absl::EndsWith(p, "}")) p = p.substr(1, p.size() - 2);
  size_t i = 0;
  while (i < p.size()) {
    if (p[i] == '.') {
      ++i;
      size_t j = i;
      while (j < p.size() && p[j] != '.' && p[j] != '[') ++j;
      std::string key = p.substr(i, j - i);
      i = j;
      if (key.empty()) continue;
      if (!cur->is_object() || !cur->contains(key)) return json();
      cur = &(*cur)[key];
    } else if (p[i] == '[') {
      size_t j = p.find(']', i);
      if (j == std::string::npos) return json();
      std::string inner = p.substr(i + 1, j - i - 1);
      i = j + 1;
      if (!cur->is_array()) return json();
      if (absl::StartsWith(inner, "?(@.")) {
        size_t eq = inner.find("==");
        if (eq == std::string::npos) return json();
        std::string k = inner.substr(4, eq - 4);
        std::string v = inner.substr(eq + 2);
        if (!v.empty() && v.back() == ')') v.pop_back();
        v = std::string(absl::StripAsciiWhitespace(v));
        if (v.size() >= 2 && (v[0] == '"' || v[0] == '\'')) v = v.substr(1, v.size() - 2);
        const json* found = nullptr;
        for (const json& e : *cur) {
          if (e.is_object() && e.contains(k) && e[k].is_string() && e[k] == v) {
            found = &e;
            break;
          }
        }
        if (found == nullptr) return json();
        cur = found;
      } else {
        size_t idx = 0;
        if (!absl::SimpleAtoi(inner, &idx) || idx >= cur->size()) return json();
        cur = &(*cur)[idx];
      }
    } else {
      return json();
    }
  }
  return *cur;
}

struct WatchEvent {
  std::string type;
  ObjPtr object;
};

struct Watcher {
  std::string store_key;
  std::string ns;  // empty = all namespaces
  LabelSelector labels;
  FieldSelector fields;
  absl::Mutex mu;
  std::deque<WatchEvent> queue ABSL_GUARDED_BY(mu);
  bool overflow ABSL_GUARDED_BY(mu) = false;
  // Queue bound: a watcher this far behind is cut off so writers never wait.
  // Raised while the initial ADDED events of a large collection are queued.
  size_t limit ABSL_GUARDED_BY(mu) = kWatchQueueLimit;

  bool Matches(const json& o) const {
    if (!ns.empty() && MetaStr(o, "namespace") != ns) return false;
    return LabelsMatch(labels, Labels(o)) && FieldsMatch(fields, o);
  }
  void Push(std::string type, ObjPtr obj) {
    absl::MutexLock l(&mu);
    if (overflow) return;
    if (queue.size() >= limit) {
      overflow = true;
      return;
    }
    queue.push_back({std::move(type), std::move(obj)});
  }
};

struct HistoryEvent {
  uint64_t rv;
  std::string store_key;
  std::string type;
  ObjPtr old_obj;
  ObjPtr obj;
};

// Runs delayed callbacks on one background thread.
class Scheduler {
 public:
  Scheduler() {
    std::thread([this] { Loop(); }).detach();
  }
  void After(absl::Duration d, std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    tasks_.emplace(absl::Now() + d, std::move(fn));
    cv_.Signal();
  }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_) {
    while (true) {
      std::function<void()> fn;
      {
        absl::MutexLock l(&mu_);
        while (tasks_.empty() || tasks_.begin()->first > absl::Now()) {
          absl::Time wake = tasks_.empty() ? absl::Now() + absl::Seconds(1) : tasks_.begin()->first;
          cv_.WaitWithDeadline(&mu_, wake);
        }
        fn = std::move(tasks_.begin()->second);
        tasks_.erase(tasks_.begin());
      }
      try {
        fn();
      } catch (const std::exception& e) {
        std::cerr << "kube-emulator: background task failed: " << e.what() << "\n";
      }
    }
  }
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::multimap<absl::Time, std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
};

// fieldValidation of one write request and the unknown fields it met.
struct FieldCheck {
  bool strict = false;
  bool ignore = false;
  std::vector<std::string> unknown;
};

// The Warning headers for fieldValidation=Warn.
HttpResponder::Headers FieldWarnings(const FieldCheck& check) {
  HttpResponder::Headers h;
  if (check.strict || check.ignore) return h;
  for (const std::string& f : check.unknown) {
    h.push_back({"Warning", absl::StrCat("299 - \"unknown field \\\"", f, "\\\"\"")});
  }
  return h;
}

// How an update's body applies to the stored object.
enum PatchKind { kMerge, kJsonPatch, kStrategic, kApply };

// `body` applied to `base` as a patch of `kind` (server-side apply approximated as a merge,
// by list keys for built-in kinds); false and *err (400, or 422 for a failed JSON-patch
// test) when it does not apply.
bool ApplyPatch(PatchKind kind, bool custom, const json& base, const json& body, json* out,
                ApiError* err) {
  if (kind == kMerge) {
    *out = MergePatch(base, body);
  } else if (kind == kStrategic || (kind == kApply && !custom)) {
    *out = StrategicMergePatch(base, body);
  } else if (kind == kApply) {
    *out = MergePatch(base, body);
  } else {
    auto patched = JsonPatch(base, body);
    if (!patched.ok()) {
      bool test_failed = absl::StrContains(patched.status().message(), "unsuccessful");
      *err = Err(test_failed ? 422 : 400, test_failed ? "Invalid" : "BadRequest",
                 absl::StrCat("the server rejected our request due to an error in our request: ",
                              patched.status().message()));
      return false;
    }
    *out = *std::move(patched);
  }
  return true;
}

// True when a patch sets metadata.resourceVersion (a precondition on the current object).
bool PatchNamesResourceVersion(PatchKind kind, const json& body) {
  if (kind == kJsonPatch) {
    if (!body.is_array()) return false;
    for (const json& op : body) {
      if (op.is_object() && absl::StartsWith(op.value("path", ""), "/metadata/resourceVersion")) {
        return true;
      }
    }
    return false;
  }
  const json* rv = GetPath(body, "metadata.resourceVersion");
  return rv != nullptr && !rv->is_null();
}

// A body in another version of the group than the request's: the API server refuses it
// (true and *err set) rather than guess.
bool OtherApiVersion(const ResourceType& t, const json& body, ApiError* err) {
  if (!body.is_object() || !body.contains("apiVersion") || !body["apiVersion"].is_string()) {
    return false;
  }
  const std::string got = body["apiVersion"].get<std::string>();
  if (got.empty() || got == t.GroupVersion()) return false;
  *err = Err(400, "BadRequest",
             absl::StrCat("the API version in the data (", got,
                          ") does not match the expected API version (", t.GroupVersion(), ")"));
  return true;
}

// A failed conversion as the API server answers it: 500, a Status without a reason.
ApiError ConversionFailed(const std::string& message) {
  return {500,
          {{"kind", "Status"},
           {"apiVersion", "v1"},
           {"metadata", json::object()},
           {"status", "Failure"},
           {"message", message},
           {"code", 500}}};
}

struct Target {
  TypePtr type;
  std::string ns;
  std::string name;
  std::string sub;
  bool all_namespaces = false;
};

// What RBAC would see of one API request, judged from the path and method alone (like the
// API server's request-info resolver), so that requests for unknown resources are logged
// too. `resource` is empty for non-resource paths (discovery, /version, /openapi).
// Then what became of it: when the emulator acted on it and what it answered.
struct RequestRecord {
  std::string verb, group, version, resource, subresource, ns, name, path, user_agent;
  // When the emulator acted: the first store change the request made, else the moment
  // its answer (or, for a watch, its stream) started; until then, when it was taken up
  // (after any hold). A dropped request: when it was dropped.
  absl::Time time = absl::InfinitePast();
  int code = 0;          // the HTTP status answered; 0 while unanswered or when dropped
  bool dropped = false;  // held by hold_user_agents and given up by its client

  json ToJson() const {
    return {{"verb", verb},
            {"group", group},
            {"version", version},
            {"resource", resource},
            {"subresource", subresource},
            {"namespace", ns},
            {"name", name},
            {"path", path},
            {"user_agent", user_agent},
            {"time", UnixSeconds(time)},
            {"code", code},
            {"dropped", dropped}};
  }
  // Unix seconds with microseconds, as a JSON number.
  static double UnixSeconds(absl::Time t) {
    return static_cast<double>(absl::ToUnixMicros(t)) / 1e6;
  }
};

// The request being served on this thread, so that the store can stamp the moment the
// request's first write is applied (CommitLocked) without passing it through every verb.
// Only the connection thread that serves the request reads or writes it.
struct RequestInFlight {
  absl::Time applied = absl::InfinitePast();
};
thread_local RequestInFlight* current_request = nullptr;

RequestRecord DescribeRequest(const HttpRequest& req) {
  RequestRecord r;
  r.path = req.path;
  r.user_agent = req.Header("user-agent");
  std::vector<std::string> segs = absl::StrSplit(req.path, '/', absl::SkipEmpty());
  size_t i;
  if (segs.size() >= 3 && segs[0] == "api") {
    r.version = segs[1];
    i = 2;
  } else if (segs.size() >= 4 && segs[0] == "apis") {
    r.group = segs[1];
    r.version = segs[2];
    i = 3;
  } else {
    r.verb = absl::AsciiStrToLower(req.method);
    return r;
  }
  std::vector<std::string> rest(segs.begin() + static_cast<long>(i), segs.end());
  bool legacy_watch = false;
  if (!rest.empty() && rest[0] == "watch") {
    legacy_watch = true;
    rest.erase(rest.begin());
  }
  if (!rest.empty() && rest[0] == "namespaces" && rest.size() >= 2) {
    r.ns = rest[1];
    if (rest.size() > 2 && rest[2] != "status" && rest[2] != "finalize") {
      rest.erase(rest.begin(), rest.begin() + 2);
    }
  }
  if (!rest.empty()) r.resource = rest[0];
  if (rest.size() >= 2) r.name = rest[1];
  if (rest.size() >= 3) r.subresource = rest[2];
  const std::string& m = req.method;
  if (m == "GET" || m == "HEAD") {
    if (legacy_watch || BoolParam(req, "watch").value_or(false)) {
      r.verb = "watch";
    } else {
      r.verb = r.name.empty() ? "list" : "get";
    }
  } else if (m == "POST") {
    r.verb = "create";
  } else if (m == "PUT") {
    r.verb = "update";
  } else if (m == "PATCH") {
    r.verb = "patch";
  } else if (m == "DELETE") {
    r.verb = r.name.empty() ? "deletecollection" : "delete";
  } else {
    r.verb = absl::AsciiStrToLower(m);
  }
  return r;
}

// Containers of a pod spec at `spec_path` ("spec" of a Pod, "spec.template.spec" of a
// workload): at least one, each with a name and an image.
void ValidateContainers(const json& obj, const std::string& spec_path,
                        std::vector<SchemaError>* errors) {
  const std::string field = spec_path + ".containers";
  const json* containers = GetPath(obj, field);
  if (containers == nullptr || !containers->is_array() || containers->empty()) {
    errors->push_back({field, "FieldValueRequired", "Required value"});
    return;
  }
  for (size_t i = 0; i < containers->size(); ++i) {
    const json& c = (*containers)[i];
    std::string base = absl::StrCat(field, "[", i, "]");
    for (const char* key : {"name", "image"}) {
      if (!c.is_object() || !c.contains(key) || !c[key].is_string() ||
          c[key].get<std::string>().empty()) {
        errors->push_back({absl::StrCat(base, ".", key), "FieldValueRequired", "Required value"});
      }
    }
  }
}

// What the API server checks of a StatefulSet that a chart can get wrong: a selector
// that selects the pod template's labels, and the template's containers. Defaults
// spec.replicas to 1 on create, as the API server does.
void ValidateStatefulSet(json& obj, bool create, std::vector<SchemaError>* errors) {
  if (create && GetPath(obj, "spec.replicas") == nullptr) SetPath(obj, "spec.replicas", 1);
  const json* match = GetPath(obj, "spec.selector.matchLabels");
  const json* expr = GetPath(obj, "spec.selector.matchExpressions");
  if ((match == nullptr || !match->is_object() || match->empty()) &&
      (expr == nullptr || !expr->is_array() || expr->empty())) {
    errors->push_back({"spec.selector", "FieldValueRequired", "Required value"});
  } else if (match != nullptr && match->is_object()) {
    const json* labels = GetPath(obj, "spec.template.metadata.labels");
    for (auto it = match->begin(); it != match->end(); ++it) {
      if (labels == nullptr || !labels->is_object() || !labels->contains(it.key()) ||
          (*labels)[it.key()] != *it) {
        errors->push_back({"spec.template.metadata.labels", "FieldValueInvalid",
                           "Invalid value: `selector` does not match template `labels`"});
        break;
      }
    }
  }
  ValidateContainers(obj, "spec.template.spec", errors);
}

// Roles and bindings as the RBAC API validates them: rules need verbs and either
// API groups with resources or (cluster-wide only) non-resource URLs; bindings need a
// roleRef to a Role or ClusterRole and named subjects.
void ValidateRbac(const ResourceType& t, const json& obj, std::vector<SchemaError>* errors) {
  auto non_empty_list = [](const json& o, const char* key) {
    return o.is_object() && o.contains(key) && o[key].is_array() && !o[key].empty();
  };
  if (t.plural == "roles" || t.plural == "clusterroles") {
    const json* rules = GetPath(obj, "rules");
    if (rules == nullptr || !rules->is_array()) return;  // aggregated or empty roles
    for (size_t i = 0; i < rules->size(); ++i) {
      const json& r = (*rules)[i];
      const std::string base = absl::StrCat("rules[", i, "]");
      if (!non_empty_list(r, "verbs")) {
        errors->push_back({base + ".verbs", "FieldValueRequired",
                           "Required value: verbs must "
                           "contain at least one value"});
      }
      if (non_empty_list(r, "nonResourceURLs")) {
        if (t.namespaced) {
          errors->push_back({base + ".nonResourceURLs", "FieldValueInvalid",
                             "Invalid value: namespaced rules cannot apply to non-resource URLs"});
        }
        continue;
      }
      if (!r.is_object() || !r.contains("apiGroups") || !r["apiGroups"].is_array() ||
          r["apiGroups"].empty()) {
        errors->push_back({base + ".apiGroups", "FieldValueRequired",
                           "Required value: resource rules must supply at least one api group"});
      }
      if (!non_empty_list(r, "resources")) {
        errors->push_back({base + ".resources", "FieldValueRequired",
                           "Required value: resource rules must supply at least one resource"});
      }
    }
    return;
  }
  const json* ref = GetPath(obj, "roleRef");
  if (ref == nullptr || !ref->is_object()) {
    errors->push_back({"roleRef", "FieldValueRequired", "Required value"});
  } else {
    if (ref->value("apiGroup", "") != "rbac.authorization.k8s.io") {
      errors->push_back({"roleRef.apiGroup", "FieldValueNotSupported",
                         "Unsupported value: supported values: \"rbac.authorization.k8s.io\""});
    }
    const std::string kind = ref->value("kind", "");
    if (kind != "ClusterRole" && (kind != "Role" || !t.namespaced)) {
      errors->push_back(
          {"roleRef.kind", "FieldValueNotSupported",
           absl::StrCat("Unsupported value: \"", kind, "\": supported values: ",
                        t.namespaced ? "\"Role\", \"ClusterRole\"" : "\"ClusterRole\"")});
    }
    if (ref->value("name", "").empty()) {
      errors->push_back({"roleRef.name", "FieldValueRequired", "Required value"});
    }
  }
  const json* subjects = GetPath(obj, "subjects");
  if (subjects == nullptr || !subjects->is_array()) return;
  for (size_t i = 0; i < subjects->size(); ++i) {
    const json& sub = (*subjects)[i];
    const std::string base = absl::StrCat("subjects[", i, "]");
    const std::string kind = sub.is_object() ? sub.value("kind", "") : "";
    if (kind != "ServiceAccount" && kind != "User" && kind != "Group") {
      errors->push_back({base + ".kind", "FieldValueNotSupported",
                         absl::StrCat("Unsupported value: \"", kind,
                                      "\": supported values: \"Group\", \"ServiceAccount\", "
                                      "\"User\"")});
    }
    if (!sub.is_object() || sub.value("name", "").empty()) {
      errors->push_back({base + ".name", "FieldValueRequired", "Required value"});
    }
    if (kind == "ServiceAccount" && !t.namespaced && sub.value("namespace", "").empty()) {
      errors->push_back({base + ".namespace", "FieldValueRequired", "Required value"});
    }
  }
}

// The request log keeps at most this many records (the oldest go first), so that a long
// benchmark run cannot grow the emulator without bound.
constexpr size_t kRequestLogLimit = 1000000;

// How often a held request looks whether its client gave up (closed the connection).
constexpr absl::Duration kHoldPollInterval = absl::Milliseconds(100);

// True when two objects differ only in metadata and status (no change of generation),
// compared field by field without copying either.
bool SameOutsideMetadataAndStatus(const json& a, const json& b) {
  auto counted = [](const json& x) {
    size_t n = x.size();
    for (const char* k : {"metadata", "status"}) n -= x.contains(k) ? 1 : 0;
    return n;
  };
  if (!a.is_object() || !b.is_object()) return a == b;
  if (counted(a) != counted(b)) return false;
  for (auto it = a.begin(); it != a.end(); ++it) {
    if (it.key() == "metadata" || it.key() == "status") continue;
    auto other = b.find(it.key());
    if (other == b.end() || *other != *it) return false;
  }
  return true;
}

// metadata.name as the API server checks it for the kind.
void CheckName(const ResourceType& t, const std::string& name, std::vector<SchemaError>* errors) {
  bool name_ok = t.plural == "namespaces" ? IsDns1123Label(name) : IsDns1123Subdomain(name);
  if (t.plural == "services") name_ok = IsDns1123Label(name);
  if (!name_ok) {
    errors->push_back(
        {"metadata.name", "FieldValueInvalid",
         absl::StrCat("Invalid value: \"", name,
                      "\": a lowercase RFC 1123 subdomain must consist of lower case "
                      "alphanumeric characters, '-' or '.', and must start and end with an "
                      "alphanumeric character (e.g. 'example.com', regex used for validation "
                      "is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")});
  }
}

// A custom resource as its version's strategy validates it: the name, then pruned,
// defaulted and validated with the version's schema; the pruned fields are added to
// *unknown (for fieldValidation) when it is not null.
std::vector<SchemaError> ValidateCustom(const ResourceType& t, json& obj, FieldCheck* unknown) {
  std::vector<SchemaError> errors;
  CheckName(t, MetaStr(obj, "name"), &errors);
  std::vector<std::string> pruned;
  for (SchemaError& e : ApplySchema(obj, t.schema, &pruned)) errors.push_back(std::move(e));
  if (unknown != nullptr) {
    unknown->unknown.insert(unknown->unknown.end(), pruned.begin(), pruned.end());
  }
  return errors;
}

// fieldValidation=Strict met unknown fields: true and *err set.
bool StrictFailure(const ResourceType& t, const FieldCheck* check, ApiError* err) {
  if (check == nullptr || !check->strict || check->unknown.empty()) return false;
  std::vector<std::string> parts;
  for (const std::string& f : check->unknown) {
    parts.push_back(absl::StrCat("unknown field \"", f, "\""));
  }
  *err = Err(400, "BadRequest",
             absl::StrCat(t.kind, " in version \"", t.version, "\" cannot be handled as a ", t.kind,
                          ": strict decoding error: ", absl::StrJoin(parts, ", ")));
  return true;
}

// The checks of an update's body `next` of `o` that need no store: a JSON object with
// well-formed metadata naming `o`, with a resourceVersion when `require_rv` asks for one
// (custom resources only, as the API server asks).
bool CheckNextBody(const ResourceType& t, const json& o, json& next, bool require_rv,
                   ApiError* err) {
  std::string name = MetaStr(o, "name");
  if (!next.is_object()) {
    *err = Err(400, "BadRequest", "the request body must be a JSON object");
    return false;
  }
  if (next["metadata"].is_null()) next["metadata"] = json::object();
  if (std::string bad = BadMetadata(next["metadata"]); !bad.empty()) {
    *err = Err(400, "BadRequest", absl::StrCat("the object provided is unrecognized: ", bad));
    return false;
  }
  std::string next_name = next["metadata"].value("name", name);
  if (next_name != name) {
    *err = Err(400, "BadRequest",
               absl::StrCat("the name of the object (", next_name,
                            ") does not match the name on the URL (", name, ")"));
    return false;
  }
  if (require_rv && t.custom && next["metadata"].value("resourceVersion", "").empty()) {
    *err = Invalid(t, name,
                   {{"metadata.resourceVersion", "FieldValueInvalid",
                     "Invalid value: 0x0: must be specified for an update"}});
    return false;
  }
  return true;
}

// Makes `next` the update of `o` as stored: with the status subresource only the status
// comes from `next` (for `sub` "status") or none of it does; apiVersion and kind are t's;
// the identity and deletion fields of metadata are o's.
void MergeUpdate(const ResourceType& t, const json& o, json& next, const std::string& sub) {
  if (sub == "status") {
    json merged = o;
    if (next.contains("status")) {
      merged["status"] = std::move(next["status"]);
    } else {
      merged.erase("status");
    }
    next = std::move(merged);
  } else if (t.status_sub) {
    if (o.contains("status")) {
      next["status"] = o["status"];
    } else {
      next.erase("status");
    }
  }
  next["apiVersion"] = t.GroupVersion();
  next["kind"] = t.kind;
  json& m = next["metadata"];
  const json& om = Meta(o);
  for (const char* f : {"uid", "creationTimestamp", "namespace", "name", "deletionTimestamp",
                        "deletionGracePeriodSeconds", "generation"}) {
    if (om.contains(f)) {
      m[f] = om[f];
    } else {
      m.erase(f);
    }
  }
  m.erase("managedFields");
  if (m.contains("finalizers") && (m["finalizers"].is_null() || m["finalizers"].empty())) {
    m.erase("finalizers");
  }
  if (m.contains("labels") && m["labels"].is_null()) m.erase("labels");
  if (m.contains("annotations") && m["annotations"].is_null()) m.erase("annotations");
}

// status.storedVersions of an updated CRD: a new storage version joins them, and each
// must still be one of spec.versions (objects may be stored in it).
void UpdateStoredVersions(json& crd, std::vector<SchemaError>* errors) {
  json& status = crd["status"];
  if (!status.is_object()) status = json::object();
  json stored = status.value("storedVersions", json::array());
  if (!stored.is_array()) stored = json::array();
  std::set<std::string> names;
  std::string storage;
  const json* versions = GetPath(crd, "spec.versions");
  if (versions != nullptr && versions->is_array()) {
    for (const json& v : *versions) {
      if (!v.is_object()) continue;
      names.insert(v.value("name", ""));
      if (v.value("storage", false)) storage = v.value("name", "");
    }
  }
  if (!storage.empty() && std::find(stored.begin(), stored.end(), storage) == stored.end()) {
    stored.push_back(storage);
  }
  for (size_t i = 0; i < stored.size(); ++i) {
    std::string v = stored[i].is_string() ? stored[i].get<std::string>() : stored[i].dump();
    if (!names.count(v)) {
      errors->push_back({absl::StrCat("status.storedVersions[", i, "]"), "FieldValueInvalid",
                         absl::StrCat("Invalid value: \"", v, "\": must appear in spec.versions")});
    }
  }
  status["storedVersions"] = std::move(stored);
}

// spec.versions and spec.conversion of a CRD as the API server validates them (the
// conversion's field paths are those of its internal version, as in its messages), with
// spec.conversion.strategy defaulted to None.
void ValidateCrdVersions(json& crd, std::vector<SchemaError>* errors) {
  json& spec = crd["spec"];
  std::set<std::string> seen;
  std::vector<std::string> names;
  bool unique = true;
  int storage = 0;
  for (size_t i = 0; i < spec["versions"].size(); ++i) {
    const json& v = spec["versions"][i];
    std::string name = v.is_object() ? v.value("name", "") : "";
    names.push_back(name);
    if (!seen.insert(name).second) unique = false;
    if (v.is_object() && v.value("storage", false)) ++storage;
    if (!IsDns1123Label(name) || !absl::ascii_isalpha(name[0])) {
      errors->push_back(
          {absl::StrCat("spec.versions[", i, "].name"), "FieldValueInvalid",
           absl::StrCat("Invalid value: \"", name,
                        "\": a DNS-1035 label must consist of lower case alphanumeric characters "
                        "or '-', start with an alphabetic character, and end with an alphanumeric "
                        "character (e.g. 'my-name',  or 'abc-123', regex used for validation is "
                        "'[a-z]([-a-z0-9]*[a-z0-9])?')")});
    }
  }
  const std::string listed = json(names).dump();
  if (!unique) {
    errors->push_back(
        {"spec.versions", "FieldValueInvalid",
         absl::StrCat("Invalid value: ", listed, ": must contain unique version names")});
  }
  if (storage != 1) {
    errors->push_back({"spec.versions", "FieldValueInvalid",
                       absl::StrCat("Invalid value: ", listed,
                                    ": must have exactly one version marked as storage version")});
  }
  json& conversion = spec["conversion"];
  if (!conversion.is_object()) conversion = json::object();
  if (!conversion.contains("strategy") || conversion["strategy"].is_null()) {
    conversion["strategy"] = "None";
  }
  const std::string strategy =
      conversion["strategy"].is_string() ? conversion["strategy"].get<std::string>() : "";
  const json webhook = conversion.value("webhook", json::object());
  const json cc = webhook.is_object() ? webhook.value("clientConfig", json()) : json();
  const json review_versions =
      webhook.is_object() ? webhook.value("conversionReviewVersions", json()) : json();
  const std::string base = "spec.conversion.";
  if (strategy != "None" && strategy != "Webhook") {
    errors->push_back({base + "strategy", "FieldValueNotSupported",
                       absl::StrCat("Unsupported value: \"", strategy,
                                    "\": supported values: \"None\", \"Webhook\"")});
    return;
  }
  if (strategy == "None") {
    if (cc.is_object()) {
      errors->push_back({base + "webhookClientConfig", "FieldValueForbidden",
                         "Forbidden: should not be set when strategy is not set to Webhook"});
    }
    if (review_versions.is_array() && !review_versions.empty()) {
      errors->push_back({base + "conversionReviewVersions", "FieldValueForbidden",
                         "Forbidden: should not be set when strategy is not set to Webhook"});
    }
    return;
  }
  const std::string ccp = base + "webhookClientConfig";
  if (!cc.is_object()) {
    errors->push_back(
        {ccp, "FieldValueRequired", "Required value: required when strategy is set to Webhook"});
  } else if (cc.contains("url") == cc.contains("service")) {
    errors->push_back(
        {ccp, "FieldValueRequired", "Required value: exactly one of url or service is required"});
  } else if (cc.contains("url")) {
    std::string url = cc["url"].is_string() ? cc["url"].get<std::string>() : "";
    size_t scheme_end = url.find("://");
    std::string scheme = scheme_end == std::string::npos ? "" : url.substr(0, scheme_end);
    std::string rest = scheme_end == std::string::npos ? url : url.substr(scheme_end + 3);
    std::string host = rest.substr(0, rest.find('/'));
    std::string why;
    if (scheme != "https") {
      why = absl::StrCat("Invalid value: \"", scheme, "\": 'https' is the only allowed URL scheme");
    } else if (host.empty()) {
      why = absl::StrCat("Invalid value: \"", url, "\": host must be specified");
    } else if (host.find('@') != std::string::npos) {
      why = absl::StrCat("Invalid value: \"", url,
                         "\": user information is not permitted in the URL");
    } else if (url.find('#') != std::string::npos) {
      why = absl::StrCat("Invalid value: \"", url, "\": fragments are not permitted in the URL");
    } else if (url.find('?') != std::string::npos) {
      why = absl::StrCat("Invalid value: \"", url,
                         "\": query parameters are not permitted in the URL");
    }
    if (!why.empty()) errors->push_back({ccp + ".url", "FieldValueInvalid", why});
  } else {
    const json& svc = cc["service"];
    const std::string sp = ccp + ".service";
    if (!svc.is_object() || svc.value("name", "").empty()) {
      errors->push_back(
          {sp + ".name", "FieldValueRequired", "Required value: service name is required"});
    }
    if (!svc.is_object() || svc.value("namespace", "").empty()) {
      errors->push_back({sp + ".namespace", "FieldValueRequired",
                         "Required value: service namespace is required"});
    }
    if (svc.is_object() && svc.contains("port")) {
      int64_t port = svc["port"].is_number_integer() ? svc["port"].get<int64_t>() : 0;
      if (port < 1 || port > 65535) {
        errors->push_back({sp + ".port", "FieldValueInvalid",
                           absl::StrCat("Invalid value: ", svc["port"].dump(),
                                        ": port is not valid: must be between 1 and 65535, "
                                        "inclusive")});
      }
    }
    if (svc.is_object() && svc.contains("path")) {
      std::string path = svc["path"].is_string() ? svc["path"].get<std::string>() : "";
      if (path.empty() || path[0] != '/') {
        errors->push_back({sp + ".path", "FieldValueInvalid",
                           absl::StrCat("Invalid value: \"", path, "\": must start with a '/'")});
      }
    }
  }
  if (cc.is_object() && cc.contains("caBundle")) {
    std::string decoded;
    if (!cc["caBundle"].is_string() ||
        !absl::Base64Unescape(cc["caBundle"].get<std::string>(), &decoded)) {
      errors->push_back(
          {ccp + ".caBundle", "FieldValueInvalid", "Invalid value: illegal base64 data"});
    }
  }
  const std::string rvp = base + "conversionReviewVersions";
  if (!review_versions.is_array() || review_versions.empty()) {
    errors->push_back({rvp, "FieldValueRequired", "Required value"});
    return;
  }
  bool known = false;
  std::vector<std::string> quoted;
  for (const json& v : review_versions) {
    known = known || v == "v1" || v == "v1beta1";
    quoted.push_back(v.dump());
  }
  if (!known) {
    errors->push_back({rvp, "FieldValueInvalid",
                       absl::StrCat("Invalid value: []string{", absl::StrJoin(quoted, ", "),
                                    "}: must include at least one of v1, v1beta1")});
  }
}

// The checks of a new object's body that need no store: a JSON object of the type's kind
// with well-formed metadata in the request's namespace (metadata.namespace is set, or
// cleared for a cluster-scoped kind).
bool CheckNewBody(const ResourceType& t, const std::string& ns, json& body, ApiError* err) {
  if (!body.is_object()) {
    *err = Err(400, "BadRequest", "the request body must be a JSON object");
    return false;
  }
  if (body.contains("kind") && body["kind"].is_string() && body["kind"] != t.kind) {
    *err = Err(400, "BadRequest",
               absl::StrCat("the kind of the provided object (", body["kind"].get<std::string>(),
                            ") does not match the resource (", t.kind, ")"));
    return false;
  }
  json& meta = body["metadata"];
  if (meta.is_null()) meta = json::object();
  if (std::string bad = BadMetadata(meta); !bad.empty()) {
    *err = Err(400, "BadRequest", absl::StrCat("the object provided is unrecognized: ", bad));
    return false;
  }
  if (t.namespaced) {
    std::string body_ns = meta.value("namespace", "");
    if (!body_ns.empty() && body_ns != ns) {
      *err = Err(400, "BadRequest",
                 "the namespace of the provided object does not match the namespace sent on "
                 "the request");
      return false;
    }
    meta["namespace"] = ns;
  } else {
    meta.erase("namespace");
  }
  return true;
}

}  // namespace

class EmulatorImpl {
 public:
  explicit EmulatorImpl(const EmulatorOptions& o);
  void Handle(const HttpRequest& req, HttpResponder& resp);
  void HandleUnsafe(const HttpRequest& req, HttpResponder& resp);

 private:
  // --- request plumbing ---
  void SendJson(HttpResponder& resp, int code, const json& body,
                const HttpResponder::Headers& extra = {}) {
    resp.Send(code, kJson, body.dump(), extra);
  }
  void SendError(HttpResponder& resp, const ApiError& e) { SendJson(resp, e.code, e.status); }
  bool ParseSelectors(const HttpRequest& req, HttpResponder& resp, Selectors* out);
  bool Authorized(const HttpRequest& req) ABSL_LOCKS_EXCLUDED(auth_mu_);
  void HandleAdmin(const HttpRequest& req, HttpResponder& resp);
  bool HandleDiscovery(const HttpRequest& req, HttpResponder& resp) ABSL_LOCKS_EXCLUDED(mu_);
  bool ParseTarget(const std::string& path, Target* t) ABSL_LOCKS_EXCLUDED(mu_);
  // Returns true when a fault was injected (and answered).
  bool InjectFault(const HttpRequest& req, HttpResponder& resp, const std::string& verb,
                   const Target& t) ABSL_LOCKS_EXCLUDED(faults_mu_);
  void Count(const std::string& verb, const Target& t) ABSL_LOCKS_EXCLUDED(stats_mu_);
  // Appends `record` to the request log and returns it, to be completed later.
  std::shared_ptr<RequestRecord> LogRequest(RequestRecord record) ABSL_LOCKS_EXCLUDED(stats_mu_);
  // Logs the request as taken up now and has `resp` stamp its code and time when the
  // answer starts. *in_flight receives the store's write time (see current_request).
  void TrackRequest(const HttpRequest& req, HttpResponder& resp,
                    const std::shared_ptr<RequestInFlight>& in_flight)
      ABSL_LOCKS_EXCLUDED(stats_mu_);

  // --- one-sided partition (hold_user_agents) ---
  enum class Hold { kServe, kDropped, kOverLimit };
  // Blocks (this connection's thread only) while the request's User-Agent starts with
  // a prefix in hold_user_agents_. kServe: not held, or healed with the client still
  // connected; kDropped: the client closed its connection while held (the request was
  // logged as dropped; the caller closes without answering); kOverLimit: it would be
  // held but max_held_requests are already (the caller answers 503).
  Hold HoldWhilePartitioned(const HttpRequest& req, HttpResponder& resp)
      ABSL_LOCKS_EXCLUDED(hold_mu_);
  bool HeldLocked(const std::string& user_agent) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(hold_mu_);
  bool Held(const std::string& user_agent) ABSL_LOCKS_EXCLUDED(hold_mu_);
  // Waits until `user_agent` is no longer held or `timeout` passed; true when healed.
  bool AwaitHeal(const std::string& user_agent, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(hold_mu_);
  double Random() ABSL_LOCKS_EXCLUDED(rng_mu_);
  std::string RandomSuffix() ABSL_LOCKS_EXCLUDED(rng_mu_);

  void DoGet(const HttpRequest& req, HttpResponder& resp, const Target& t) ABSL_LOCKS_EXCLUDED(mu_);
  void DoList(const HttpRequest& req, HttpResponder& resp, const Target& t)
      ABSL_LOCKS_EXCLUDED(mu_);
  void DoWatch(const HttpRequest& req, HttpResponder& resp, const Target& t)
      ABSL_LOCKS_EXCLUDED(mu_);
  void DoCreate(const HttpRequest& req, HttpResponder& resp, const Target& t)
      ABSL_LOCKS_EXCLUDED(mu_);
  void DoUpdate(const HttpRequest& req, HttpResponder& resp, const Target& t, bool patch)
      ABSL_LOCKS_EXCLUDED(mu_);
  void DoDelete(const HttpRequest& req, HttpResponder& resp, const Target& t)
      ABSL_LOCKS_EXCLUDED(mu_);
  void DoDeleteCollection(const HttpRequest& req, HttpResponder& resp, const Target& t)
      ABSL_LOCKS_EXCLUDED(mu_);
  json ToTable(const ResourceType& t, const std::vector<ObjPtr>& items, const json& list_meta);

  // --- versions of custom resources (no lock held: conversion webhooks are called) ---
  // Converts the objects of `objs` that are not in t's version to it (one ConversionReview
  // for all with strategy Webhook; `list` for a list's items). False and *err (500) when
  // the conversion fails.
  bool ConvertForRequest(const ResourceType& t, std::vector<ObjPtr>* objs, bool list, ApiError* err)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Converts the objects not in `version` of the CRD to it and prunes them with that
  // version's schema.
  bool ConvertTo(const CrdInfo& crd, const std::string& version, std::vector<json>* objs, bool list,
                 ApiError* err) ABSL_LOCKS_EXCLUDED(mu_, services_mu_);
  // t as now registered (a CRD changed since converts with its new settings), or t.
  TypePtr CurrentType(const TypePtr& t) ABSL_LOCKS_EXCLUDED(mu_);
  // Create and update in a version of a CRD with several: validated in the request's
  // version, converted to the storage version, stored, converted back for the answer.
  void CreateConverted(HttpResponder& resp, const ResourceType& t, const std::string& ns, json body,
                       FieldCheck& unknown) ABSL_LOCKS_EXCLUDED(mu_);
  void UpdateConverted(HttpResponder& resp, const Target& t, bool patch, PatchKind kind,
                       const json& body, FieldCheck& unknown) ABSL_LOCKS_EXCLUDED(mu_);

  // --- store (mu_ held) ---
  ObjPtr FindLocked(const ResourceType& t, const std::string& ns, const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string ObjKey(const std::string& ns, const std::string& name) { return ns + "/" + name; }
  void CommitLocked(const std::string& store_key, const std::string& type, ObjPtr old_obj,
                    ObjPtr obj) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validates and stores a new object. `converted`: a custom resource converted to the
  // storage version after it was validated in its request's version (it is pruned and
  // defaulted, not validated, and keeps its uid and creationTimestamp).
  absl::StatusOr<ObjPtr> CreateLocked(const ResourceType& t, const std::string& ns, json body,
                                      ApiError* err, bool converted = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Not found or terminating namespaces take no new objects.
  bool NamespaceWritableLocked(const ResourceType& t, const std::string& ns, ApiError* err)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Validates and stores `next` as the new version of `old` (`converted` as for create).
  ObjPtr UpdateLocked(const ResourceType& t, const ObjPtr& old, json next, const std::string& sub,
                      bool require_rv, ApiError* err, bool converted = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ObjPtr DeleteLocked(const ResourceType& t, const ObjPtr& obj, const json& options, ApiError* err)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the object for good and runs the cascades.
  ObjPtr RemoveLocked(const ResourceType& t, const ObjPtr& obj) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CollectGarbageLocked(const std::string& owner_uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::pair<TypePtr, ObjPtr>> DependentsLocked(const std::string& owner_uid)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TypePtr TypeForStoreKeyLocked(const std::string& store_key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ForegroundGc(std::string uid) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<SchemaError> ValidateLocked(const ResourceType& t, json& obj, bool create,
                                          bool converted = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RegisterCrdLocked(const json& crd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True (and *err set) when fieldValidation=Strict met unknown fields.
  bool StrictFailureLocked(const ResourceType& t, ApiError* err)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return StrictFailure(t, unknown_fields_, err);
  }
  void UnregisterCrdLocked(const json& crd) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddType(ResourceType t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  json ScaleFor(const ResourceType& t, const json& obj);
  std::string Uid() ABSL_LOCKS_EXCLUDED(rng_mu_);

  // --- kubelet ---
  void SchedulePod(const json& pod) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void BindPod(std::string key, std::string uid) ABSL_LOCKS_EXCLUDED(mu_);
  void StartPod(std::string key, std::string uid) ABSL_LOCKS_EXCLUDED(mu_);
  bool FailPodLocked(const ObjPtr& pod, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EmulatorOptions options_;
  Scheduler scheduler_;

  absl::Mutex mu_;
  uint64_t rv_ ABSL_GUARDED_BY(mu_) = 1;
  // Every event with rv > history_floor_ is in history_.
  uint64_t history_floor_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<HistoryEvent> history_ ABSL_GUARDED_BY(mu_);
  // group/version/plural -> type
  std::map<std::string, TypePtr> types_ ABSL_GUARDED_BY(mu_);
  // group/plural -> "ns/name" -> object
  std::map<std::string, std::map<std::string, ObjPtr>> objects_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::pair<std::string, std::string>> uids_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::string, std::shared_ptr<Watcher>> watchers_ ABSL_GUARDED_BY(mu_);
  // owner uid -> (store key, object key) of each dependent naming it.
  std::multimap<std::string, std::pair<std::string, std::string>> dependents_ ABSL_GUARDED_BY(mu_);
  int watches_active_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t pod_ip_counter_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t service_ip_counter_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t node_rr_ ABSL_GUARDED_BY(mu_) = 0;
  int ready_delay_ms_ ABSL_GUARDED_BY(mu_);
  double fail_rate_ ABSL_GUARDED_BY(mu_) = 0;
  // While a request's write runs (mu_ held): where to report the fields that
  // schema pruning dropped, for fieldValidation=Strict|Warn. Null otherwise.
  FieldCheck* unknown_fields_ ABSL_GUARDED_BY(mu_) = nullptr;

  absl::Mutex faults_mu_;
  int latency_ms_ ABSL_GUARDED_BY(faults_mu_);
  std::map<int, double> error_rates_ ABSL_GUARDED_BY(faults_mu_);
  int retry_after_ ABSL_GUARDED_BY(faults_mu_);
  int qps_limit_ ABSL_GUARDED_BY(faults_mu_);
  double watch_drop_rate_ ABSL_GUARDED_BY(faults_mu_);
  int64_t qps_second_ ABSL_GUARDED_BY(faults_mu_) = 0;
  int qps_count_ ABSL_GUARDED_BY(faults_mu_) = 0;

  absl::Mutex stats_mu_;
  std::map<std::string, int64_t> stats_ ABSL_GUARDED_BY(stats_mu_);
  int64_t stats_writes_ ABSL_GUARDED_BY(stats_mu_) = 0;
  int64_t stats_total_ ABSL_GUARDED_BY(stats_mu_) = 0;
  // Shared with the request's responder, which fills in code and time (under stats_mu_).
  std::deque<std::shared_ptr<RequestRecord>> request_log_ ABSL_GUARDED_BY(stats_mu_);
  int64_t request_log_dropped_ ABSL_GUARDED_BY(stats_mu_) = 0;

  absl::Mutex rng_mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(rng_mu_);

  // Its own mutex: held requests wait on conditions over it, which absl evaluates on
  // every unlock, so it must not be one every request takes.
  absl::Mutex hold_mu_;
  std::vector<std::string> hold_user_agents_ ABSL_GUARDED_BY(hold_mu_);
  int held_ ABSL_GUARDED_BY(hold_mu_) = 0;  // requests waiting in HoldWhilePartitioned
  uint64_t hold_generation_ ABSL_GUARDED_BY(hold_mu_) = 0;  // +1 per new hold_user_agents_

  // Where conversion webhooks given as services are reached: "NAMESPACE/NAME" -> HOST:PORT.
  absl::Mutex services_mu_;
  std::map<std::string, std::string> service_addresses_ ABSL_GUARDED_BY(services_mu_);

  absl::Mutex auth_mu_;
  std::string token_ ABSL_GUARDED_BY(auth_mu_);
  int64_t token_mtime_ns_ ABSL_GUARDED_BY(auth_mu_) = -1;
  int64_t token_size_ ABSL_GUARDED_BY(auth_mu_) = -1;
};

EmulatorImpl::EmulatorImpl(const EmulatorOptions& o)
    : options_(o),
      ready_delay_ms_(o.pod_ready_delay_ms),
      latency_ms_(o.latency_ms),
      error_rates_(o.error_rates),
      retry_after_(o.retry_after_seconds),
      qps_limit_(o.qps_limit),
      watch_drop_rate_(o.watch_drop_rate),
      rng_(o.seed != 0 ? o.seed : std::random_device{}()),
      service_addresses_(o.service_addresses) {
  absl::MutexLock l(&mu_);
  const std::vector<std::string> all = {"create", "delete", "deletecollection", "get",
                                        "list",   "patch",  "update",           "watch"};
  auto add = [&](std::string group, std::string version, std::string plural, std::string singular,
                 std::string kind, bool namespaced, std::vector<std::string> shorts, bool status)
                 ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                   ResourceType t;
                   t.group = std::move(group);
                   t.version = std::move(version);
                   t.plural = std::move(plural);
                   t.singular = std::move(singular);
                   t.kind = std::move(kind);
                   t.namespaced = namespaced;
                   t.short_names = std::move(shorts);
                   t.status_sub = status;
                   AddType(std::move(t));
                 };
  add("", "v1", "namespaces", "namespace", "Namespace", false, {"ns"}, true);
  add("", "v1", "pods", "pod", "Pod", true, {"po"}, true);
  add("", "v1", "services", "service", "Service", true, {"svc"}, true);
  add("", "v1", "persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim", true,
      {"pvc"}, true);
  add("", "v1", "events", "event", "Event", true, {"ev"}, false);
  add("", "v1", "nodes", "node", "Node", false, {"no"}, true);
  add("", "v1", "configmaps", "configmap", "ConfigMap", true, {"cm"}, false);
  add("", "v1", "secrets", "secret", "Secret", true, {}, false);
  add("", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", true, {"sa"}, false);
  add("coordination.k8s.io", "v1", "leases", "lease", "Lease", true, {}, false);
  add("events.k8s.io", "v1", "events", "event", "Event", true, {"ev"}, false);
  add("networking.k8s.io", "v1", "networkpolicies", "networkpolicy", "NetworkPolicy", true,
      {"netpol"}, false);
  add("apiextensions.k8s.io", "v1", "customresourcedefinitions", "customresourcedefinition",
      "CustomResourceDefinition", false, {"crd", "crds"}, true);
  // The kinds a Helm chart of sbx installs. No workload controller runs: a StatefulSet is
  // stored (its scale subresource works) but makes no pods.
  add("apps", "v1", "statefulsets", "statefulset", "StatefulSet", true, {"sts"}, true);
  {
    ResourceType sts = *types_["apps/v1/statefulsets"];
    sts.scale_sub = true;
    sts.spec_replicas_path = ".spec.replicas";
    sts.status_replicas_path = ".status.replicas";
    sts.categories = {"all"};
    AddType(std::move(sts));
  }
  add("rbac.authorization.k8s.io", "v1", "roles", "role", "Role", true, {}, false);
  add("rbac.authorization.k8s.io", "v1", "rolebindings", "rolebinding", "RoleBinding", true, {},
      false);
  add("rbac.authorization.k8s.io", "v1", "clusterroles", "clusterrole", "ClusterRole", false, {},
      false);
  add("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "clusterrolebinding",
      "ClusterRoleBinding", false, {}, false);
  add("policy", "v1", "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", true,
      {"pdb"}, true);

  for (const char* key : {"/v1/pods", "/v1/services"}) {
    ResourceType copy = *types_[key];
    copy.categories = {"all"};
    types_[key] = std::make_shared<const ResourceType>(std::move(copy));
  }
  TypePtr ns_type = types_["/v1/namespaces"];
  for (const char* n : {"default", "kube-system", "kube-public", "kube-node-lease"}) {
    json o = {{"apiVersion", "v1"},
              {"kind", "Namespace"},
              {"metadata", {{"name", n}, {"labels", {{"kubernetes.io/metadata.name", n}}}}},
              {"spec", {{"finalizers", {"kubernetes"}}}}};
    ApiError err;
    (void)CreateLocked(*ns_type, "", o, &err);
  }
  TypePtr node_type = types_["/v1/nodes"];
  for (int i = 1; i <= options_.nodes; ++i) {
    std::string name = absl::StrCat("emu-node-", i);
    json o = {{"apiVersion", "v1"},
              {"kind", "Node"},
              {"metadata",
               {{"name", name},
                {"labels",
                 {{"kubernetes.io/hostname", name},
                  {"kubernetes.io/os", "linux"},
                  {"kubernetes.io/arch", NodeArch()}}}}},
              {"spec", json::object()}};
    ApiError err;
    auto created = CreateLocked(*node_type, "", o, &err);
    if (created.ok()) {
      json n = **created;
      n["status"] = {{"conditions",
                      {{{"type", "Ready"},
                        {"status", "True"},
                        {"reason", "KubeletReady"},
                        {"lastHeartbeatTime", Now()},
                        {"lastTransitionTime", Now()}}}},
                     {"addresses",
                      {{{"type", "InternalIP"}, {"address", absl::StrCat("172.18.0.", i + 1)}},
                       {{"type", "Hostname"}, {"address", name}}}},
                     {"capacity", {{"cpu", "8"}, {"memory", "32Gi"}, {"pods", "110"}}},
                     {"allocatable", {{"cpu", "8"}, {"memory", "32Gi"}, {"pods", "110"}}},
                     {"nodeInfo", {{"kubeletVersion", "v1.32.0-sbx-emulator"}}}};
      (void)UpdateLocked(*node_type, *created, n, "status", false, &err);
    }
  }
}

void EmulatorImpl::AddType(ResourceType t) {
  std::string key = absl::StrCat(t.group, "/", t.version, "/", t.plural);
  types_[key] = std::make_shared<const ResourceType>(std::move(t));
}

TypePtr EmulatorImpl::TypeForStoreKeyLocked(const std::string& store_key) {
  for (const auto& [k, t] : types_) {
    if (t->StoreKey() != store_key) continue;
    // Custom resources are stored in the storage version of their CRD.
    if (t->crd != nullptr && t->crd->versions.count(t->crd->storage_version)) {
      return t->crd->StorageType();
    }
    return t;
  }
  return nullptr;
}

double EmulatorImpl::Random() {
  absl::MutexLock l(&rng_mu_);
  return std::uniform_real_distribution<double>(0, 1)(rng_);
}

std::string EmulatorImpl::RandomSuffix() {
  static const char kChars[] = "bcdfghjklmnpqrstvwxz2456789";
  absl::MutexLock l(&rng_mu_);
  std::string s;
  for (int i = 0; i < 5; ++i) s.push_back(kChars[rng_() % (sizeof(kChars) - 1)]);
  return s;
}

std::string EmulatorImpl::Uid() {
  absl::MutexLock l(&rng_mu_);
  uint64_t a = rng_(), b = rng_();
  char buf[40];
  snprintf(buf, sizeof(buf), "%08x-%04x-4%03x-%04x-%012llx", static_cast<unsigned>(a >> 32),
           static_cast<unsigned>((a >> 16) & 0xffff), static_cast<unsigned>(a & 0xfff),
           static_cast<unsigned>(((b >> 48) & 0x3fff) | 0x8000),
           static_cast<unsigned long long>(b & 0xffffffffffffULL));
  return buf;
}

bool EmulatorImpl::Authorized(const HttpRequest& req) {
  if (options_.token_file.empty()) return true;
  struct stat st;
  absl::MutexLock l(&auth_mu_);
  if (::stat(options_.token_file.c_str(), &st) == 0) {
    int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (mtime != token_mtime_ns_ || st.st_size != token_size_) {
      std::ifstream in(options_.token_file);
      std::stringstream ss;
      ss << in.rdbuf();
      token_ = std::string(absl::StripAsciiWhitespace(ss.str()));
      token_mtime_ns_ = mtime;
      token_size_ = st.st_size;
    }
  } else {
    token_.clear();
  }
  std::string auth = req.Header("authorization");
  return !token_.empty() && auth == "Bearer " + token_;
}

void EmulatorImpl::Count(const std::string& verb, const Target& t) {
  std::string key = absl::StrCat(verb, " ", t.type->plural, t.sub.empty() ? "" : "/", t.sub);
  absl::MutexLock l(&stats_mu_);
  ++stats_[key];
  ++stats_total_;
  if (verb != "get" && verb != "list" && verb != "watch") ++stats_writes_;
}

std::shared_ptr<RequestRecord> EmulatorImpl::LogRequest(RequestRecord record) {
  auto shared = std::make_shared<RequestRecord>(std::move(record));
  absl::MutexLock l(&stats_mu_);
  request_log_.push_back(shared);
  if (request_log_.size() > kRequestLogLimit) {
    request_log_.pop_front();
    ++request_log_dropped_;
  }
  return shared;
}

void EmulatorImpl::TrackRequest(const HttpRequest& req, HttpResponder& resp,
                                const std::shared_ptr<RequestInFlight>& in_flight) {
  RequestRecord record = DescribeRequest(req);
  record.time = absl::Now();
  std::shared_ptr<RequestRecord> logged = LogRequest(std::move(record));
  // Runs on this connection's thread when the answer starts, after any write the
  // request made (so in_flight->applied needs no lock).
  resp.OnStatus([this, logged, in_flight](int code) {
    absl::Time acted =
        in_flight->applied != absl::InfinitePast() ? in_flight->applied : absl::Now();
    absl::MutexLock l(&stats_mu_);
    logged->code = code;
    logged->time = acted;
  });
}

bool EmulatorImpl::HeldLocked(const std::string& user_agent) const {
  for (const std::string& prefix : hold_user_agents_) {
    if (absl::StartsWith(user_agent, prefix)) return true;
  }
  return false;
}

bool EmulatorImpl::Held(const std::string& user_agent) {
  absl::MutexLock l(&hold_mu_);
  return HeldLocked(user_agent);
}

bool EmulatorImpl::AwaitHeal(const std::string& user_agent, absl::Duration timeout) {
  absl::MutexLock l(&hold_mu_);
  if (!HeldLocked(user_agent)) return true;
  // The condition absl evaluates on each unlock of hold_mu_ is an integer compare, not
  // the prefix match, however many requests are held.
  struct Wait {
    EmulatorImpl* self;
    uint64_t seen;
  } wait{this, hold_generation_};
  auto changed = [](Wait* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->self->hold_mu_) {
    return w->self->hold_generation_ != w->seen;
  };
  hold_mu_.AwaitWithTimeout(absl::Condition(+changed, &wait), timeout);
  return !HeldLocked(user_agent);
}

EmulatorImpl::Hold EmulatorImpl::HoldWhilePartitioned(const HttpRequest& req, HttpResponder& resp) {
  const std::string user_agent = req.Header("user-agent");
  {
    absl::MutexLock l(&hold_mu_);
    if (!HeldLocked(user_agent)) return Hold::kServe;
    if (held_ >= options_.max_held_requests) return Hold::kOverLimit;
    ++held_;
  }
  // The wait blocks only this connection's thread (one thread per connection). The
  // client's connection is looked at between waits: a client that gave up frees its
  // place at once instead of at the heal.
  bool gone = false;
  while (!AwaitHeal(user_agent, kHoldPollInterval)) {
    if (resp.PeerGone()) {
      gone = true;
      break;
    }
  }
  if (!gone) gone = resp.PeerGone();
  {
    absl::MutexLock l(&hold_mu_);
    --held_;
  }
  if (!gone) return Hold::kServe;
  RequestRecord record = DescribeRequest(req);
  record.time = absl::Now();
  record.dropped = true;
  LogRequest(std::move(record));
  return Hold::kDropped;
}

bool EmulatorImpl::InjectFault(const HttpRequest& req, HttpResponder& resp, const std::string& verb,
                               const Target& t) {
  int code = 0;
  int retry_after;
  {
    absl::MutexLock l(&faults_mu_);
    retry_after = retry_after_;
    if (qps_limit_ > 0) {
      int64_t sec = absl::ToUnixSeconds(absl::Now());
      if (sec != qps_second_) {
        qps_second_ = sec;
        qps_count_ = 0;
      }
      if (++qps_count_ > qps_limit_) code = 429;
    }
    if (code == 0 && !error_rates_.empty()) {
      bool write = verb != "get" && verb != "list" && verb != "watch";
      bool resumable = verb == "watch" || (verb == "list" && req.HasQuery("continue"));
      double r;
      {
        absl::MutexLock rl(&rng_mu_);
        r = std::uniform_real_distribution<double>(0, 1)(rng_);
      }
      double cum = 0;
      for (const auto& [c, rate] : error_rates_) {
        if (c == 409 && !write) continue;
        if (c == 410 && !resumable) continue;
        cum += rate;
        if (r < cum) {
          code = c;
          break;
        }
      }
    }
  }
  if (code == 0) return false;
  std::string name = t.name.empty() ? t.type->plural : t.name;
  switch (code) {
    case 429:
      SendJson(resp, 429,
               MakeStatus(429, "TooManyRequests",
                          "the server has received too many requests and has asked us to try "
                          "again later",
                          {{"retryAfterSeconds", retry_after}}),
               {{"Retry-After", std::to_string(retry_after)}});
      break;
    case 500:
      SendJson(resp, 500,
               MakeStatus(500, "InternalError",
                          "Internal error occurred: injected fault (kube-emulator)",
                          {{"causes", {{{"message", "injected fault"}}}}}));
      break;
    case 503:
      SendJson(resp, 503,
               MakeStatus(503, "ServiceUnavailable",
                          "the server is currently unable to handle the request"),
               {{"Retry-After", std::to_string(retry_after)}});
      break;
    case 409:
      SendError(resp, Conflict(*t.type, name));
      break;
    case 410: {
      json st = MakeStatus(410, "Expired", "too old resource version: injected fault");
      if (verb == "watch") {
        resp.StartChunked(200, kJson);
        resp.WriteChunk(json({{"type", "ERROR"}, {"object", st}}).dump() + "\n");
        resp.EndChunked();
      } else {
        SendJson(resp, 410, st);
      }
      break;
    }
  }
  return true;
}

bool EmulatorImpl::ParseTarget(const std::string& path, Target* t) {
  std::vector<std::string> segs = absl::StrSplit(path, '/', absl::SkipEmpty());
  std::string group, version;
  size_t i;
  if (segs.size() >= 3 && segs[0] == "api" && segs[1] == "v1") {
    version = "v1";
    i = 2;
  } else if (segs.size() >= 4 && segs[0] == "apis") {
    group = segs[1];
    version = segs[2];
    i = 3;
  } else {
    return false;
  }
  std::vector<std::string> rest(segs.begin() + static_cast<long>(i), segs.end());
  if (rest.size() >= 3 && rest[0] == "namespaces" &&
      !(rest.size() == 3 && (rest[2] == "status" || rest[2] == "finalize"))) {
    t->ns = rest[1];
    rest.erase(rest.begin(), rest.begin() + 2);
  }
  if (rest.empty() || rest.size() > 3) return false;
  absl::MutexLock l(&mu_);
  auto it = types_.find(absl::StrCat(group, "/", version, "/", rest[0]));
  if (it == types_.end()) return false;
  t->type = it->second;
  if (rest.size() >= 2) t->name = rest[1];
  if (rest.size() == 3) t->sub = rest[2];
  if (t->type->namespaced && t->ns.empty()) {
    if (!t->name.empty()) return false;
    t->all_namespaces = true;
  }
  if (!t->type->namespaced && !t->ns.empty()) return false;
  if (!t->sub.empty()) {
    if (t->sub == "status" && !t->type->status_sub) return false;
    if (t->sub == "scale" && !t->type->scale_sub) return false;
    if (t->sub != "status" && t->sub != "scale" && t->sub != "finalize") return false;
  }
  return true;
}

void EmulatorImpl::Handle(const HttpRequest& req, HttpResponder& resp) {
  // A malformed object (e.g. labels that are not strings) makes nlohmann::json
  // throw; answer 400 instead of taking the emulator down.
  try {
    HandleUnsafe(req, resp);
  } catch (const json::exception& e) {
    if (!resp.sent()) {
      SendError(resp, Err(400, "BadRequest",
                          absl::StrCat("the object provided is unrecognized: ", e.what())));
    } else {
      resp.Abort();
    }
  } catch (const std::exception& e) {
    if (!resp.sent()) {
      SendError(resp,
                Err(500, "InternalError", absl::StrCat("Internal error occurred: ", e.what())));
    } else {
      resp.Abort();
    }
  }
}

void EmulatorImpl::HandleUnsafe(const HttpRequest& req, HttpResponder& resp) {
  if (absl::StartsWith(req.path, "/emulator/")) {
    HandleAdmin(req, resp);
    return;
  }
  // A partitioned client's request has not arrived yet: held before anything else.
  const Hold hold = HoldWhilePartitioned(req, resp);
  if (hold == Hold::kDropped) {
    resp.Drop();
    return;
  }
  if (!Authorized(req)) {
    SendJson(resp, 401, MakeStatus(401, "Unauthorized", "Unauthorized"));
    return;
  }
  // Logged before faults are injected: a request that failed was still asked for (and
  // would have needed RBAC permission). Its code and time are filled in as it is answered.
  auto in_flight = std::make_shared<RequestInFlight>();
  TrackRequest(req, resp, in_flight);
  current_request = in_flight.get();
  struct Reset {
    ~Reset() { current_request = nullptr; }
  } reset;
  if (hold == Hold::kOverLimit) {
    SendJson(resp, 503,
             MakeStatus(503, "ServiceUnavailable",
                        absl::StrCat("kube-emulator: ", options_.max_held_requests,
                                     " requests are already held by hold_user_agents "
                                     "(--max_held_requests); this one is refused")),
             {{"Retry-After", "1"}});
    return;
  }
  Target t;
  bool is_resource = ParseTarget(req.path, &t);
  std::string verb;
  if (is_resource && !t.type->deprecation_warning.empty()) {
    resp.AddHeader("Warning", WarningHeader(t.type->deprecation_warning));
  }
  if (is_resource) {
    const bool item = !t.name.empty();
    const std::string& m = req.method;
    std::optional<bool> watch = BoolParam(req, "watch");
    for (const char* name : {"watch", "allowWatchBookmarks", "sendInitialEvents"}) {
      if (!BoolParam(req, name).has_value()) {
        SendError(resp,
                  Err(400, "BadRequest",
                      absl::StrCat("invalid value \"", req.Query(name), "\" of query parameter ",
                                   name, ": strconv.ParseBool: parsing \"", req.Query(name),
                                   "\": invalid syntax")));
        return;
      }
    }
    if (m == "GET") {
      verb = item ? "get" : *watch ? "watch" : "list";
    } else if (m == "POST" && !item) {
      verb = "create";
    } else if (m == "PUT" && item) {
      verb = "update";
    } else if (m == "PATCH" && item) {
      verb = "patch";
    } else if (m == "DELETE") {
      verb = item ? "delete" : "deletecollection";
    }
    if (verb.empty()) {
      SendJson(resp, 405,
               MakeStatus(405, "MethodNotAllowed",
                          absl::StrCat("the server does not allow this method on the requested "
                                       "resource")));
      return;
    }
    Count(verb, t);
    if (InjectFault(req, resp, verb, t)) return;
  }
  int latency;
  {
    absl::MutexLock l(&faults_mu_);
    latency = latency_ms_;
  }
  if (latency > 0) absl::SleepFor(absl::Milliseconds(latency));
  if (!is_resource) {
    if (!HandleDiscovery(req, resp)) {
      SendJson(
          resp, 404,
          MakeStatus(
              404, "NotFound", "the server could not find the requested resource",
              {{"causes",
                {{{"reason", "UnexpectedServerResponse"}, {"message", "404 page not found"}}}}}));
    }
    return;
  }
  if (absl::StrContains(req.Header("content-type"), "protobuf") ||
      absl::StrContains(req.Header("content-type"), "cbor")) {
    SendError(resp, Err(415, "UnsupportedMediaType",
                        absl::StrCat("the body of the request was in an unknown format - "
                                     "accepted media types include: application/json (",
                                     req.Header("content-type"),
                                     " is not served by kube-emulator; for kubectl's typed create "
                                     "commands, write the object and apply it: kubectl create ... "
                                     "--dry-run=client -o yaml | kubectl apply -f -)")));
    return;
  }
  if (t.all_namespaces && verb != "list" && verb != "watch" && verb != "deletecollection") {
    SendJson(resp, 405,
             MakeStatus(405, "MethodNotAllowed",
                        "the server does not allow this method on the requested resource"));
    return;
  }
  if (verb == "get") {
    DoGet(req, resp, t);
  } else if (verb == "list") {
    DoList(req, resp, t);
  } else if (verb == "watch") {
    DoWatch(req, resp, t);
  } else if (verb == "create") {
    DoCreate(req, resp, t);
  } else if (verb == "update") {
    DoUpdate(req, resp, t, false);
  } else if (verb == "patch") {
    DoUpdate(req, resp, t, true);
  } else if (verb == "delete") {
    DoDelete(req, resp, t);
  } else {
    DoDeleteCollection(req, resp, t);
  }
}

// ---------------------------------------------------------------- discovery

bool EmulatorImpl::HandleDiscovery(const HttpRequest& req, HttpResponder& resp) {
  if (req.method != "GET") return false;
  const std::string& p = req.path;
  if (p == "/version" || p == "/version/") {
    SendJson(resp, 200,
             {{"major", "1"},
              {"minor", "32"},
              {"gitVersion", "v1.32.0-sbx-emulator"},
              {"gitCommit", "0000000000000000000000000000000000000000"},
              {"gitTreeState", "clean"},
              {"buildDate", "2025-01-01T00:00:00Z"},
              {"goVersion", "go1.23.4"},
              {"compiler", "gc"},
              {"platform", "linux/amd64"}});
    return true;
  }
  if (p == "/healthz" || p == "/readyz" || p == "/livez") {
    resp.Send(200, "text/plain", "ok");
    return true;
  }
  std::vector<std::string> segs = absl::StrSplit(p, '/', absl::SkipEmpty());
  std::vector<TypePtr> types;
  {
    absl::MutexLock l(&mu_);
    for (const auto& [k, t] : types_) types.push_back(t);
  }
  auto resource_list = [&](const std::string& group, const std::string& version) {
    json resources = json::array();
    bool found = false;
    for (const TypePtr& t : types) {
      if (t->group != group || t->version != version) continue;
      found = true;
      json r = {
          {"name", t->plural},
          {"singularName", t->singular},
          {"namespaced", t->namespaced},
          {"kind", t->kind},
          {"verbs",
           {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}}};
      if (!t->short_names.empty()) r["shortNames"] = t->short_names;
      if (!t->categories.empty()) r["categories"] = t->categories;
      r["storageVersionHash"] = "";
      resources.push_back(r);
      if (t->status_sub) {
        resources.push_back({{"name", t->plural + "/status"},
                             {"singularName", ""},
                             {"namespaced", t->namespaced},
                             {"kind", t->kind},
                             {"verbs", {"get", "patch", "update"}}});
      }
      if (t->scale_sub) {
        resources.push_back({{"name", t->plural + "/scale"},
                             {"singularName", ""},
                             {"namespaced", t->namespaced},
                             {"group", "autoscaling"},
                             {"version", "v1"},
                             {"kind", "Scale"},
                             {"verbs", {"get", "patch", "update"}}});
      }
    }
    if (!found) return json();
    return json({{"kind", "APIResourceList"},
                 {"apiVersion", "v1"},
                 {"groupVersion", group.empty() ? version : group + "/" + version},
                 {"resources", resources}});
  };
  // group -> served versions, by Kubernetes' version priority: the first is preferred.
  std::map<std::string, std::vector<std::string>> groups;
  for (const TypePtr& t : types) {
    if (t->group.empty()) continue;
    auto& v = groups[t->group];
    if (std::find(v.begin(), v.end(), t->version) == v.end()) v.push_back(t->version);
  }
  for (auto& [g, versions] : groups) {
    std::sort(versions.begin(), versions.end(), VersionPriorityBefore);
  }
  auto group_json = [&](const std::string& g) {
    json versions = json::array();
    for (const std::string& v : groups[g]) {
      versions.push_back({{"groupVersion", g + "/" + v}, {"version", v}});
    }
    return json({{"name", g}, {"versions", versions}, {"preferredVersion", versions[0]}});
  };
  // OpenAPI v2, which kubectl's client-side validation still reads (for kind: List, say)
  // and asks for only as protobuf (gnostic's openapi_v2.Document). Served without
  // definitions, so kubectl validates no kind against a schema (as for a CRD without
  // one): swagger "2.0" (field 1) and info (field 2: title 1, version 2), hand-encoded.
  if (segs.size() == 2 && segs[0] == "openapi" && segs[1] == "v2") {
    auto field = [](int number, const std::string& value) {
      std::string out;
      out.push_back(static_cast<char>(number << 3 | 2));  // length-delimited
      out.push_back(static_cast<char>(value.size()));     // every value here is < 128
      return out + value;
    };
    const std::string info = field(1, "Kubernetes") + field(2, "v1.32.0-sbx-emulator");
    resp.Send(200, "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
              field(1, "2.0") + field(2, info));
    return true;
  }
  // OpenAPI v3: a root listing every group-version and per group-version documents
  // whose PATCH operations declare the fieldValidation parameter, which is what
  // kubectl needs to use server-side validation. No schemas are served, so kubectl
  // computes strategic merge patches from its compiled-in types.
  if (segs.size() == 2 && segs[0] == "openapi" && segs[1] == "v3") {
    json paths = json::object();
    std::map<std::string, std::string> hashes;
    for (const TypePtr& t : types) {
      std::string gv = t->group.empty() ? "api/" + t->version : "apis/" + t->GroupVersion();
      hashes[gv] += t->plural + t->kind + (t->namespaced ? "n" : "c");
    }
    for (const auto& [gv, h] : hashes) {
      paths[gv] = {{"serverRelativeURL",
                    absl::StrCat("/openapi/v3/", gv, "?hash=", std::hash<std::string>{}(h))}};
    }
    SendJson(resp, 200, {{"paths", paths}});
    return true;
  }
  if (segs.size() >= 4 && segs[0] == "openapi" && segs[1] == "v3") {
    std::string gv = absl::StrJoin(segs.begin() + 2, segs.end(), "/");
    json paths = json::object();
    for (const TypePtr& t : types) {
      std::string tgv = t->group.empty() ? "api/" + t->version : "apis/" + t->GroupVersion();
      if (tgv != gv) continue;
      json gvk = {{"group", t->group}, {"version", t->version}, {"kind", t->kind}};
      json params = json::array();
      for (const char* q : {"dryRun", "fieldManager", "fieldValidation", "force"}) {
        params.push_back({{"name", q}, {"in", "query"}, {"schema", {{"type", "string"}}}});
      }
      json op = {{"x-kubernetes-group-version-kind", gvk},
                 {"x-kubernetes-action", "patch"},
                 {"parameters", params},
                 {"responses", {{"200", {{"description", "OK"}}}}}};
      std::string base = "/" + gv + (t->namespaced ? "/namespaces/{namespace}/" : "/") + t->plural;
      paths[base + "/{name}"] = {{"patch", op}};
    }
    if (paths.empty()) return false;
    SendJson(resp, 200,
             {{"openapi", "3.0.0"},
              {"info", {{"title", "Kubernetes"}, {"version", "v1.32.0-sbx-emulator"}}},
              {"paths", paths},
              {"components", {{"schemas", json::object()}}}});
    return true;
  }
  if (segs.size() == 1 && segs[0] == "api") {
    SendJson(resp, 200,
             {{"kind", "APIVersions"},
              {"versions", {"v1"}},
              {"serverAddressByClientCIDRs",
               {{{"clientCIDR", "0.0.0.0/0"}, {"serverAddress", "127.0.0.1:443"}}}}});
    return true;
  }
  if (segs.size() == 2 && segs[0] == "api" && segs[1] == "v1") {
    SendJson(resp, 200, resource_list("", "v1"));
    return true;
  }
  if (segs.size() == 1 && segs[0] == "apis") {
    json list = json::array();
    for (const auto& [g, v] : groups) list.push_back(group_json(g));
    SendJson(resp, 200, {{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", list}});
    return true;
  }
  if (segs.size() == 2 && segs[0] == "apis" && groups.count(segs[1])) {
    json g = group_json(segs[1]);
    g["kind"] = "APIGroup";
    g["apiVersion"] = "v1";
    SendJson(resp, 200, g);
    return true;
  }
  if (segs.size() == 3 && segs[0] == "apis") {
    json r = resource_list(segs[1], segs[2]);
    if (r.is_null()) return false;
    SendJson(resp, 200, r);
    return true;
  }
  return false;
}

// ---------------------------------------------------------------- store

ObjPtr EmulatorImpl::FindLocked(const ResourceType& t, const std::string& ns,
                                const std::string& name) {
  auto s = objects_.find(t.StoreKey());
  if (s == objects_.end()) return nullptr;
  auto it = s->second.find(ObjKey(ns, name));
  return it == s->second.end() ? nullptr : it->second;
}

void EmulatorImpl::CommitLocked(const std::string& store_key, const std::string& type,
                                ObjPtr old_obj, ObjPtr obj) {
  // Stamped under mu_, so the times of writes are in the order they were applied.
  if (current_request != nullptr && current_request->applied == absl::InfinitePast()) {
    current_request->applied = absl::Now();
  }
  const json& o = *obj;
  std::string key = ObjKey(MetaStr(o, "namespace"), MetaStr(o, "name"));
  std::string uid = MetaStr(o, "uid");
  auto& bucket = objects_[store_key];
  auto owner_uids = [](const json& x) {
    std::vector<std::string> out;
    const json& m = Meta(x);
    auto refs = m.find("ownerReferences");
    if (refs != m.end() && refs->is_array()) {
      for (const json& r : *refs) out.push_back(r.value("uid", ""));
    }
    return out;
  };
  // The owner index changes only when the owners do (an owner with many dependents makes
  // every scan of its entries long; status updates must not pay for it).
  const bool same_owners =
      old_obj != nullptr && type != "DELETED" && owner_uids(*old_obj) == owner_uids(o);
  if (old_obj != nullptr && !same_owners) {
    std::string old_key = ObjKey(MetaStr(*old_obj, "namespace"), MetaStr(*old_obj, "name"));
    for (const std::string& ou : owner_uids(*old_obj)) {
      auto range = dependents_.equal_range(ou);
      for (auto it = range.first; it != range.second; ++it) {
        if (it->second.first == store_key && it->second.second == old_key) {
          dependents_.erase(it);
          break;
        }
      }
    }
  }
  if (type != "DELETED" && !same_owners) {
    for (const std::string& ou : owner_uids(o))
      dependents_.emplace(ou, std::make_pair(store_key, key));
  }
  if (type == "DELETED") {
    bucket.erase(key);
    uids_.erase(uid);
  } else {
    bucket[key] = obj;
    uids_[uid] = {store_key, key};
  }
  history_.push_back({rv_, store_key, type, old_obj, obj});
  while (static_cast<int64_t>(history_.size()) > options_.watch_history) {
    history_floor_ = history_.front().rv;
    history_.pop_front();
  }
  auto range = watchers_.equal_range(store_key);
  for (auto it = range.first; it != range.second; ++it) {
    Watcher& w = *it->second;
    bool now = w.Matches(o);
    bool before = old_obj != nullptr && w.Matches(*old_obj);
    if (type == "ADDED") {
      if (now) w.Push("ADDED", obj);
    } else if (type == "DELETED") {
      if (now) w.Push("DELETED", obj);
    } else if (now && before) {
      w.Push("MODIFIED", obj);
    } else if (now) {
      w.Push("ADDED", obj);
    } else if (before) {
      w.Push("DELETED", obj);
    }
  }
}

std::vector<SchemaError> EmulatorImpl::ValidateLocked(const ResourceType& t, json& obj, bool create,
                                                      bool converted) {
  if (t.custom && converted) {
    // Converted by the CRD's conversion (and validated in the request's version before):
    // pruned and defaulted with this version's schema, as the API server prunes converted
    // objects and defaults what it reads from storage.
    (void)ApplySchema(obj, t.schema);
    return {};
  }
  if (t.custom) return ValidateCustom(t, obj, unknown_fields_);
  std::vector<SchemaError> errors;
  std::string name = MetaStr(obj, "name");
  CheckName(t, name, &errors);
  if (t.plural == "pods") {
    ValidateContainers(obj, "spec", &errors);
  } else if (t.group == "apps" && t.plural == "statefulsets") {
    ValidateStatefulSet(obj, create, &errors);
  } else if (t.group == "rbac.authorization.k8s.io") {
    ValidateRbac(t, obj, &errors);
  } else if (t.group == "policy" && t.plural == "poddisruptionbudgets") {
    if (GetPath(obj, "spec.minAvailable") != nullptr &&
        GetPath(obj, "spec.maxUnavailable") != nullptr) {
      errors.push_back({"spec", "FieldValueInvalid",
                        "Invalid value: minAvailable and maxUnavailable cannot be both set"});
    }
  } else if (t.plural == "customresourcedefinitions") {
    const json& spec = obj.contains("spec") ? obj["spec"] : json::object();
    std::string group = spec.value("group", "");
    std::string plural = GetPath(obj, "spec.names.plural") != nullptr &&
                                 GetPath(obj, "spec.names.plural")->is_string()
                             ? GetPath(obj, "spec.names.plural")->get<std::string>()
                             : "";
    if (group.empty()) errors.push_back({"spec.group", "FieldValueRequired", "Required value"});
    if (plural.empty()) {
      errors.push_back({"spec.names.plural", "FieldValueRequired", "Required value"});
    }
    if (GetPath(obj, "spec.names.kind") == nullptr) {
      errors.push_back({"spec.names.kind", "FieldValueRequired", "Required value"});
    }
    if (!spec.contains("versions") || !spec["versions"].is_array() || spec["versions"].empty()) {
      errors.push_back({"spec.versions", "FieldValueRequired", "Required value"});
    } else {
      ValidateCrdVersions(obj, &errors);
    }
    std::string scope = spec.value("scope", "");
    if (scope != "Namespaced" && scope != "Cluster") {
      errors.push_back({"spec.scope", "FieldValueNotSupported",
                        absl::StrCat("Unsupported value: \"", scope,
                                     "\": supported values: \"Cluster\", \"Namespaced\"")});
    }
    if (!plural.empty() && !group.empty() && name != plural + "." + group) {
      errors.push_back({"metadata.name", "FieldValueInvalid",
                        absl::StrCat("Invalid value: \"", name,
                                     "\": must be spec.names.plural+\".\"+spec.group")});
    }
    if (create && errors.empty()) {
      // The plural must not clash with an existing type in the group.
      for (const auto& [k, ty] : types_) {
        if (ty->group == group && ty->plural == plural && !ty->custom) {
          errors.push_back({"spec.names.plural", "FieldValueInvalid", "already served"});
        }
      }
    }
  }
  return errors;
}

bool EmulatorImpl::NamespaceWritableLocked(const ResourceType& t, const std::string& ns,
                                           ApiError* err) {
  if (!t.namespaced) return true;
  TypePtr ns_type = types_["/v1/namespaces"];
  ObjPtr nso = FindLocked(*ns_type, "", ns);
  if (nso == nullptr) {
    *err = NotFound(*ns_type, ns);
    return false;
  }
  if (Meta(*nso).contains("deletionTimestamp")) {
    *err = Err(403, "Forbidden",
               absl::StrCat(t.Qualified(),
                            " is forbidden: unable to create new content in "
                            "namespace ",
                            ns, " because it is being terminated"));
    return false;
  }
  return true;
}

absl::StatusOr<ObjPtr> EmulatorImpl::CreateLocked(const ResourceType& t, const std::string& ns,
                                                  json body, ApiError* err, bool converted) {
  if (!CheckNewBody(t, ns, body, err)) return absl::InvalidArgumentError("bad body");
  if (!NamespaceWritableLocked(t, ns, err)) return absl::FailedPreconditionError("namespace");
  json& meta = body["metadata"];
  std::string name = meta.value("name", "");
  if (name.empty()) {
    std::string gen = meta.value("generateName", "");
    if (gen.empty()) {
      *err = Invalid(t, "",
                     {{"metadata.name", "FieldValueRequired",
                       "Required value: name or generateName is required"}});
      return absl::InvalidArgumentError("no name");
    }
    for (int attempt = 0; attempt < 10; ++attempt) {
      name = gen + RandomSuffix();
      if (FindLocked(t, ns, name) == nullptr) break;
    }
    meta["name"] = name;
  }
  body["apiVersion"] = t.GroupVersion();
  body["kind"] = t.kind;
  if (t.custom && t.status_sub) body.erase("status");
  // Kind defaults and server-set fields.
  if (t.plural == "pods") {
    body["status"] = {{"phase", "Pending"}, {"qosClass", "BestEffort"}};
    json& spec = body["spec"];
    if (spec.is_object()) {
      if (!spec.contains("restartPolicy")) spec["restartPolicy"] = "Always";
      if (!spec.contains("dnsPolicy")) spec["dnsPolicy"] = "ClusterFirst";
      if (!spec.contains("schedulerName")) spec["schedulerName"] = "default-scheduler";
      if (!spec.contains("terminationGracePeriodSeconds")) {
        spec["terminationGracePeriodSeconds"] = 30;
      }
      if (spec.contains("containers") && spec["containers"].is_array()) {
        for (json& c : spec["containers"]) {
          if (c.is_object() && !c.contains("imagePullPolicy")) {
            c["imagePullPolicy"] = "IfNotPresent";
          }
        }
      }
    }
  } else if (t.plural == "services") {
    json& spec = body["spec"];
    if (!spec.is_object()) spec = json::object();
    if (!spec.contains("type")) spec["type"] = "ClusterIP";
    if (!spec.contains("sessionAffinity")) spec["sessionAffinity"] = "None";
    if (spec.value("clusterIP", "") != "None") {
      uint64_t n = ++service_ip_counter_;
      std::string ip = absl::StrCat("10.96.", (n >> 8) & 0xff, ".", n & 0xff);
      spec["clusterIP"] = ip;
      spec["clusterIPs"] = {ip};
    } else {
      spec["clusterIPs"] = {"None"};
    }
    if (spec.contains("ports") && spec["ports"].is_array()) {
      for (json& p : spec["ports"]) {
        if (!p.is_object()) continue;
        if (!p.contains("protocol")) p["protocol"] = "TCP";
        if (!p.contains("targetPort") && p.contains("port")) p["targetPort"] = p["port"];
      }
    }
    body["status"] = {{"loadBalancer", json::object()}};
  } else if (t.plural == "persistentvolumeclaims") {
    json modes = body.contains("spec") && body["spec"].is_object()
                     ? body["spec"].value("accessModes", json::array())
                     : json::array();
    json capacity = json::object();
    if (const json* req = GetPath(body, "spec.resources.requests"); req != nullptr) {
      capacity = *req;
    }
    body["status"] = {{"phase", "Bound"}, {"accessModes", modes}, {"capacity", capacity}};
    if (body["spec"].is_object()) body["spec"]["volumeName"] = "pv-" + Uid().substr(0, 8);
  } else if (t.plural == "namespaces") {
    body["status"] = {{"phase", "Active"}};
    meta["labels"]["kubernetes.io/metadata.name"] = name;
    if (!body.contains("spec")) body["spec"] = {{"finalizers", {"kubernetes"}}};
  }
  std::vector<SchemaError> errors = ValidateLocked(t, body, true, converted);
  if (StrictFailureLocked(t, err)) return absl::InvalidArgumentError("unknown fields");
  if (!errors.empty()) {
    *err = Invalid(t, name, errors);
    return absl::InvalidArgumentError("invalid");
  }
  if (FindLocked(t, ns, name) != nullptr) {
    *err = Err(409, "AlreadyExists", absl::StrCat(t.Qualified(), " \"", name, "\" already exists"),
               {{"name", name}, {"group", t.group}, {"kind", t.plural}});
    return absl::AlreadyExistsError("exists");
  }
  json& m = body["metadata"];
  // A converted object keeps the identity its conversion webhook was shown.
  if (!converted || MetaStr(body, "uid").empty()) m["uid"] = Uid();
  if (!converted || MetaStr(body, "creationTimestamp").empty()) m["creationTimestamp"] = Now();
  m["generation"] = 1;
  m.erase("deletionTimestamp");
  m.erase("deletionGracePeriodSeconds");
  m.erase("managedFields");
  m.erase("selfLink");
  if (m.contains("finalizers") && m["finalizers"].empty()) m.erase("finalizers");
  m["resourceVersion"] = std::to_string(++rv_);
  if (t.plural == "customresourcedefinitions") {
    const json& spec = body["spec"];
    std::vector<std::string> stored;
    for (const json& v : spec["versions"]) {
      if (v.value("storage", false)) stored.push_back(v.value("name", ""));
    }
    std::string now = Now();
    body["status"] = {{"conditions",
                       {{{"type", "NamesAccepted"},
                         {"status", "True"},
                         {"lastTransitionTime", now},
                         {"reason", "NoConflicts"},
                         {"message", "no conflicts found"}},
                        {{"type", "Established"},
                         {"status", "True"},
                         {"lastTransitionTime", now},
                         {"reason", "InitialNamesAccepted"},
                         {"message", "the initial names have been accepted"}}}},
                      {"acceptedNames", spec["names"]},
                      {"storedVersions", stored}};
    RegisterCrdLocked(body);
  }
  auto obj = std::make_shared<const json>(std::move(body));
  CommitLocked(t.StoreKey(), "ADDED", nullptr, obj);
  if (t.plural == "pods") SchedulePod(*obj);
  if (Meta(*obj).contains("ownerReferences") && !Meta(*obj)["ownerReferences"].empty()) {
    // Like the garbage collector, collect a dependent created for owners that are gone.
    std::string store_key = t.StoreKey();
    std::string uid = MetaStr(*obj, "uid");
    std::string key = ObjKey(ns, name);
    scheduler_.After(absl::Milliseconds(20), [this, store_key, key, uid] {
      absl::MutexLock l(&mu_);
      TypePtr dt = TypeForStoreKeyLocked(store_key);
      auto bucket = objects_.find(store_key);
      if (dt == nullptr || bucket == objects_.end()) return;
      auto it = bucket->second.find(key);
      if (it == bucket->second.end() || MetaStr(*it->second, "uid") != uid) return;
      const json& refs = Meta(*it->second)["ownerReferences"];
      if (!refs.is_array() || refs.empty()) return;
      for (const json& r : refs) {
        if (uids_.count(r.value("uid", ""))) return;
      }
      ApiError err;
      DeleteLocked(*dt, it->second, json::object(), &err);
    });
  }
  return obj;
}

void EmulatorImpl::RegisterCrdLocked(const json& crd) {
  const json& spec = crd["spec"];
  const json& names = spec["names"];
  auto info = std::make_shared<CrdInfo>();
  info->group = spec.value("group", "");
  info->kind = names.value("kind", "");
  if (const json* conversion = GetPath(crd, "spec.conversion");
      conversion != nullptr && conversion->is_object() &&
      conversion->value("strategy", "None") == "Webhook") {
    info->webhook = true;
    const json webhook = conversion->value("webhook", json::object());
    const json cc = webhook.value("clientConfig", json::object());
    info->client.url = cc.value("url", "");
    if (const json svc = cc.value("service", json()); svc.is_object()) {
      info->client.service_namespace = svc.value("namespace", "");
      info->client.service_name = svc.value("name", "");
      info->client.service_path = svc.value("path", "");
      info->client.service_port = svc.value("port", 443);
    }
    if (cc.contains("caBundle") && cc["caBundle"].is_string()) {
      (void)absl::Base64Unescape(cc["caBundle"].get<std::string>(), &info->client.ca_bundle);
    }
    // The first ConversionReview version of the CRD's list that is spoken.
    for (const json& v : webhook.value("conversionReviewVersions", json::array())) {
      if (v == "v1" || v == "v1beta1") {
        info->review_version = v.get<std::string>();
        break;
      }
    }
  }
  std::vector<std::string> served;
  for (const json& v : spec["versions"]) {
    ResourceType t;
    t.group = info->group;
    t.version = v.value("name", "");
    t.plural = names.value("plural", "");
    t.singular = names.value("singular", absl::AsciiStrToLower(names.value("kind", "")));
    t.kind = info->kind;
    t.namespaced = spec.value("scope", "Namespaced") == "Namespaced";
    if (names.contains("shortNames"))
      t.short_names = names["shortNames"].get<std::vector<std::string>>();
    if (names.contains("categories"))
      t.categories = names["categories"].get<std::vector<std::string>>();
    if (const json* s = GetPath(v, "schema.openAPIV3Schema"); s != nullptr) t.schema = *s;
    if (const json* sub = GetPath(v, "subresources"); sub != nullptr && sub->is_object()) {
      t.status_sub = sub->contains("status");
      if (sub->contains("scale")) {
        t.scale_sub = true;
        const json& sc = (*sub)["scale"];
        t.spec_replicas_path = sc.value("specReplicasPath", ".spec.replicas");
        t.status_replicas_path = sc.value("statusReplicasPath", ".status.replicas");
        t.label_selector_path = sc.value("labelSelectorPath", "");
      }
    }
    t.printer_columns = v.value("additionalPrinterColumns", json::array());
    t.custom = true;
    if (v.value("deprecated", false)) {
      t.deprecation_warning = v.value("deprecationWarning", "");
      if (t.deprecation_warning.empty()) {
        t.deprecation_warning =
            absl::StrCat(t.group, "/", t.version, " ", t.kind, " is deprecated");
      }
    }
    if (v.value("storage", false)) info->storage_version = t.version;
    if (v.value("served", true)) served.push_back(t.version);
    const std::string version = t.version;
    info->versions[version] = std::make_shared<const ResourceType>(std::move(t));
  }
  std::shared_ptr<const CrdInfo> shared = info;
  for (const std::string& version : served) {
    ResourceType t = *info->versions[version];
    t.crd = shared;
    AddType(std::move(t));
  }
}

void EmulatorImpl::UnregisterCrdLocked(const json& crd) {
  std::string group =
      GetPath(crd, "spec.group") ? GetPath(crd, "spec.group")->get<std::string>() : "";
  const json* plural = GetPath(crd, "spec.names.plural");
  if (plural == nullptr) return;
  for (auto it = types_.begin(); it != types_.end();) {
    if (it->second->custom && it->second->group == group && it->second->plural == *plural) {
      it = types_.erase(it);
    } else {
      ++it;
    }
  }
}

ObjPtr EmulatorImpl::UpdateLocked(const ResourceType& t, const ObjPtr& old, json next,
                                  const std::string& sub, bool require_rv, ApiError* err,
                                  bool converted) {
  const json& o = *old;
  std::string name = MetaStr(o, "name");
  if (!CheckNextBody(t, o, next, require_rv, err)) return nullptr;
  std::string rv = next["metadata"].value("resourceVersion", "");
  if (!rv.empty() && rv != MetaStr(o, "resourceVersion")) {
    *err = Conflict(t, name);
    return nullptr;
  }
  MergeUpdate(t, o, next, sub);
  json& m = next["metadata"];
  const json& om = Meta(o);
  std::vector<SchemaError> errors = ValidateLocked(t, next, false, converted);
  if (t.custom && !converted) {
    for (SchemaError& e : CheckTransitionRules(next, o, t.schema)) errors.push_back(std::move(e));
  }
  // Immutable fields of built-in kinds that an upgrade (kubectl apply, helm upgrade) can
  // trip over.
  if (t.group == "rbac.authorization.k8s.io" && absl::EndsWith(t.plural, "bindings") &&
      next.value("roleRef", json()) != o.value("roleRef", json())) {
    errors.push_back({"roleRef", "FieldValueInvalid", "Invalid value: cannot change roleRef"});
  }
  if (t.group == "apps" && t.plural == "statefulsets") {
    for (const char* f :
         {"selector", "serviceName", "volumeClaimTemplates", "podManagementPolicy"}) {
      const json* a = GetPath(next, absl::StrCat("spec.", f));
      const json* b = GetPath(o, absl::StrCat("spec.", f));
      if ((a == nullptr) != (b == nullptr) || (a != nullptr && *a != *b)) {
        errors.push_back({"spec", "FieldValueForbidden",
                          "Forbidden: updates to statefulset spec for fields other than "
                          "'replicas', 'ordinals', 'template', 'updateStrategy', "
                          "'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are "
                          "forbidden"});
        break;
      }
    }
  }
  if (t.plural == "customresourcedefinitions") UpdateStoredVersions(next, &errors);
  if (StrictFailureLocked(t, err)) return nullptr;
  if (!errors.empty()) {
    *err = Invalid(t, name, errors);
    return nullptr;
  }
  // Generation follows changes outside metadata and status.
  if (!SameOutsideMetadataAndStatus(o, next)) m["generation"] = om.value("generation", 1) + 1;
  m["resourceVersion"] = om.value("resourceVersion", "");
  if (next == o) return old;  // no-op writes do not bump the resourceVersion
  m["resourceVersion"] = std::to_string(++rv_);
  if (t.plural == "customresourcedefinitions") {
    UnregisterCrdLocked(o);
    RegisterCrdLocked(next);
  }
  auto obj = std::make_shared<const json>(std::move(next));
  if (Meta(*obj).contains("deletionTimestamp") && !Meta(*obj).contains("finalizers")) {
    CommitLocked(t.StoreKey(), "MODIFIED", old, obj);
    return RemoveLocked(t, obj);
  }
  CommitLocked(t.StoreKey(), "MODIFIED", old, obj);
  return obj;
}

std::vector<std::pair<TypePtr, ObjPtr>> EmulatorImpl::DependentsLocked(
    const std::string& owner_uid) {
  std::vector<std::pair<TypePtr, ObjPtr>> out;
  auto range = dependents_.equal_range(owner_uid);
  for (auto it = range.first; it != range.second; ++it) {
    const auto& [store_key, key] = it->second;
    auto bucket = objects_.find(store_key);
    if (bucket == objects_.end()) continue;
    auto obj = bucket->second.find(key);
    TypePtr t = TypeForStoreKeyLocked(store_key);
    if (obj != bucket->second.end() && t != nullptr) out.push_back({t, obj->second});
  }
  return out;
}

ObjPtr EmulatorImpl::RemoveLocked(const ResourceType& t, const ObjPtr& obj) {
  json final_obj = *obj;
  final_obj["metadata"]["resourceVersion"] = std::to_string(++rv_);
  auto gone = std::make_shared<const json>(std::move(final_obj));
  CommitLocked(t.StoreKey(), "DELETED", obj, gone);
  std::string uid = MetaStr(*obj, "uid");
  if (t.plural == "namespaces") {
    std::string ns = MetaStr(*obj, "name");
    std::vector<std::pair<TypePtr, ObjPtr>> victims;
    for (const auto& [store_key, bucket] : objects_) {
      TypePtr vt = TypeForStoreKeyLocked(store_key);
      if (vt == nullptr || !vt->namespaced) continue;
      for (auto it = bucket.lower_bound(ns + "/"); it != bucket.end(); ++it) {
        if (!absl::StartsWith(it->first, ns + "/")) break;
        victims.push_back({vt, it->second});
      }
    }
    for (auto& [vt, v] : victims) {
      json stripped = *v;
      stripped["metadata"].erase("finalizers");
      ObjPtr cur = FindLocked(*vt, MetaStr(*v, "namespace"), MetaStr(*v, "name"));
      if (cur != nullptr) RemoveLocked(*vt, std::make_shared<const json>(std::move(stripped)));
    }
  } else if (t.plural == "customresourcedefinitions") {
    const json* group = GetPath(*obj, "spec.group");
    const json* plural = GetPath(*obj, "spec.names.plural");
    if (group != nullptr && plural != nullptr) {
      std::string store_key = group->get<std::string>() + "/" + plural->get<std::string>();
      TypePtr ct = TypeForStoreKeyLocked(store_key);
      auto bucket = objects_.find(store_key);
      if (ct != nullptr && bucket != objects_.end()) {
        std::vector<ObjPtr> all;
        for (const auto& [k, v] : bucket->second) all.push_back(v);
        for (const ObjPtr& v : all) RemoveLocked(*ct, v);
      }
      UnregisterCrdLocked(*obj);
    }
  }
  CollectGarbageLocked(uid);
  return gone;
}

void EmulatorImpl::CollectGarbageLocked(const std::string& owner_uid) {
  for (auto& [dt, dep] : DependentsLocked(owner_uid)) {
    ObjPtr cur = FindLocked(*dt, MetaStr(*dep, "namespace"), MetaStr(*dep, "name"));
    if (cur == nullptr) continue;
    bool any_alive = false;
    for (const json& r : Meta(*cur)["ownerReferences"]) {
      if (uids_.count(r.value("uid", ""))) any_alive = true;
    }
    ApiError err;
    if (any_alive) {
      json next = *cur;
      json refs = json::array();
      for (const json& r : next["metadata"]["ownerReferences"]) {
        if (r.value("uid", "") != owner_uid) refs.push_back(r);
      }
      next["metadata"]["ownerReferences"] = refs;
      UpdateLocked(*dt, cur, std::move(next), "", false, &err);
    } else {
      DeleteLocked(*dt, cur, json::object(), &err);
    }
  }
}

ObjPtr EmulatorImpl::DeleteLocked(const ResourceType& t, const ObjPtr& obj, const json& options,
                                  ApiError* err) {
  const json& m = Meta(*obj);
  std::string name = m.value("name", "");
  if (const json* pre = GetPath(options, "preconditions"); pre != nullptr && pre->is_object()) {
    std::string uid = pre->value("uid", "");
    std::string rv = pre->value("resourceVersion", "");
    auto failed = [&](const char* what, const std::string& want, const std::string& have) {
      *err = Err(409, "Conflict",
                 absl::StrCat("Operation cannot be fulfilled on ", t.Qualified(), " \"", name,
                              "\": Precondition failed: ", what, " in precondition: ", want, ", ",
                              what, " in object meta: ", have),
                 {{"name", name}, {"group", t.group}, {"kind", t.plural}});
    };
    if (!uid.empty() && uid != m.value("uid", "")) {
      failed("UID", uid, m.value("uid", ""));
      return nullptr;
    }
    if (!rv.empty() && rv != m.value("resourceVersion", "")) {
      failed("ResourceVersion", rv, m.value("resourceVersion", ""));
      return nullptr;
    }
  }
  std::string policy = options.value("propagationPolicy", "");
  if (policy.empty() && options.contains("orphanDependents") &&
      options["orphanDependents"].is_boolean()) {
    policy = options["orphanDependents"].get<bool>() ? "Orphan" : "Background";
  }
  std::string uid = m.value("uid", "");
  if (policy == "Orphan") {
    for (auto& [dt, dep] : DependentsLocked(uid)) {
      json next = *dep;
      json refs = json::array();
      for (const json& r : next["metadata"]["ownerReferences"]) {
        if (r.value("uid", "") != uid) refs.push_back(r);
      }
      if (refs.empty()) {
        next["metadata"].erase("ownerReferences");
      } else {
        next["metadata"]["ownerReferences"] = refs;
      }
      ApiError ignored;
      UpdateLocked(*dt, dep, std::move(next), "", false, &ignored);
    }
  }
  // Current version (orphaning may not touch it, but be safe).
  ObjPtr cur = FindLocked(t, m.value("namespace", ""), name);
  if (cur == nullptr) return obj;
  bool has_finalizers = Meta(*cur).contains("finalizers") && !Meta(*cur)["finalizers"].empty();
  // Graceful pod deletion: a bound pod gets deletionTimestamp and is removed by
  // the fake kubelet after the kubelet delay (gracePeriodSeconds=0 removes at once).
  int64_t grace = -1;
  if (options.contains("gracePeriodSeconds") && options["gracePeriodSeconds"].is_number()) {
    grace = options["gracePeriodSeconds"].get<int64_t>();
  }
  const json* node = GetPath(*cur, "spec.nodeName");
  if (t.plural == "pods" && grace != 0 && policy != "Foreground" && node != nullptr &&
      node->is_string() && !node->get<std::string>().empty() &&
      !Meta(*cur).contains("deletionTimestamp")) {
    json next = *cur;
    json& nm = next["metadata"];
    nm["deletionTimestamp"] = Now();
    nm["deletionGracePeriodSeconds"] =
        grace > 0 ? grace : next["spec"].value("terminationGracePeriodSeconds", int64_t{30});
    nm["resourceVersion"] = std::to_string(++rv_);
    auto upd = std::make_shared<const json>(std::move(next));
    CommitLocked(t.StoreKey(), "MODIFIED", cur, upd);
    std::string key = ObjKey(MetaStr(*upd, "namespace"), name);
    scheduler_.After(absl::Milliseconds(ready_delay_ms_), [this, key, uid] {
      absl::MutexLock l(&mu_);
      auto& pods = objects_["/pods"];
      auto it = pods.find(key);
      if (it == pods.end() || MetaStr(*it->second, "uid") != uid) return;
      const json& fm = Meta(*it->second);
      if (fm.contains("finalizers") && !fm["finalizers"].empty()) return;
      RemoveLocked(*types_["/v1/pods"], it->second);
    });
    return upd;
  }
  if (policy == "Foreground" || has_finalizers) {
    json next = *cur;
    json& nm = next["metadata"];
    bool changed = false;
    if (!nm.contains("deletionTimestamp")) {
      nm["deletionTimestamp"] = Now();
      nm["deletionGracePeriodSeconds"] = 0;
      changed = true;
    }
    if (policy == "Foreground") {
      json& f = nm["finalizers"];
      if (!f.is_array()) f = json::array();
      if (std::find(f.begin(), f.end(), "foregroundDeletion") == f.end()) {
        f.push_back("foregroundDeletion");
        changed = true;
      }
      scheduler_.After(absl::Milliseconds(5), [this, uid] { ForegroundGc(uid); });
    }
    if (!changed) return cur;
    nm["resourceVersion"] = std::to_string(++rv_);
    auto upd = std::make_shared<const json>(std::move(next));
    CommitLocked(t.StoreKey(), "MODIFIED", cur, upd);
    return upd;
  }
  return RemoveLocked(t, cur);
}

void EmulatorImpl::ForegroundGc(std::string uid) {
  absl::MutexLock l(&mu_);
  auto it = uids_.find(uid);
  if (it == uids_.end()) return;
  auto [store_key, key] = it->second;
  TypePtr t = TypeForStoreKeyLocked(store_key);
  if (t == nullptr) return;
  ObjPtr owner = objects_[store_key][key];
  std::vector<std::pair<TypePtr, ObjPtr>> deps = DependentsLocked(uid);
  if (!deps.empty()) {
    // Blocking dependents first, then the rest.
    std::stable_sort(deps.begin(), deps.end(), [&](const auto& a, const auto& b) {
      auto blocking = [&](const ObjPtr& o) {
        for (const json& r : Meta(*o)["ownerReferences"]) {
          if (r.value("uid", "") == uid && r.value("blockOwnerDeletion", false)) return true;
        }
        return false;
      };
      return blocking(a.second) && !blocking(b.second);
    });
    for (auto& [dt, dep] : deps) {
      if (Meta(*dep).contains("deletionTimestamp")) continue;
      ApiError err;
      DeleteLocked(*dt, dep, {{"propagationPolicy", "Foreground"}}, &err);
    }
    scheduler_.After(absl::Milliseconds(10), [this, uid] { ForegroundGc(uid); });
    return;
  }
  json next = *owner;
  json fins = json::array();
  for (const json& f : Meta(next)["finalizers"]) {
    if (f != "foregroundDeletion") fins.push_back(f);
  }
  ApiError err;
  if (fins.empty()) {
    next["metadata"].erase("finalizers");
  } else {
    next["metadata"]["finalizers"] = fins;
  }
  UpdateLocked(*t, owner, std::move(next), "", false, &err);
}

// ---------------------------------------------------------------- kubelet

void EmulatorImpl::SchedulePod(const json& pod) {
  std::string key = ObjKey(MetaStr(pod, "namespace"), MetaStr(pod, "name"));
  std::string uid = MetaStr(pod, "uid");
  const json* node = GetPath(pod, "spec.nodeName");
  if (node != nullptr && node->is_string() && !node->get<std::string>().empty()) {
    scheduler_.After(absl::Milliseconds(ready_delay_ms_), [this, key, uid] { StartPod(key, uid); });
  } else {
    scheduler_.After(absl::Milliseconds(1), [this, key, uid] { BindPod(key, uid); });
  }
}

void EmulatorImpl::BindPod(std::string key, std::string uid) {
  absl::MutexLock l(&mu_);
  TypePtr t = types_["/v1/pods"];
  auto& bucket = objects_["/pods"];
  auto it = bucket.find(key);
  if (it == bucket.end() || MetaStr(*it->second, "uid") != uid) return;
  ObjPtr old = it->second;
  if (Meta(*old).contains("deletionTimestamp")) return;
  // spec.nodeSelector must match a node's labels (round robin over the nodes that do);
  // with none, the pod stays Pending with PodScheduled=False/Unschedulable, as the
  // scheduler reports it, and is tried again every 500 ms (a node may be labelled).
  LabelSelector wanted;
  if (const json* selector = GetPath(*old, "spec.nodeSelector");
      selector != nullptr && selector->is_object()) {
    for (auto sel = selector->begin(); sel != selector->end(); ++sel) {
      wanted.push_back({sel.key(),
                        LabelRequirement::Op::kEquals,
                        {sel->is_string() ? sel->get<std::string>() : sel->dump()}});
    }
  }
  std::vector<std::string> fit;
  const auto node_bucket = objects_.find("/nodes");
  if (node_bucket != objects_.end()) {
    for (const auto& [node_key, node_obj] : node_bucket->second) {
      if (LabelsMatch(wanted, Labels(*node_obj))) fit.push_back(MetaStr(*node_obj, "name"));
    }
  }
  const json* conditions = GetPath(*old, "status.conditions");
  bool reported = false;  // PodScheduled=False/Unschedulable is on the pod already
  if (conditions != nullptr && conditions->is_array()) {
    for (const json& c : *conditions) {
      reported = reported || (c.value("type", "") == "PodScheduled" &&
                              c.value("reason", "") == "Unschedulable");
    }
  }
  if (fit.empty()) {
    const size_t nodes = node_bucket == objects_.end() ? 0 : node_bucket->second.size();
    if (!reported) {
      json next = *old;
      next["status"]["phase"] = "Pending";
      next["status"]["conditions"] = {
          {{"type", "PodScheduled"},
           {"status", "False"},
           {"lastProbeTime", nullptr},
           {"lastTransitionTime", Now()},
           {"reason", "Unschedulable"},
           {"message", absl::StrCat("0/", nodes, " nodes are available: ", nodes,
                                    " node(s) didn't match Pod's node affinity/selector.")}}};
      ApiError err;
      if (UpdateLocked(*t, old, std::move(next), "status", false, &err) == nullptr) return;
    }
    scheduler_.After(absl::Milliseconds(500), [this, key, uid] { BindPod(key, uid); });
    return;
  }
  std::sort(fit.begin(), fit.end());
  json next = *old;
  std::string node = fit[node_rr_++ % fit.size()];
  next["spec"]["nodeName"] = node;
  next["status"]["conditions"] = {{{"type", "PodScheduled"},
                                   {"status", "True"},
                                   {"lastProbeTime", nullptr},
                                   {"lastTransitionTime", Now()}}};
  json scheduled = next["status"]["conditions"];
  ApiError err;
  ObjPtr bound = UpdateLocked(*t, old, std::move(next), "", false, &err);
  if (bound == nullptr) return;
  if (reported) {
    // The status (not written by the update above) still says Unschedulable: replace it.
    json status_next = *bound;
    status_next["status"]["conditions"] = std::move(scheduled);
    if (UpdateLocked(*t, bound, std::move(status_next), "status", false, &err) == nullptr) return;
  }
  scheduler_.After(absl::Milliseconds(ready_delay_ms_), [this, key, uid] { StartPod(key, uid); });
}

void EmulatorImpl::StartPod(std::string key, std::string uid) {
  absl::MutexLock l(&mu_);
  TypePtr t = types_["/v1/pods"];
  auto& bucket = objects_["/pods"];
  auto it = bucket.find(key);
  if (it == bucket.end() || MetaStr(*it->second, "uid") != uid) return;
  ObjPtr old = it->second;
  const json* phase = GetPath(*old, "status.phase");
  if (phase == nullptr || *phase != "Pending" || Meta(*old).contains("deletionTimestamp")) return;
  if (fail_rate_ > 0 && Random() < fail_rate_) {
    FailPodLocked(old, "Error");
    return;
  }
  json next = *old;
  std::string node = next["spec"].value("nodeName", "emu-node-1");
  int node_index = 1;
  if (absl::StartsWith(node, "emu-node-")) {
    (void)absl::SimpleAtoi(node.substr(9), &node_index);
  }
  uint64_t n = ++pod_ip_counter_;
  std::string ip = !options_.pod_ip.empty() ? options_.pod_ip
                                            : absl::StrCat("10.", 244 + (n >> 16) % 10, ".",
                                                           (n >> 8) & 0xff, ".", n & 0xff);
  std::string host_ip = absl::StrCat("172.18.0.", node_index + 1);
  std::string now = Now();
  json& st = next["status"];
  st["phase"] = "Running";
  st["podIP"] = ip;
  st["podIPs"] = {{{"ip", ip}}};
  st["hostIP"] = host_ip;
  st["hostIPs"] = {{{"ip", host_ip}}};
  st["startTime"] = now;
  json conds = json::array();
  for (const char* c :
       {"PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"}) {
    conds.push_back(
        {{"type", c}, {"status", "True"}, {"lastProbeTime", nullptr}, {"lastTransitionTime", now}});
  }
  st["conditions"] = conds;
  json statuses = json::array();
  for (const json& c : next["spec"]["containers"]) {
    statuses.push_back({{"name", c.value("name", "")},
                        {"image", c.value("image", "")},
                        {"imageID", "docker.io/library/" + c.value("image", "") + "@sha256:0"},
                        {"containerID", "containerd://" + Uid()},
                        {"ready", true},
                        {"started", true},
                        {"restartCount", 0},
                        {"state", {{"running", {{"startedAt", now}}}}},
                        {"lastState", json::object()}});
  }
  st["containerStatuses"] = statuses;
  ApiError err;
  UpdateLocked(*t, old, std::move(next), "status", false, &err);
}

bool EmulatorImpl::FailPodLocked(const ObjPtr& old, const std::string& reason) {
  TypePtr t = types_["/v1/pods"];
  json next = *old;
  std::string now = Now();
  json& st = next["status"];
  st["phase"] = "Failed";
  json conds = st.value("conditions", json::array());
  for (const char* c : {"Ready", "ContainersReady"}) {
    bool found = false;
    for (json& x : conds) {
      if (x.value("type", "") == c) {
        x["status"] = "False";
        x["reason"] = "PodFailed";
        x["lastTransitionTime"] = now;
        found = true;
      }
    }
    if (!found) {
      conds.push_back({{"type", c},
                       {"status", "False"},
                       {"reason", "PodFailed"},
                       {"lastProbeTime", nullptr},
                       {"lastTransitionTime", now}});
    }
  }
  st["conditions"] = conds;
  json statuses = json::array();
  for (const json& c : next["spec"]["containers"]) {
    statuses.push_back(
        {{"name", c.value("name", "")},
         {"image", c.value("image", "")},
         {"ready", false},
         {"started", false},
         {"restartCount", 0},
         {"state",
          {{"terminated",
            {{"exitCode", 1}, {"reason", reason}, {"startedAt", now}, {"finishedAt", now}}}}},
         {"lastState", json::object()}});
  }
  st["containerStatuses"] = statuses;
  ApiError err;
  return UpdateLocked(*t, old, std::move(next), "status", false, &err) != nullptr;
}

// ---------------------------------------------------------------- verbs

json EmulatorImpl::ScaleFor(const ResourceType& t, const json& obj) {
  const json* spec = GetPath(obj, t.spec_replicas_path);
  const json* status = GetPath(obj, t.status_replicas_path);
  json scale = {
      {"kind", "Scale"},
      {"apiVersion", "autoscaling/v1"},
      {"metadata",
       {{"name", MetaStr(obj, "name")},
        {"namespace", MetaStr(obj, "namespace")},
        {"uid", MetaStr(obj, "uid")},
        {"resourceVersion", MetaStr(obj, "resourceVersion")},
        {"creationTimestamp", MetaStr(obj, "creationTimestamp")}}},
      {"spec", {{"replicas", spec != nullptr && spec->is_number() ? *spec : json(0)}}},
      {"status", {{"replicas", status != nullptr && status->is_number() ? *status : json(0)}}}};
  if (!t.label_selector_path.empty()) {
    const json* sel = GetPath(obj, t.label_selector_path);
    if (sel != nullptr && sel->is_string()) scale["status"]["selector"] = *sel;
  } else if (!t.custom && t.plural == "statefulsets") {
    // Built-in workloads report their spec.selector (matchLabels) in selector syntax.
    const json* labels = GetPath(obj, "spec.selector.matchLabels");
    if (labels != nullptr && labels->is_object() && !labels->empty()) {
      std::vector<std::string> terms;
      for (auto it = labels->begin(); it != labels->end(); ++it) {
        terms.push_back(absl::StrCat(it.key(), "=", it->is_string() ? it->get<std::string>() : ""));
      }
      scale["status"]["selector"] = absl::StrJoin(terms, ",");
    }
  }
  return scale;
}

// ---------------------------------------------------------------- conversion

bool EmulatorImpl::ConvertTo(const CrdInfo& crd, const std::string& version,
                             std::vector<json>* objs, bool list, ApiError* err) {
  const std::string desired = crd.group + "/" + version;
  std::vector<size_t> todo;
  for (size_t i = 0; i < objs->size(); ++i) {
    if ((*objs)[i].value("apiVersion", "") != desired) todo.push_back(i);
  }
  if (todo.empty()) return true;
  if (crd.webhook) {
    std::vector<json> sent;
    sent.reserve(todo.size());
    for (size_t i : todo) sent.push_back(std::move((*objs)[i]));
    ConversionCall call;
    call.client = crd.client;
    call.review_version = crd.review_version;
    call.timeout = absl::Milliseconds(options_.conversion_webhook_timeout_ms);
    if (!crd.client.service_name.empty()) {
      absl::MutexLock l(&services_mu_);
      auto it =
          service_addresses_.find(crd.client.service_namespace + "/" + crd.client.service_name);
      if (it != service_addresses_.end()) call.service_address = it->second;
    }
    // Named as the API server names it: the version the objects are converted from.
    const std::string in_gvk = absl::StrCat(sent[0].value("apiVersion", ""), ", Kind=", crd.kind);
    absl::StatusOr<std::vector<json>> converted =
        ConvertWithWebhook(call, Uid(), desired, in_gvk, list, sent);
    if (!converted.ok()) {
      // Not logged: the answer says it, and a test's harness may never drain stderr.
      *err = ConversionFailed(std::string(converted.status().message()));
      return false;
    }
    for (size_t k = 0; k < todo.size(); ++k) (*objs)[todo[k]] = std::move((*converted)[k]);
  } else {
    for (size_t i : todo) (*objs)[i]["apiVersion"] = desired;
  }
  auto target = crd.versions.find(version);
  if (target != crd.versions.end()) {
    for (size_t i : todo) PruneToSchema((*objs)[i], target->second->schema);
  }
  return true;
}

bool EmulatorImpl::ConvertForRequest(const ResourceType& t, std::vector<ObjPtr>* objs, bool list,
                                     ApiError* err) {
  if (!Converting(t)) return true;
  const std::string gv = t.GroupVersion();
  std::vector<size_t> todo;
  std::vector<json> converted;
  for (size_t i = 0; i < objs->size(); ++i) {
    const ObjPtr& o = (*objs)[i];
    if (o != nullptr && o->value("apiVersion", "") != gv) {
      todo.push_back(i);
      converted.push_back(*o);
    }
  }
  if (todo.empty()) return true;
  if (!ConvertTo(*t.crd, t.version, &converted, list, err)) return false;
  for (size_t k = 0; k < todo.size(); ++k) {
    (*objs)[todo[k]] = std::make_shared<const json>(std::move(converted[k]));
  }
  return true;
}

TypePtr EmulatorImpl::CurrentType(const TypePtr& t) {
  absl::MutexLock l(&mu_);
  auto it = types_.find(absl::StrCat(t->group, "/", t->version, "/", t->plural));
  return it != types_.end() ? it->second : t;
}

void EmulatorImpl::CreateConverted(HttpResponder& resp, const ResourceType& t,
                                   const std::string& ns, json body, FieldCheck& unknown) {
  ApiError err;
  const TypePtr storage = t.crd->StorageType();
  auto fail = [&](const ApiError& e) { SendError(resp, e); };
  // First what the request version's strategy does, before the object is encoded for
  // storage (the webhook sees it with its name, uid and creationTimestamp).
  if (OtherApiVersion(t, body, &err) || !CheckNewBody(t, ns, body, &err)) return fail(err);
  bool writable;
  {
    absl::MutexLock l(&mu_);
    writable = NamespaceWritableLocked(t, ns, &err);
  }
  if (!writable) return fail(err);
  std::string name = body["metadata"].value("name", "");
  if (name.empty()) {
    std::string gen = body["metadata"].value("generateName", "");
    if (gen.empty()) {
      return fail(Invalid(t, "",
                          {{"metadata.name", "FieldValueRequired",
                            "Required value: name or generateName is required"}}));
    }
    name = gen + RandomSuffix();
    body["metadata"]["name"] = name;
  }
  body["apiVersion"] = t.GroupVersion();
  body["kind"] = t.kind;
  if (t.status_sub) body.erase("status");
  std::vector<SchemaError> errors = ValidateCustom(t, body, &unknown);
  if (StrictFailure(t, &unknown, &err)) return fail(err);
  if (!errors.empty()) return fail(Invalid(t, name, errors));
  json& m = body["metadata"];
  m["uid"] = Uid();
  m["creationTimestamp"] = Now();
  m["generation"] = 1;
  for (const char* f : {"deletionTimestamp", "deletionGracePeriodSeconds", "managedFields",
                        "selfLink", "resourceVersion"}) {
    m.erase(f);
  }
  std::vector<json> objs;
  objs.push_back(std::move(body));
  if (!ConvertTo(*t.crd, storage->version, &objs, false, &err)) return fail(err);
  absl::StatusOr<ObjPtr> created;
  {
    absl::MutexLock l(&mu_);
    created = CreateLocked(*storage, ns, std::move(objs[0]), &err, /*converted=*/true);
  }
  if (!created.ok()) return fail(err);
  std::vector<ObjPtr> out = {*created};
  if (!ConvertForRequest(t, &out, false, &err)) return fail(err);
  resp.Send(201, kJson, out[0]->dump(), FieldWarnings(unknown));
}

void EmulatorImpl::UpdateConverted(HttpResponder& resp, const Target& t, bool patch, PatchKind kind,
                                   const json& body, FieldCheck& unknown) {
  const ResourceType& vt = *t.type;
  const TypePtr storage = vt.crd->StorageType();
  auto fail = [&](const ApiError& e) { SendError(resp, e); };
  // A patch without a resourceVersion applies to the object as it is: when it changed
  // while this one was converted, the patch is applied again (the API server retries
  // such conflicts too).
  const bool retry = patch && !PatchNamesResourceVersion(kind, body);
  constexpr int kMaxAttempts = 20;
  for (int attempt = 1;; ++attempt) {
    ApiError err;
    ObjPtr old;
    {
      absl::MutexLock l(&mu_);
      old = FindLocked(*storage, t.ns, t.name);
    }
    if (old == nullptr) {
      if (kind != kApply || !patch || !t.sub.empty()) return fail(NotFound(vt, t.name));
      json obj = body;
      if (obj.is_object()) {
        if (!obj["metadata"].is_object()) obj["metadata"] = json::object();
        obj["metadata"]["name"] = t.name;
      }
      return CreateConverted(resp, vt, t.ns, std::move(obj), unknown);
    }
    // The object as seen in the request's version is what a patch applies to.
    std::vector<ObjPtr> seen = {old};
    if (!ConvertForRequest(vt, &seen, false, &err)) return fail(err);
    const json& old_v = *seen[0];
    std::string sub = t.sub;
    json next;
    if (t.sub == "scale") {
      json scale = ScaleFor(vt, old_v);
      json changed;
      if (!patch) {
        changed = body;
      } else if (!ApplyPatch(kind, true, scale, body, &changed, &err)) {
        return fail(err);
      }
      if (!changed.is_object()) changed = json::object();
      const json* replicas = GetPath(changed, "spec.replicas");
      if (replicas == nullptr || !replicas->is_number_integer() || replicas->get<int64_t>() < 0) {
        return fail(Err(422, "Invalid",
                        absl::StrCat("Scale.autoscaling \"", t.name,
                                     "\" is invalid: spec.replicas: Invalid value: ",
                                     replicas == nullptr ? "null" : replicas->dump(),
                                     ": must be greater than or equal to 0")));
      }
      next = old_v;
      SetPath(next, vt.spec_replicas_path, *replicas);
      const json* rv = GetPath(changed, "metadata.resourceVersion");
      if (rv != nullptr && rv->is_string() && !rv->get<std::string>().empty()) {
        next["metadata"]["resourceVersion"] = *rv;
      }
      sub = "";
    } else if (!patch) {
      if (OtherApiVersion(vt, body, &err)) return fail(err);
      next = body;
    } else if (!ApplyPatch(kind, true, old_v, body, &next, &err)) {
      return fail(err);
    }
    // What the request version's strategy checks.
    if (!CheckNextBody(vt, old_v, next, !patch && t.sub.empty(), &err)) return fail(err);
    std::string rv = next["metadata"].value("resourceVersion", "");
    if (!rv.empty() && rv != MetaStr(old_v, "resourceVersion")) return fail(Conflict(vt, t.name));
    MergeUpdate(vt, old_v, next, sub);
    unknown.unknown.clear();
    std::vector<SchemaError> errors = ValidateCustom(vt, next, &unknown);
    for (SchemaError& e : CheckTransitionRules(next, old_v, vt.schema)) {
      errors.push_back(std::move(e));
    }
    if (StrictFailure(vt, &unknown, &err)) return fail(err);
    if (!errors.empty()) return fail(Invalid(vt, t.name, errors));
    std::vector<json> nexts;
    nexts.push_back(std::move(next));
    if (!ConvertTo(*vt.crd, storage->version, &nexts, false, &err)) return fail(err);
    ObjPtr cur, result;
    bool again = false;
    {
      absl::MutexLock l(&mu_);
      cur = FindLocked(*storage, t.ns, t.name);
      if (cur == nullptr) {
        err = NotFound(vt, t.name);
      } else if (MetaStr(*cur, "resourceVersion") != MetaStr(*old, "resourceVersion")) {
        if (retry && attempt < kMaxAttempts) {
          again = true;
        } else {
          err = Conflict(vt, t.name);
        }
      } else {
        result = UpdateLocked(*storage, cur, std::move(nexts[0]), sub, false, &err,
                              /*converted=*/true);
      }
    }
    if (again) continue;
    if (result == nullptr) return fail(err);
    std::vector<ObjPtr> out = {result};
    if (result == cur) {
      out[0] = seen[0];  // a no-op write: the object as read
    } else if (!ConvertForRequest(vt, &out, false, &err)) {
      return fail(err);
    }
    if (t.sub == "scale") {
      SendJson(resp, 200, ScaleFor(vt, *out[0]));
    } else {
      resp.Send(200, kJson, out[0]->dump(), FieldWarnings(unknown));
    }
    return;
  }
}

void EmulatorImpl::DoGet(const HttpRequest& req, HttpResponder& resp, const Target& t) {
  ObjPtr obj;
  {
    absl::MutexLock l(&mu_);
    obj = FindLocked(*t.type, t.ns, t.name);
  }
  if (obj == nullptr) {
    SendError(resp, NotFound(*t.type, t.name));
    return;
  }
  std::vector<ObjPtr> seen = {obj};
  if (ApiError err; !ConvertForRequest(*t.type, &seen, false, &err)) {
    SendError(resp, err);
    return;
  }
  obj = seen[0];
  if (t.sub == "scale") {
    SendJson(resp, 200, ScaleFor(*t.type, *obj));
    return;
  }
  if (req.Header("accept").find("as=Table") != std::string::npos) {
    SendJson(resp, 200,
             ToTable(*t.type, {obj}, {{"resourceVersion", MetaStr(*obj, "resourceVersion")}}));
    return;
  }
  resp.Send(200, kJson, obj->dump());
}

// The request's label and field selectors; false (after a 400 naming the problem) when
// either does not parse.
bool EmulatorImpl::ParseSelectors(const HttpRequest& req, HttpResponder& resp, Selectors* out) {
  auto labels = ParseLabelSelector(req.Query("labelSelector"));
  auto fields = ParseFieldSelector(req.Query("fieldSelector"));
  if (!labels.ok() || !fields.ok()) {
    SendError(resp, Err(400, "BadRequest",
                        std::string(!labels.ok() ? labels.status().message()
                                                 : fields.status().message())));
    return false;
  }
  out->labels = *std::move(labels);
  out->fields = *std::move(fields);
  return true;
}

void EmulatorImpl::DoList(const HttpRequest& req, HttpResponder& resp, const Target& t) {
  Selectors selectors;
  if (!ParseSelectors(req, resp, &selectors)) return;
  int64_t limit = 0;
  if (req.HasQuery("limit")) (void)absl::SimpleAtoi(req.Query("limit"), &limit);
  std::string start_after;
  uint64_t list_rv = 0;
  std::string token = req.Query("continue");
  if (!token.empty()) {
    std::string decoded;
    json tok;
    if (!absl::WebSafeBase64Unescape(token, &decoded) ||
        !(tok = json::parse(decoded, nullptr, false)).is_object()) {
      SendError(resp, Err(400, "BadRequest", "continue key is not valid"));
      return;
    }
    start_after = tok.value("start", "");
    list_rv = tok.value("rv", uint64_t{0});
  }
  std::vector<ObjPtr> items;
  int64_t remaining = 0;
  std::string last_key;
  {
    absl::ReleasableMutexLock l(&mu_);
    if (!token.empty() && list_rv < history_floor_) {
      ApiError e = Err(410, "Expired",
                       "The provided continue parameter is too old to display a consistent list "
                       "result. You can start a new list without the continue parameter, or use "
                       "the continue token in this response to retrieve the remainder of the "
                       "results. Continuing with the provided token results in an inconsistent "
                       "list - objects that were created, modified, or deleted between the time "
                       "the first chunk was returned and now may show up in the list.");
      l.Release();
      SendError(resp, e);
      return;
    }
    if (token.empty()) list_rv = rv_;
    auto bucket_it = objects_.find(t.type->StoreKey());
    if (bucket_it != objects_.end()) {
      const auto& bucket = bucket_it->second;
      std::string prefix = t.all_namespaces ? "" : t.ns + "/";
      auto it = start_after.empty() ? bucket.lower_bound(prefix) : bucket.upper_bound(start_after);
      for (; it != bucket.end(); ++it) {
        if (!absl::StartsWith(it->first, prefix)) break;
        const json& o = *it->second;
        if (!LabelsMatch(selectors.labels, Labels(o)) || !FieldsMatch(selectors.fields, o))
          continue;
        if (limit > 0 && static_cast<int64_t>(items.size()) >= limit) {
          ++remaining;
          continue;
        }
        items.push_back(it->second);
        last_key = it->first;
      }
    }
    l.Release();
  }
  if (ApiError err; !ConvertForRequest(*t.type, &items, true, &err)) {
    SendError(resp, err);
    return;
  }
  json meta = {{"resourceVersion", std::to_string(list_rv)}};
  if (remaining > 0) {
    meta["continue"] =
        absl::WebSafeBase64Escape(json({{"rv", list_rv}, {"start", last_key}}).dump());
    meta["remainingItemCount"] = remaining;
  }
  if (req.Header("accept").find("as=Table") != std::string::npos) {
    SendJson(resp, 200, ToTable(*t.type, items, meta));
    return;
  }
  std::string out =
      absl::StrCat("{\"kind\":\"", t.type->kind, "List\",\"apiVersion\":\"", t.type->GroupVersion(),
                   "\",\"metadata\":", meta.dump(), ",\"items\":[");
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += ",";
    out += items[i]->dump();
  }
  out += "]}";
  resp.Send(200, kJson, out);
}

json EmulatorImpl::ToTable(const ResourceType& t, const std::vector<ObjPtr>& items,
                           const json& list_meta) {
  auto col = [](const std::string& name, const std::string& type, const std::string& format,
                int priority) {
    return json({{"name", name},
                 {"type", type},
                 {"format", format},
                 {"description", ""},
                 {"priority", priority}});
  };
  json cols = json::array();
  cols.push_back(col("Name", "string", "name", 0));
  bool pods = t.plural == "pods";
  if (pods) {
    cols.push_back(col("Ready", "string", "", 0));
    cols.push_back(col("Status", "string", "", 0));
    cols.push_back(col("Restarts", "string", "", 0));
  }
  json printer = t.custom ? t.printer_columns : json::array();
  bool has_age_column = false;
  for (const json& pc : printer) {
    cols.push_back(col(pc.value("name", ""), pc.value("type", "string"), pc.value("format", ""),
                       pc.value("priority", 0)));
    if (pc.value("jsonPath", "") == ".metadata.creationTimestamp") has_age_column = true;
  }
  if (!has_age_column) cols.push_back(col("Age", "string", "", 0));
  if (pods) {
    cols.push_back(col("IP", "string", "", 1));
    cols.push_back(col("Node", "string", "", 1));
  }
  absl::Time now = absl::Now();
  auto age = [&](const json& o) {
    absl::Time ct;
    std::string err;
    if (!absl::ParseTime(absl::RFC3339_full, MetaStr(o, "creationTimestamp"), &ct, &err)) {
      return std::string("<unknown>");
    }
    return HumanAge(now - ct);
  };
  json rows = json::array();
  for (const ObjPtr& p : items) {
    const json& o = *p;
    json cells = json::array();
    cells.push_back(MetaStr(o, "name"));
    if (pods) {
      const json* cs = GetPath(o, "status.containerStatuses");
      const json* cont = GetPath(o, "spec.containers");
      int total = cont != nullptr && cont->is_array() ? static_cast<int>(cont->size()) : 0;
      int ready = 0;
      int restarts = 0;
      std::string reason;
      if (cs != nullptr && cs->is_array()) {
        for (const json& c : *cs) {
          if (c.value("ready", false)) ++ready;
          restarts += c.value("restartCount", 0);
          if (const json* term = GetPath(c, "state.terminated"); term != nullptr) {
            reason = term->value("reason", "");
          }
        }
      }
      const json* phase = GetPath(o, "status.phase");
      std::string status = phase != nullptr && phase->is_string() ? phase->get<std::string>() : "";
      if (!reason.empty()) status = reason;
      if (Meta(o).contains("deletionTimestamp")) status = "Terminating";
      cells.push_back(absl::StrCat(ready, "/", total));
      cells.push_back(status);
      cells.push_back(std::to_string(restarts));
    }
    for (const json& pc : printer) {
      std::string jp = pc.value("jsonPath", "");
      json v = EvalJsonPath(o, jp);
      if (jp == ".metadata.creationTimestamp") {
        cells.push_back(age(o));
      } else if (v.is_null()) {
        cells.push_back(nullptr);
      } else {
        cells.push_back(v.is_string() ? v : json(v.dump()));
      }
    }
    if (!has_age_column) cells.push_back(age(o));
    if (pods) {
      const json* ip = GetPath(o, "status.podIP");
      const json* node = GetPath(o, "spec.nodeName");
      cells.push_back(ip != nullptr ? *ip : json("<none>"));
      cells.push_back(node != nullptr ? *node : json("<none>"));
    }
    rows.push_back({{"cells", cells}, {"object", o}});
  }
  return {{"kind", "Table"},
          {"apiVersion", "meta.k8s.io/v1"},
          {"metadata", list_meta},
          {"columnDefinitions", cols},
          {"rows", rows}};
}

void EmulatorImpl::DoWatch(const HttpRequest& req, HttpResponder& resp, const Target& t) {
  Selectors selectors;
  if (!ParseSelectors(req, resp, &selectors)) return;
  std::string rv_param = req.Query("resourceVersion");
  uint64_t since = 0;
  if (!rv_param.empty() && !absl::SimpleAtoi(rv_param, &since)) {
    SendError(resp,
              Err(400, "BadRequest", absl::StrCat("invalid resource version \"", rv_param, "\"")));
    return;
  }
  bool bookmarks = BoolParam(req, "allowWatchBookmarks").value_or(false);
  const bool as_table = req.Header("accept").find("as=Table") != std::string::npos;
  const bool initial_events = BoolParam(req, "sendInitialEvents").value_or(false);
  int64_t timeout_s = 0;
  if (req.HasQuery("timeoutSeconds"))
    (void)absl::SimpleAtoi(req.Query("timeoutSeconds"), &timeout_s);
  auto w = std::make_shared<Watcher>();
  w->store_key = t.type->StoreKey();
  w->ns = t.all_namespaces ? "" : t.ns;
  w->labels = std::move(selectors.labels);
  w->fields = std::move(selectors.fields);
  json expired;
  {
    absl::MutexLock l(&mu_);
    if (since == 0 || initial_events) {
      auto bucket = objects_.find(w->store_key);
      if (bucket != objects_.end()) {
        {
          absl::MutexLock wl(&w->mu);
          w->limit = kWatchQueueLimit + bucket->second.size();
        }
        for (const auto& [k, o] : bucket->second) {
          if (w->Matches(*o)) w->Push("ADDED", o);
        }
      }
      if (initial_events && bookmarks) {
        // Watch-list: a bookmark marks the end of the initial state.
        w->Push("BOOKMARK", std::make_shared<const json>(json(
                                {{"kind", t.type->kind},
                                 {"apiVersion", t.type->GroupVersion()},
                                 {"metadata",
                                  {{"resourceVersion", std::to_string(rv_)},
                                   {"annotations", {{"k8s.io/initial-events-end", "true"}}}}}})));
      }
    } else if (since < history_floor_) {
      expired =
          MakeStatus(410, "Expired",
                     absl::StrCat("too old resource version: ", since, " (", history_floor_, ")"));
    } else {
      {
        absl::MutexLock wl(&w->mu);
        w->limit = kWatchQueueLimit + history_.size();
      }
      auto it = std::upper_bound(history_.begin(), history_.end(), since,
                                 [](uint64_t v, const HistoryEvent& e) { return v < e.rv; });
      for (; it != history_.end(); ++it) {
        if (it->store_key != w->store_key) continue;
        bool now = w->Matches(*it->obj);
        bool before = it->old_obj != nullptr && w->Matches(*it->old_obj);
        if (it->type == "ADDED" || it->type == "DELETED") {
          if (now) w->Push(it->type, it->obj);
        } else if (now && before) {
          w->Push("MODIFIED", it->obj);
        } else if (now) {
          w->Push("ADDED", it->obj);
        } else if (before) {
          w->Push("DELETED", it->obj);
        }
      }
    }
    if (expired.is_null()) {
      watchers_.emplace(w->store_key, w);
      ++watches_active_;
    }
  }
  if (!resp.StartChunked(200, kJson)) {
    expired = json();
  }
  if (!expired.is_null()) {
    resp.WriteChunk(json({{"type", "ERROR"}, {"object", expired}}).dump() + "\n");
    resp.EndChunked();
    return;
  }
  absl::Time deadline =
      timeout_s > 0 ? absl::Now() + absl::Seconds(timeout_s) : absl::InfiniteFuture();
  absl::Time next_bookmark = absl::Now() + absl::Milliseconds(options_.bookmark_interval_ms);
  bool clean_end = true;
  bool alive = !resp.close_after();
  const bool converting = Converting(*t.type);
  const std::string user_agent = req.Header("user-agent");
  while (alive) {
    // A watch whose client is cut off by hold_user_agents stays open and sends nothing:
    // events wait in its queue (and end the watch on heal if they overflowed it), no
    // bookmarks, and its timeoutSeconds is not looked at until the heal.
    if (Held(user_agent)) {
      if (!AwaitHeal(user_agent, kHoldPollInterval) && resp.PeerGone()) {
        alive = false;
        clean_end = false;
      }
      continue;
    }
    std::deque<WatchEvent> batch;
    bool overflow;
    {
      absl::MutexLock l(&w->mu);
      absl::Time wake = std::min({deadline, absl::Now() + absl::Milliseconds(200),
                                  bookmarks ? next_bookmark : absl::InfiniteFuture()});
      auto has_work = [](Watcher* x) ABSL_EXCLUSIVE_LOCKS_REQUIRED(x->mu) {
        return !x->queue.empty() || x->overflow;
      };
      w->mu.AwaitWithDeadline(absl::Condition(+has_work, w.get()), wake);
      batch.swap(w->queue);
      overflow = w->overflow;
    }
    if (!batch.empty() && Held(user_agent)) {  // cut off while it waited: keep them
      absl::MutexLock l(&w->mu);
      w->queue.insert(w->queue.begin(), batch.begin(), batch.end());
      continue;
    }
    double drop_rate;
    {
      absl::MutexLock l(&faults_mu_);
      drop_rate = watch_drop_rate_;
    }
    // One chunk (one write) per batch of events; a dropped watch ends after the event
    // that drew the drop, as before.
    std::string out;
    // Objects of a CRD with several versions are converted event by event, with the CRD
    // as it is now; the API server ends a watch whose event it cannot convert.
    const TypePtr view = converting && !batch.empty() ? CurrentType(t.type) : t.type;
    bool unconvertible = false;
    for (const WatchEvent& e : batch) {
      ObjPtr object = e.object;
      if (converting && e.type != "BOOKMARK" && e.type != "ERROR") {
        std::vector<ObjPtr> one = {object};
        ApiError err;
        if (!ConvertForRequest(*view, &one, false, &err)) {
          unconvertible = true;
          break;
        }
        object = one[0];
      }
      absl::StrAppend(&out, "{\"type\":\"", e.type, "\",\"object\":");
      if (as_table && e.type != "BOOKMARK" && e.type != "ERROR") {
        absl::StrAppend(&out, ToTable(*view, {object},
                                      {{"resourceVersion", MetaStr(*object, "resourceVersion")}})
                                  .dump());
      } else {
        absl::StrAppend(&out, object->dump());
      }
      out += "}\n";
      if (drop_rate > 0 && e.type != "BOOKMARK" && Random() < drop_rate) {
        clean_end = false;
        alive = false;
        break;
      }
    }
    if (!out.empty() && !resp.WriteChunk(out)) alive = false;
    if (!alive) break;
    if (overflow || unconvertible) break;
    absl::Time now = absl::Now();
    if (now >= deadline) break;
    if (bookmarks && now >= next_bookmark) {
      next_bookmark = now + absl::Milliseconds(options_.bookmark_interval_ms);
      absl::MutexLock l(&mu_);
      w->Push("BOOKMARK", std::make_shared<const json>(
                              json({{"kind", t.type->kind},
                                    {"apiVersion", t.type->GroupVersion()},
                                    {"metadata", {{"resourceVersion", std::to_string(rv_)}}}})));
    }
    if (resp.PeerGone()) {
      alive = false;
      clean_end = false;
    }
  }
  {
    absl::MutexLock l(&mu_);
    auto range = watchers_.equal_range(w->store_key);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == w) {
        watchers_.erase(it);
        --watches_active_;
        break;
      }
    }
  }
  if (alive && clean_end) {
    resp.EndChunked();
  } else {
    resp.Abort();
  }
}

namespace {
// Parses a JSON body, or a YAML one when the content type says YAML.
absl::StatusOr<json> ParseBody(const std::string& body, const std::string& content_type = "") {
  json j = json::parse(body, nullptr, false);
  if (!j.is_discarded()) return j;
  if (absl::StrContains(content_type, "yaml")) return YamlToJson(body);
  return absl::InvalidArgumentError("body is not valid JSON");
}
}  // namespace

void EmulatorImpl::DoCreate(const HttpRequest& req, HttpResponder& resp, const Target& t) {
  auto body = ParseBody(req.body, req.Header("content-type"));
  if (!body.ok()) {
    SendError(resp,
              Err(400, "BadRequest",
                  absl::StrCat("the object provided is unrecognized: ", body.status().message())));
    return;
  }
  if (!t.sub.empty()) {
    SendJson(resp, 405,
             MakeStatus(405, "MethodNotAllowed",
                        "the server does not allow this method on the requested resource"));
    return;
  }
  ApiError err;
  absl::StatusOr<ObjPtr> obj;
  FieldCheck unknown;
  unknown.strict = req.Query("fieldValidation") == "Strict";
  unknown.ignore = req.Query("fieldValidation") == "Ignore";
  if (Converting(*t.type)) {
    CreateConverted(resp, *t.type, t.ns, std::move(*body), unknown);
    return;
  }
  {
    absl::MutexLock l(&mu_);
    unknown_fields_ = &unknown;
    obj = CreateLocked(*t.type, t.ns, std::move(*body), &err);
    unknown_fields_ = nullptr;
  }
  if (!obj.ok()) {
    SendError(resp, err);
    return;
  }
  resp.Send(201, kJson, (*obj)->dump(), FieldWarnings(unknown));
}

void EmulatorImpl::DoUpdate(const HttpRequest& req, HttpResponder& resp, const Target& t,
                            bool patch) {
  auto body = ParseBody(req.body, req.Header("content-type"));
  if (!body.ok()) {
    SendError(resp, Err(400, "BadRequest",
                        absl::StrCat("the body of the request was in an unknown format: ",
                                     body.status().message())));
    return;
  }
  std::string ctype = absl::AsciiStrToLower(req.Header("content-type"));
  ctype = ctype.substr(0, ctype.find(';'));
  PatchKind kind = kMerge;
  if (patch) {
    if (ctype == "application/apply-patch+yaml" && t.sub.empty()) {
      // Server-side apply, approximated: no managedFields and no conflicts; the
      // applied object is merged in (lists by key for built-in kinds).
      kind = kApply;
      if (req.Query("fieldManager").empty()) {
        SendError(resp, Err(422, "Invalid",
                            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required "
                            "value: is required for apply patch"));
        return;
      }
    } else if (ctype == "application/merge-patch+json") {
      kind = kMerge;
    } else if (ctype == "application/json-patch+json") {
      kind = kJsonPatch;
    } else if (ctype == "application/strategic-merge-patch+json" &&
               (!t.type->custom || t.sub == "scale")) {
      kind = kStrategic;
    } else {
      SendError(resp, Err(415, "UnsupportedMediaType",
                          absl::StrCat(
                              "the body of the request was in an unknown format - "
                              "accepted media types include: application/json-patch+json, "
                              "application/merge-patch+json",
                              t.type->custom ? "" : ", application/strategic-merge-patch+json")));
      return;
    }
  }
  FieldCheck unknown;
  unknown.strict = req.Query("fieldValidation") == "Strict";
  unknown.ignore = req.Query("fieldValidation") == "Ignore";
  if (Converting(*t.type)) {
    UpdateConverted(resp, t, patch, kind, *body, unknown);
    return;
  }
  ApiError err;
  ObjPtr result;
  json scale_result;
  {
    absl::ReleasableMutexLock l(&mu_);
    ObjPtr old = FindLocked(*t.type, t.ns, t.name);
    if (old == nullptr && kind == kApply) {
      json obj = std::move(*body);
      if (obj.is_object()) {
        if (!obj["metadata"].is_object()) obj["metadata"] = json::object();
        obj["metadata"]["name"] = t.name;
      }
      unknown_fields_ = &unknown;
      absl::StatusOr<ObjPtr> created = CreateLocked(*t.type, t.ns, std::move(obj), &err);
      unknown_fields_ = nullptr;
      l.Release();
      if (!created.ok()) {
        SendError(resp, err);
      } else {
        resp.Send(201, kJson, (*created)->dump(), FieldWarnings(unknown));
      }
      return;
    }
    if (old == nullptr) {
      l.Release();
      SendError(resp, NotFound(*t.type, t.name));
      return;
    }
    json scale_base;
    const json& base = t.sub == "scale" ? (scale_base = ScaleFor(*t.type, *old)) : *old;
    json next;
    if (!patch) {
      next = std::move(*body);
    } else if (!ApplyPatch(kind, t.type->custom, base, *body, &next, &err)) {
      l.Release();
      SendError(resp, err);
      return;
    }
    if (t.sub == "scale") {
      if (!next.is_object()) next = json::object();
      std::string rv = GetPath(next, "metadata.resourceVersion") != nullptr &&
                               GetPath(next, "metadata.resourceVersion")->is_string()
                           ? GetPath(next, "metadata.resourceVersion")->get<std::string>()
                           : "";
      const json* replicas = GetPath(next, "spec.replicas");
      if (replicas == nullptr || !replicas->is_number_integer() || replicas->get<int64_t>() < 0) {
        err = Err(422, "Invalid",
                  absl::StrCat("Scale.autoscaling \"", t.name,
                               "\" is invalid: spec.replicas: Invalid value: ",
                               replicas == nullptr ? "null" : replicas->dump(),
                               ": must be greater than or equal to 0"));
      } else {
        json obj = *old;
        SetPath(obj, t.type->spec_replicas_path, *replicas);
        obj["metadata"]["resourceVersion"] = rv.empty() ? MetaStr(*old, "resourceVersion") : rv;
        result = UpdateLocked(*t.type, old, obj, "", false, &err);
        if (result != nullptr) scale_result = ScaleFor(*t.type, *result);
      }
    } else {
      unknown_fields_ = &unknown;
      result = UpdateLocked(*t.type, old, std::move(next), t.sub, !patch, &err);
      unknown_fields_ = nullptr;
    }
    l.Release();
  }
  if (result == nullptr) {
    SendError(resp, err);
    return;
  }
  if (t.sub == "scale") {
    SendJson(resp, 200, scale_result);
    return;
  }
  resp.Send(200, kJson, result->dump(), FieldWarnings(unknown));
}

void EmulatorImpl::DoDelete(const HttpRequest& req, HttpResponder& resp, const Target& t) {
  json options = json::object();
  if (!absl::StripAsciiWhitespace(req.body).empty()) {
    auto body = ParseBody(req.body);
    if (!body.ok() || !body->is_object()) {
      SendError(resp, Err(400, "BadRequest", "the DeleteOptions body is not valid JSON"));
      return;
    }
    options = *body;
  }
  if (req.HasQuery("gracePeriodSeconds")) {
    int64_t g = 0;
    if (absl::SimpleAtoi(req.Query("gracePeriodSeconds"), &g)) options["gracePeriodSeconds"] = g;
  }
  if (req.HasQuery("propagationPolicy"))
    options["propagationPolicy"] = req.Query("propagationPolicy");
  std::string policy = options.value("propagationPolicy", "");
  if (!policy.empty() && policy != "Orphan" && policy != "Background" && policy != "Foreground") {
    SendError(resp,
              Err(422, "Invalid",
                  absl::StrCat("DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: "
                               "Unsupported value: \"",
                               policy,
                               "\": supported values: "
                               "\"Foreground\", \"Background\", \"Orphan\", \"nil\"")));
    return;
  }
  ApiError err;
  ObjPtr result;
  const bool converting = Converting(*t.type);
  const ResourceType& st = converting ? *t.type->crd->StorageType() : *t.type;
  if (converting) {
    // The API server reads (and so converts) the object before it deletes it: when that
    // fails, nothing is deleted.
    ObjPtr obj;
    {
      absl::MutexLock l(&mu_);
      obj = FindLocked(st, t.ns, t.name);
    }
    std::vector<ObjPtr> seen = {obj};
    if (obj != nullptr && !ConvertForRequest(*t.type, &seen, false, &err)) {
      SendError(resp, err);
      return;
    }
  }
  {
    absl::ReleasableMutexLock l(&mu_);
    ObjPtr obj = FindLocked(st, t.ns, t.name);
    if (obj == nullptr) {
      l.Release();
      SendError(resp, NotFound(*t.type, t.name));
      return;
    }
    result = DeleteLocked(st, obj, options, &err);
    l.Release();
  }
  std::vector<ObjPtr> out = {result};
  if (result == nullptr || !ConvertForRequest(*t.type, &out, false, &err)) {
    SendError(resp, err);
    return;
  }
  resp.Send(200, kJson, out[0]->dump());
}

void EmulatorImpl::DoDeleteCollection(const HttpRequest& req, HttpResponder& resp,
                                      const Target& t) {
  Selectors selectors;
  if (!ParseSelectors(req, resp, &selectors)) return;
  json options = json::object();
  auto body = ParseBody(req.body);
  if (body.ok() && body->is_object()) options = *body;
  if (req.HasQuery("gracePeriodSeconds")) {
    int64_t g = 0;
    if (absl::SimpleAtoi(req.Query("gracePeriodSeconds"), &g)) options["gracePeriodSeconds"] = g;
  }
  if (req.HasQuery("propagationPolicy"))
    options["propagationPolicy"] = req.Query("propagationPolicy");
  const bool converting = Converting(*t.type);
  const ResourceType& st = converting ? *t.type->crd->StorageType() : *t.type;
  auto matching = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<ObjPtr> victims;
    auto bucket = objects_.find(t.type->StoreKey());
    if (bucket != objects_.end()) {
      std::string prefix = t.all_namespaces ? "" : t.ns + "/";
      for (auto it = bucket->second.lower_bound(prefix); it != bucket->second.end(); ++it) {
        if (!absl::StartsWith(it->first, prefix)) break;
        if (LabelsMatch(selectors.labels, Labels(*it->second)) &&
            FieldsMatch(selectors.fields, *it->second)) {
          victims.push_back(it->second);
        }
      }
    }
    return victims;
  };
  ApiError err;
  if (converting) {
    // The API server lists (and so converts) what it deletes first: when that fails,
    // nothing is deleted.
    std::vector<ObjPtr> listed;
    {
      absl::MutexLock l(&mu_);
      listed = matching();
    }
    if (!ConvertForRequest(*t.type, &listed, true, &err)) {
      SendError(resp, err);
      return;
    }
  }
  std::vector<ObjPtr> deleted;
  uint64_t rv;
  {
    absl::MutexLock l(&mu_);
    std::vector<ObjPtr> victims = matching();
    rv = rv_;
    for (const ObjPtr& v : victims) {
      ObjPtr cur = FindLocked(st, MetaStr(*v, "namespace"), MetaStr(*v, "name"));
      if (cur == nullptr) continue;
      ApiError ignored;
      ObjPtr r = DeleteLocked(st, cur, options, &ignored);
      if (r != nullptr) deleted.push_back(std::move(r));
    }
  }
  if (!ConvertForRequest(*t.type, &deleted, true, &err)) {
    SendError(resp, err);
    return;
  }
  std::string out =
      absl::StrCat("{\"kind\":\"", t.type->kind, "List\",\"apiVersion\":\"", t.type->GroupVersion(),
                   "\",\"metadata\":{\"resourceVersion\":\"", rv, "\"},\"items\":[");
  for (size_t i = 0; i < deleted.size(); ++i) {
    if (i > 0) out += ",";
    out += deleted[i]->dump();
  }
  out += "]}";
  resp.Send(200, kJson, out);
}

// ---------------------------------------------------------------- admin

void EmulatorImpl::HandleAdmin(const HttpRequest& req, HttpResponder& resp) {
  const std::string& p = req.path;
  json body = json::object();
  if (req.method == "POST" && !absl::StripAsciiWhitespace(req.body).empty()) {
    body = json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      SendJson(resp, 400, {{"error", "body must be a JSON object"}});
      return;
    }
  }
  if (p == "/emulator/stats" && req.method == "GET") {
    json out;
    {
      absl::MutexLock l(&stats_mu_);
      out["requests"] = json::object();
      for (const auto& [k, v] : stats_) out["requests"][k] = v;
      out["writes"] = stats_writes_;
      out["total"] = stats_total_;
    }
    absl::MutexLock l(&mu_);
    out["watches_active"] = watches_active_;
    size_t n = 0;
    for (const auto& [k, b] : objects_) n += b.size();
    out["objects"] = n;
    out["resourceVersion"] = std::to_string(rv_);
    SendJson(resp, 200, out);
    return;
  }
  if (p == "/emulator/requests" && req.method == "GET") {
    // Optional filters: ?user_agent=PREFIX keeps the records whose User-Agent starts so,
    // ?since=UNIX_SECONDS those whose time is at or after it.
    const std::string prefix = req.Query("user_agent");
    absl::Time since = absl::InfinitePast();
    if (req.HasQuery("since")) {
      double seconds;
      if (!absl::SimpleAtod(req.Query("since"), &seconds) || !std::isfinite(seconds)) {
        SendJson(resp, 400,
                 {{"error", absl::StrCat("since wants Unix seconds (a number), got \"",
                                         req.Query("since"), "\"")}});
        return;
      }
      // The same rounding as the log's times, so that since=<a logged time> keeps it.
      since = absl::FromUnixMicros(static_cast<int64_t>(std::llround(seconds * 1e6)));
    }
    json out = json::array();
    int64_t dropped;
    {
      absl::MutexLock l(&stats_mu_);
      for (const std::shared_ptr<RequestRecord>& r : request_log_) {
        if (absl::StartsWith(r->user_agent, prefix) && r->time >= since) {
          out.push_back(r->ToJson());
        }
      }
      dropped = request_log_dropped_;
    }
    SendJson(resp, 200, out, {{"X-Emulator-Requests-Dropped", std::to_string(dropped)}});
    return;
  }
  if (p == "/emulator/stats/reset" && req.method == "POST") {
    absl::MutexLock l(&stats_mu_);
    stats_.clear();
    stats_writes_ = 0;
    stats_total_ = 0;
    request_log_.clear();
    request_log_dropped_ = 0;
    SendJson(resp, 200, {{"ok", true}});
    return;
  }
  auto faults_json = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(faults_mu_) {
    json errors = json::object();
    for (const auto& [c, r] : error_rates_) errors[std::to_string(c)] = r;
    json out = {{"latency_ms", latency_ms_},
                {"errors", errors},
                {"retry_after_seconds", retry_after_},
                {"qps_limit", qps_limit_},
                {"watch_drop_rate", watch_drop_rate_}};
    absl::MutexLock hl(&hold_mu_);
    out["hold_user_agents"] = hold_user_agents_;
    out["held"] = held_;
    out["max_held_requests"] = options_.max_held_requests;
    return out;
  };
  if (p == "/emulator/faults" && (req.method == "GET" || req.method == "POST")) {
    // hold_user_agents is checked before anything is changed: a bad list changes nothing.
    std::optional<std::vector<std::string>> hold;
    if (body.contains("hold_user_agents")) {
      const json& list = body["hold_user_agents"];
      std::string bad;
      if (!list.is_array()) {
        bad = absl::StrCat("hold_user_agents must be a list of User-Agent prefixes (strings), got ",
                           list.dump());
      } else {
        hold.emplace();
        for (size_t i = 0; i < list.size() && bad.empty(); ++i) {
          if (!list[i].is_string()) {
            bad = absl::StrCat("hold_user_agents[", i, "] must be a string, got ", list[i].dump());
          } else if (list[i].get<std::string>().empty()) {
            bad = absl::StrCat("hold_user_agents[", i,
                               "] is empty: it would hold every client (name a prefix)");
          } else {
            hold->push_back(list[i].get<std::string>());
          }
        }
      }
      if (!bad.empty()) {
        SendJson(resp, 400, {{"error", bad}});
        return;
      }
    }
    absl::MutexLock l(&faults_mu_);
    if (hold.has_value()) {
      // Held requests whose prefix is gone wake up when hold_mu_ is released.
      absl::MutexLock hl(&hold_mu_);
      hold_user_agents_ = std::move(*hold);
      ++hold_generation_;
    }
    try {
      if (body.contains("latency_ms")) latency_ms_ = body["latency_ms"].get<int>();
      if (body.contains("retry_after_seconds")) {
        retry_after_ = body["retry_after_seconds"].get<int>();
      }
      if (body.contains("qps_limit")) qps_limit_ = body["qps_limit"].get<int>();
      if (body.contains("watch_drop_rate"))
        watch_drop_rate_ = body["watch_drop_rate"].get<double>();
      if (body.contains("errors")) {
        for (auto it = body["errors"].begin(); it != body["errors"].end(); ++it) {
          int code = std::stoi(it.key());
          double rate = it->get<double>();
          if (rate <= 0) {
            error_rates_.erase(code);
          } else {
            error_rates_[code] = rate;
          }
        }
      }
    } catch (const std::exception& e) {
      SendJson(resp, 400, {{"error", absl::StrCat("bad faults body: ", e.what())}});
      return;
    }
    SendJson(resp, 200, faults_json());
    return;
  }
  if (p == "/emulator/service_addresses" && (req.method == "GET" || req.method == "POST")) {
    absl::MutexLock l(&services_mu_);
    for (auto it = body.begin(); it != body.end(); ++it) {
      if (!it->is_string() || std::count(it.key().begin(), it.key().end(), '/') != 1) {
        SendJson(resp, 400, {{"error", "want {\"NAMESPACE/NAME\": \"HOST:PORT\" or \"\"}"}});
        return;
      }
      if (it->get<std::string>().empty()) {
        service_addresses_.erase(it.key());
      } else {
        service_addresses_[it.key()] = it->get<std::string>();
      }
    }
    json out = json::object();
    for (const auto& [k, v] : service_addresses_) out[k] = v;
    SendJson(resp, 200, out);
    return;
  }
  if (p == "/emulator/compact" && req.method == "POST") {
    absl::MutexLock l(&mu_);
    history_.clear();
    history_floor_ = rv_;
    SendJson(resp, 200, {{"ok", true}, {"resourceVersion", std::to_string(rv_)}});
    return;
  }
  if (p == "/emulator/kubelet" && req.method == "POST") {
    absl::MutexLock l(&mu_);
    if (body.contains("ready_delay_ms")) ready_delay_ms_ = body["ready_delay_ms"].get<int>();
    if (body.contains("fail_rate")) fail_rate_ = body["fail_rate"].get<double>();
    SendJson(resp, 200, {{"ready_delay_ms", ready_delay_ms_}, {"fail_rate", fail_rate_}});
    return;
  }
  if (p == "/emulator/pods/fail" && req.method == "POST") {
    std::string ns = body.value("namespace", "default");
    std::string name = body.value("name", "");
    std::string reason = body.value("reason", "Error");
    absl::MutexLock l(&mu_);
    auto& bucket = objects_["/pods"];
    auto it = bucket.find(ObjKey(ns, name));
    if (it == bucket.end()) {
      SendJson(resp, 404, {{"error", absl::StrCat("pod ", ns, "/", name, " not found")}});
      return;
    }
    FailPodLocked(it->second, reason);
    SendJson(resp, 200, {{"ok", true}});
    return;
  }
  SendJson(resp, 404, {{"error", absl::StrCat("no admin endpoint ", req.method, " ", p)}});
}

Emulator::Emulator(const EmulatorOptions& options)
    : impl_(std::make_unique<EmulatorImpl>(options)) {}
Emulator::~Emulator() = default;
void Emulator::Handle(const HttpRequest& request, HttpResponder& responder) {
  impl_->Handle(request, responder);
}

}  // namespace kube_emulator

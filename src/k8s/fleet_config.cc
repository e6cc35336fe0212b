#include "src/k8s/fleet_config.h"

#include <cmath>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "src/common/ids.h"

namespace sbx::k8s {

absl::StatusOr<ClusterSpec> ParseClusterSpec(absl::string_view text) {
  auto bad = [text](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("--cluster \"", text, "\": ", why,
                                                   " (the form is NAME=KUBECONFIG[,key=value...], "
                                                   "keys context, qps, burst, write_qps, "
                                                   "write_burst, weight, min, max)"));
  };
  std::vector<absl::string_view> parts = absl::StrSplit(text, ',');
  const size_t eq = parts[0].find('=');
  if (eq == absl::string_view::npos) return bad("no NAME= before the kubeconfig");
  ClusterSpec spec;
  spec.name = std::string(parts[0].substr(0, eq));
  spec.kubeconfig = std::string(parts[0].substr(eq + 1));
  if (absl::Status s = ValidateName("cluster name", spec.name); !s.ok()) {
    return bad(s.message());
  }
  if (spec.kubeconfig.empty()) return bad("no kubeconfig after NAME=");
  if (spec.kubeconfig == "in-cluster") {
    return bad(
        "a member cluster is reached with a kubeconfig file, not \"in-cluster\" (that is "
        "the home cluster, --kubeconfig in-cluster)");
  }
  std::set<std::string> seen;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    const std::string key(kv.first);
    const absl::string_view value = kv.second;
    if (parts[i].find('=') == absl::string_view::npos || key.empty()) {
      return bad(absl::StrCat("\"", parts[i], "\" is not key=value"));
    }
    if (!seen.insert(key).second) return bad(absl::StrCat("key \"", key, "\" given twice"));
    auto number = [&](double* out, double floor, bool strict) -> absl::Status {
      if (!absl::SimpleAtod(value, out) || !std::isfinite(*out) ||
          !(strict ? *out > floor : *out >= floor)) {
        return bad(absl::StrCat(key, " \"", value, "\" is not a number ", strict ? ">" : ">=", " ",
                                floor));
      }
      return absl::OkStatus();
    };
    auto integer = [&](int64_t* out, int64_t floor) -> absl::Status {
      if (!absl::SimpleAtoi(value, out) || *out < floor) {
        return bad(absl::StrCat(key, " \"", value, "\" is not a whole number >= ", floor));
      }
      return absl::OkStatus();
    };
    absl::Status s;
    double d = 0;
    int64_t n = 0;
    if (key == "context") {
      if (value.empty()) return bad("context is empty");
      spec.context = std::string(value);
    } else if (key == "qps" || key == "write_qps") {
      s = number(&d, 0, true);
      (key == "qps" ? spec.qps : spec.write_qps) = d;
    } else if (key == "burst" || key == "write_burst") {
      s = integer(&n, 1);
      if (s.ok() && n > 1'000'000) s = bad(absl::StrCat(key, " ", n, " is above 1000000"));
      (key == "burst" ? spec.burst : spec.write_burst) = static_cast<int>(n);
    } else if (key == "weight") {
      s = number(&spec.weight, 0, true);
    } else if (key == "min") {
      s = integer(&spec.min, 0);
    } else if (key == "max") {
      s = integer(&spec.max, 0);
    } else {
      return bad(absl::StrCat("unknown key \"", key, "\""));
    }
    if (!s.ok()) return s;
  }
  if (spec.max > 0 && spec.min > spec.max) {
    return bad(absl::StrCat("min ", spec.min, " is above max ", spec.max));
  }
  return spec;
}

}  // namespace sbx::k8s

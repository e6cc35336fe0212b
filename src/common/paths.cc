#include "src/common/paths.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace sbx {
namespace {

std::string Quote(absl::string_view s) {
  constexpr size_t kMaxShown = 256;
  if (s.size() > kMaxShown)
    return absl::StrCat("\"", absl::CHexEscape(s.substr(0, kMaxShown)), "...\"");
  return absl::StrCat("\"", absl::CHexEscape(s), "\"");
}

}  // namespace

absl::Status CheckNormalAbsolutePath(absl::string_view what, absl::string_view path) {
  auto bad = [&](absl::string_view rule) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", Quote(path), " ", rule));
  };
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  if (path.find('\0') != absl::string_view::npos) return bad("contains a NUL byte");
  if (path.size() > kMaxPathBytes) {
    return bad(absl::StrCat("is longer than ", kMaxPathBytes, " bytes"));
  }
  if (path[0] != '/') return bad("is not an absolute path (it must start with \"/\")");
  if (path == "/") return absl::OkStatus();
  if (path.back() == '/') return bad("ends with \"/\"; write it without");
  // Components between the slashes; the leading "/" was checked above.
  size_t start = 1;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == absl::string_view::npos) end = path.size();
    const absl::string_view component = path.substr(start, end - start);
    if (component.empty()) return bad("has an empty component (\"//\"); write it normalized");
    if (component == ".") return bad("has a \".\" component; write it normalized");
    if (component == "..") return bad("has a \"..\" component; write it normalized");
    start = end + 1;
  }
  return absl::OkStatus();
}

bool PathIsWithin(absl::string_view path, absl::string_view dir) {
  if (dir == "/") return true;
  if (path.size() < dir.size() || path.substr(0, dir.size()) != dir) return false;
  return path.size() == dir.size() || path[dir.size()] == '/';
}

absl::Status CheckSandboxMountTarget(absl::string_view what, absl::string_view target) {
  if (absl::Status s = CheckNormalAbsolutePath(what, target); !s.ok()) return s;
  for (absl::string_view control : kSandboxControlPaths) {
    absl::string_view rule;
    if (target == control) {
      rule = "is";
    } else if (PathIsWithin(target, control)) {
      rule = "lies under";
    } else if (PathIsWithin(control, target)) {
      rule = "covers";
    } else {
      continue;
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Quote(target), " ", rule, " \"", control,
                     "\", which the sandbox runtime mounts itself; mount elsewhere"));
  }
  return absl::OkStatus();
}

}  // namespace sbx

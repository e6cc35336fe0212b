#include "src/runtime/state_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "src/runtime/proc.h"

namespace sbx::runtime::local {
namespace {

// The state file's version; files of other versions are not trusted (version 1 lived in a
// folder the sandbox could write).
constexpr int kStateVersion = 2;
// The largest template spec kept in the state file (what a Reset after a restart needs): the
// file must stay well under ReadOwnFile's 1 MiB, or the sandbox would not be adopted.
constexpr size_t kMaxKeptSpec = 256 * 1024;

}  // namespace

std::string EncodeState(const Sandbox& sb) {
  nlohmann::json j;
  j["version"] = kStateVersion;
  j["id"] = sb.id;
  j["pool"] = sb.pool;
  j["pid"] = sb.pid;
  j["start_time"] = sb.start_time;
  j["init_pid"] = sb.init_pid;
  j["init_start_time"] = sb.init_start_time;
  j["suspended"] = sb.suspended.load(std::memory_order_relaxed);
  if (!sb.image_digest.empty()) j["image"] = sb.image_digest;
  if (!sb.snapshot.empty()) j["snapshot"] = sb.snapshot;
  if (sb.has_template && sb.template_spec.size() <= kMaxKeptSpec) {
    j["template"] = {{"name", sb.template_name}, {"spec", sb.template_spec}};
  }
  return j.dump();
}

bool DecodeState(const std::string& text, Sandbox* sb) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    if (j.value("version", 0) != kStateVersion) return false;
    sb->id = j.at("id").get<std::string>();
    sb->pool = j.at("pool").get<std::string>();
    sb->pid = j.at("pid").get<pid_t>();
    sb->start_time = j.at("start_time").get<uint64_t>();
    sb->init_pid = j.value("init_pid", -1);
    sb->init_start_time = j.value("init_start_time", uint64_t{0});
    sb->suspended.store(j.value("suspended", false), std::memory_order_relaxed);
    sb->image_digest = j.value("image", std::string());
    sb->snapshot = j.value("snapshot", std::string());
    if (const auto t = j.find("template"); t != j.end() && t->is_object()) {
      sb->template_name = t->value("name", std::string());
      sb->template_spec = t->value("spec", std::string());
      sb->has_template = true;
    }
    return sb->pid > 0;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

std::string ReadOwnFile(const std::string& dir, const char* name) {
  Fd fd(OpenInDir(dir, name, O_RDONLY));
  struct stat st;
  if (!fd.valid() || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      st.st_size > (1 << 20)) {
    return "";
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  const ssize_t n = read(fd.get(), text.data(), text.size());
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return text;
}

bool WriteState(const Sandbox& sb) {
  const Fd dfd(open(sb.dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dfd.valid()) return false;
  const std::string tmp = absl::StrCat(kStateName, ".tmp");
  const std::string text = EncodeState(sb);
  const int fd =
      openat(dfd.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  if (close(fd) != 0 || !ok) return false;
  return renameat(dfd.get(), tmp.c_str(), dfd.get(), kStateName) == 0;
}

}  // namespace sbx::runtime::local

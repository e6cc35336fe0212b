#include "src/images/image_cache.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "src/common/errno_text.h"
#include "src/common/paths.h"
#include "src/images/digest.h"
#include "src/images/process.h"

namespace sbx::images {
namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr char kImagesDir[] = "images";
constexpr char kTmpDir[] = "tmp";
constexpr char kMetaName[] = "image.json";
// What SanitizeTree does, by version: an image published by an older one is sanitized
// again when the cache opens (2: kernel and overlayfs extended attributes dropped).
constexpr int kSanitizeVersion = 2;
constexpr char kRootfsName[] = "rootfs";

// The state of a local reference's source, to tell whether it changed since it was
// resolved: the inode, size and times of the archive, or of an OCI layout's index.json.
// Empty for a registry's reference or when the source cannot be read.
std::string SourceFingerprint(const std::string& ref) {
  absl::string_view rest = ref;
  const bool layout = absl::ConsumePrefix(&rest, "oci:");
  if (!layout && !absl::ConsumePrefix(&rest, "oci-archive:") &&
      !absl::ConsumePrefix(&rest, "docker-archive:")) {
    return "";
  }
  std::string path(rest.substr(0, rest.find(':')));
  if (layout) path += "/index.json";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";
  return absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                      st.st_mtim.tv_nsec, ":", st.st_ctim.tv_sec, ".", st.st_ctim.tv_nsec);
}

bool IsHex64(absl::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return absl::ascii_isxdigit(c) && !absl::ascii_isupper(c);
         });
}

absl::StatusOr<std::string> ReadFile(const std::string& path, size_t max = size_t{64} << 20) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read \"", path, "\""));
  std::string s;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    s.append(buf, static_cast<size_t>(in.gcount()));
    if (s.size() > max)
      return absl::InvalidArgumentError(absl::StrCat("\"", path, "\" is too large"));
  }
  return s;
}

// Bytes on disk under `path` (links not followed).
thread_local int64_t g_walk_bytes = 0;
int64_t DiskBytes(const std::string& path) {
  g_walk_bytes = 0;
  // nftw is listed as not thread-safe for FTW_CHDIR, which changes the process's folder; without it
  // glibc's nftw keeps its state on this thread's stack (and the sums here are thread_local).
  nftw(  // NOLINT(concurrency-mt-unsafe)
      path.c_str(),
      [](const char*, const struct stat* st, int, FTW*) {
        g_walk_bytes += static_cast<int64_t>(st->st_blocks) * 512;
        return 0;
      },
      64, FTW_PHYS);
  return g_walk_bytes;
}

// Makes an unpacked tree harmless on the host: no set-uid/set-gid bits, no device nodes,
// FIFOs or sockets (umoci's rootless unpack already skips devices; the rest is ours).
thread_local int g_sanitize_errors = 0;
// Removes the extended attributes of `path` that mean something to the kernel or to
// overlayfs: security.* (file capabilities, LSM labels), trusted.* and user.overlay.*
// (overlayfs's own marks: opaque folders, redirects, whiteouts, metacopy, which a sandbox's
// overlay over this image would obey). Other user.* attributes are the image's content.
void DropKernelAttributes(const char* path) {
  char names[65536];
  const ssize_t n = llistxattr(path, names, sizeof(names));
  if (n < 0) {
    if (errno != ENOTSUP && errno != ENODATA) ++g_sanitize_errors;
    return;
  }
  for (ssize_t at = 0; at < n; at += static_cast<ssize_t>(std::strlen(names + at)) + 1) {
    const absl::string_view name(names + at);
    if (absl::StartsWith(name, "security.") || absl::StartsWith(name, "trusted.") ||
        absl::StartsWith(name, "user.overlay.")) {
      if (lremovexattr(path, names + at) != 0) ++g_sanitize_errors;
    }
  }
}

int SanitizeTree(const std::string& root) {
  g_sanitize_errors = 0;
  // nftw is listed as not thread-safe for FTW_CHDIR, which changes the process's folder; without it
  // glibc's nftw keeps its state on this thread's stack (and the sums here are thread_local).
  nftw(  // NOLINT(concurrency-mt-unsafe)
      root.c_str(),
      [](const char* path, const struct stat* st, int type, FTW*) {
        DropKernelAttributes(path);
        if (type == FTW_SL || type == FTW_SLN) return 0;
        if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode) || S_ISFIFO(st->st_mode) ||
            S_ISSOCK(st->st_mode)) {
          if (unlink(path) != 0) ++g_sanitize_errors;
          return 0;
        }
        if ((st->st_mode & (S_ISUID | S_ISGID)) != 0) {
          if (chmod(path, st->st_mode & 0777 & ~static_cast<mode_t>(S_ISUID | S_ISGID)) != 0) {
            ++g_sanitize_errors;
          }
        }
        return 0;
      },
      64, FTW_PHYS);
  return g_sanitize_errors;
}

std::vector<std::string> Strings(const Json& j) {
  std::vector<std::string> out;
  if (!j.is_array()) return out;
  for (const Json& s : j) {
    if (s.is_string()) out.push_back(s.get<std::string>());
  }
  return out;
}

ImageConfig ConfigFrom(const Json& config) {
  ImageConfig c;
  const Json& cfg = config.is_object() && config.contains("config") ? config["config"] : Json();
  if (!cfg.is_object()) return c;
  c.env = Strings(cfg.value("Env", Json()));
  c.working_dir = cfg.value("WorkingDir", std::string());
  c.user = cfg.value("User", std::string());
  c.entrypoint = Strings(cfg.value("Entrypoint", Json()));
  c.cmd = Strings(cfg.value("Cmd", Json()));
  return c;
}

Json ConfigJson(const ImageConfig& c) {
  return {{"Env", c.env},
          {"WorkingDir", c.working_dir},
          {"User", c.user},
          {"Entrypoint", c.entrypoint},
          {"Cmd", c.cmd}};
}

// A blob of an OCI layout, by digest ("sha256:<hex>"), checked against it.
absl::StatusOr<std::string> ReadBlob(const std::string& layout, const std::string& digest) {
  absl::string_view hex = digest;
  if (!absl::ConsumePrefix(&hex, "sha256:") || !IsHex64(hex)) {
    return absl::DataLossError(absl::StrCat("blob digest \"", digest, "\" is not sha256:<hex>"));
  }
  absl::StatusOr<std::string> blob = ReadFile(absl::StrCat(layout, "/blobs/sha256/", hex));
  if (!blob.ok()) return blob.status();
  if (Sha256Hex(*blob) != hex) {
    return absl::DataLossError(absl::StrCat("blob ", digest, " does not match its digest"));
  }
  return blob;
}

// The one manifest of a layout skopeo wrote, and the image's config and layer bytes.
struct LayoutImage {
  Json config;
  int64_t layer_bytes = 0;
};
absl::StatusOr<LayoutImage> ReadLayout(const std::string& layout) {
  absl::StatusOr<std::string> index_text = ReadFile(layout + "/index.json");
  if (!index_text.ok()) return index_text.status();
  Json index = Json::parse(*index_text, nullptr, false);
  if (!index.is_object() || !index["manifests"].is_array() || index["manifests"].empty()) {
    return absl::DataLossError("the copied layout has no manifest");
  }
  absl::StatusOr<std::string> manifest_text =
      ReadBlob(layout, index["manifests"][0].value("digest", std::string()));
  if (!manifest_text.ok()) return manifest_text.status();
  Json manifest = Json::parse(*manifest_text, nullptr, false);
  if (!manifest.is_object()) return absl::DataLossError("the image's manifest is not JSON");
  LayoutImage out;
  for (const Json& layer : manifest.value("layers", Json::array())) {
    if (layer.is_object()) out.layer_bytes += layer.value("size", int64_t{0});
  }
  absl::StatusOr<std::string> config_text =
      ReadBlob(layout, manifest.value("config", Json::object()).value("digest", std::string()));
  if (!config_text.ok()) return config_text.status();
  out.config = Json::parse(*config_text, nullptr, false);
  return out;
}

// skopeo's and umoci's failures as the cache's codes.
absl::Status ToolError(const std::string& ref, const absl::Status& s) {
  const std::string m(s.message());
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  if (absl::IsDeadlineExceeded(s) || absl::IsResourceExhausted(s)) {
    code = s.code();
  } else if (absl::StrContains(m, "igest did not match") ||
             absl::StrContains(m, "does not match") || absl::StrContains(m, "digest mismatch")) {
    code = absl::StatusCode::kDataLoss;
  } else if (absl::StrContains(m, "no such file") || absl::StrContains(m, "not found") ||
             absl::StrContains(m, "manifest unknown") || absl::StrContains(m, "no descriptor")) {
    code = absl::StatusCode::kNotFound;
  }
  return absl::Status(code, absl::StrCat("image \"", ref, "\": ", m));
}

int64_t FreeBytes(const std::string& dir) {
  struct statvfs v;
  if (statvfs(dir.c_str(), &v) != 0) return -1;
  return static_cast<int64_t>(v.f_bavail) * static_cast<int64_t>(v.f_frsize);
}

}  // namespace

struct ImageCache::Pulling {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
};

absl::Status ImageCacheOptions::Validate() const {
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("image cache dir \"", dir, "\" is not absolute"));
  }
  if (budget_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("image cache budget must be positive (got ", budget_bytes, " bytes)"));
  }
  for (const std::string& d : import_dirs) {
    if (absl::Status s = CheckNormalAbsolutePath("image import dir", d); !s.ok()) return s;
  }
  if (pull_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("image pull timeout must be positive");
  }
  return absl::OkStatus();
}

ImageCache::ImageCache(ImageCacheOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<ImageCache>> ImageCache::Open(ImageCacheOptions options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::error_code ec;
  for (const std::string& d : {options.dir, options.dir + "/" + kImagesDir}) {
    fs::create_directories(d, ec);
    if (ec || chmod(d.c_str(), d == options.dir ? 0700 : 0711) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("image cache dir \"", d, "\": ", ec ? ec.message() : sbx::ErrnoText(errno)));
    }
  }
  fs::remove_all(options.dir + "/" + kTmpDir, ec);  // pulls cut short
  std::unique_ptr<ImageCache> cache(new ImageCache(std::move(options)));
  absl::MutexLock lock(&cache->mu_);
  for (const fs::directory_entry& e :
       fs::directory_iterator(cache->options_.dir + "/" + kImagesDir, ec)) {
    const std::string name = e.path().filename();
    const std::string path = e.path();
    absl::StatusOr<std::string> meta_text = ReadFile(path + "/" + kMetaName);
    Json meta = meta_text.ok() ? Json::parse(*meta_text, nullptr, false) : Json();
    if (!IsHex64(name) || !meta.is_object() || !fs::is_directory(path + "/" + kRootfsName)) {
      spdlog::warn("image cache: removing \"{}\" (not a complete image)", path);
      fs::remove_all(path, ec);
      continue;
    }
    if (meta.value("sanitized", 1) < kSanitizeVersion) {
      // Made by an older version: what it let through goes now, before any sandbox uses it.
      struct timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_OMIT}};
      struct stat before;
      const bool timed = stat((path + "/" + kMetaName).c_str(), &before) == 0;
      if (timed) times[1] = before.st_mtim;  // keep its place in the LRU order
      if (SanitizeTree(path + "/" + kRootfsName) != 0) {
        spdlog::warn("image cache: removing \"{}\" (it cannot be made harmless)", path);
        fs::remove_all(path, ec);
        continue;
      }
      meta["sanitized"] = kSanitizeVersion;
      std::ofstream out(path + "/" + kMetaName, std::ios::trunc);
      out << meta.dump();
      out.close();
      if (timed) utimensat(AT_FDCWD, (path + "/" + kMetaName).c_str(), times, 0);
      spdlog::info("image cache: \"{}\" sanitized again (made by an older version)", path);
    }
    Image image;
    image.digest = absl::StrCat("sha256:", name);
    image.rootfs = path + "/" + kRootfsName;
    image.bytes = meta.value("bytes", int64_t{0});
    image.ref = meta.value("ref", std::string());
    image.config = ConfigFrom(Json{{"config", meta.value("config", Json::object())}});
    struct stat st;
    image.last_used = stat((path + "/" + kMetaName).c_str(), &st) == 0
                          ? absl::TimeFromTimespec(st.st_mtim)
                          : absl::UnixEpoch();
    cache->bytes_ += image.bytes;
    cache->images_.emplace(image.digest, std::move(image));
  }
  cache->stats_.images = static_cast<int64_t>(cache->images_.size());
  spdlog::info("image cache: {} images, {} bytes in \"{}\" (budget {} bytes)",
               cache->images_.size(), cache->bytes_, cache->options_.dir,
               cache->options_.budget_bytes);
  return cache;
}

absl::Status ImageCache::CheckReference(const std::string& ref) const {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("image reference \"", absl::CEscape(ref), "\" ", why));
  };
  if (ref.empty()) return bad("is empty");
  if (ref.size() > 4096) return bad("is longer than 4096 bytes");
  for (char c : ref) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return bad("has a control character");
  }
  absl::string_view rest = ref;
  if (absl::ConsumePrefix(&rest, "docker://")) {
    if (!options_.allow_registry) return bad("names a registry, and registries are off");
    if (rest.empty() || absl::StartsWith(rest, "/")) return bad("names no image");
    return absl::OkStatus();
  }
  const bool local = absl::ConsumePrefix(&rest, "oci:") ||
                     absl::ConsumePrefix(&rest, "oci-archive:") ||
                     absl::ConsumePrefix(&rest, "docker-archive:");
  if (!local) {
    return bad(
        "is not oci:DIR[:TAG], oci-archive:FILE[:TAG], docker-archive:FILE or "
        "docker://NAME[:TAG]");
  }
  const std::string path(rest.substr(0, rest.find(':')));
  if (absl::Status s = CheckNormalAbsolutePath("image path", path); !s.ok()) {
    return bad(absl::StrCat("has a path that is not a normal absolute path: ", s.message()));
  }
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("image \"", ref, "\": \"", path, "\": ", sbx::ErrnoText(errno)));
  }
  for (const std::string& d : options_.import_dirs) {
    if (PathIsWithin(resolved, d)) return absl::OkStatus();
  }
  return bad(
      options_.import_dirs.empty()
          ? std::string("is a local path, and no import folder is configured")
          : absl::StrCat("lies outside the import folders (links resolved: \"", resolved, "\")"));
}

absl::StatusOr<Image> ImageCache::Pull(const std::string& ref) {
  absl::StatusOr<Image> image = Acquire(ref);
  if (image.ok()) {
    Release(image->digest);
    --image->holders;  // shown as it is after the release, not with the pull's own hold
  }
  return image;
}

Image ImageCache::HitLocked(Image& image) {
  ++image.holders;
  image.last_used = absl::Now();
  ++stats_.hits;
  utimensat(AT_FDCWD, (fs::path(image.rootfs).parent_path() / kMetaName).c_str(), nullptr, 0);
  return image;
}

bool ImageCache::Hold(const std::string& digest) {
  absl::MutexLock lock(&mu_);
  auto it = images_.find(digest);
  if (it == images_.end()) return false;
  ++it->second.holders;
  return true;
}

absl::StatusOr<Image> ImageCache::Acquire(const std::string& ref) {
  if (absl::Status s = CheckReference(ref); !s.ok()) return s;
  const std::string fingerprint = SourceFingerprint(ref);
  std::string scratch;
  {
    absl::MutexLock lock(&mu_);
    if (auto r = resolved_.find(ref); r != resolved_.end()) {
      const bool fresh = fingerprint.empty() ? absl::StartsWith(ref, "docker://") &&
                                                   absl::Now() - r->second.at < absl::Seconds(60)
                                             : r->second.fingerprint == fingerprint;
      if (auto it = images_.find(r->second.digest); fresh && it != images_.end()) {
        return HitLocked(it->second);
      }
    }
    scratch = absl::StrCat(options_.dir, "/", kTmpDir, "/inspect-", next_pull_++);
    ++inspecting_[ref];
  }
  absl::Cleanup inspected = [this, &ref] {
    absl::MutexLock lock(&mu_);
    if (--inspecting_[ref] == 0) inspecting_.erase(ref);
  };
  std::error_code ec;
  fs::create_directories(scratch, ec);
  ToolRun inspect;
  inspect.argv = {options_.skopeo, "inspect", "--raw", ref};
  inspect.timeout = options_.pull_timeout;
  inspect.max_stdout = size_t{4} << 20;
  inspect.scratch = scratch;
  absl::StatusOr<std::string> manifest = RunTool(inspect);
  fs::remove_all(scratch, ec);
  if (!manifest.ok()) {
    absl::MutexLock lock(&mu_);
    ++stats_.failures;
    return ToolError(ref, manifest.status());
  }
  const std::string digest = absl::StrCat("sha256:", Sha256Hex(*manifest));
  {
    absl::MutexLock lock(&mu_);
    if (resolved_.size() >= 10000) resolved_.clear();
    resolved_[ref] = Resolved{fingerprint, digest, absl::Now()};
  }
  while (true) {
    std::shared_ptr<Pulling> wait;
    {
      absl::MutexLock lock(&mu_);
      if (auto it = images_.find(digest); it != images_.end()) return HitLocked(it->second);
      auto p = pulling_.find(digest);
      if (p == pulling_.end()) {
        pulling_[digest] = std::make_shared<Pulling>();
        break;  // this caller pulls
      }
      wait = p->second;
    }
    absl::MutexLock wait_lock(&wait->mu);
    wait->mu.Await(absl::Condition(&wait->done));
    if (!wait->status.ok()) return wait->status;  // the same error for every waiter
  }
  absl::StatusOr<Image> pulled = PullMiss(ref, digest, *manifest);
  std::shared_ptr<Pulling> done;
  {
    absl::MutexLock lock(&mu_);
    done = pulling_[digest];
    pulling_.erase(digest);
    if (!pulled.ok()) ++stats_.failures;
  }
  {
    absl::MutexLock lock(&done->mu);
    done->status = pulled.status();
    done->done = true;
  }
  return pulled;
}

absl::StatusOr<Image> ImageCache::PullMiss(const std::string& ref, const std::string& digest,
                                           const std::string& manifest) {
  const absl::Time start = absl::Now();
  std::string work;
  {
    absl::MutexLock lock(&mu_);
    work = absl::StrCat(options_.dir, "/", kTmpDir, "/pull-", next_pull_++);
    ++stats_.misses;
  }
  std::error_code ec;
  fs::create_directories(work, ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat("image cache: \"", work, "\": ", ec.message()));
  struct Cleanup {
    std::string path;
    ~Cleanup() {
      std::error_code e;
      fs::remove_all(path, e);
    }
  } cleanup{work};
  const std::string layout = work + "/layout";
  // What is left of the budget bounds both the copy and the unpack (a gzip bomb is
  // killed when it has written that much).
  // (Images nobody holds do not count: they are evicted to make room when it is
  // published. Two pulls of different images are each bounded so, not together.)
  int64_t room = 0;
  {
    absl::MutexLock lock(&mu_);
    int64_t held = 0;
    for (const auto& [d, image] : images_) {
      if (image.holders > 0) held += image.bytes;
    }
    room = options_.budget_bytes - held;
  }
  // What the manifest declares (an index of manifests declares no layers): an image whose
  // layers alone exceed what is left is refused before a byte is copied. A manifest that
  // lies low is caught by skopeo (sizes are checked) or by the watchdog below.
  {
    const Json m = Json::parse(manifest, nullptr, false);
    int64_t declared = 0;
    if (m.is_object() && m.contains("layers") && m["layers"].is_array()) {
      for (const Json& layer : m["layers"]) {
        if (!layer.is_object() || !layer.contains("size")) continue;
        const Json& size = layer["size"];
        // Saturating: a hostile manifest may declare sizes that overflow a sum.
        const int64_t bytes = size.is_number_unsigned() && size.get<uint64_t>() > INT64_MAX
                                  ? INT64_MAX
                              : size.is_number_integer() ? std::max<int64_t>(0, size.get<int64_t>())
                                                         : 0;
        declared = bytes > INT64_MAX - declared ? INT64_MAX : declared + bytes;
      }
    }
    if (declared > room) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "image \"", ref, "\" declares layers of ", declared, " bytes compressed, more than the ",
          std::max<int64_t>(room, 0), " bytes left of the image cache's budget of ",
          options_.budget_bytes, " bytes (images in use hold the rest); nothing was fetched"));
    }
  }
  const int64_t free_at_start = FreeBytes(options_.dir);
  // The file system's free space is the cheap look; only when it says "too much" (other
  // writers count there too) is the pull's own folder measured.
  auto watchdog = [&]() -> absl::Status {
    const int64_t free_now = FreeBytes(options_.dir);
    if (free_at_start >= 0 && free_now >= 0 && free_at_start - free_now > room &&
        DiskBytes(work) > room) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "image \"", ref, "\" grew past the ", room, " bytes left of the image cache's budget of ",
          options_.budget_bytes, " bytes while being fetched or unpacked"));
    }
    return absl::OkStatus();
  };
  ToolRun copy;
  copy.argv = {options_.skopeo,
               "copy",
               "--quiet",
               "--retry-times",
               "0",
               ref,
               absl::StrCat("oci:", layout, ":image")};
  copy.timeout = options_.pull_timeout;
  copy.scratch = work;
  copy.watchdog = watchdog;
  if (absl::StatusOr<std::string> s = RunTool(copy); !s.ok()) return ToolError(ref, s.status());
  absl::StatusOr<LayoutImage> image_layout = ReadLayout(layout);
  if (!image_layout.ok()) return ToolError(ref, image_layout.status());
  if (image_layout->layer_bytes > options_.budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("image \"", ref, "\": its layers are ", image_layout->layer_bytes,
                     " bytes compressed, more than the image cache's budget of ",
                     options_.budget_bytes, " bytes"));
  }
  const std::string staged = work + "/image";
  fs::create_directories(staged, ec);
  ToolRun unpack;
  unpack.argv = {options_.umoci,
                 "raw",
                 "unpack",
                 "--rootless",
                 "--image",
                 absl::StrCat(layout, ":image"),
                 staged + "/" + kRootfsName};
  unpack.timeout = options_.pull_timeout;
  unpack.scratch = work;
  unpack.watchdog = watchdog;
  if (absl::StatusOr<std::string> s = RunTool(unpack); !s.ok()) return ToolError(ref, s.status());
  if (int errors = SanitizeTree(staged + "/" + kRootfsName); errors != 0) {
    return absl::UnavailableError(absl::StrCat("image \"", ref, "\": ", errors,
                                               " set-uid bits or special files could not be "
                                               "removed from the unpacked tree"));
  }
  fs::remove_all(layout, ec);  // the unpacked tree is what stays
  Image image;
  image.digest = digest;
  image.ref = ref;
  image.config = ConfigFrom(image_layout->config);
  image.bytes = DiskBytes(staged);
  {
    std::ofstream meta(staged + "/" + kMetaName, std::ios::trunc);
    meta << Json{{"digest", digest},
                 {"ref", ref},
                 {"bytes", image.bytes},
                 {"config", ConfigJson(image.config)},
                 {"sanitized", kSanitizeVersion}}
                .dump();
    if (!meta)
      return absl::UnavailableError(absl::StrCat("image \"", ref, "\": writing its record"));
  }
  const std::string hex(absl::string_view(digest).substr(7));
  const std::string final_dir = absl::StrCat(options_.dir, "/", kImagesDir, "/", hex);
  absl::MutexLock lock(&mu_);
  if (!MakeRoomLocked(image.bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "image \"", ref, "\" takes ", image.bytes,
        " bytes unpacked: it does not fit the image "
        "cache's budget of ",
        options_.budget_bytes, " bytes beside the images in use (", bytes_, " bytes)"));
  }
  if (rename(staged.c_str(), final_dir.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("image \"", ref, "\": publishing it as \"",
                                               final_dir, "\": ", sbx::ErrnoText(errno)));
  }
  image.rootfs = final_dir + "/" + kRootfsName;
  image.last_used = absl::Now();
  image.holders = 1;
  bytes_ += image.bytes;
  stats_.unpack_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  images_[digest] = image;
  stats_.images = static_cast<int64_t>(images_.size());
  spdlog::info("image cache: \"{}\" is {} ({} bytes unpacked in {})", ref, digest, image.bytes,
               absl::FormatDuration(absl::Now() - start));
  return image;
}

bool ImageCache::MakeRoomLocked(int64_t bytes) {
  while (bytes_ + bytes > options_.budget_bytes) {
    const Image* oldest = nullptr;
    for (const auto& [digest, image] : images_) {
      if (image.holders == 0 && (oldest == nullptr || image.last_used < oldest->last_used)) {
        oldest = &image;
      }
    }
    if (oldest == nullptr) return false;
    EvictLocked(oldest->digest);
  }
  return true;
}

void ImageCache::EvictLocked(const std::string& digest) {
  auto it = images_.find(digest);
  if (it == images_.end()) return;
  spdlog::info("image cache: evicting {} (\"{}\", {} bytes)", digest, it->second.ref,
               it->second.bytes);
  std::error_code ec;
  // Renamed away first, so a crash never leaves a half-removed image that looks whole.
  const std::string dir = fs::path(it->second.rootfs).parent_path();
  const std::string doomed = absl::StrCat(options_.dir, "/", kTmpDir, "/evicted-", next_pull_++);
  fs::create_directories(fs::path(doomed).parent_path(), ec);
  if (rename(dir.c_str(), doomed.c_str()) == 0) {
    fs::remove_all(doomed, ec);
  } else {
    fs::remove_all(dir, ec);
  }
  bytes_ -= it->second.bytes;
  images_.erase(it);
  ++stats_.evictions;
  stats_.images = static_cast<int64_t>(images_.size());
}

void ImageCache::Release(const std::string& digest) {
  absl::MutexLock lock(&mu_);
  auto it = images_.find(digest);
  if (it != images_.end() && it->second.holders > 0) --it->second.holders;
}

std::string ImageCache::State(const std::string& ref) const {
  absl::MutexLock lock(&mu_);
  if (inspecting_.contains(ref)) return "pulling";
  auto r = resolved_.find(ref);
  if (r == resolved_.end()) return "";
  if (pulling_.contains(r->second.digest)) return "pulling";
  return images_.contains(r->second.digest) ? "cached" : "";
}

std::vector<Image> ImageCache::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<Image> out;
  for (const auto& [digest, image] : images_) out.push_back(image);
  return out;
}

absl::Status ImageCache::Remove(const std::string& digest) {
  absl::MutexLock lock(&mu_);
  auto it = images_.find(digest);
  if (it == images_.end()) {
    // A unique prefix of at least 12 hex digits, with or without "sha256:", as `sbx images`
    // shows them.
    absl::string_view prefix = digest;
    absl::ConsumePrefix(&prefix, "sha256:");
    if (prefix.size() >= 12) {
      int matches = 0;
      for (auto i = images_.begin(); i != images_.end(); ++i) {
        if (absl::StartsWith(absl::string_view(i->first).substr(7), prefix)) {
          ++matches;
          it = i;
        }
      }
      if (matches > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("image digest prefix \"", digest, "\" names ", matches, " images"));
      }
      if (matches == 0) it = images_.end();
    }
  }
  if (it == images_.end()) {
    return absl::NotFoundError(absl::StrCat("image ", digest, " is not in the cache"));
  }
  if (it->second.holders > 0) {
    return absl::FailedPreconditionError(absl::StrCat("image ", digest, " (\"", it->second.ref,
                                                      "\") is in use by ", it->second.holders,
                                                      " holders"));
  }
  EvictLocked(it->first);
  return absl::OkStatus();
}

ImageCacheStats ImageCache::Stats() const {
  absl::MutexLock lock(&mu_);
  ImageCacheStats s = stats_;
  s.bytes = bytes_;
  s.budget_bytes = options_.budget_bytes;
  return s;
}

}  // namespace sbx::images

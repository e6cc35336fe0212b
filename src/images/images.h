#pragma once
// sbx::images: OCI images of the local runtime, fetched and unpacked once per digest and
// shared read-only (docs/architecture.md, "Images"). `Images` is what the server and the
// runtime use; ImageCache (image_cache.h) is the implementation.
//
// Thread-safety: every method may be called from any thread.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace sbx::images {

// The parts of an image's configuration a sandbox uses (OCI image config's "config").
struct ImageConfig {
  std::vector<std::string> env;
  std::string working_dir;
  std::string user;
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd;
};

struct Image {
  std::string digest;  // "sha256:<hex>": the key (the source manifest's digest)
  std::string rootfs;  // the unpacked root, absolute; never written once published
  int64_t bytes = 0;   // on disk
  ImageConfig config;
  std::string ref;  // the reference it was first pulled by
  absl::Time last_used;
  int holders = 0;
};

struct ImageCacheStats {
  int64_t bytes = 0;
  int64_t budget_bytes = 0;
  int64_t images = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;  // pulls made
  uint64_t failures = 0;
  uint64_t evictions = 0;
  double unpack_seconds = 0;  // copy + unpack of every miss
};

class Images {
 public:
  virtual ~Images() = default;
  // The image `ref` names, pulled and unpacked on first use, held until Release(digest).
  // Errors name the reference: INVALID_ARGUMENT (not a reference this cache takes, or a
  // local one outside the import folders), NOT_FOUND (the source has no such image),
  // RESOURCE_EXHAUSTED (it does not fit the budget), DATA_LOSS (a blob's digest does not
  // match its bytes), UNAVAILABLE (the tools failed otherwise).
  [[nodiscard]] virtual absl::StatusOr<Image> Acquire(const std::string& ref) = 0;
  virtual void Release(const std::string& digest) = 0;
  // Holds the cached image `digest` once more (a sandbox found running after a restart);
  // false when it is not in the cache.
  virtual bool Hold(const std::string& digest) = 0;
  // Acquire then Release: the image is in the cache afterwards (until evicted).
  [[nodiscard]] virtual absl::StatusOr<Image> Pull(const std::string& ref) = 0;
  virtual std::vector<Image> List() const = 0;
  // Where the image `ref` stands: "pulling" (being resolved, fetched or unpacked now),
  // "cached" (what it last resolved to is in the cache), or "" (neither). Asks no tool.
  virtual std::string State(const std::string& ref) const = 0;
  // Removes an image nobody holds, named by its digest or a unique prefix of at least 12
  // hex digits: NOT_FOUND, INVALID_ARGUMENT for an ambiguous prefix, or FAILED_PRECONDITION
  // while held.
  [[nodiscard]] virtual absl::Status Remove(const std::string& digest) = 0;
  virtual ImageCacheStats Stats() const = 0;
  // OK when `ref` is a reference this cache would try; INVALID_ARGUMENT naming it.
  [[nodiscard]] virtual absl::Status CheckReference(const std::string& ref) const = 0;
};

}  // namespace sbx::images

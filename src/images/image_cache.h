#pragma once
// ImageCache: OCI images for local sandboxes, fetched and unpacked once per digest into a
// content-addressed folder that every sandbox of the image shares read-only
// (docs/architecture.md, "Images").
//
// A reference is what skopeo reads: `oci:DIR[:TAG]`, `oci-archive:FILE[:TAG]`,
// `docker-archive:FILE[:NAME:TAG]` (a `docker save` tar) and, when allowed,
// `docker://NAME[:TAG|@DIGEST]` from a registry. Local references must lie under one of
// the configured import folders (the server would otherwise read any host file a caller
// names). An image's key is the sha256 of its source manifest as skopeo reads it
// (`skopeo inspect --raw`); a miss copies it with skopeo into a private OCI layout (which
// checks every blob's digest), unpacks it with `umoci raw unpack --rootless`, makes the
// tree harmless (no set-uid/set-gid bits, no device nodes, FIFOs or sockets; nothing
// outside the image's folder) and publishes it with one rename. The cache keeps at most
// `budget_bytes` on disk: images nobody holds are evicted least recently used first, an
// image that cannot fit is refused (RESOURCE_EXHAUSTED) and an unpack that grows past
// what is left is killed. The cache survives restarts: Open keeps every published image
// and removes half-made ones.
//
// Layout under `dir` (0700): images/<hex>/{rootfs/,image.json}, tmp/<pull>/ while pulling.
//
// Thread-safety: every method may be called from any thread. Concurrent Acquires of one
// image wait for a single pull.
// Lifetime: the cache must outlive the holders of its images (Release after use).

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "src/images/images.h"

namespace sbx::images {

struct ImageCacheOptions {
  std::string dir;
  int64_t budget_bytes = int64_t{10} << 30;
  // Folders under which local references (oci:, oci-archive:, docker-archive:) may lie,
  // links resolved. Empty: none is accepted.
  std::vector<std::string> import_dirs;
  // Whether docker:// references (a registry) are accepted.
  bool allow_registry = true;
  std::string skopeo = "skopeo";
  std::string umoci = "umoci";
  absl::Duration pull_timeout = absl::Minutes(10);

  // INVALID_ARGUMENT naming the field.
  [[nodiscard]] absl::Status Validate() const;
};

class ImageCache final : public Images {
 public:
  // Makes `dir` when missing (0700), loads the published images, removes leftovers of
  // pulls cut short. Errors name the folder.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ImageCache>> Open(ImageCacheOptions options);

  // The image `ref` names, pulled and unpacked on first use, held until Release(digest).
  // Errors name the reference: INVALID_ARGUMENT (not a reference this cache takes, or a
  // local one outside the import folders), NOT_FOUND (the source has no such image),
  // RESOURCE_EXHAUSTED (it does not fit the budget), DATA_LOSS (a blob's digest does not
  // match its bytes), UNAVAILABLE (the tools failed otherwise).
  [[nodiscard]] absl::StatusOr<Image> Acquire(const std::string& ref) override
      ABSL_LOCKS_EXCLUDED(mu_);
  void Release(const std::string& digest) override ABSL_LOCKS_EXCLUDED(mu_);
  bool Hold(const std::string& digest) override ABSL_LOCKS_EXCLUDED(mu_);
  // Acquire then Release: the image is in the cache afterwards (until evicted).
  [[nodiscard]] absl::StatusOr<Image> Pull(const std::string& ref) override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<Image> List() const override ABSL_LOCKS_EXCLUDED(mu_);
  std::string State(const std::string& ref) const override ABSL_LOCKS_EXCLUDED(mu_);
  // Removes an image nobody holds: NOT_FOUND, or FAILED_PRECONDITION while held.
  [[nodiscard]] absl::Status Remove(const std::string& digest) override ABSL_LOCKS_EXCLUDED(mu_);
  ImageCacheStats Stats() const override ABSL_LOCKS_EXCLUDED(mu_);

  // OK when `ref` is a reference this cache would try (syntax, transport, import
  // folders); INVALID_ARGUMENT naming it otherwise. No tool runs.
  [[nodiscard]] absl::Status CheckReference(const std::string& ref) const override;

 private:
  explicit ImageCache(ImageCacheOptions options);
  struct Pulling;  // one pull in flight, that others wait for

  // What a reference resolved to, and the source's state then: a later Acquire of the
  // same reference whose source is unchanged (a local file's or layout's index's inode,
  // size and times; a registry's answer for 60 s) takes the digest from here instead of
  // asking skopeo (12-14 ms).
  struct Resolved {
    std::string fingerprint;
    std::string digest;
    absl::Time at;
  };
  // The hit of a cached image: held once more, used now.
  Image HitLocked(Image& image) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `manifest`: the source's manifest as skopeo read it (its declared layer sizes are
  // checked against the budget before anything is copied).
  [[nodiscard]] absl::StatusOr<Image> PullMiss(const std::string& ref, const std::string& digest,
                                               const std::string& manifest)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Evicts unheld images, least recently used first, until `bytes` more fit; false when
  // they cannot.
  bool MakeRoomLocked(int64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictLocked(const std::string& digest) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ImageCacheOptions options_;
  mutable absl::Mutex mu_;
  std::map<std::string, Image> images_ ABSL_GUARDED_BY(mu_);  // by digest
  std::map<std::string, std::shared_ptr<Pulling>> pulling_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Resolved> resolved_ ABSL_GUARDED_BY(mu_);  // by reference
  // References being resolved (skopeo inspect) now, with how many calls resolve each.
  std::map<std::string, int> inspecting_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  ImageCacheStats stats_ ABSL_GUARDED_BY(mu_);
  uint64_t next_pull_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace sbx::images

#pragma once
// Evicting files from the page cache, for benchmarks that measure a cold start (the first
// start on a new node, or after a reboot): fdatasync, then POSIX_FADV_DONTNEED, per
// regular file of a folder. Clean pages of those files leave the cache; no root needed
// (unlike /proc/sys/vm/drop_caches). Used by store_bench and allocator_bench.

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>

namespace sbx::bench {

// Returns the bytes evicted, or -1 when a file could not be.
inline int64_t EvictFromPageCache(const std::string& dir) {
  int64_t bytes = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file()) continue;
    const int fd = open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    const bool ok = fdatasync(fd) == 0 && posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
    close(fd);
    if (!ok) return -1;
    bytes += static_cast<int64_t>(it->file_size(ec));
  }
  return ec ? -1 : bytes;
}

}  // namespace sbx::bench

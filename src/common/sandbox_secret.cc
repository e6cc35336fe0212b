#include "src/common/sandbox_secret.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "src/common/errno_text.h"

namespace sbx {
namespace {

absl::Status KeyError(const std::string& path, absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat("sandbox key file \"", path, "\": ", what));
}

absl::Status Errno(const std::string& path, absl::string_view what) {
  return KeyError(path, absl::StrCat(what, ": ", sbx::ErrnoText(errno)));
}

}  // namespace

absl::StatusOr<std::string> SandboxSecrets::NewKey() {
  std::string key(kKeyBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key.data()), static_cast<int>(key.size())) != 1) {
    return absl::FailedPreconditionError("no random bytes from OpenSSL for a sandbox key");
  }
  return key;
}

absl::StatusOr<SandboxSecrets> SandboxSecrets::LoadOrCreate(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno == ENOENT) {
    absl::StatusOr<std::string> key = NewKey();
    if (!key.ok()) return KeyError(path, key.status().message());
    // Written under another name and linked into place: a crash never leaves half a key,
    // and two servers racing on the same folder agree on the one that won.
    const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
    const int out = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (out < 0) return Errno(tmp, "cannot create");
    const bool written =
        write(out, key->data(), key->size()) == static_cast<ssize_t>(key->size()) &&
        fsync(out) == 0;
    close(out);
    if (!written) {
      unlink(tmp.c_str());
      return Errno(tmp, "cannot write");
    }
    const int linked = link(tmp.c_str(), path.c_str());
    const int link_errno = errno;
    unlink(tmp.c_str());
    if (linked != 0 && link_errno != EEXIST) {
      errno = link_errno;
      return Errno(path, "cannot create");
    }
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  }
  if (fd < 0) return Errno(path, "cannot open");
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return Errno(path, "cannot stat");
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return KeyError(path, "is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    close(fd);
    return KeyError(path,
                    absl::StrCat("is readable or writable by others (mode ",
                                 absl::StrCat(absl::Hex(st.st_mode & 0777)), "); it must be 0600"));
  }
  std::string key(kKeyBytes + 1, '\0');
  const ssize_t n = read(fd, key.data(), key.size());
  close(fd);
  if (n != static_cast<ssize_t>(kKeyBytes)) {
    return KeyError(path,
                    absl::StrCat("holds ", n < 0 ? 0 : n, " bytes, not a key of ", kKeyBytes));
  }
  key.resize(kKeyBytes);
  return SandboxSecrets(std::move(key));
}

SandboxSecrets SandboxSecrets::FromKey(std::string key) { return SandboxSecrets(std::move(key)); }

std::string SandboxSecrets::For(absl::string_view id) const {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
       reinterpret_cast<const unsigned char*>(id.data()), id.size(), mac, &len);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(mac), static_cast<size_t>(len)));
}

}  // namespace sbx

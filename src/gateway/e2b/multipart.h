#pragma once
// A strict parser of multipart/form-data bodies (RFC 7578 over RFC 2046's multipart
// syntax), for the E2B SDK's file uploads. Internal to src/gateway/e2b. Beast has none.
// MultipartReader reads a body as it arrives, part by part, at constant memory (a part's
// bytes are handed on as they come, never held whole); ParseMultipart parses a body held
// whole with it.
//
// Strict: CRLF line ends only; the body starts with the first delimiter (no preamble
// beyond empty lines), ends with the close delimiter (anything after it is ignored, as the
// RFC says); every part has a Content-Disposition of form-data with a name; at most
// kMaxParts parts and kMaxPartHeaderBytes of headers per part. Anything else is
// INVALID_ARGUMENT naming the problem.
//
// Thread-safety: a MultipartReader is used by one thread at a time.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "src/gateway/e2b/http.h"

namespace sbx::e2b {

inline constexpr int kMaxParts = 1000;
inline constexpr size_t kMaxPartHeaderBytes = 8 * 1024;

struct FormPart {
  std::string name;      // the form field's name
  std::string filename;  // the filename parameter, "" without one
  absl::string_view data;
};

// The boundary of a Content-Type "multipart/form-data; boundary=...". INVALID_ARGUMENT
// for another type or a boundary that is missing, empty, longer than 70 characters or of
// characters RFC 2046 does not allow.
[[nodiscard]] absl::StatusOr<std::string> MultipartBoundary(absl::string_view content_type);

// A body held whole, read as a stream (for MultipartReader); `body` must outlive it.
class WholeBodyReader final : public BodyReader {
 public:
  explicit WholeBodyReader(absl::string_view body) : rest_(body) {}
  [[nodiscard]] absl::StatusOr<size_t> Read(char* buf, size_t n) override;

 private:
  absl::string_view rest_;
};

// Reads a multipart body from `body` (which must outlive it): NextPart, then the part's
// bytes through data(), then NextPart again (skipping what was not read), until NextPart
// says there are no more. Holds at most kMultipartBufferBytes of the body at a time, and
// reads `body` only as fast as its parts are read (flow control reaches the client).
// Errors of `body` itself (a client gone, a timeout) come back as they are; malformed
// input is INVALID_ARGUMENT (from NextPart, or from data()'s Read when a part does not end).
inline constexpr size_t kMultipartBufferBytes = 64 * 1024;

class MultipartReader {
 public:
  MultipartReader(BodyReader* body, absl::string_view boundary);
  MultipartReader(const MultipartReader&) = delete;
  MultipartReader& operator=(const MultipartReader&) = delete;

  // The next part's name and filename (`data` empty); nullopt after the close delimiter.
  [[nodiscard]] absl::StatusOr<std::optional<FormPart>> NextPart();
  // The current part's bytes: Read returns 0 at the part's end.
  BodyReader* data() { return &data_; }
  // Bytes of the body consumed so far (what data() returned last ends here, before the
  // delimiter that follows it).
  uint64_t offset() const { return consumed_ + pos_; }

 private:
  class PartData final : public BodyReader {
   public:
    explicit PartData(MultipartReader* r) : r_(r) {}
    [[nodiscard]] absl::StatusOr<size_t> Read(char* buf, size_t n) override {
      return r_->ReadData(buf, n);
    }

   private:
    MultipartReader* const r_;
  };

  [[nodiscard]] absl::StatusOr<size_t> ReadData(char* buf, size_t n);
  // Makes at least `n` unread bytes available unless the body ends first; false then.
  [[nodiscard]] absl::StatusOr<bool> Fill(size_t n);
  absl::string_view Unread() const { return absl::string_view(buf_).substr(pos_); }

  BodyReader* const body_;
  const std::string first_;      // "--boundary"
  const std::string delimiter_;  // "\r\n--boundary"
  PartData data_{this};
  std::string buf_;
  size_t pos_ = 0;         // the first unread byte of buf_
  uint64_t consumed_ = 0;  // body bytes dropped from buf_ before it
  bool body_ended_ = false;
  bool started_ = false;   // the first delimiter was read
  bool in_part_ = false;   // a part's data is being read
  bool finished_ = false;  // the close delimiter was read
  int parts_ = 0;
};

// The parts of `body`; views into it.
[[nodiscard]] absl::StatusOr<std::vector<FormPart>> ParseMultipart(absl::string_view body,
                                                                   absl::string_view boundary);

}  // namespace sbx::e2b

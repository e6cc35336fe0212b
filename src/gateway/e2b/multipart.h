#pragma once
// A strict parser of multipart/form-data bodies (RFC 7578 over RFC 2046's multipart
// syntax), for the E2B SDK's file uploads. Internal to src/gateway/e2b. Beast has none; the body
// is held whole (the caller bounds its size), and the parts are views into it.
//
// Strict: CRLF line ends only; the body starts with the first delimiter (no preamble
// beyond empty lines), ends with the close delimiter (anything after it is ignored, as the
// RFC says); every part has a Content-Disposition of form-data with a name; at most
// kMaxParts parts and kMaxPartHeaderBytes of headers per part. Anything else is
// INVALID_ARGUMENT naming the problem.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

// The parts of `body`; views into it.
[[nodiscard]] absl::StatusOr<std::vector<FormPart>> ParseMultipart(absl::string_view body,
                                                                   absl::string_view boundary);

}  // namespace sbx::e2b

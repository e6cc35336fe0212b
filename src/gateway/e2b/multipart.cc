#include "src/gateway/e2b/multipart.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace sbx::e2b {

namespace {

absl::Status Bad(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("malformed multipart/form-data body: ", why));
}

// RFC 2046 bchars.
bool BoundaryChar(char c) {
  return absl::ascii_isalnum(c) || absl::StrContains("'()+_,-./:=? ", c);
}

// The value of parameter `name` in a header's parameters ("; a=b; c=\"d\""), unquoted.
// false when absent; an error for a quoted value that does not end.
absl::StatusOr<bool> Param(absl::string_view params, absl::string_view name, std::string* out) {
  while (!params.empty()) {
    params = absl::StripLeadingAsciiWhitespace(params);
    if (params.empty()) break;
    if (params.front() == ';') {
      params.remove_prefix(1);
      continue;
    }
    const size_t eq = params.find('=');
    if (eq == absl::string_view::npos) return false;
    const std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(params.substr(0, eq)));
    params.remove_prefix(eq + 1);
    params = absl::StripLeadingAsciiWhitespace(params);
    std::string value;
    if (!params.empty() && params.front() == '"') {
      size_t i = 1;
      for (; i < params.size() && params[i] != '"'; ++i) {
        if (params[i] == '\\' && i + 1 < params.size()) ++i;
        value.push_back(params[i]);
      }
      if (i >= params.size()) return Bad(absl::StrCat("unterminated quoted ", key));
      params.remove_prefix(i + 1);
    } else {
      const size_t end = params.find(';');
      value = std::string(absl::StripAsciiWhitespace(params.substr(0, end)));
      params.remove_prefix(end == absl::string_view::npos ? params.size() : end);
    }
    if (key == name) {
      *out = std::move(value);
      return true;
    }
  }
  return false;
}

}  // namespace

absl::StatusOr<std::string> MultipartBoundary(absl::string_view content_type) {
  const size_t semi = content_type.find(';');
  const std::string type =
      absl::AsciiStrToLower(absl::StripAsciiWhitespace(content_type.substr(0, semi)));
  if (type != "multipart/form-data") {
    return absl::InvalidArgumentError(
        absl::StrCat("content type \"", content_type, "\" is not multipart/form-data"));
  }
  std::string boundary;
  absl::StatusOr<bool> found =
      Param(semi == absl::string_view::npos ? absl::string_view() : content_type.substr(semi),
            "boundary", &boundary);
  if (!found.ok()) return found.status();
  if (!*found || boundary.empty() || boundary.size() > 70 || boundary.back() == ' ') {
    return absl::InvalidArgumentError(
        absl::StrCat("content type \"", content_type, "\" has no valid boundary"));
  }
  for (char c : boundary) {
    if (!BoundaryChar(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the multipart boundary has a character RFC 2046 does not allow: \"", boundary, "\""));
    }
  }
  return boundary;
}

absl::StatusOr<std::vector<FormPart>> ParseMultipart(absl::string_view body,
                                                     absl::string_view boundary) {
  const std::string first = absl::StrCat("--", boundary);
  const std::string delimiter = absl::StrCat("\r\n--", boundary);
  // Empty lines may come before the first delimiter.
  while (absl::StartsWith(body, "\r\n")) body.remove_prefix(2);
  if (!absl::StartsWith(body, first)) return Bad("it does not start with the boundary");
  body.remove_prefix(first.size());
  std::vector<FormPart> parts;
  while (true) {
    if (absl::StartsWith(body, "--")) return parts;  // the close delimiter
    // Transport padding after a delimiter, then CRLF.
    while (!body.empty() && (body.front() == ' ' || body.front() == '\t')) body.remove_prefix(1);
    if (!absl::StartsWith(body, "\r\n")) return Bad("a boundary is not followed by CRLF");
    body.remove_prefix(2);
    if (static_cast<int>(parts.size()) >= kMaxParts) {
      return Bad(absl::StrCat("more than ", kMaxParts, " parts"));
    }
    const size_t header_end = body.find("\r\n\r\n");
    const size_t empty_headers = absl::StartsWith(body, "\r\n") ? 0 : absl::string_view::npos;
    if (header_end == absl::string_view::npos && empty_headers == absl::string_view::npos) {
      return Bad("a part's headers do not end");
    }
    absl::string_view headers =
        empty_headers == 0 ? absl::string_view() : body.substr(0, header_end);
    if (headers.size() > kMaxPartHeaderBytes) {
      return Bad(absl::StrCat("a part's headers exceed ", kMaxPartHeaderBytes, " bytes"));
    }
    body.remove_prefix(empty_headers == 0 ? 2 : header_end + 4);
    FormPart part;
    bool disposition = false;
    for (absl::string_view line : absl::StrSplit(headers, "\r\n")) {
      const size_t colon = line.find(':');
      if (colon == absl::string_view::npos || colon == 0) {
        return Bad(absl::StrCat("a part header line has no name: \"", line, "\""));
      }
      const std::string name = absl::AsciiStrToLower(line.substr(0, colon));
      absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
      if (name != "content-disposition") continue;
      if (disposition) return Bad("a part has two Content-Disposition headers");
      disposition = true;
      const size_t semi = value.find(';');
      if (absl::AsciiStrToLower(absl::StripAsciiWhitespace(value.substr(0, semi))) != "form-data") {
        return Bad(absl::StrCat("Content-Disposition \"", value, "\" is not form-data"));
      }
      absl::string_view params =
          semi == absl::string_view::npos ? absl::string_view() : value.substr(semi);
      absl::StatusOr<bool> has_name = Param(params, "name", &part.name);
      if (!has_name.ok()) return has_name.status();
      if (!*has_name) return Bad("a part's Content-Disposition has no name");
      absl::StatusOr<bool> has_file = Param(params, "filename", &part.filename);
      if (!has_file.ok()) return has_file.status();
    }
    if (!disposition) return Bad("a part has no Content-Disposition");
    const size_t end = body.find(delimiter);
    if (end == absl::string_view::npos) return Bad("a part does not end with the boundary");
    part.data = body.substr(0, end);
    parts.push_back(std::move(part));
    body.remove_prefix(end + delimiter.size());
  }
}

}  // namespace sbx::e2b

#include "src/gateway/e2b/multipart.h"

#include <algorithm>
#include <cstring>
#include <utility>

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

namespace {

// A part's headers (without the blank line that ends them) into `part`.
absl::Status ParsePartHeaders(absl::string_view headers, FormPart* part) {
  bool disposition = false;
  if (!headers.empty()) {
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
      absl::StatusOr<bool> has_name = Param(params, "name", &part->name);
      if (!has_name.ok()) return has_name.status();
      if (!*has_name) return Bad("a part's Content-Disposition has no name");
      absl::StatusOr<bool> has_file = Param(params, "filename", &part->filename);
      if (!has_file.ok()) return has_file.status();
    }
  }
  if (!disposition) return Bad("a part has no Content-Disposition");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<size_t> WholeBodyReader::Read(char* buf, size_t n) {
  n = std::min(n, rest_.size());
  std::memcpy(buf, rest_.data(), n);
  rest_.remove_prefix(n);
  return n;
}

MultipartReader::MultipartReader(BodyReader* body, absl::string_view boundary)
    : body_(body),
      first_(absl::StrCat("--", boundary)),
      delimiter_(absl::StrCat("\r\n--", boundary)) {}

absl::StatusOr<bool> MultipartReader::Fill(size_t n) {
  while (buf_.size() - pos_ < n) {
    if (body_ended_) return false;
    // Drop what was read, then read at most a buffer's worth more.
    consumed_ += pos_;
    buf_.erase(0, pos_);
    pos_ = 0;
    const size_t old = buf_.size();
    const size_t room = std::max(n, kMultipartBufferBytes) - old;
    buf_.resize(old + room);
    absl::StatusOr<size_t> got = body_->Read(buf_.data() + old, room);
    buf_.resize(old + (got.ok() ? *got : 0));
    if (!got.ok()) return got.status();
    if (*got == 0) body_ended_ = true;
  }
  return true;
}

absl::StatusOr<size_t> MultipartReader::ReadData(char* out, size_t n) {
  if (!in_part_ || n == 0) return 0;
  while (true) {
    const absl::string_view unread = Unread();
    const size_t at = unread.find(delimiter_);
    if (at == 0) {
      pos_ += delimiter_.size();
      in_part_ = false;
      return 0;
    }
    // Bytes surely before the delimiter: up to it, or all but a tail that may begin one.
    const size_t safe = at != absl::string_view::npos ? at
                        : unread.size() >= delimiter_.size()
                            ? unread.size() - (delimiter_.size() - 1)
                            : 0;
    if (safe > 0) {
      const size_t k = std::min(n, safe);
      std::memcpy(out, unread.data(), k);
      pos_ += k;
      return k;
    }
    absl::StatusOr<bool> more = Fill(unread.size() + 1);
    if (!more.ok()) return more.status();
    if (!*more) return Bad("a part does not end with the boundary");
  }
}

absl::StatusOr<std::optional<FormPart>> MultipartReader::NextPart() {
  if (finished_) return std::nullopt;
  if (in_part_) {  // skip the rest of the current part
    char scratch[4096];
    while (in_part_) {
      absl::StatusOr<size_t> n = ReadData(scratch, sizeof(scratch));
      if (!n.ok()) return n.status();
    }
  }
  absl::StatusOr<bool> ok;
  if (!started_) {
    // Empty lines may come before the first delimiter.
    while (true) {
      ok = Fill(2);
      if (!ok.ok()) return ok.status();
      if (!absl::StartsWith(Unread(), "\r\n")) break;
      pos_ += 2;
    }
    ok = Fill(first_.size());
    if (!ok.ok()) return ok.status();
    if (!absl::StartsWith(Unread(), first_)) return Bad("it does not start with the boundary");
    pos_ += first_.size();
    started_ = true;
  }
  // After a delimiter: "--" closes; else transport padding, then CRLF.
  ok = Fill(2);
  if (!ok.ok()) return ok.status();
  if (absl::StartsWith(Unread(), "--")) {
    finished_ = true;
    return std::nullopt;
  }
  while (true) {
    while (!Unread().empty() && (Unread().front() == ' ' || Unread().front() == '\t')) ++pos_;
    if (!Unread().empty() || body_ended_) break;
    ok = Fill(1);
    if (!ok.ok()) return ok.status();
  }
  ok = Fill(2);
  if (!ok.ok()) return ok.status();
  if (!absl::StartsWith(Unread(), "\r\n")) return Bad("a boundary is not followed by CRLF");
  pos_ += 2;
  if (parts_ >= kMaxParts) return Bad(absl::StrCat("more than ", kMaxParts, " parts"));
  // The headers end at an empty line, within kMaxPartHeaderBytes.
  size_t header_end = absl::string_view::npos;
  size_t skip = 0;
  while (true) {
    const absl::string_view unread = Unread();
    if (absl::StartsWith(unread, "\r\n")) {
      header_end = 0;
      skip = 2;
      break;
    }
    header_end = unread.find("\r\n\r\n");
    if (header_end != absl::string_view::npos) {
      skip = header_end + 4;
      break;
    }
    if (unread.size() > kMaxPartHeaderBytes + 4) {
      return Bad(absl::StrCat("a part's headers exceed ", kMaxPartHeaderBytes, " bytes"));
    }
    ok = Fill(unread.size() + 1);
    if (!ok.ok()) return ok.status();
    if (!*ok) return Bad("a part's headers do not end");
  }
  if (header_end > kMaxPartHeaderBytes) {
    return Bad(absl::StrCat("a part's headers exceed ", kMaxPartHeaderBytes, " bytes"));
  }
  FormPart part;
  if (absl::Status s = ParsePartHeaders(Unread().substr(0, header_end), &part); !s.ok()) return s;
  pos_ += skip;
  ++parts_;
  in_part_ = true;
  return part;
}

absl::StatusOr<std::vector<FormPart>> ParseMultipart(absl::string_view body,
                                                     absl::string_view boundary) {
  WholeBodyReader whole(body);
  MultipartReader reader(&whole, boundary);
  std::vector<FormPart> parts;
  char scratch[4096];
  while (true) {
    absl::StatusOr<std::optional<FormPart>> part = reader.NextPart();
    if (!part.ok()) return part.status();
    if (!part->has_value()) return parts;
    const uint64_t start = reader.offset();
    uint64_t end = start;
    while (true) {
      absl::StatusOr<size_t> n = reader.data()->Read(scratch, sizeof(scratch));
      if (!n.ok()) return n.status();
      if (*n == 0) break;
      end = reader.offset();
    }
    (*part)->data = body.substr(start, end - start);
    parts.push_back(**std::move(part));
  }
}

}  // namespace sbx::e2b

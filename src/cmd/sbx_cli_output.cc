#include "src/cmd/sbx_cli_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "src/common/errno_text.h"

namespace sbx::cli {

// ---- JSON -------------------------------------------------------------------------------

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  std::string out;
  // Serializing a valid message cannot fail; if it ever did, an empty object keeps the
  // output parseable.
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) out = "{}";
  if (!pretty) return out;
  // Indented by two spaces like PrintJsonArray (protobuf's own pretty printing uses one);
  // ordered_json keeps the field order of the proto.
  return nlohmann::ordered_json::parse(out, nullptr, false).dump(2);
}

void PrintJson(const google::protobuf::Message& message) {
  std::fprintf(stdout, "%s\n", ToJson(message, true).c_str());
}

void PrintJsonArray(const std::vector<const google::protobuf::Message*>& messages) {
  // Re-parsed so that the array is indented as a whole.
  nlohmann::ordered_json array = nlohmann::ordered_json::array();
  for (const google::protobuf::Message* m : messages) {
    array.push_back(nlohmann::ordered_json::parse(ToJson(*m, false), nullptr, false));
  }
  std::fprintf(stdout, "%s\n", array.dump(2).c_str());
}

void PrintJsonLine(const google::protobuf::Message& message) {
  std::fprintf(stdout, "%s\n", ToJson(message, false).c_str());
  std::fflush(stdout);
}

// ---- Terminal safety --------------------------------------------------------------------

namespace {

// The length of the UTF-8 sequence that starts with `lead` (2..4), or 0 when `lead`
// cannot start one.
size_t Utf8Length(unsigned char lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// The code point of the complete sequence s[0..n), or -1 when it is not valid UTF-8
// (continuation bytes, overlong forms, surrogates, beyond U+10FFFF).
int32_t DecodeUtf8(absl::string_view s, size_t n) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  int32_t cp = byte(0) & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (byte(i) & 0x3F);
  }
  static constexpr int32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
  return cp;
}

bool Unsafe(int32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

void AppendOctal(unsigned char c, std::string* out) {
  const char digits[] = {'\\', static_cast<char>('0' + (c >> 6)),
                         static_cast<char>('0' + ((c >> 3) & 7)), static_cast<char>('0' + (c & 7))};
  out->append(digits, sizeof digits);
}

// Escapes s into out; stops before an incomplete UTF-8 sequence at the end when
// `hold_tail` (returns where it stopped).
size_t EscapeInto(absl::string_view s, EscapeMode mode, bool hold_tail, std::string* out) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F) {
      if (c == '\\' && mode == EscapeMode::kName) {
        out->append("\\\\");
      } else {
        out->push_back(static_cast<char>(c));
      }
      ++i;
      continue;
    }
    if (c < 0x80) {
      if (mode == EscapeMode::kText && (c == '\n' || c == '\t')) {
        out->push_back(static_cast<char>(c));
      } else {
        switch (c) {
          case '\a':
            out->append("\\a");
            break;
          case '\b':
            out->append("\\b");
            break;
          case '\t':
            out->append("\\t");
            break;
          case '\n':
            out->append("\\n");
            break;
          case '\v':
            out->append("\\v");
            break;
          case '\f':
            out->append("\\f");
            break;
          case '\r':
            out->append("\\r");
            break;
          default:
            AppendOctal(c, out);
        }
      }
      ++i;
      continue;
    }
    const size_t n = Utf8Length(c);
    if (n != 0 && i + n > s.size() && hold_tail) {
      // Possibly the start of a sequence the next chunk completes.
      bool prefix_ok = true;
      for (size_t k = i + 1; k < s.size(); ++k) {
        prefix_ok = prefix_ok && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80;
      }
      if (prefix_ok) return i;
    }
    const int32_t cp = n != 0 && i + n <= s.size() ? DecodeUtf8(s.substr(i), n) : -1;
    if (cp < 0 || Unsafe(cp)) {
      // One byte at a time: what follows an invalid lead byte is looked at again.
      const size_t bytes = cp < 0 ? 1 : n;
      for (size_t k = 0; k < bytes; ++k) AppendOctal(static_cast<unsigned char>(s[i + k]), out);
      i += bytes;
      continue;
    }
    out->append(s.data() + i, n);
    i += n;
  }
  return i;
}

}  // namespace

std::string EscapeForTerminal(absl::string_view s, EscapeMode mode) {
  std::string out;
  out.reserve(s.size());
  EscapeInto(s, mode, /*hold_tail=*/false, &out);
  return out;
}

std::string TerminalEscaper::Feed(absl::string_view chunk) {
  pending_.append(chunk.data(), chunk.size());
  std::string out;
  const size_t used = EscapeInto(pending_, EscapeMode::kText, /*hold_tail=*/true, &out);
  pending_.erase(0, used);
  return out;
}

std::string TerminalEscaper::Finish() {
  std::string out = EscapeForTerminal(pending_, EscapeMode::kText);
  pending_.clear();
  return out;
}

// ---- Tables and human formats -----------------------------------------------------------

void Table::Print(FILE* out) const {
  std::vector<std::vector<std::string>> rows;
  rows.reserve(rows_.size());
  for (const auto& row : rows_) {
    std::vector<std::string> escaped;
    for (const std::string& cell : row) escaped.push_back(EscapeForTerminal(cell));
    rows.push_back(std::move(escaped));
  }
  std::vector<size_t> widths(header_.size(), 0);
  auto measure = [&widths](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  };
  measure(header_);
  for (const auto& row : rows) measure(row);
  auto print = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < widths.size(); ++i) {
      const std::string& cell = i < row.size() ? row[i] : std::string();
      line += cell;
      if (i + 1 < widths.size()) line += std::string(widths[i] - cell.size() + 3, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::fprintf(out, "%s\n", line.c_str());
  };
  print(header_);
  for (const auto& row : rows) print(row);
}

std::string HumanDuration(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = -d;
  const int64_t s = absl::ToInt64Seconds(d);
  if (s < 60) return absl::StrCat(s, "s");
  const int64_t m = s / 60;
  if (m < 10) return s % 60 == 0 ? absl::StrCat(m, "m") : absl::StrCat(m, "m", s % 60, "s");
  if (m < 60) return absl::StrCat(m, "m");
  const int64_t h = m / 60;
  if (h < 24) return m % 60 == 0 ? absl::StrCat(h, "h") : absl::StrCat(h, "h", m % 60, "m");
  const int64_t days = h / 24;
  return h % 24 == 0 ? absl::StrCat(days, "d") : absl::StrCat(days, "d", h % 24, "h");
}

absl::Time FromProto(const google::protobuf::Timestamp& ts) {
  return absl::FromUnixSeconds(ts.seconds()) + absl::Nanoseconds(ts.nanos());
}

std::string RelativeTime(bool set, const google::protobuf::Timestamp& ts, absl::Time now) {
  if (!set) return "-";
  const absl::Duration d = FromProto(ts) - now;
  if (d >= absl::ZeroDuration()) return absl::StrCat("in ", HumanDuration(d));
  return absl::StrCat(HumanDuration(d), " ago");
}

std::string AbsoluteTime(bool set, const google::protobuf::Timestamp& ts) {
  if (!set) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", FromProto(ts), absl::UTCTimeZone());
}

std::string ShortEnumName(const std::string& name, absl::string_view prefix) {
  if (name.empty()) return "?";
  if (absl::string_view(name).substr(0, prefix.size()) == prefix) {
    return name.substr(prefix.size());
  }
  return name;
}

std::string FormatLabels(const google::protobuf::Map<std::string, std::string>& labels) {
  if (labels.empty()) return "-";
  const std::map<std::string, std::string> sorted(labels.begin(), labels.end());
  return absl::StrJoin(sorted, ",", absl::PairFormatter("="));
}

std::string ModeString(uint32_t mode) {
  std::string s = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) {
    if ((mode & (1u << (8 - i))) == 0) s[i] = '-';
  }
  return s;
}

// ---- Progress ---------------------------------------------------------------------------

namespace {
constexpr int kBarWidth = 24;
constexpr char kSpinner[] = "-\\|/";
constexpr absl::Duration kRedraw = absl::Milliseconds(100);
constexpr absl::Duration kPlainInterval = absl::Seconds(1);

void WriteStderr(const std::string& text) {
  // Best effort: a closed stderr must not stop the command.
  WriteAll(STDERR_FILENO, text).IgnoreError();  // dropped: nowhere left to report it
}
}  // namespace

Progress::Progress(bool tty, std::string label)
    : tty_(tty), label_(EscapeForTerminal(label)), start_(absl::Now()) {
  if (tty_) thread_ = std::thread([this] { Run(); });
}

Progress::~Progress() {
  bool finished;
  {
    absl::MutexLock lock(&mu_);
    finished = stopped_;
  }
  if (!finished) Finish("");
}

std::string Progress::LineLocked(bool with_bar) const {
  std::string line = label_;
  if (with_bar && total_ > 0) {
    const int64_t filled = std::clamp<int64_t>(done_ * kBarWidth / total_, 0, kBarWidth);
    std::string bar(kBarWidth, ' ');
    for (int64_t i = 0; i < filled; ++i) bar[i] = '=';
    if (filled < kBarWidth) bar[filled] = '>';
    absl::StrAppend(&line, " [", bar, "]");
  } else if (with_bar) {
    absl::StrAppend(&line, " ", std::string(1, kSpinner[frame_ % 4]));
  }
  if (total_ > 0) absl::StrAppend(&line, " ", done_, "/", total_);
  if (!detail_.empty()) absl::StrAppend(&line, " ", detail_);
  return line;
}

void Progress::Set(int64_t done, int64_t total, std::string detail) {
  std::string plain;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    done_ = done;
    total_ = total;
    detail_ = EscapeForTerminal(detail);
    if (tty_) return;  // the drawing thread shows it
    std::string line = LineLocked(false);
    const absl::Time now = absl::Now();
    if (line == last_plain_ || now - last_plain_at_ < kPlainInterval) return;
    last_plain_ = line;
    last_plain_at_ = now;
    plain = std::move(line);
  }
  WriteStderr(plain + "\n");
}

void Progress::Finish(const std::string& final_line) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (thread_.joinable()) thread_.join();
  std::string text;
  if (tty_) text = "\r\033[K";
  if (!final_line.empty()) absl::StrAppend(&text, final_line, "\n");
  if (!text.empty()) WriteStderr(text);
}

void Progress::Run() {
  while (true) {
    std::string line;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopped_), kRedraw)) return;
      ++frame_;
      line = LineLocked(true);
    }
    absl::StrAppend(&line, " (",
                    absl::StrFormat("%.1f", absl::ToDoubleSeconds(absl::Now() - start_)), "s)");
    WriteStderr("\r\033[K" + line);
  }
}

// ---- Local files ------------------------------------------------------------------------

absl::Status ErrnoStatus(int error, const std::string& what) {
  std::string reason = error == EPIPE ? "broken pipe" : sbx::ErrnoText(error);
  absl::StatusCode code = absl::ErrnoToStatusCode(error);
  if (error == EPIPE) code = absl::StatusCode::kFailedPrecondition;
  return absl::Status(code, absl::StrCat(what, ": ", reason));
}

absl::StatusOr<std::string> ReadLocalFile(const std::string& path) {
  const bool is_stdin = path == "-";
  const int fd = is_stdin ? STDIN_FILENO : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("\"", path, "\""));
  std::string content;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      if (!is_stdin) ::close(fd);
      return ErrnoStatus(error, absl::StrCat("reading \"", path, "\""));
    }
    if (n == 0) break;
    content.append(buf, static_cast<size_t>(n));
  }
  if (!is_stdin) ::close(fd);
  return content;
}

absl::Status WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "write");
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace sbx::cli

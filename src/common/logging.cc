#include "src/common/logging.h"

#include <time.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/formatter.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace sbx {
namespace {

// The innermost ScopedLogField of this thread (a stack through `outer`).
thread_local const ScopedLogField* current_fields = nullptr;

// "2026-12-03T07:48:30.123456Z"
void AppendTime(spdlog::log_clock::time_point t, std::string* out) {
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  const time_t secs = static_cast<time_t>(micros / 1000000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  char buf[40];
  const int n = std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ",
                              tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                              tm.tm_sec, static_cast<int>(micros % 1000000));
  out->append(buf, static_cast<size_t>(n));
}

bool Reserved(absl::string_view key) {
  return key == "ts" || key == "level" || key == "thread" || key == "msg";
}

// Formats each line itself (instead of a pattern) so that JSON output escapes the message
// and carries the thread's ScopedLogFields.
class LineFormatter final : public spdlog::formatter {
 public:
  explicit LineFormatter(bool json) : json_(json) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    std::string line;
    line.reserve(msg.payload.size() + 96);
    const absl::string_view payload(msg.payload.data(), msg.payload.size());
    // Innermost last: collect the stack, then walk it outermost first.
    std::vector<const ScopedLogField*> fields;
    for (const ScopedLogField* f = current_fields; f != nullptr; f = f->outer()) {
      fields.push_back(f);
    }
    if (json_) {
      line += R"({"ts":")";
      AppendTime(msg.time, &line);
      const auto level = spdlog::level::to_string_view(msg.level);
      absl::StrAppend(&line, R"(","level":")", absl::string_view(level.data(), level.size()),
                      R"(","thread":)", msg.thread_id, R"(,"msg":")");
      AppendJsonEscaped(payload, &line);
      line += '"';
      for (auto it = fields.rbegin(); it != fields.rend(); ++it) {
        line += ",\"";
        if (Reserved((*it)->key())) line += "field.";
        AppendJsonEscaped((*it)->key(), &line);
        line += "\":\"";
        AppendJsonEscaped((*it)->value(), &line);
        line += '"';
      }
      line += "}\n";
    } else {
      AppendTime(msg.time, &line);
      absl::StrAppend(&line, " ", spdlog::level::to_short_c_str(msg.level), " ", msg.thread_id,
                      "] ", payload);
      for (auto it = fields.rbegin(); it != fields.rend(); ++it) {
        absl::StrAppend(&line, " ", (*it)->key(), "=", (*it)->value());
      }
      line += '\n';
    }
    dest.append(line.data(), line.data() + line.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<LineFormatter>(json_);
  }

 private:
  const bool json_;
};

}  // namespace

ScopedLogField::ScopedLogField(absl::string_view key, absl::string_view value)
    : key_(key), value_(value), outer_(current_fields) {
  current_fields = this;
}

ScopedLogField::~ScopedLogField() { current_fields = outer_; }

void AppendJsonEscaped(absl::string_view s, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          *out += "\\u00";
          *out += kHex[c >> 4];
          *out += kHex[c & 0xf];
        } else {
          *out += ch;
        }
    }
  }
}

absl::Status LogOptions::Validate() const {
  if (spdlog::level::from_str(level) == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "log level \"", level, "\" is not one of trace, debug, info, warn, error, critical, off"));
  }
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("log format \"", format, "\" is not one of text, json"));
  }
  return absl::OkStatus();
}

absl::Status InitLogging(const LogOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  auto logger = spdlog::stderr_logger_mt("sbx");
  logger->set_formatter(std::make_unique<LineFormatter>(options.format == "json"));
  logger->set_level(spdlog::level::from_str(options.level));
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace sbx

#pragma once
// Process-wide logging setup (spdlog). Components log with spdlog::info/warn/error; this
// header only configures the sink once in main().

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace sbx {

struct LogOptions {
  // One of trace, debug, info, warn, error, critical, off.
  std::string level = "info";
  // "text": one human-readable line per event; "json": one JSON object per line.
  std::string format = "text";

  // INVALID_ARGUMENT naming the bad level or format.
  [[nodiscard]] absl::Status Validate() const;
};

// Installs the stderr logger. Returns INVALID_ARGUMENT for bad options.
//
// Text lines read "<UTC time> <level letter> <thread>] <message> key=value...". JSON
// lines are one object each: {"ts":"<RFC 3339 UTC, microseconds>","level":"info",
// "thread":N,"msg":"...","<key>":"<value>",...}, every string escaped, so any message can
// be logged and every line parses.
[[nodiscard]] absl::Status InitLogging(const LogOptions& options);

// Adds a field (such as request_id) to every line this thread logs while the object
// lives: a member of the JSON object, or " key=value" after a text message. Scopes nest;
// the innermost comes last. Key and value must outlive the object (they are not copied).
// A reserved key (ts, level, thread, msg) is written with a "field." prefix.
class ScopedLogField {
 public:
  ScopedLogField(absl::string_view key, absl::string_view value);
  ~ScopedLogField();
  ScopedLogField(const ScopedLogField&) = delete;
  ScopedLogField& operator=(const ScopedLogField&) = delete;

  absl::string_view key() const { return key_; }
  absl::string_view value() const { return value_; }
  const ScopedLogField* outer() const { return outer_; }

 private:
  const absl::string_view key_;
  const absl::string_view value_;
  const ScopedLogField* const outer_;
};

// Appends `s` to `out` as the inside of a JSON string (quotes, backslashes and control
// characters escaped). Exposed for tests.
void AppendJsonEscaped(absl::string_view s, std::string* out);

}  // namespace sbx

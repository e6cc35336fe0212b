#pragma once
// Output of the `sbx` command-line client: aligned tables and human times for people,
// JSON (the sbx.v1 messages through protobuf's JSON mapping) for scripts, a progress
// display on stderr, and the local file helpers the commands share.
//
// Thread-safety: Table and the free functions are not synchronized (one command thread
// uses them). Progress may be updated from any thread; it draws from its own thread.
// Lifetime: plain values.

#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/map.h"
#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"

namespace sbx::cli {

enum class Format { kTable, kJson };

// ---- JSON -------------------------------------------------------------------------------

// `message` in protobuf's JSON mapping (lowerCamelCase names, enums by name, int64 as
// strings, durations as "30s"), with fields at their default value included so that
// scripts find every key. `pretty`: indented; otherwise one line.
std::string ToJson(const google::protobuf::Message& message, bool pretty);

// Prints one message (indented) to stdout.
void PrintJson(const google::protobuf::Message& message);
// Prints a JSON array of the messages (indented) to stdout; `[]` when there are none.
void PrintJsonArray(const std::vector<const google::protobuf::Message*>& messages);
template <typename Container>
void PrintJsonArrayOf(const Container& messages) {
  std::vector<const google::protobuf::Message*> all;
  for (const auto& m : messages) all.push_back(&m);
  PrintJsonArray(all);
}
// Prints one message on one line and flushes stdout (for streams of events).
void PrintJsonLine(const google::protobuf::Message& message);

// ---- Terminal safety --------------------------------------------------------------------

// What a sandbox or a tenant chose (file names, labels, error messages quoting them,
// command output) must not drive the operator's terminal. Escaped as `ls -b` does:
// backslash escapes for \a \b \t \n \v \f \r and the backslash itself, \ooo (octal) for
// every other control byte (C0, DEL), for bytes that are not valid UTF-8, and for the
// UTF-8 of C1 controls (U+0080..U+009F) and of the bidirectional overrides that reorder
// what a terminal shows (U+202A..U+202E, U+2066..U+2069). Printable UTF-8 passes as is.
enum class EscapeMode {
  kName,  // a value in a table or a message: everything above is escaped
  kText,  // command output shown on a terminal: newlines and tabs pass, no "\\" doubling
};
std::string EscapeForTerminal(absl::string_view s, EscapeMode mode = EscapeMode::kName);

// EscapeForTerminal(kText) over a stream cut into chunks: a UTF-8 sequence split between
// two chunks is held back until its end arrives (or Finish).
class TerminalEscaper {
 public:
  std::string Feed(absl::string_view chunk);
  // What is still held back, escaped (an incomplete sequence at the end of the stream).
  std::string Finish();

 private:
  std::string pending_;
};

// ---- Tables and human formats -----------------------------------------------------------

// Columns aligned on the widest cell, separated by three spaces. Every cell is escaped
// (EscapeForTerminal): a table is for people, and its cells hold names others chose.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  bool empty() const { return rows_.empty(); }
  void Print(FILE* out) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// "42s", "5m3s", "59m", "3h20m", "2d4h": at most two units, for reading at a glance.
std::string HumanDuration(absl::Duration d);
// The time of `ts` relative to `now`: "in 59m", "3m ago"; "-" when `ts` is unset (the
// caller passes has_x() as `set`).
std::string RelativeTime(bool set, const google::protobuf::Timestamp& ts, absl::Time now);
// UTC, second precision ("2024-05-01T12:00:00Z"); "-" when unset.
std::string AbsoluteTime(bool set, const google::protobuf::Timestamp& ts);
absl::Time FromProto(const google::protobuf::Timestamp& ts);
// An enum value name without its type prefix: ("CLAIM_STATE_ACTIVE", "CLAIM_STATE_") ->
// "ACTIVE".
std::string ShortEnumName(const std::string& name, absl::string_view prefix);
// "a=1,b=2" in key order; "-" when empty.
std::string FormatLabels(const google::protobuf::Map<std::string, std::string>& labels);
// Unix permission bits as ls shows them, e.g. "rwxr-xr-x".
std::string ModeString(uint32_t mode);

// ---- Progress on stderr -----------------------------------------------------------------

// Progress of a long operation. On a terminal, one line redrawn in place every 100 ms: a
// bar when the total is known, a spinner otherwise, with the elapsed time. Not on a
// terminal: a plain line whenever the state changes, at most one per second, so that logs
// stay readable.
class Progress {
 public:
  Progress(bool tty, std::string label);
  // Stops drawing and clears the line (if Finish was not called).
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `total` 0: unknown (a spinner). `detail` is shown after the counts.
  void Set(int64_t done, int64_t total, std::string detail) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops drawing, clears the line and prints `final_line` (if not empty) on stderr.
  void Finish(const std::string& final_line) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  std::string LineLocked(bool with_bar) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool tty_;
  const std::string label_;
  const absl::Time start_;
  mutable absl::Mutex mu_;
  int64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  std::string detail_ ABSL_GUARDED_BY(mu_);
  int frame_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_plain_ ABSL_GUARDED_BY(mu_);
  absl::Time last_plain_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread thread_;  // only on a terminal
};

// ---- Local files ------------------------------------------------------------------------

// The whole content of a local file ("-": standard input). NOT_FOUND, PERMISSION_DENIED
// or another errno-derived code, with the path in the message.
[[nodiscard]] absl::StatusOr<std::string> ReadLocalFile(const std::string& path);
// Writes all of `data` to `fd`, retrying short writes. The errno-derived status
// otherwise (EPIPE becomes FAILED_PRECONDITION "broken pipe").
[[nodiscard]] absl::Status WriteAll(int fd, absl::string_view data);
// Status for the current errno: `what` followed by strerror.
[[nodiscard]] absl::Status ErrnoStatus(int error, const std::string& what);

// Where output from a sandbox goes (exec, attach, cp to "-"): `fd` as is, or escaped
// (TerminalEscaper) when `fd` is a terminal.
class OutputSink {
 public:
  OutputSink(int fd, bool terminal) : fd_(fd), terminal_(terminal) {}
  [[nodiscard]] absl::Status Write(absl::string_view data) {
    if (!terminal_) return WriteAll(fd_, data);
    return WriteAll(fd_, escaper_.Feed(data));
  }
  [[nodiscard]] absl::Status Finish() {
    return terminal_ ? WriteAll(fd_, escaper_.Finish()) : absl::OkStatus();
  }

 private:
  const int fd_;
  const bool terminal_;
  TerminalEscaper escaper_;
};

}  // namespace sbx::cli

#pragma once
// The subcommands of the `sbx` command-line client. Each Add*Commands function declares
// its subcommands, flags and help texts on the CLI11 app and registers, per subcommand,
// the action main() runs when that subcommand is the one given.
//
// Exit codes (docs/cli.md): an action returns the process's exit code (0, or the remote
// command's for exec) or an error status; main prints errors as
// `sbx: error: <CODE>: <message>` and exits 1, or 2 for usage errors (UsageError).
//
// Thread-safety: one invocation runs one action on the main thread; actions may start
// their own threads and join them before returning.
// Lifetime: Context and Actions live in main() for the whole run; the option structs are
// owned by the registered actions.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "src/cmd/sbx_cli_client.h"
#include "src/cmd/sbx_cli_output.h"
#include "src/cmd/sbx_cli_signals.h"

namespace sbx::cli {

// What every command shares: the global flags, the connection and the terminal.
class Context {
 public:
  ClientOptions client_options;
  std::string output = "table";  // -o: table | json
  bool stderr_tty = false;       // progress is drawn in place only on a terminal
  // Output from a sandbox (exec, cp to "-") is escaped on a terminal and exact otherwise.
  bool stdout_tty = false;
  SignalRouter* signals = nullptr;

  Format format() const { return output == "json" ? Format::kJson : Format::kTable; }
  bool json() const { return format() == Format::kJson; }

  // The client, connected on first use (so that --help never needs a server). Bad flag
  // combinations are usage errors; unreadable token or certificate files are errors.
  [[nodiscard]] absl::StatusOr<Client*> Connect();

 private:
  std::unique_ptr<Client> client_;
};

// The action of one subcommand: the exit code, or an error to print.
using Action = std::function<absl::StatusOr<int>()>;
// The action of each subcommand, keyed by its CLI11 app. main() runs the one of the
// deepest subcommand that was parsed.
using Actions = std::map<const CLI::App*, Action>;

// claim, release, renew, claims (list, get).
void AddClaimCommands(CLI::App& app, Context& ctx, Actions& actions);
// pools (list, get, scale), templates (list, get).
void AddAdminCommands(CLI::App& app, Context& ctx, Actions& actions);
// exec, cp, ls, suspend, resume.
void AddSandboxCommands(CLI::App& app, Context& ctx, Actions& actions);
// shell, attach, ps, kill (the processes of a sandbox).
void AddProcessCommands(CLI::App& app, Context& ctx, Actions& actions);
// watch claims, watch pools.
void AddWatchCommands(CLI::App& app, Context& ctx, Actions& actions);
// url (a signed URL of a port, through the port proxy).
void AddPortCommands(CLI::App& app, Context& ctx, Actions& actions);
// snapshot, snapshots (list, get, delete), reset, fork: snapshots of claimed sandboxes (issue 37).
void AddSnapshotCommands(CLI::App& app, Context& ctx, Actions& actions);

// ---- Helpers shared by the command files ------------------------------------------------

// `sbx exec -d`: a process started in the background (StartProcess, detached); prints its
// process id. Errors: the call's.
struct DetachedStart {
  std::string id;
  std::vector<std::string> argv;
  std::vector<std::string> env;  // K=V
  std::string cwd;
  std::string tag;
  bool stdin = false;
};
[[nodiscard]] absl::StatusOr<int> RunDetachedProcess(Context& ctx, const DetachedStart& start);

// An error in how sbx was called, detected after parsing (e.g. `cp` between two local
// paths): printed like CLI11's own errors, exit code 2.
[[nodiscard]] absl::Status UsageError(const std::string& message);
bool IsUsageError(const absl::Status& status);
// Prints `sbx: error: <CODE>: <message>` (or `sbx: error: <message>` for usage errors)
// on stderr, the message escaped (EscapeForTerminal).
void PrintError(const absl::Status& status);

// CLI11 check for flags that take a duration ("300ms", "30s", "10m", "1h30m"; >= 0).
CLI::Validator DurationCheck();
// CLI11 check for KEY=VALUE flags (a non-empty key before the first '=').
CLI::Validator KeyValueCheck();
// `text` as a duration; only call on values DurationCheck accepted.
absl::Duration ParseDurationFlag(const std::string& text);
void ToProto(absl::Duration d, google::protobuf::Duration* out);
absl::Duration FromProto(const google::protobuf::Duration& d);
// Splits "KEY=VALUE" at the first '='.
std::pair<std::string, std::string> SplitKeyValue(const std::string& text);

// The claim filter flags that `claims` and `watch claims` share: --pool, --selector/-l,
// --state (repeatable or comma-separated; active|released|expired|lost), --owner.
struct ClaimFilterFlags {
  std::string pool;
  std::string selector;
  std::vector<std::string> states;
  std::string owner;
};
void AddClaimFilterFlags(CLI::App* sub, ClaimFilterFlags* flags);
void FillClaimFilter(const ClaimFilterFlags& flags, v1::ClaimFilter* filter);

}  // namespace sbx::cli

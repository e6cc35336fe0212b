// Helpers shared by the `sbx` subcommands (sbx_cli_claims.cc, sbx_cli_admin.cc,
// sbx_cli_sandbox.cc, sbx_cli_watch.cc).

#include "src/cmd/sbx_cli_commands.h"

#include <cstdio>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace sbx::cli {
namespace {
// Marks a status as a usage error; never leaves the process.
constexpr char kUsagePayload[] = "sbx.cli/usage";
}  // namespace

absl::StatusOr<Client*> Context::Connect() {
  if (client_ == nullptr) {
    if (absl::Status s = client_options.Validate(); !s.ok()) {
      return UsageError(std::string(s.message()));
    }
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(client_options);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
  }
  return client_.get();
}

absl::Status UsageError(const std::string& message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kUsagePayload, absl::Cord("1"));
  return s;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsagePayload).has_value();
}

void PrintError(const absl::Status& status) {
  if (IsUsageError(status)) {
    std::fprintf(stderr, "sbx: error: %s\nRun with --help for more information.\n",
                 EscapeForTerminal(status.message()).c_str());
    return;
  }
  // The message may quote what a sandbox or a tenant chose (a file name, a label).
  std::fprintf(stderr, "sbx: error: %s: %s\n", absl::StatusCodeToString(status.code()).c_str(),
               EscapeForTerminal(status.message()).c_str());
}

CLI::Validator DurationCheck() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        absl::Duration d;
        if (!absl::ParseDuration(text, &d)) {
          return absl::StrCat(
              "\"", text, "\" is not a duration (a number with a unit: 300ms, 30s, 10m, 1h30m)");
        }
        if (d < absl::ZeroDuration()) return absl::StrCat("\"", text, "\" is negative");
        return "";
      },
      "DURATION");
}

CLI::Validator KeyValueCheck() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const size_t eq = text.find('=');
        if (eq == std::string::npos || eq == 0) {
          return absl::StrCat("\"", text, "\" is not KEY=VALUE");
        }
        return "";
      },
      "KEY=VALUE");
}

absl::Duration ParseDurationFlag(const std::string& text) {
  absl::Duration d = absl::ZeroDuration();
  if (!absl::ParseDuration(text, &d)) d = absl::ZeroDuration();
  return d;
}

void ToProto(absl::Duration d, google::protobuf::Duration* out) {
  const int64_t seconds = absl::IDivDuration(d, absl::Seconds(1), &d);
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(d)));
}

absl::Duration FromProto(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

std::pair<std::string, std::string> SplitKeyValue(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos) return {text, ""};
  return {text.substr(0, eq), text.substr(eq + 1)};
}

void AddClaimFilterFlags(CLI::App* sub, ClaimFilterFlags* flags) {
  static const std::vector<std::string> kStates = {"active", "released", "expired", "lost"};
  sub->add_option("--pool", flags->pool, "Only claims of this pool");
  sub->add_option("--selector,-l", flags->selector, "Label selector, e.g. 'team=rl,run!=3,!debug'");
  sub->add_option("--state", flags->states,
                  "Only claims in these states (repeatable or comma-separated)")
      ->allow_extra_args(false)
      ->delimiter(',')
      ->check(CLI::IsMember(kStates));
  sub->add_option("--owner", flags->owner,
                  "Only claims of this tenant (admin token; default: your own)");
}

void FillClaimFilter(const ClaimFilterFlags& flags, v1::ClaimFilter* filter) {
  filter->set_pool(flags.pool);
  filter->set_label_selector(flags.selector);
  filter->set_owner(flags.owner);
  for (const std::string& s : flags.states) {
    if (s == "active") filter->add_states(v1::CLAIM_STATE_ACTIVE);
    if (s == "released") filter->add_states(v1::CLAIM_STATE_RELEASED);
    if (s == "expired") filter->add_states(v1::CLAIM_STATE_EXPIRED);
    if (s == "lost") filter->add_states(v1::CLAIM_STATE_LOST);
  }
}

}  // namespace sbx::cli

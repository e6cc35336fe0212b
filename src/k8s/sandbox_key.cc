#include "src/k8s/sandbox_key.h"

#include <algorithm>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"
#include "src/common/sandbox_secret.h"
#include "src/common/status_macros.h"

namespace sbx::k8s {
namespace {

std::string What(const SandboxKeyOptions& options) {
  return absl::StrCat("sandbox key Secret \"", options.ns, "/", options.name, "\"");
}

// Errors worth another round: the API server may answer later. The client has already
// retried each request with its own backoff.
bool Transient(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
         absl::IsResourceExhausted(status) || absl::IsAborted(status);
}

// The key in a Secret as the API server returns it (data values in base64).
absl::StatusOr<std::string> KeyOf(const Json& secret, const SandboxKeyOptions& options) {
  const std::string what = What(options);
  // Changing or removing the key would make every existing sandbox unreachable, so a bad
  // one is reported, never replaced.
  const std::string advice =
      "; sbx never replaces a key (the sandboxes made with it would become unreachable): fix "
      "or delete the Secret (then replace the existing sandboxes)";
  const Json* data =
      secret.contains("data") && secret["data"].is_object() ? &secret["data"] : nullptr;
  if (data == nullptr || !data->contains(kSandboxKeyDataKey)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " has no data \"", kSandboxKeyDataKey, "\"", advice));
  }
  const Json& value = (*data)[kSandboxKeyDataKey];
  std::string key;
  if (!value.is_string() || !absl::Base64Unescape(value.get<std::string>(), &key)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": data \"", kSandboxKeyDataKey, "\" is not base64", advice));
  }
  if (key.size() != SandboxSecrets::kKeyBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": data \"", kSandboxKeyDataKey, "\" holds ", key.size(),
                     " bytes, not a key of ", SandboxSecrets::kKeyBytes, advice));
  }
  return key;
}

Json SecretObject(const SandboxKeyOptions& options, const std::string& key) {
  return Json{
      {"apiVersion", "v1"},
      {"kind", "Secret"},
      {"metadata",
       {{"name", options.name},
        {"namespace", options.ns},
        {"labels",
         {{"app.kubernetes.io/component", "sandbox-key"},
          {"app.kubernetes.io/managed-by", "sbx-server"}}}}},
      {"type", "Opaque"},
      // The key never changes; immutable also keeps an accidental edit out.
      {"immutable", true},
      {"data", {{kSandboxKeyDataKey, absl::Base64Escape(key)}}},
  };
}

void SleepUntil(Clock& clock, absl::Time until) {
  absl::Mutex mu;
  const bool never = false;
  absl::MutexLock lock(&mu);
  clock.AwaitUntil(mu, &never, until);
}

}  // namespace

absl::Status SandboxKeyOptions::Validate() const {
  if (ns.empty()) return absl::InvalidArgumentError("sandbox key Secret: no namespace");
  if (name.empty()) return absl::InvalidArgumentError("sandbox key Secret: no name");
  if (deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sandbox key Secret: deadline ", absl::FormatDuration(deadline), " is not positive"));
  }
  if (retry_period <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("sandbox key Secret: retry_period ",
                                                   absl::FormatDuration(retry_period),
                                                   " is not positive"));
  }
  if (clock == nullptr) return absl::InvalidArgumentError("sandbox key Secret: no clock");
  return absl::OkStatus();
}

absl::StatusOr<std::string> LoadOrCreateSandboxKey(Client& client,
                                                   const SandboxKeyOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  Clock& clock = *options.clock;
  const std::string what = What(options);
  const absl::Time deadline = clock.Now() + options.deadline;
  while (true) {
    absl::Status failed;
    bool wait = true;
    absl::StatusOr<Json> secret = client.Get(kSecrets, options.ns, options.name);
    if (secret.ok()) {
      ASSIGN_OR_RETURN(std::string key, KeyOf(*secret, options));
      spdlog::info("{}: key read", what);
      return key;
    }
    failed = secret.status();
    if (absl::IsNotFound(failed)) {
      ASSIGN_OR_RETURN(std::string key, SandboxSecrets::NewKey());
      failed = client.CreateNoResult(kSecrets, options.ns, SecretObject(options, key));
      if (failed.ok()) {
        spdlog::info("{}: made with a new key", what);
        return key;
      }
      // Another replica made it first (or a repeat of this create found the first one in
      // place): read the one that is there, at once.
      if (absl::IsAlreadyExists(failed)) wait = false;
    }
    if (!wait) {
      // Read again below (unless the deadline has passed).
    } else if (absl::IsPermissionDenied(failed)) {
      const std::string needed = absl::StrCat(
          "sbx-server needs get on this Secret and create on secrets in \"", options.ns, "\"");
      return absl::PermissionDeniedError(
          absl::StrCat(what, ": ", failed.message(), " (", needed, ")"));
    } else if (!Transient(failed)) {
      return absl::Status(failed.code(), absl::StrCat(what, ": ", failed.message()));
    }
    const absl::Time now = clock.Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": no key read or made within ",
                                                      absl::FormatDuration(options.deadline),
                                                      "; last error: ", failed.ToString()));
    }
    if (wait) {
      spdlog::warn("{}: {}; trying again", what, failed.ToString());
      SleepUntil(clock, std::min(deadline, now + options.retry_period));
    }
  }
}

}  // namespace sbx::k8s

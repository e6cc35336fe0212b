#include "src/server/sandboxd_client.h"

#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/support/client_interceptor.h"
#include "src/common/dropped.h"
#include "src/common/sandbox_secret.h"

namespace sbx::server {
namespace {

bool IsEnvName(absl::string_view name) {
  if (name.empty()) return false;
  auto alpha = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  if (!alpha(name[0])) return false;
  for (char c : name) {
    if (!alpha(c) && !(c >= '0' && c <= '9')) return false;
  }
  return true;
}

std::string Shorten(absl::string_view s) {
  return s.size() <= 64 ? std::string(s) : absl::StrCat(s.substr(0, 61), "...");
}

}  // namespace

absl::Status ValidateEnv(absl::string_view field,
                         const google::protobuf::Map<std::string, std::string>& env) {
  if (env.size() > static_cast<size_t>(kMaxEnvEntries)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " has ", env.size(), " entries; at most ", kMaxEnvEntries));
  }
  for (const auto& [name, value] : env) {
    if (name.size() > kMaxEnvNameBytes || !IsEnvName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": name \"", Shorten(name),
                                                     "\" is not [A-Za-z_][A-Za-z0-9_]* of at most ",
                                                     kMaxEnvNameBytes, " bytes"));
    }
    if (value.size() > kMaxEnvValueBytes) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", name, "]: value of ", value.size(),
                                                     " bytes is above ", kMaxEnvValueBytes));
    }
    if (value.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", name, "]: value contains a NUL byte"));
    }
  }
  return absl::OkStatus();
}

bool HasConfig(const v1::SandboxConfig& config) {
  return config.env_size() > 0 || config.files_size() > 0;
}

absl::Status ValidateSandboxConfig(absl::string_view field, const v1::SandboxConfig& config) {
  if (absl::Status s = ValidateEnv(absl::StrCat(field, ".env"), config.env()); !s.ok()) return s;
  if (config.files_size() > kMaxConfigFiles) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".files has ", config.files_size(),
                                                   " files; at most ", kMaxConfigFiles));
  }
  size_t total = 0;
  for (int i = 0; i < config.files_size(); ++i) {
    const v1::FileSpec& f = config.files(i);
    if (f.path().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".files[", i, "].path is empty"));
    }
    if (f.mode() > 07777) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".files[", i, "].mode ", f.mode(), " is above 07777 (4095)"));
    }
    total += f.content().size();
  }
  if (total > kMaxConfigFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".files hold ", total, " bytes; at most ", kMaxConfigFileBytes,
                     " in total (write larger files with SandboxService.WriteFile)"));
  }
  return absl::OkStatus();
}

namespace {

// Adds the sandbox's secret to every call of one channel, so that no call site can forget
// it.
class SecretInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit SecretInterceptor(const std::string* secret) : secret_(secret) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kSandboxSecretMetadata, *secret_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const secret_;
};

class SecretInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit SecretInterceptorFactory(std::string secret) : secret_(std::move(secret)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new SecretInterceptor(&secret_);
  }

 private:
  // Lives as long as the channel (which owns its factories).
  const std::string secret_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<sandboxd::v1::Sandboxd::Stub>> SandboxdClients::Stub(
    const store::ClaimRecord& claim) {
  if (!absl::StartsWith(claim.endpoint, "unix:") && !absl::StrContains(claim.endpoint, ":")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sandbox \"", claim.sandbox_id, "\" has no daemon endpoint (\"", claim.endpoint, "\")"));
  }
  if (absl::StartsWith(claim.endpoint, "instant:")) {
    return absl::FailedPreconditionError(
        absl::StrCat("sandbox \"", claim.sandbox_id,
                     "\" comes from the instant runtime (a load-test runtime): nothing can run "
                     "in it"));
  }
  // Keyed by sandbox and endpoint: a pod IP may come back for another sandbox, with
  // another secret.
  const std::string key = absl::StrCat(claim.sandbox_id, "@", claim.endpoint);
  absl::MutexLock lock(&mu_);
  auto it = stubs_.find(key);
  if (it != stubs_.end()) return it->second;
  // Sandboxes come and go; a full cache is simply emptied (channels in use stay alive
  // through the calls' references).
  if (stubs_.size() >= max_channels_) stubs_.clear();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 * 1024 * 1024);
  // A sandbox that vanished should fail calls at once rather than wait for reconnects.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> secret;
  if (secret_)
    secret.push_back(std::make_unique<SecretInterceptorFactory>(secret_(claim.sandbox_id)));
  auto channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      claim.endpoint, grpc::InsecureChannelCredentials(), args, std::move(secret));
  auto stub =
      std::shared_ptr<sandboxd::v1::Sandboxd::Stub>(sandboxd::v1::Sandboxd::NewStub(channel));
  stubs_.emplace(key, stub);
  return stub;
}

void SandboxdClients::Configure(const store::ClaimRecord& claim, const v1::SandboxConfig& config,
                                absl::Duration timeout,
                                absl::AnyInvocable<void(absl::Status) &&> done) {
  absl::StatusOr<std::shared_ptr<sandboxd::v1::Sandboxd::Stub>> stub = Stub(claim);
  if (!stub.ok()) return std::move(done)(stub.status());
  struct Call {
    std::shared_ptr<sandboxd::v1::Sandboxd::Stub> stub;
    grpc::ClientContext ctx;
    sandboxd::v1::ConfigureRequest request;
    sandboxd::v1::ConfigureResponse response;
    store::ClaimRecord claim;
    absl::AnyInvocable<void(absl::Status) &&> done;
  };
  auto* call = new Call;
  call->stub = std::move(*stub);
  call->claim = claim;
  call->done = std::move(done);
  call->ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
  // A sandbox still starting up is waited for (within the deadline) instead of failing.
  call->ctx.set_wait_for_ready(true);
  for (const auto& [k, v] : config.env()) (*call->request.mutable_env())[k] = v;
  for (const v1::FileSpec& f : config.files()) {
    sandboxd::v1::ConfigureFile* out = call->request.add_files();
    out->set_path(f.path());
    out->set_content(f.content());
    out->set_mode(f.mode());
  }
  call->stub->async()->Configure(&call->ctx, &call->request, &call->response,
                                 [call](grpc::Status s) {
                                   std::unique_ptr<Call> owned(call);
                                   std::move(owned->done)(FromDaemon(s, owned->claim));
                                 });
}

uint64_t SandboxdClients::ResetGeneration(const std::string& claim_id) {
  absl::MutexLock lock(&mu_);
  auto it = resets_.find(claim_id);
  return it == resets_.end() ? 0 : it->second.generation;
}

void SandboxdClients::BeginReset(const std::string& claim_id, const std::string& snapshot_id) {
  absl::MutexLock lock(&mu_);
  if (resets_.size() >= max_channels_ && !resets_.contains(claim_id)) {
    // Bounded like the caches above: a claim whose note goes only loses the ABORTED label
    // of a call that was in flight across its reset (FromDaemonSince).
    resets_.erase(resets_.begin());
  }
  ResetNote& n = resets_[claim_id];
  ++n.generation;
  n.snapshot_id = snapshot_id;
}

void SandboxdClients::ForgetChannel(const std::string& sandbox_id) {
  const std::string prefix = absl::StrCat(sandbox_id, "@");
  absl::MutexLock lock(&mu_);
  for (auto it = stubs_.begin(); it != stubs_.end();) {
    if (absl::StartsWith(it->first, prefix)) {
      stubs_.erase(it++);
    } else {
      ++it;
    }
  }
}

absl::Status SandboxdClients::FromDaemonSince(const grpc::Status& status,
                                              const store::ClaimRecord& claim,
                                              uint64_t generation) {
  if (!status.ok()) {
    absl::MutexLock lock(&mu_);
    auto it = resets_.find(claim.id);
    if (it != resets_.end() && it->second.generation != generation) {
      return absl::AbortedError(absl::StrCat(
          "the sandbox of claim \"", claim.id, "\" was reset to snapshot ", it->second.snapshot_id,
          ": what ran in it was killed (daemon: ", status.error_message(), ")"));
    }
  }
  return FromDaemon(status, claim);
}

absl::Status FromDaemon(const grpc::Status& status, const store::ClaimRecord& claim) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(
        code, absl::StrCat("the daemon of sandbox \"", claim.sandbox_id, "\" (claim \"", claim.id,
                           "\") cannot be reached: ", status.error_message()));
  }
  return absl::Status(code, status.error_message());
}

}  // namespace sbx::server

#include "src/cmd/sbx_cli_client.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "src/cmd/sbx_cli_output.h"

namespace sbx::cli {
namespace {

// Largest response accepted: ReadFile answers carry up to 1 MiB, list pages up to 1000
// objects; 64 MiB leaves room without letting a broken server exhaust memory.
constexpr int kMaxReceiveMessageBytes = 64 << 20;

absl::StatusOr<std::string> ReadPem(const std::string& what, const std::string& path) {
  absl::StatusOr<std::string> pem = ReadLocalFile(path);
  if (!pem.ok()) {
    return absl::Status(pem.status().code(), absl::StrCat(what, ": ", pem.status().message()));
  }
  return pem;
}

}  // namespace

bool ClientOptions::UseTls() const {
  return tls || !ca_file.empty() || !cert_file.empty() || !key_file.empty() ||
         !tls_server_name.empty();
}

absl::Status ClientOptions::Validate() const {
  if (server.empty()) return absl::InvalidArgumentError("--server is empty");
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout ", absl::FormatDuration(timeout), " is not positive"));
  }
  if (!token.empty() && !token_file.empty()) {
    return absl::InvalidArgumentError("--token and --token-file are exclusive");
  }
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError("--cert and --key must be given together");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<Client> client(new Client());
  client->timeout_ = options.timeout;

  std::string token = options.token;
  if (!options.token_file.empty()) {
    absl::StatusOr<std::string> text = ReadLocalFile(options.token_file);
    if (!text.ok()) {
      return absl::Status(text.status().code(),
                          absl::StrCat("--token-file: ", text.status().message()));
    }
    token = std::string(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file \"", options.token_file, "\" holds no token"));
    }
  }
  if (!token.empty()) client->authorization_ = absl::StrCat("Bearer ", token);

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (options.UseTls()) {
    grpc::SslCredentialsOptions ssl;
    if (!options.ca_file.empty()) {
      absl::StatusOr<std::string> ca = ReadPem("--ca", options.ca_file);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = std::move(*ca);
    }
    if (!options.cert_file.empty()) {
      absl::StatusOr<std::string> cert = ReadPem("--cert", options.cert_file);
      if (!cert.ok()) return cert.status();
      absl::StatusOr<std::string> key = ReadPem("--key", options.key_file);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = std::move(*cert);
      ssl.pem_private_key = std::move(*key);
    }
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
    credentials = grpc::SslCredentials(ssl);
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  client->channel_ = grpc::CreateCustomChannel(options.server, credentials, args);
  client->claims_ = v1::ClaimService::NewStub(client->channel_);
  client->admin_ = v1::AdminService::NewStub(client->channel_);
  client->images_ = v1::ImageService::NewStub(client->channel_);
  client->sandboxes_ = v1::SandboxService::NewStub(client->channel_);
  client->snapshots_ = v1::Snapshots::NewStub(client->channel_);
  return client;
}

std::unique_ptr<grpc::ClientContext> Client::NewContext(absl::Duration deadline) const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (deadline != absl::InfiniteDuration()) {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  }
  if (!authorization_.empty()) ctx->AddMetadata("authorization", authorization_);
  return ctx;
}

absl::Status Client::Call(absl::Duration deadline,
                          const std::function<grpc::Status(grpc::ClientContext*)>& call) const {
  std::unique_ptr<grpc::ClientContext> ctx = NewContext(deadline);
  const grpc::Status status = call(ctx.get());
  return FromGrpc(status, *ctx);
}

absl::Status FromGrpc(const grpc::Status& status, const grpc::ClientContext& ctx) {
  if (status.ok()) return absl::OkStatus();
  std::string message = status.error_message();
  // sbx-server already words the hint into its message; other servers may not.
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
      message.find("retry") == std::string::npos) {
    const auto& trailers = ctx.GetServerTrailingMetadata();
    auto it = trailers.find("sbx-retry-after-ms");
    int64_t ms = 0;
    if (it != trailers.end() &&
        absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &ms)) {
      absl::StrAppend(&message, " (retry after ", ms, " ms)");
    }
  }
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), message);
}

}  // namespace sbx::cli

#pragma once
// The `sbx` command-line client's connection to an sbx-server: channel credentials
// (plaintext or TLS), the bearer token, per-call deadlines, and the conversion of a failed
// call into an absl::Status carrying the server's code and message.
//
// Thread-safety: after Connect, every method may be called from any thread (the gRPC
// stubs are thread-safe; the Client itself is immutable).
// Lifetime: owned by main(); it must outlive every call and context made through it.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "sbx/v1/admin.grpc.pb.h"
#include "sbx/v1/claims.grpc.pb.h"
#include "sbx/v1/images.grpc.pb.h"
#include "sbx/v1/sandboxes.grpc.pb.h"
#include "sbx/v1/snapshots.grpc.pb.h"

namespace sbx::cli {

// How to reach the server. Defaults are those of `sbx` without flags or environment.
struct ClientOptions {
  // gRPC target, normally host:port.
  std::string server = "127.0.0.1:50051";
  // Bearer token sent as `authorization: Bearer <token>`; empty: no metadata.
  std::string token;
  // File whose first line is the token (instead of `token`, which shows in `ps`).
  std::string token_file;
  // Deadline of each unary call (commands that wait add their wait to it).
  absl::Duration timeout = absl::Seconds(30);
  // TLS: on when `tls` is set or any of the files is given.
  bool tls = false;
  // PEM root certificates to verify the server with; empty: the system's roots.
  std::string ca_file;
  // PEM client certificate chain and its private key (mutual TLS); both or neither.
  std::string cert_file;
  std::string key_file;
  // Name to check the server's certificate against instead of the host in `server`.
  std::string tls_server_name;

  // INVALID_ARGUMENT for an empty server, a non-positive timeout, both token and
  // token_file, or only one of cert_file and key_file.
  [[nodiscard]] absl::Status Validate() const;
  bool UseTls() const;
};

class Client {
 public:
  // Creates the channel (connecting lazily: a server that is down shows up as
  // UNAVAILABLE on the first call). Fails with the options' Validate error, or NOT_FOUND
  // / PERMISSION_DENIED naming a token, CA, certificate or key file that cannot be read.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options);

  v1::ClaimService::Stub& claims() const { return *claims_; }
  v1::AdminService::Stub& admin() const { return *admin_; }
  v1::ImageService::Stub& images() const { return *images_; }
  v1::SandboxService::Stub& sandboxes() const { return *sandboxes_; }
  v1::Snapshots::Stub& snapshots() const { return *snapshots_; }
  absl::Duration timeout() const { return timeout_; }

  // A context carrying the token, with a deadline `deadline` from now
  // (absl::InfiniteDuration(): none, for watches).
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration deadline) const;

  // Runs one unary call with a fresh context and the deadline `deadline`; returns OK or
  // the call's error as converted by FromGrpc.
  [[nodiscard]] absl::Status Call(
      absl::Duration deadline, const std::function<grpc::Status(grpc::ClientContext*)>& call) const;
  [[nodiscard]] absl::Status Call(
      const std::function<grpc::Status(grpc::ClientContext*)>& call) const {
    return Call(timeout_, call);
  }

 private:
  Client() = default;

  std::string authorization_;  // "Bearer <token>", or empty
  absl::Duration timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ClaimService::Stub> claims_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
  std::unique_ptr<v1::ImageService::Stub> images_;
  std::unique_ptr<v1::SandboxService::Stub> sandboxes_;
  std::unique_ptr<v1::Snapshots::Stub> snapshots_;
};

// The absl::Status for a failed call: same code, the server's message, plus the retry hint
// of RESOURCE_EXHAUSTED answers (trailing metadata `sbx-retry-after-ms`) when present.
// OK for an OK status.
[[nodiscard]] absl::Status FromGrpc(const grpc::Status& status, const grpc::ClientContext& ctx);

}  // namespace sbx::cli

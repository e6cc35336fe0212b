#pragma once
// SandboxdService: the gRPC face of sandboxd (sbx.sandboxd.v1.Sandboxd, callback API).
// File RPCs run on the gRPC thread (short, local-disk calls); Exec hands all process I/O
// to an ExecRunner thread and only moves messages between it and the stream.
//
// Thread-safety: safe for concurrent calls. Lifetime: must outlive the grpc::Server it is
// registered with; the Workspace and ExecManager must outlive it.

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "sbx/sandboxd/v1/sandboxd.grpc.pb.h"
#include "src/sandboxd/exec.h"
#include "src/sandboxd/workspace.h"

namespace sbx::sandboxd {

// Largest stdin chunk accepted in one ExecRequest.
inline constexpr size_t kMaxStdinChunkBytes = 1 << 20;
// ExecStart.max_output_bytes: the default and the cap, per stream.
inline constexpr int64_t kDefaultMaxOutputBytes = 1 << 20;
inline constexpr int64_t kMaxMaxOutputBytes = 64 << 20;

// The one mapping from absl::Status to grpc::Status in sandboxd (same canonical codes).
grpc::Status ToGrpcStatus(const absl::Status& status);

class SandboxdService final : public sbx::sandboxd::v1::Sandboxd::CallbackService {
 public:
  // `secret`: what every call must carry (kSecretMetadata); empty: no check.
  // `default_cwd`: where commands naming no cwd start (absolute; empty: the workspace).
  SandboxdService(const Workspace* workspace, ExecManager* execs,
                  std::map<std::string, std::string> base_env, std::string secret,
                  std::string default_cwd = "");

  grpc::ServerBidiReactor<v1::ExecRequest, v1::ExecResponse>* Exec(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Configure(grpc::CallbackServerContext* context,
                                      const v1::ConfigureRequest* request,
                                      v1::ConfigureResponse* response) override;
  grpc::ServerUnaryReactor* WriteFile(grpc::CallbackServerContext* context,
                                      const v1::WriteFileRequest* request,
                                      v1::WriteFileResponse* response) override;
  grpc::ServerUnaryReactor* ReadFile(grpc::CallbackServerContext* context,
                                     const v1::ReadFileRequest* request,
                                     v1::ReadFileResponse* response) override;
  grpc::ServerUnaryReactor* ListFiles(grpc::CallbackServerContext* context,
                                      const v1::ListFilesRequest* request,
                                      v1::ListFilesResponse* response) override;

  // Validates `start` and builds the spec with the merged environment.
  absl::StatusOr<ExecSpec> MakeSpec(const v1::ExecStart& start) const ABSL_LOCKS_EXCLUDED(mu_);
  ExecManager& execs() { return *execs_; }

 private:
  absl::Status DoConfigure(const v1::ConfigureRequest& request) ABSL_LOCKS_EXCLUDED(mu_);
  // OK when the call carries the secret (or none is required), else UNAUTHENTICATED.
  absl::Status CheckCaller(const grpc::CallbackServerContext& context) const;

  const Workspace* const workspace_;
  ExecManager* const execs_;
  const std::map<std::string, std::string> base_env_;
  const std::string secret_;
  const std::string default_cwd_;
  mutable absl::Mutex mu_;
  // The env of the last Configure.
  std::map<std::string, std::string> configured_env_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::sandboxd

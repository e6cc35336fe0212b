#pragma once
// SandboxdService: the gRPC face of sandboxd (sbx.sandboxd.v1.Sandboxd, callback API).
// File RPCs run on the gRPC thread (short, local-disk calls); Exec hands all process I/O
// to an ExecRunner thread and only moves messages between it and the stream; the process
// RPCs (process_service.cc) do the same with the ProcessTable's threads.
//
// Thread-safety: safe for concurrent calls. Lifetime: must outlive the grpc::Server it is
// registered with; the Workspace, ExecManager and ProcessTable must outlive it.

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "sbx/sandboxd/v1/sandboxd.grpc.pb.h"
#include "src/sandboxd/exec.h"
#include "src/sandboxd/process_table.h"
#include "src/sandboxd/workspace.h"

namespace sbx::sandboxd {

// Largest stdin chunk accepted in one ExecRequest.
inline constexpr size_t kMaxStdinChunkBytes = 1 << 20;
// ExecStart.max_output_bytes: the default and the cap, per stream.
inline constexpr int64_t kDefaultMaxOutputBytes = 1 << 20;
inline constexpr int64_t kMaxMaxOutputBytes = 64 << 20;

// A process's replay ring when StartProcessRequest.replay_bytes is 0.
inline constexpr int64_t kDefaultReplayBytes = 1 << 20;
// Largest SendProcessInputRequest.data.
inline constexpr size_t kMaxInputBytes = 1 << 20;
// A PTY has 1 to this many columns and rows.
inline constexpr uint32_t kMaxPtySide = 1000;

// The one mapping from absl::Status to grpc::Status in sandboxd (same canonical codes).
grpc::Status ToGrpcStatus(const absl::Status& status);
void SetTimestamp(absl::Time t, google::protobuf::Timestamp* out);
// A listed or stat'ed workspace entry as the API shows it (ListFiles, Stat).
void FillEntry(const Workspace::Entry& e, v1::FileEntry* out);
void SetDuration(absl::Duration d, google::protobuf::Duration* out);
// INVALID_ARGUMENT naming `field` unless `tag` is 1 to 64 bytes of [A-Za-z0-9._-] (or
// empty and `may_be_empty`).
[[nodiscard]] absl::Status ValidateTag(absl::string_view field, const std::string& tag,
                                       bool may_be_empty);
// INVALID_ARGUMENT naming `field` unless both sides are 1 to kMaxPtySide.
[[nodiscard]] absl::Status ValidatePtySize(absl::string_view field, const v1::PtySize& size);

class SandboxdService final : public sbx::sandboxd::v1::Sandboxd::CallbackService {
 public:
  // `secret`: what every call must carry (kSecretMetadata); empty: no check.
  // `default_cwd`: where commands naming no cwd start (absolute; empty: the workspace).
  SandboxdService(const Workspace* workspace, ExecManager* execs, ProcessTable* processes,
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

  // Streamed files (file_service.cc).
  grpc::ServerReadReactor<v1::UploadRequest>* UploadFile(grpc::CallbackServerContext* context,
                                                         v1::UploadResponse* response) override;
  grpc::ServerReadReactor<v1::UploadRequest>* UploadTar(grpc::CallbackServerContext* context,
                                                        v1::UploadResponse* response) override;
  grpc::ServerWriteReactor<v1::DownloadChunk>* DownloadFile(
      grpc::CallbackServerContext* context, const v1::DownloadRequest* request) override;
  grpc::ServerWriteReactor<v1::DownloadChunk>* DownloadTar(
      grpc::CallbackServerContext* context, const v1::DownloadRequest* request) override;
  grpc::ServerUnaryReactor* Stat(grpc::CallbackServerContext* context,
                                 const v1::StatRequest* request,
                                 v1::StatResponse* response) override;
  grpc::ServerUnaryReactor* MakeDir(grpc::CallbackServerContext* context,
                                    const v1::MakeDirRequest* request,
                                    v1::MakeDirResponse* response) override;
  grpc::ServerUnaryReactor* Move(grpc::CallbackServerContext* context,
                                 const v1::MoveRequest* request,
                                 v1::MoveResponse* response) override;
  grpc::ServerUnaryReactor* Remove(grpc::CallbackServerContext* context,
                                   const v1::RemoveRequest* request,
                                   v1::RemoveResponse* response) override;

  grpc::ServerWriteReactor<v1::WatchDirEvent>* WatchDir(
      grpc::CallbackServerContext* context, const v1::WatchDirRequest* request) override;
  // inotify watches all WatchDir streams hold together (watch_service.cc).
  static constexpr int kMaxWatches = 4096;
  bool AcquireWatch();
  void ReleaseWatches(int n);

  // Streams (uploads, downloads) running at once; more are RESOURCE_EXHAUSTED. Each holds
  // a thread and at most two chunks.
  static constexpr int kMaxTransfers = 16;
  const Workspace& workspace() const { return *workspace_; }
  // Takes a transfer slot: false when kMaxTransfers run already.
  bool AcquireTransfer();
  void ReleaseTransfer();

  grpc::ServerWriteReactor<v1::ProcessEvent>* StartProcess(
      grpc::CallbackServerContext* context, const v1::StartProcessRequest* request) override;
  grpc::ServerWriteReactor<v1::ProcessEvent>* ConnectProcess(
      grpc::CallbackServerContext* context, const v1::ConnectProcessRequest* request) override;
  grpc::ServerUnaryReactor* ListProcesses(grpc::CallbackServerContext* context,
                                          const v1::ListProcessesRequest* request,
                                          v1::ListProcessesResponse* response) override;
  grpc::ServerUnaryReactor* SendProcessInput(grpc::CallbackServerContext* context,
                                             const v1::SendProcessInputRequest* request,
                                             v1::SendProcessInputResponse* response) override;
  grpc::ServerUnaryReactor* CloseProcessInput(grpc::CallbackServerContext* context,
                                              const v1::CloseProcessInputRequest* request,
                                              v1::CloseProcessInputResponse* response) override;
  grpc::ServerUnaryReactor* SignalProcess(grpc::CallbackServerContext* context,
                                          const v1::SignalProcessRequest* request,
                                          v1::SignalProcessResponse* response) override;
  grpc::ServerUnaryReactor* ResizeProcess(grpc::CallbackServerContext* context,
                                          const v1::ResizeProcessRequest* request,
                                          v1::ResizeProcessResponse* response) override;
  grpc::ServerUnaryReactor* WaitProcess(grpc::CallbackServerContext* context,
                                        const v1::WaitProcessRequest* request,
                                        v1::WaitProcessResponse* response) override;

  // Validates `start` and builds the spec with the merged environment.
  [[nodiscard]] absl::StatusOr<ExecSpec> MakeSpec(const v1::ExecStart& start) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same for a process.
  [[nodiscard]] absl::StatusOr<ProcessSpec> MakeProcessSpec(
      const v1::StartProcessRequest& request) const ABSL_LOCKS_EXCLUDED(mu_);
  ExecManager& execs() { return *execs_; }
  ProcessTable& processes() { return *processes_; }

 private:
  // The process a selector names. INVALID_ARGUMENT (no selector, bad pid or tag),
  // NOT_FOUND.
  [[nodiscard]] absl::StatusOr<std::shared_ptr<Process>> FindProcess(
      const v1::ProcessSelector& selector) const;
  // The environment of a command: the daemon's, the last Configure's, then `env`.
  std::map<std::string, std::string> MergedEnv(
      const google::protobuf::Map<std::string, std::string>& env) const ABSL_LOCKS_EXCLUDED(mu_);

  [[nodiscard]] absl::Status DoConfigure(const v1::ConfigureRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);
  // OK when the call carries the secret (or none is required), else UNAUTHENTICATED.
  [[nodiscard]] absl::Status CheckCaller(const grpc::CallbackServerContext& context) const;

  const Workspace* const workspace_;
  ExecManager* const execs_;
  ProcessTable* const processes_;
  const std::map<std::string, std::string> base_env_;
  const std::string secret_;
  const std::string default_cwd_;
  mutable absl::Mutex mu_;
  int transfers_ ABSL_GUARDED_BY(mu_) = 0;
  int watches_ ABSL_GUARDED_BY(mu_) = 0;
  // The env of the last Configure.
  std::map<std::string, std::string> configured_env_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::sandboxd

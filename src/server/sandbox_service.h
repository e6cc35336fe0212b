#pragma once
// sbx.v1.SandboxService: work inside a claimed sandbox, forwarded to the sandbox's daemon
// (sbx-sandboxd, sbx.sandboxd.v1) over gRPC. Exec is a bidirectional proxy: a server
// reactor towards the client and a client reactor towards the daemon, one message in
// flight each way, so a fast producer is slowed to the client's pace instead of being
// buffered. The process calls (StartProcess, ConnectProcess, ListProcesses, ...) are
// relayed the same way: their streams move one message at a time from the daemon to the
// client, so a process flooding its output costs the server one message per call (the
// daemon's replay ring drops what nobody takes). Suspend and Resume go through the
// allocator (which asks the runtime and records the state durably).
//
// Every call is authenticated; the claim must belong to the caller (another tenant's
// claim is NOT_FOUND), be ACTIVE and not suspended (except for Suspend/Resume).
//
// Thread-safety: handlers run concurrently on gRPC's threads.
// Lifetime: the Allocator, Authenticator and SandboxdClients must outlive the service and
// every call in flight (shut the gRPC server down before destroying them).

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "sbx/v1/sandboxes.grpc.pb.h"
#include "src/allocator/allocator.h"
#include "src/server/auth.h"
#include "src/server/metrics.h"
#include "src/server/port_token.h"
#include "src/server/sandboxd_client.h"

namespace sbx::server {

struct SandboxLimits {
  // Exec calls running at once in one sandbox; more are RESOURCE_EXHAUSTED.
  int max_concurrent_execs = 16;
  // Cap on one Exec's combined stdout+stderr sent to the client: a larger (or unset)
  // ExecStart.max_output_bytes is lowered to it. At most 64 MiB (the daemon's own cap).
  int64_t max_exec_output_bytes = 16 * 1024 * 1024;
  // Processes (StartProcess) running at once in one sandbox (1 to 4096), PTY processes
  // among them (0 to 1024), and the bytes all of a sandbox's replay buffers may hold
  // (64 KiB to 4 GiB). The daemon enforces them (it knows what runs); a start beyond one
  // is RESOURCE_EXHAUSTED naming it.
  int max_processes = 32;
  int max_ptys = 8;
  int64_t max_replay_bytes = 32 * 1024 * 1024;

  // INVALID_ARGUMENT naming the bad field.
  [[nodiscard]] absl::Status Validate() const;
};

// What GetPortUrl needs to hand out URLs of the port proxy (src/gateway/gateway.h).
struct PortUrlOptions {
  // Signs the URL tokens. Null: the server runs no port proxy (GetPortUrl is
  // FAILED_PRECONDITION).
  std::shared_ptr<const PortTokens> tokens;
  // How clients reach the proxy, e.g. "http://127.0.0.1:8090" (no trailing slash).
  std::string base_url;
  // The host form's domain (--proxy_domain; empty: no host form), and what follows it in
  // a URL (":8090", or "" behind a proxy on the scheme's port).
  std::string domain;
  std::string host_port_suffix;
};

// Counts Exec calls per sandbox against SandboxLimits::max_concurrent_execs.
class ExecSlots {
 public:
  explicit ExecSlots(int limit) : limit_(limit) {}
  // RESOURCE_EXHAUSTED when `sandbox` already runs `limit` calls.
  [[nodiscard]] absl::Status Acquire(const std::string& sandbox) ABSL_LOCKS_EXCLUDED(mu_);
  void Release(const std::string& sandbox) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int limit_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> running_ ABSL_GUARDED_BY(mu_);
};

class SandboxService final : public sbx::v1::SandboxService::CallbackService {
 public:
  // `counters` may be null (Exec calls are then not counted).
  SandboxService(allocator::Allocator* allocator, const Authenticator* auth,
                 SandboxdClients* daemons, SandboxLimits limits,
                 RequestCounters* counters = nullptr, PortUrlOptions port_urls = {})
      : allocator_(allocator),
        auth_(auth),
        daemons_(daemons),
        limits_(limits),
        counters_(counters),
        port_urls_(std::move(port_urls)),
        slots_(limits.max_concurrent_execs) {}

  grpc::ServerBidiReactor<v1::ExecRequest, v1::ExecResponse>* Exec(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* WriteFile(grpc::CallbackServerContext* ctx,
                                      const v1::WriteFileRequest* req,
                                      v1::WriteFileResponse* resp) override;
  grpc::ServerUnaryReactor* ReadFile(grpc::CallbackServerContext* ctx,
                                     const v1::ReadFileRequest* req,
                                     v1::ReadFileResponse* resp) override;
  grpc::ServerUnaryReactor* ListFiles(grpc::CallbackServerContext* ctx,
                                      const v1::ListFilesRequest* req,
                                      v1::ListFilesResponse* resp) override;
  grpc::ServerUnaryReactor* Suspend(grpc::CallbackServerContext* ctx, const v1::SuspendRequest* req,
                                    v1::SuspendResponse* resp) override;
  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* ctx, const v1::ResumeRequest* req,
                                   v1::ResumeResponse* resp) override;

  // Streamed files (file_service.cc).
  grpc::ServerReadReactor<v1::UploadRequest>* UploadFile(grpc::CallbackServerContext* ctx,
                                                         v1::UploadResponse* resp) override;
  grpc::ServerReadReactor<v1::UploadRequest>* UploadTar(grpc::CallbackServerContext* ctx,
                                                        v1::UploadResponse* resp) override;
  grpc::ServerWriteReactor<v1::DownloadChunk>* DownloadFile(
      grpc::CallbackServerContext* ctx, const v1::DownloadRequest* req) override;
  grpc::ServerWriteReactor<v1::DownloadChunk>* DownloadTar(grpc::CallbackServerContext* ctx,
                                                           const v1::DownloadRequest* req) override;
  grpc::ServerUnaryReactor* Stat(grpc::CallbackServerContext* ctx, const v1::StatRequest* req,
                                 v1::StatResponse* resp) override;
  grpc::ServerUnaryReactor* MakeDir(grpc::CallbackServerContext* ctx, const v1::MakeDirRequest* req,
                                    v1::MakeDirResponse* resp) override;
  grpc::ServerUnaryReactor* Move(grpc::CallbackServerContext* ctx, const v1::MoveRequest* req,
                                 v1::MoveResponse* resp) override;
  grpc::ServerUnaryReactor* Remove(grpc::CallbackServerContext* ctx, const v1::RemoveRequest* req,
                                   v1::RemoveResponse* resp) override;
  grpc::ServerWriteReactor<v1::WatchDirEvent>* WatchDir(grpc::CallbackServerContext* ctx,
                                                        const v1::WatchDirRequest* req) override;

  grpc::ServerWriteReactor<v1::ProcessEvent>* StartProcess(
      grpc::CallbackServerContext* ctx, const v1::StartProcessRequest* req) override;
  grpc::ServerWriteReactor<v1::ProcessEvent>* ConnectProcess(
      grpc::CallbackServerContext* ctx, const v1::ConnectProcessRequest* req) override;
  grpc::ServerUnaryReactor* ListProcesses(grpc::CallbackServerContext* ctx,
                                          const v1::ListProcessesRequest* req,
                                          v1::ListProcessesResponse* resp) override;
  grpc::ServerUnaryReactor* SendProcessInput(grpc::CallbackServerContext* ctx,
                                             const v1::SendProcessInputRequest* req,
                                             v1::SendProcessInputResponse* resp) override;
  grpc::ServerUnaryReactor* CloseProcessInput(grpc::CallbackServerContext* ctx,
                                              const v1::CloseProcessInputRequest* req,
                                              v1::CloseProcessInputResponse* resp) override;
  grpc::ServerUnaryReactor* SignalProcess(grpc::CallbackServerContext* ctx,
                                          const v1::SignalProcessRequest* req,
                                          v1::SignalProcessResponse* resp) override;
  grpc::ServerUnaryReactor* ResizeProcess(grpc::CallbackServerContext* ctx,
                                          const v1::ResizeProcessRequest* req,
                                          v1::ResizeProcessResponse* resp) override;
  grpc::ServerUnaryReactor* WaitProcess(grpc::CallbackServerContext* ctx,
                                        const v1::WaitProcessRequest* req,
                                        v1::WaitProcessResponse* resp) override;
  // In port_urls.cc.
  grpc::ServerUnaryReactor* GetPortUrl(grpc::CallbackServerContext* ctx,
                                       const v1::GetPortUrlRequest* req,
                                       v1::GetPortUrlResponse* resp) override;

 private:
  friend class ExecCall;

  // The caller's active, running claim `claim_id`. NOT_FOUND, FAILED_PRECONDITION (ended
  // or suspended), INVALID_ARGUMENT (malformed id).
  [[nodiscard]] absl::StatusOr<store::ClaimRecord> ActiveClaim(const Caller& caller,
                                                               const std::string& claim_id) const;
  // Authorize + ActiveClaim + the daemon's stub: what every call into a sandbox needs.
  absl::StatusOr<std::pair<store::ClaimRecord, std::shared_ptr<sandboxd::v1::Sandboxd::Stub>>>
  OpenSandbox(grpc::CallbackServerContext* ctx, const std::string& claim_id,
              absl::string_view method) const;

  allocator::Allocator* const allocator_;
  const Authenticator* const auth_;
  SandboxdClients* const daemons_;
  const SandboxLimits limits_;
  RequestCounters* const counters_;
  const PortUrlOptions port_urls_;
  ExecSlots slots_;
};

}  // namespace sbx::server

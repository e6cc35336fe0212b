#pragma once
// sbx.v1.AdminService over the allocator: templates and pools (Put/Get/List/Delete,
// ScalePool) and WatchPools (watch_service.h). Every RPC needs an admin caller.
//
// Optimistic concurrency (expected_generation, create_only): the check and the write are
// made atomic by marking the object busy in this service from the check until the write
// is durable; a second write to the same object meanwhile gets ABORTED (retry). This
// server is the only writer of its allocator, so that is enough.
//
// Not supported yet: Pool.max_sandboxes != 0 (UNIMPLEMENTED), created_at/updated_at of
// templates and pools (the records keep no timestamps; left unset), PoolStatus.starting,
// stale and observed_generation (need the reconciler; left 0). PoolStatus.last_error is
// the runtime's error of the pool's last failed create (Allocator::ObserveCreateResult).
//
// Thread-safety: handlers run concurrently on gRPC's threads.
// Lifetime: the Allocator and Authenticator must outlive the service and every call.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "sbx/v1/admin.grpc.pb.h"
#include "src/allocator/allocator.h"
#include "src/images/images.h"
#include "src/server/auth.h"

namespace sbx::server {

// What the runtimes of this server say about a template before it is stored
// (ServerOptions::check_template): OK, or the error PutTemplate answers.
using TemplateCheck = std::function<absl::Status(const v1::Template&)>;

class AdminService final : public sbx::v1::AdminService::CallbackService {
 public:
  // `images` (may be null): where pools' images stand in the cache (PoolStatus).
  AdminService(allocator::Allocator* allocator, const Authenticator* auth,
               TemplateCheck check_template = nullptr, const images::Images* images = nullptr)
      : allocator_(allocator),
        auth_(auth),
        check_template_(std::move(check_template)),
        images_(images) {}

  grpc::ServerUnaryReactor* PutTemplate(grpc::CallbackServerContext* ctx,
                                        const v1::PutTemplateRequest* req,
                                        v1::PutTemplateResponse* resp) override;
  grpc::ServerUnaryReactor* GetTemplate(grpc::CallbackServerContext* ctx,
                                        const v1::GetTemplateRequest* req,
                                        v1::GetTemplateResponse* resp) override;
  grpc::ServerUnaryReactor* ListTemplates(grpc::CallbackServerContext* ctx,
                                          const v1::ListTemplatesRequest* req,
                                          v1::ListTemplatesResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteTemplate(grpc::CallbackServerContext* ctx,
                                           const v1::DeleteTemplateRequest* req,
                                           v1::DeleteTemplateResponse* resp) override;
  grpc::ServerUnaryReactor* PutPool(grpc::CallbackServerContext* ctx, const v1::PutPoolRequest* req,
                                    v1::PutPoolResponse* resp) override;
  grpc::ServerUnaryReactor* GetPool(grpc::CallbackServerContext* ctx, const v1::GetPoolRequest* req,
                                    v1::GetPoolResponse* resp) override;
  grpc::ServerUnaryReactor* ListPools(grpc::CallbackServerContext* ctx,
                                      const v1::ListPoolsRequest* req,
                                      v1::ListPoolsResponse* resp) override;
  grpc::ServerUnaryReactor* DeletePool(grpc::CallbackServerContext* ctx,
                                       const v1::DeletePoolRequest* req,
                                       v1::DeletePoolResponse* resp) override;
  grpc::ServerUnaryReactor* ScalePool(grpc::CallbackServerContext* ctx,
                                      const v1::ScalePoolRequest* req,
                                      v1::ScalePoolResponse* resp) override;
  grpc::ServerWriteReactor<v1::PoolEvent>* WatchPools(grpc::CallbackServerContext* ctx,
                                                      const v1::WatchPoolsRequest* req) override;

 private:
  // The one name (src/common/ids.h) of the template or pool a request names in `field`;
  // INVALID_ARGUMENT naming the field when it is malformed.
  [[nodiscard]] absl::StatusOr<std::string> Canonical(absl::string_view field,
                                                      absl::string_view name) const;
  // The shared body of DeleteTemplate and DeletePool (after authorization and with the
  // canonical name): honours allow_missing and expected_generation against `get`, and runs `erase`
  // with the object marked busy. `kind` is "template" or "pool".
  template <typename Record, typename Response>
  grpc::ServerUnaryReactor* DeleteObject(grpc::CallbackServerContext* ctx, const char* kind,
                                         const std::string& name, bool allow_missing,
                                         int64_t expected_generation, Response* resp,
                                         const std::function<absl::StatusOr<Record>()>& get,
                                         std::function<void(allocator::StatusCallback)> erase);

  // Objects with a write between its check and its durability: "template/<name>" and
  // "pool/<name>". Shared with the allocator callbacks, which may outlive the service when
  // a call was cancelled.
  class WriteLocks {
   public:
    // Marks `key` busy; ABORTED if a write to it is in flight.
    [[nodiscard]] absl::Status Begin(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
    void End(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);

   private:
    absl::Mutex mu_;
    absl::flat_hash_set<std::string> busy_ ABSL_GUARDED_BY(mu_);
  };

  allocator::Allocator* const allocator_;
  const Authenticator* const auth_;
  const TemplateCheck check_template_;
  const images::Images* const images_;
  const std::shared_ptr<WriteLocks> writes_ = std::make_shared<WriteLocks>();
};

}  // namespace sbx::server

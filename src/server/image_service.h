#pragma once
// sbx.v1.ImageService over the local runtime's image cache (src/images/images.h): list,
// pull, remove. Every RPC needs an admin caller. A pull runs skopeo and umoci for seconds,
// so it runs on a thread of its own (at most max_pulls at once; more are
// RESOURCE_EXHAUSTED) and finishes its call from there, never blocking gRPC's threads.
//
// Thread-safety: handlers run concurrently on gRPC's threads.
// Lifetime: the Images and Authenticator must outlive the service; the destructor waits
// for the pulls in flight.

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "sbx/v1/images.grpc.pb.h"
#include "src/images/images.h"
#include "src/server/auth.h"

namespace sbx::server {

class ImageService final : public sbx::v1::ImageService::CallbackService {
 public:
  // `images` null: every call is FAILED_PRECONDITION (this server has no image cache).
  ImageService(images::Images* images, const Authenticator* auth, int max_pulls = 4)
      : images_(images), auth_(auth), max_pulls_(max_pulls) {}
  ~ImageService() override;

  grpc::ServerUnaryReactor* ListImages(grpc::CallbackServerContext* ctx,
                                       const v1::ListImagesRequest* req,
                                       v1::ListImagesResponse* resp) override;
  grpc::ServerUnaryReactor* PullImage(grpc::CallbackServerContext* ctx,
                                      const v1::PullImageRequest* req,
                                      v1::PullImageResponse* resp) override;
  grpc::ServerUnaryReactor* RemoveImage(grpc::CallbackServerContext* ctx,
                                        const v1::RemoveImageRequest* req,
                                        v1::RemoveImageResponse* resp) override;

 private:
  [[nodiscard]] absl::Status Check(grpc::CallbackServerContext* ctx, const char* method) const;

  images::Images* const images_;
  const Authenticator* const auth_;
  const int max_pulls_;
  absl::Mutex mu_;
  int pulls_ ABSL_GUARDED_BY(mu_) = 0;
  // Pull threads; finished ones (done set) are joined at the next pull or at destruction.
  struct PullThread {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<PullThread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::server

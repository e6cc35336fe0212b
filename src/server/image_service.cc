#include "src/server/image_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "src/server/call.h"
#include "src/server/convert.h"

namespace sbx::server {
namespace {

void ImageToProto(const images::Image& in, v1::Image* out) {
  out->set_digest(in.digest);
  out->set_ref(in.ref);
  out->set_bytes(in.bytes);
  out->set_holders(in.holders);
  ToProto(in.last_used, out->mutable_last_used());
  v1::ImageConfig* c = out->mutable_config();
  for (const std::string& e : in.config.env) c->add_env(e);
  c->set_working_dir(in.config.working_dir);
  c->set_user(in.config.user);
  for (const std::string& e : in.config.entrypoint) c->add_entrypoint(e);
  for (const std::string& e : in.config.cmd) c->add_cmd(e);
}

}  // namespace

ImageService::~ImageService() {
  std::vector<PullThread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads = std::move(threads_);
  }
  for (PullThread& t : threads) t.thread.join();
}

absl::Status ImageService::Check(grpc::CallbackServerContext* ctx, const char* method) const {
  absl::StatusOr<Caller> caller = Authorize(*auth_, ctx, true, method);
  if (!caller.ok()) return caller.status();
  if (images_ == nullptr) {
    return absl::FailedPreconditionError(
        "this server has no image cache (sbx-server --image_cache_bytes is 0)");
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* ImageService::ListImages(grpc::CallbackServerContext* ctx,
                                                   const v1::ListImagesRequest*,
                                                   v1::ListImagesResponse* resp) {
  if (absl::Status s = Check(ctx, "ListImages"); !s.ok()) return FinishNow(ctx, s);
  for (const images::Image& image : images_->List()) ImageToProto(image, resp->add_images());
  const images::ImageCacheStats st = images_->Stats();
  resp->set_budget_bytes(st.budget_bytes);
  resp->set_bytes(st.bytes);
  return FinishNow(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* ImageService::PullImage(grpc::CallbackServerContext* ctx,
                                                  const v1::PullImageRequest* req,
                                                  v1::PullImageResponse* resp) {
  if (absl::Status s = Check(ctx, "PullImage"); !s.ok()) return FinishNow(ctx, s);
  // The reference is checked here, before a thread is spent on it.
  if (absl::Status s = images_->CheckReference(req->ref()); !s.ok()) return FinishNow(ctx, s);
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::MutexLock lock(&mu_);
  if (pulls_ >= max_pulls_) {
    return FinishNow(ctx, absl::ResourceExhaustedError(
                              absl::StrCat(max_pulls_, " image pulls are running: retry \"",
                                           req->ref(), "\" when one has ended")));
  }
  // Join the pulls that have ended (a thread's last act is to set its flag).
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (it->done->load(std::memory_order_acquire)) {
      it->thread.join();
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
  ++pulls_;
  auto done = std::make_shared<std::atomic<bool>>(false);
  threads_.push_back({std::thread([this, ctx, reactor, ref = req->ref(), resp, done] {
                        absl::StatusOr<images::Image> image = images_->Pull(ref);
                        if (image.ok()) ImageToProto(*image, resp->mutable_image());
                        {
                          absl::MutexLock lock(&mu_);
                          --pulls_;
                        }
                        AddErrorMetadata(ctx, image.status());
                        reactor->Finish(ToGrpcStatus(image.status()));
                        done->store(true, std::memory_order_release);
                      }),
                      done});
  return reactor;
}

grpc::ServerUnaryReactor* ImageService::RemoveImage(grpc::CallbackServerContext* ctx,
                                                    const v1::RemoveImageRequest* req,
                                                    v1::RemoveImageResponse*) {
  if (absl::Status s = Check(ctx, "RemoveImage"); !s.ok()) return FinishNow(ctx, s);
  return FinishNow(ctx, images_->Remove(req->digest()));
}

}  // namespace sbx::server

// The streamed file calls of SandboxdService: UploadFile, UploadTar, DownloadFile,
// DownloadTar, and Stat, MakeDir, Move, Remove.
//
// A stream moves its bytes between the gRPC reactor and a worker thread of its own through
// at most two chunks: an upload reads the next message only once the worker has taken
// the previous chunk (so a fast client is paced by the disk, and the daemon holds at most
// two chunks per upload); a download's worker blocks while two chunks wait for the
// client. The worker does the blocking file and libarchive work; the reactor never blocks.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "src/common/status_macros.h"
#include "src/sandboxd/service.h"
#include "src/sandboxd/tar.h"

namespace sbx::sandboxd {
namespace {

// Largest chunk an upload message may carry.
constexpr size_t kMaxUploadChunk = 4 << 20;
// Download chunks are filled up to this size.
constexpr size_t kDownloadChunk = 256 * 1024;
// Chunks waiting in either direction.
constexpr size_t kMaxQueuedChunks = 2;

// What an upload does with its bytes, on the worker thread.
// `read` returns false at the end of the stream, and also when it failed or was
// cancelled: `ended_well` tells which.
using UploadBody = std::function<absl::StatusOr<v1::UploadResponse>(
    SandboxdService& service, const v1::UploadStart& start, const ReadChunkFn& read,
    const std::function<bool()>& ended_well)>;

// One UploadFile or UploadTar call. Lifetime: deleted when both the reactor is done and
// the worker has returned (refs_).
class UploadStream final : public grpc::ServerReadReactor<v1::UploadRequest> {
 public:
  UploadStream(SandboxdService* service, v1::UploadResponse* response, UploadBody body)
      : service_(service), response_(response), body_(std::move(body)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!started_) {
      started_ = true;
      if (!ok || !request_.has_start()) {
        Refuse(absl::InvalidArgumentError("the first message must be `start`"));
        return;
      }
      if (!service_->AcquireTransfer()) {
        Refuse(absl::ResourceExhaustedError(
            absl::StrCat("the daemon runs ", SandboxdService::kMaxTransfers,
                         " file streams already (its limit); retry later")));
        return;
      }
      start_ = request_.start();
      {
        absl::MutexLock lock(&mu_);
        refs_ = 2;
      }
      std::thread([this] { Work(); }).detach();
      StartRead(&request_);
      return;
    }
    bool read_more = false;
    {
      absl::MutexLock lock(&mu_);
      if (!ok) {
        eof_ = true;
      } else if (finished_) {
        failed_ = absl::InvalidArgumentError("a message after `finish`");
      } else if (request_.has_start()) {
        failed_ = absl::InvalidArgumentError("a second `start` message");
      } else if (request_.kind_case() == v1::UploadRequest::kFinish) {
        finished_ = true;
        read_more = true;
      } else if (request_.chunk().size() > kMaxUploadChunk) {
        failed_ = absl::InvalidArgumentError(absl::StrCat("a chunk of ", request_.chunk().size(),
                                                          " bytes is above ", kMaxUploadChunk));
      } else {
        queue_.push_back(std::move(*request_.mutable_chunk()));
        read_more = queue_.size() < kMaxQueuedChunks;
        paused_ = !read_more;
      }
    }
    if (read_more) StartRead(&request_);
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }

  void OnDone() override { Unref(); }

 private:
  void Refuse(const absl::Status& status) { Finish(ToGrpcStatus(status)); }

  // Blocks until a chunk, the end of the stream, a failure or the cancel.
  bool Read(std::string& chunk) {
    bool resume = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](UploadStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return !s->queue_.empty() || s->eof_ || s->cancelled_ || !s->failed_.ok();
          },
          this));
      if (cancelled_ || !failed_.ok() || queue_.empty()) return false;
      chunk = std::move(queue_.front());
      queue_.pop_front();
      if (paused_) {
        paused_ = false;
        resume = true;
      }
    }
    if (resume) StartRead(&request_);
    return true;
  }

  void Work() {
    ReadChunkFn read = [this](std::string& chunk) { return Read(chunk); };
    std::function<bool()> ended_well = [this] {
      absl::MutexLock lock(&mu_);
      return eof_ && finished_ && queue_.empty() && !cancelled_ && failed_.ok();
    };
    absl::StatusOr<v1::UploadResponse> result = body_(*service_, start_, read, ended_well);
    if (result.ok()) {
      // Take what is left of the stream (a tar's trailing blocks) so the call ends well.
      std::string rest;
      while (Read(rest)) {
      }
    }
    absl::Status status = result.status();
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) {
        status = absl::CancelledError("the upload was cancelled");
      } else if (!failed_.ok()) {
        status = failed_;
      } else if (status.ok() && !eof_) {
        status = absl::InternalError("the upload ended before its stream");
      }
    }
    if (status.ok()) *response_ = *result;
    service_->ReleaseTransfer();
    Finish(ToGrpcStatus(status));
    Unref();
  }

  void Unref() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  SandboxdService* const service_;
  v1::UploadResponse* const response_;
  const UploadBody body_;
  // Reactor side only (reads are sequenced).
  bool started_ = false;
  v1::UploadRequest request_;
  v1::UploadStart start_;
  absl::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
  // `finish` arrived.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  // The reactor's OnDone, and the worker once started.
  int refs_ ABSL_GUARDED_BY(mu_) = 1;
};

// What a download produces, on the worker thread. `header(size, mode)` may be called
// once before any write (DownloadFile's first message).
struct DownloadSink {
  std::function<void(int64_t size, uint32_t mode)> header;
  WriteBytesFn write;
};
using DownloadBody = std::function<absl::Status(const DownloadSink& sink)>;

// One DownloadFile or DownloadTar call.
class DownloadStream final : public grpc::ServerWriteReactor<v1::DownloadChunk> {
 public:
  DownloadStream(SandboxdService* service, DownloadBody body)
      : service_(service), body_(std::move(body)) {
    std::thread([this] { Work(); }).detach();
  }

  void OnWriteDone(bool ok) override {
    bool start = false;
    std::optional<absl::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) cancelled_ = true;
      if (!cancelled_ && !queue_.empty()) {
        StartNextLocked();
        start = true;
      } else if (done_ && !finished_) {
        finished_ = true;
        finish = cancelled_ ? absl::CancelledError("the download was cancelled") : final_;
      }
    }
    if (start) StartWrite(&writing_msg_);
    if (finish) Finish(ToGrpcStatus(*finish));
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }

  void OnDone() override { Unref(); }

 private:
  void StartNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    writing_msg_ = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
  }

  // Queues `msg` (or adds `data` to the last queued chunk); blocks while two wait.
  bool Push(absl::string_view data, const v1::DownloadChunk* header) {
    while (header != nullptr || !data.empty()) {
      bool start = false;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](DownloadStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
              return s->cancelled_ || s->queue_.size() < kMaxQueuedChunks ||
                     s->queue_.back().data().size() < kDownloadChunk;
            },
            this));
        if (cancelled_) return false;
        if (header != nullptr) {
          queue_.push_back(*header);
          header = nullptr;
        } else {
          if (queue_.empty() || queue_.back().data().size() >= kDownloadChunk) {
            queue_.emplace_back();
          }
          std::string* tail = queue_.back().mutable_data();
          const size_t take = std::min(data.size(), kDownloadChunk - tail->size());
          tail->append(data.data(), take);
          data.remove_prefix(take);
        }
        if (!writing_) {
          StartNextLocked();
          start = true;
        }
      }
      if (start) StartWrite(&writing_msg_);
    }
    return true;
  }

  void Work() {
    DownloadSink sink;
    sink.header = [this](int64_t size, uint32_t mode) {
      v1::DownloadChunk first;
      first.set_size(size);
      first.set_mode(mode);
      Push("", &first);
    };
    sink.write = [this](absl::string_view data) { return Push(data, nullptr); };
    absl::Status status = body_(sink);
    service_->ReleaseTransfer();
    bool start = false;
    std::optional<absl::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      final_ = status;
      if (!writing_) {
        if (status.ok() && !cancelled_ && !queue_.empty()) {
          StartNextLocked();
          start = true;
        } else {
          finished_ = true;
          finish = cancelled_ ? absl::CancelledError("the download was cancelled") : status;
        }
      }
    }
    if (start) StartWrite(&writing_msg_);
    if (finish) Finish(ToGrpcStatus(*finish));
    Unref();
  }

  void Unref() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  SandboxdService* const service_;
  const DownloadBody body_;
  absl::Mutex mu_;
  std::deque<v1::DownloadChunk> queue_ ABSL_GUARDED_BY(mu_);
  // The message being written; touched only by whoever set writing_.
  v1::DownloadChunk writing_msg_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_ ABSL_GUARDED_BY(mu_);
  // The reactor's OnDone and the worker.
  int refs_ ABSL_GUARDED_BY(mu_) = 2;
};

class RefusedDownload final : public grpc::ServerWriteReactor<v1::DownloadChunk> {
 public:
  explicit RefusedDownload(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

class RefusedUpload final : public grpc::ServerReadReactor<v1::UploadRequest> {
 public:
  explicit RefusedUpload(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

absl::StatusOr<v1::UploadResponse> UploadFileBody(SandboxdService& service,
                                                  const v1::UploadStart& start,
                                                  const ReadChunkFn& read,
                                                  const std::function<bool()>& ended_well) {
  if (start.max_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("start.max_bytes ", start.max_bytes(), " is negative"));
  }
  Workspace::WriteOptions options;
  options.mode = start.mode();
  options.create_parents = start.create_parents();
  ASSIGN_OR_RETURN(std::unique_ptr<Workspace::PendingFile> file,
                   service.workspace().CreatePending(start.path(), options, start.max_bytes()));
  std::string chunk;
  while (read(chunk)) RETURN_IF_ERROR(file->Write(chunk));
  // Only a stream that ended well (with `finish`) is committed; otherwise `file` removes
  // its temporary.
  if (!ended_well()) {
    return absl::InvalidArgumentError(
        "the upload ended without `finish`; nothing was written (send `finish` last)");
  }
  v1::UploadResponse response;
  ASSIGN_OR_RETURN(int64_t size, file->Commit());
  response.set_bytes(size);
  return response;
}

}  // namespace

bool SandboxdService::AcquireTransfer() {
  absl::MutexLock lock(&mu_);
  if (transfers_ >= kMaxTransfers) return false;
  ++transfers_;
  return true;
}

void SandboxdService::ReleaseTransfer() {
  absl::MutexLock lock(&mu_);
  --transfers_;
}

grpc::ServerReadReactor<v1::UploadRequest>* SandboxdService::UploadFile(
    grpc::CallbackServerContext* context, v1::UploadResponse* response) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return new RefusedUpload(s);
  return new UploadStream(this, response, UploadFileBody);
}

grpc::ServerReadReactor<v1::UploadRequest>* SandboxdService::UploadTar(
    grpc::CallbackServerContext* context, v1::UploadResponse* response) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return new RefusedUpload(s);
  return new UploadStream(
      this, response,
      [](SandboxdService& service, const v1::UploadStart& start, const ReadChunkFn& read,
         const std::function<bool()>&) -> absl::StatusOr<v1::UploadResponse> {
        if (start.max_bytes() < 0 || start.max_entries() < 0) {
          return absl::InvalidArgumentError("start.max_bytes and start.max_entries must be >= 0");
        }
        TarLimits limits;
        if (start.max_bytes() > 0) limits.max_bytes = start.max_bytes();
        if (start.max_entries() > 0) limits.max_entries = start.max_entries();
        ASSIGN_OR_RETURN(UniqueFd dir, service.workspace().OpenOrCreateDirectory(start.path()));
        ASSIGN_OR_RETURN(TarResult result,
                         ExtractTar(dir.get(), read, limits, service.workspace().uses_openat2()));
        v1::UploadResponse response;
        response.set_bytes(result.bytes);
        response.set_entries(result.entries);
        response.set_skipped(result.skipped);
        return response;
      });
}

grpc::ServerWriteReactor<v1::DownloadChunk>* SandboxdService::DownloadFile(
    grpc::CallbackServerContext* context, const v1::DownloadRequest* request) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return new RefusedDownload(s);
  struct stat st;
  absl::StatusOr<UniqueFd> fd = workspace_->OpenRegular(request->path(), &st);
  if (!fd.ok()) return new RefusedDownload(fd.status());
  if (!AcquireTransfer()) {
    return new RefusedDownload(absl::ResourceExhaustedError(absl::StrCat(
        "the daemon runs ", kMaxTransfers, " file streams already (its limit); retry later")));
  }
  auto shared_fd = std::make_shared<UniqueFd>(std::move(*fd));
  const std::string path = request->path();
  return new DownloadStream(this, [shared_fd, st, path](const DownloadSink& sink) {
    sink.header(st.st_size, st.st_mode & 07777);
    std::string buffer(kDownloadChunk, '\0');
    for (;;) {
      const ssize_t n = ::read(shared_fd->get(), buffer.data(), buffer.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return PathError(errno, path);
      if (n == 0) return absl::OkStatus();
      if (!sink.write(absl::string_view(buffer.data(), static_cast<size_t>(n)))) {
        return absl::CancelledError("the download was cancelled");
      }
    }
  });
}

grpc::ServerWriteReactor<v1::DownloadChunk>* SandboxdService::DownloadTar(
    grpc::CallbackServerContext* context, const v1::DownloadRequest* request) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return new RefusedDownload(s);
  absl::StatusOr<UniqueFd> dir = workspace_->OpenDirectory("path", request->path());
  if (!dir.ok()) return new RefusedDownload(dir.status());
  if (!AcquireTransfer()) {
    return new RefusedDownload(absl::ResourceExhaustedError(absl::StrCat(
        "the daemon runs ", kMaxTransfers, " file streams already (its limit); retry later")));
  }
  auto shared_dir = std::make_shared<UniqueFd>(std::move(*dir));
  return new DownloadStream(this, [shared_dir](const DownloadSink& sink) {
    return WriteTar(shared_dir->get(), sink.write);
  });
}

grpc::ServerUnaryReactor* SandboxdService::Stat(grpc::CallbackServerContext* context,
                                                const v1::StatRequest* request,
                                                v1::StatResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = CheckCaller(*context);
  if (status.ok()) {
    absl::StatusOr<Workspace::Entry> entry = workspace_->Stat(request->path());
    if (entry.ok()) FillEntry(*entry, response->mutable_entry());
    status = entry.status();
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* SandboxdService::MakeDir(grpc::CallbackServerContext* context,
                                                   const v1::MakeDirRequest* request,
                                                   v1::MakeDirResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = CheckCaller(*context);
  if (status.ok())
    status = workspace_->MakeDir(request->path(), request->mode(), request->parents());
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* SandboxdService::Move(grpc::CallbackServerContext* context,
                                                const v1::MoveRequest* request, v1::MoveResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = CheckCaller(*context);
  if (status.ok()) {
    status = workspace_->Move(request->from(), request->to(), request->overwrite(),
                              request->create_parents());
  }
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* SandboxdService::Remove(grpc::CallbackServerContext* context,
                                                  const v1::RemoveRequest* request,
                                                  v1::RemoveResponse*) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = CheckCaller(*context);
  if (status.ok()) status = workspace_->Remove(request->path(), request->recursive());
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace sbx::sandboxd

// SandboxdService::WatchDir: a stream of changes below a directory, from inotify.
//
// A worker thread per stream reads the inotify descriptor (polling, so it notices the
// client leaving within 100 ms), turns events into WatchDirEvents named by their path,
// and holds them for the debounce window (kWatchDebounce after the first of a burst):
// repeated events of one kind on one path within the window are sent once. The queue
// towards the client holds at most kMaxQueuedEvents; when it is full the worker waits, the
// kernel's own queue fills, and its overflow reaches the client as an `overflow` event.
//
// Directories are watched through /proc/self/fd/N of a descriptor opened beneath the
// workspace (inotify takes names, not descriptors; the magic link is followed on purpose,
// so no IN_DONT_FOLLOW), so the watched directory is the one
// the confined resolution found, not whatever a name points to later. Recursive watches
// add every subdirectory (never through a link) and new ones as they appear; the daemon
// holds at most kMaxWatches inotify watches in all (RESOURCE_EXHAUSTED at the start;
// directories created later beyond it are not watched, and an `overflow` event says so).

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "src/sandboxd/service.h"

namespace sbx::sandboxd {
namespace {

constexpr absl::Duration kWatchDebounce = absl::Milliseconds(50);
constexpr size_t kMaxQueuedEvents = 1024;

class RefusedWatch final : public grpc::ServerWriteReactor<v1::WatchDirEvent> {
 public:
  explicit RefusedWatch(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

std::string Join(const std::string& prefix, const std::string& name) {
  if (prefix.empty()) return name;
  if (prefix == "/") return "/" + name;
  return absl::StrCat(prefix, "/", name);
}

class WatchStream final : public grpc::ServerWriteReactor<v1::WatchDirEvent> {
 public:
  WatchStream(SandboxdService* service, UniqueFd dir, std::string path, bool recursive)
      : service_(service), dir_(std::move(dir)), path_(std::move(path)), recursive_(recursive) {}

  // Sets up the watches; on success the worker runs and the stream is live.
  absl::Status Begin() {
    inotify_.Reset(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
    if (!inotify_.valid()) return PathError(errno, path_);
    bool limited = false;
    absl::Status added = AddTree(dir_.get(), path_, 0, &limited);
    if (!added.ok() || limited) {
      service_->ReleaseWatches(static_cast<int>(watches_.size()));
      watches_.clear();
    }
    if (!added.ok()) return added;
    if (limited) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "watching \"", path_, "\" needs more than the daemon's ", SandboxdService::kMaxWatches,
          " inotify watches (its limit, for all WatchDir streams of the sandbox)"));
    }
    // Holding the directory open would keep it from being deleted (and IN_DELETE_SELF
    // from coming) while the stream runs: new subdirectories are opened from the
    // workspace instead.
    dir_.Reset();
    v1::WatchDirEvent ready;
    ready.set_ready(true);
    Queue(std::move(ready));
    std::thread([this] { Work(); }).detach();
    return absl::OkStatus();
  }

  void OnWriteDone(bool ok) override {
    bool start = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) cancelled_ = true;
      if (!cancelled_ && !queue_.empty()) {
        writing_msg_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
        start = true;
      }
    }
    if (start) StartWrite(&writing_msg_);
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }

  void OnDone() override { Unref(); }

 private:
#define RETURN_IF_ERROR_WATCH(expr) \
  do {                              \
    absl::Status _s = (expr);       \
    if (!_s.ok()) return _s;        \
  } while (0)

  // Adds a watch for the directory `fd` (named `name`) and, when recursive, below it.
  absl::Status AddTree(int fd, const std::string& name, int depth, bool* limited) {
    if (!service_->AcquireWatch()) {
      *limited = true;
      return absl::OkStatus();
    }
    const std::string proc = absl::StrCat("/proc/self/fd/", fd);
    const int wd =
        ::inotify_add_watch(inotify_.get(), proc.c_str(),
                            IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM |
                                IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF | IN_ONLYDIR);
    if (wd < 0) {
      const int err = errno;
      service_->ReleaseWatches(1);
      return PathError(err == ENOSPC ? EDQUOT : err, name);
    }
    if (!watches_.emplace(wd, name).second) {
      service_->ReleaseWatches(1);  // the same directory twice (a bind mount)
    }
    if (!recursive_ || depth > 64) return absl::OkStatus();
    int dup_fd = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) return absl::OkStatus();
    DIR* dir = ::fdopendir(dup_fd);
    if (dir == nullptr) {
      ::close(dup_fd);
      return absl::OkStatus();
    }
    std::vector<std::string> subdirs;
    while (struct dirent* de = ::readdir(dir)) {  // NOLINT(concurrency-mt-unsafe): own DIR stream
      const std::string n = de->d_name;
      if (n == "." || n == "..") continue;
      if (de->d_type == DT_DIR || de->d_type == DT_UNKNOWN) subdirs.push_back(n);
    }
    ::closedir(dir);
    for (const std::string& n : subdirs) {
      UniqueFd sub(::openat(fd, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!sub.valid()) continue;  // not a directory, a link, or gone
      RETURN_IF_ERROR_WATCH(AddTree(sub.get(), Join(name, n), depth + 1, limited));
    }
    return absl::OkStatus();
  }

  // Queues `event` for the client; waits while the queue is full. False once cancelled.
  bool Queue(v1::WatchDirEvent event) {
    bool start = false;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](WatchStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->cancelled_ || s->queue_.size() < kMaxQueuedEvents;
          },
          this));
      if (cancelled_) return false;
      if (writing_) {
        queue_.push_back(std::move(event));
      } else {
        writing_msg_ = std::move(event);
        writing_ = true;
        start = true;
      }
    }
    if (start) StartWrite(&writing_msg_);
    return true;
  }

  bool Cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

  // Turns one inotify event into pending events (coalesced by path and kind).
  void Take(const struct inotify_event* e, std::vector<v1::WatchDirEvent>& pending,
            bool* root_gone) {
    if ((e->mask & IN_Q_OVERFLOW) != 0) {
      v1::WatchDirEvent ev;
      ev.set_overflow(true);
      pending.push_back(std::move(ev));
      return;
    }
    auto it = watches_.find(e->wd);
    if (it == watches_.end()) return;
    if ((e->mask & IN_IGNORED) != 0) {
      const bool root = it->second == path_;
      watches_.erase(it);
      service_->ReleaseWatches(1);
      if (root) *root_gone = true;
      return;
    }
    if ((e->mask & IN_DELETE_SELF) != 0) return;  // the parent reports the REMOVE
    if (e->len == 0) return;
    const std::string path = Join(it->second, e->name);
    const bool is_dir = (e->mask & IN_ISDIR) != 0;
    v1::FileEventType type = v1::FILE_EVENT_UNSPECIFIED;
    if ((e->mask & (IN_CREATE | IN_MOVED_TO)) != 0) {
      type = v1::FILE_EVENT_CREATE;
    } else if ((e->mask & (IN_MODIFY | IN_CLOSE_WRITE)) != 0) {
      type = v1::FILE_EVENT_WRITE;
    } else if ((e->mask & IN_DELETE) != 0) {
      type = v1::FILE_EVENT_REMOVE;
    } else if ((e->mask & IN_MOVED_FROM) != 0) {
      type = v1::FILE_EVENT_RENAME;
    } else if ((e->mask & IN_ATTRIB) != 0) {
      type = v1::FILE_EVENT_CHMOD;
    }
    if (type == v1::FILE_EVENT_UNSPECIFIED) return;
    if (recursive_ && is_dir && type == v1::FILE_EVENT_CREATE) {
      // A new directory: watch it (and what is already in it) too.
      absl::StatusOr<UniqueFd> sub = service_->workspace().OpenDirectory("path", path);
      if (sub.ok()) {
        bool limited = false;
        absl::Status s = AddTree(sub->get(), path, 1, &limited);
        if (limited || !s.ok()) {
          v1::WatchDirEvent ev;
          ev.set_overflow(true);
          pending.push_back(std::move(ev));
        }
      }
    }
    for (const v1::WatchDirEvent& p : pending) {
      if (p.type() == type && p.path() == path) return;  // debounced
    }
    v1::WatchDirEvent ev;
    ev.set_type(type);
    ev.set_path(path);
    ev.set_is_dir(is_dir);
    pending.push_back(std::move(ev));
  }

  void Work() {
    std::vector<v1::WatchDirEvent> pending;
    std::optional<absl::Time> flush_at;
    alignas(struct inotify_event) char buf[64 * 1024];
    bool root_gone = false;
    while (!Cancelled()) {
      int timeout_ms = 100;
      if (flush_at) {
        timeout_ms = static_cast<int>(
            std::max<int64_t>(0, absl::ToInt64Milliseconds(*flush_at - absl::Now())));
        timeout_ms = std::min(timeout_ms, 100);
      }
      struct pollfd p = {inotify_.get(), POLLIN, 0};
      const int r = ::poll(&p, 1, timeout_ms);
      if (r > 0) {
        const ssize_t n = ::read(inotify_.get(), buf, sizeof(buf));
        for (ssize_t off = 0; n > 0 && off < n;) {
          const auto* e = reinterpret_cast<const struct inotify_event*>(buf + off);
          Take(e, pending, &root_gone);
          off += static_cast<ssize_t>(sizeof(struct inotify_event) + e->len);
        }
        if (!pending.empty() && !flush_at) flush_at = absl::Now() + kWatchDebounce;
      }
      if (flush_at && (absl::Now() >= *flush_at || root_gone)) {
        for (v1::WatchDirEvent& ev : pending) {
          if (!Queue(std::move(ev))) break;
        }
        pending.clear();
        flush_at.reset();
      }
      if (root_gone) break;
    }
    service_->ReleaseWatches(static_cast<int>(watches_.size()));
    watches_.clear();
    bool finish = false;
    {
      absl::MutexLock lock(&mu_);
      // Wait until what is queued went out (or the client left).
      mu_.Await(absl::Condition(
          +[](WatchStream* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->cancelled_ || (!s->writing_ && s->queue_.empty());
          },
          this));
      finish = true;
    }
    if (finish) {
      Finish(root_gone ? grpc::Status::OK
                       : ToGrpcStatus(absl::CancelledError("the watch was cancelled")));
    }
    Unref();
  }
#undef RETURN_IF_ERROR_WATCH

  void Unref() {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      last = --refs_ == 0;
    }
    if (last) delete this;
  }

  SandboxdService* const service_;
  // The watched directory until the watches are set up.
  UniqueFd dir_;
  const std::string path_;
  const bool recursive_;
  UniqueFd inotify_;
  // Worker thread only (and Begin, before it starts): watch descriptor -> directory name.
  std::map<int, std::string> watches_;
  absl::Mutex mu_;
  std::deque<v1::WatchDirEvent> queue_ ABSL_GUARDED_BY(mu_);
  v1::WatchDirEvent writing_msg_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // The reactor's OnDone and the worker.
  int refs_ ABSL_GUARDED_BY(mu_) = 2;
};

}  // namespace

bool SandboxdService::AcquireWatch() {
  absl::MutexLock lock(&mu_);
  if (watches_ >= kMaxWatches) return false;
  ++watches_;
  return true;
}

void SandboxdService::ReleaseWatches(int n) {
  absl::MutexLock lock(&mu_);
  watches_ -= n;
}

grpc::ServerWriteReactor<v1::WatchDirEvent>* SandboxdService::WatchDir(
    grpc::CallbackServerContext* context, const v1::WatchDirRequest* request) {
  if (absl::Status s = CheckCaller(*context); !s.ok()) return new RefusedWatch(s);
  absl::StatusOr<UniqueFd> dir = workspace_->OpenDirectory("path", request->path());
  if (!dir.ok()) return new RefusedWatch(dir.status());
  auto* stream = new WatchStream(this, std::move(*dir), request->path(), request->recursive());
  if (absl::Status s = stream->Begin(); !s.ok()) {
    delete stream;
    return new RefusedWatch(s);
  }
  return stream;
}

}  // namespace sbx::sandboxd

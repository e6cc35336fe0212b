#pragma once
// Client: typed-by-resource access to a Kubernetes API server over REST — get, list,
// create, update, patch, delete, the status and scale subresources, and watch — with
// client-side rate limiting, retries and per-request deadlines. Objects are JSON
// (nlohmann::json); typed views of the agents.x-k8s.io kinds build on this.
//
// Errors are absl::Status with the API server's message:
//   400, 415, 422 -> INVALID_ARGUMENT   401 -> UNAUTHENTICATED   403 -> PERMISSION_DENIED
//   404 -> NOT_FOUND   409 AlreadyExists -> ALREADY_EXISTS   409 Conflict -> ABORTED
//   410 Gone/Expired -> OUT_OF_RANGE (relist)   429 -> RESOURCE_EXHAUSTED (after retries)
//   5xx, connection errors -> UNAVAILABLE (after retries)   timeout -> DEADLINE_EXCEEDED
//
// Retries: 429 always (the server did nothing; Retry-After is honoured); 5xx, connection
// errors and timeouts for every request that is safe to repeat — reads, updates and
// patches guarded by resourceVersion or idempotent, deletes, and creates with a fixed name
// (a repeat then reports ALREADY_EXISTS). A create with generateName is not repeated after
// an answer-less failure, because it could make a second object.
//
// Thread-safety: all methods may be called from any number of threads.
// Lifetime: watches must be destroyed before the client.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "src/k8s/config.h"
#include "src/k8s/http.h"
#include "src/k8s/rate_limiter.h"
#include "src/k8s/resources.h"

namespace prometheus {
class Registry;
}

namespace sbx::k8s {

using Json = nlohmann::json;

struct ClientOptions {
  // Client-side rate limit over all requests (watches included): steady QPS and burst.
  // 0 QPS = unlimited. A safety net against flooding the API server; the runtime's own
  // write budget (per pool, by priority) sits in front of it.
  double qps = 1000;
  int burst = 2000;
  // Per request, covering connect, send and the whole response.
  absl::Duration request_timeout = absl::Seconds(30);
  // Attempts after the first, and the backoff between them (doubling, with full jitter).
  int max_retries = 5;
  absl::Duration retry_initial_backoff = absl::Milliseconds(50);
  absl::Duration retry_max_backoff = absl::Seconds(5);
  // Upper bound for an honoured Retry-After.
  absl::Duration max_retry_after = absl::Seconds(30);
  // How often a token file is checked for a new token.
  absl::Duration token_recheck = absl::Seconds(1);
  std::string user_agent = "sbx/0.1";
  // The HTTP transport (http.h): "socket" (the default: each request on its caller's
  // thread) or "cpprest" (cpprestsdk's asynchronous client, the earlier default).
  std::string transport = "socket";
  // Metrics land here when set: sbx_k8s_requests_total{verb,resource,code},
  // sbx_k8s_request_duration_seconds{verb,resource}, sbx_k8s_watch_restarts_total{resource,reason}.
  std::shared_ptr<prometheus::Registry> registry;

  [[nodiscard]] absl::Status Validate() const;
};

struct ListOptions {
  std::string label_selector;
  std::string field_selector;
  // 0 = everything in one page.
  int64_t limit = 0;
  std::string continue_token;
  std::string resource_version;
};

struct ListResult {
  std::vector<Json> items;
  std::string resource_version;
  std::string continue_token;  // "" on the last page
  std::optional<int64_t> remaining_item_count;
};

struct DeleteOptions {
  // "", "Background", "Foreground" or "Orphan".
  std::string propagation_policy;
  std::optional<std::string> precondition_uid;
  std::optional<std::string> precondition_resource_version;
  std::optional<int64_t> grace_period_seconds;
};

enum class PatchType { kMerge, kJson, kStrategicMerge };

struct WatchOptions {
  std::string label_selector;
  std::string field_selector;
  // "" = the current state as ADDED events first; otherwise every change after it.
  std::string resource_version;
  bool allow_bookmarks = true;
  // Server-side end of the stream (timeoutSeconds); the stream then ends cleanly.
  absl::Duration timeout = absl::Minutes(5);
};

struct WatchEvent {
  enum class Type { kAdded, kModified, kDeleted, kBookmark };
  Type type = Type::kAdded;
  Json object;
};

// One watch stream. Not thread-safe, except Cancel.
class Watch {
 public:
  virtual ~Watch() = default;
  // Next event into *event. false when the stream ended cleanly (timeout or the server
  // closed it); OUT_OF_RANGE when the server says the resourceVersion is too old;
  // UNAVAILABLE when the connection broke; CANCELLED after Cancel.
  [[nodiscard]] virtual absl::StatusOr<bool> Next(WatchEvent* event) = 0;
  virtual void Cancel() = 0;
};

class ClientMetrics;

// What allows a replica to write to the API server (docs/architecture.md, "Fencing"): a
// client with a fence asks it right before each attempt of every write (create, update,
// patch, delete; not of Leases, the election's own), after the rate limiter's wait, and cuts the
// attempt's timeout to the time it has left, so that a write still on the wire when leadership
// lapses is abandoned then. Thread-safety: WriteWindow is called from any thread.
class WriteFence {
 public:
  virtual ~WriteFence() = default;
  // How long writes may still be sent from now (positive); FAILED_PRECONDITION saying why
  // when none may (this replica does not lead, or its last renewal is too old).
  [[nodiscard]] virtual absl::StatusOr<absl::Duration> WriteWindow() const = 0;
};

class Client {
 public:
  // Builds a client for `cluster` with the cpprestsdk transport. INVALID_ARGUMENT for bad
  // options, a bad server URL or unreadable PEMs.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Client>> Create(
      const ClusterConfig& cluster, const ClientOptions& options = {});
  // Same, over a given transport (tests).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Client>> Create(
      const ClusterConfig& cluster, const ClientOptions& options,
      std::unique_ptr<HttpTransport> transport);
  ~Client();

  const ClusterConfig& cluster() const { return cluster_; }

  // `ns` is ignored for cluster-scoped kinds; "" lists across all namespaces.
  [[nodiscard]] absl::StatusOr<Json> Get(const Resource& r, const std::string& ns,
                                         const std::string& name,
                                         const std::string& subresource = "");
  [[nodiscard]] absl::StatusOr<ListResult> List(const Resource& r, const std::string& ns,
                                                const ListOptions& options = {});
  // Every page of a list; *resource_version gets the list's version (to watch from).
  [[nodiscard]] absl::StatusOr<std::vector<Json>> ListAll(const Resource& r, const std::string& ns,
                                                          const ListOptions& options,
                                                          std::string* resource_version);
  // The object's metadata.name or metadata.generateName names it; apiVersion and kind are
  // filled in when missing. Returns the stored object.
  [[nodiscard]] absl::StatusOr<Json> Create(const Resource& r, const std::string& ns,
                                            const Json& object);
  // The same create when the caller does not need the stored object (its answer is not
  // parsed).
  [[nodiscard]] absl::Status CreateNoResult(const Resource& r, const std::string& ns,
                                            const Json& object);
  // PUT with the object's metadata.resourceVersion (a stale one is ABORTED).
  [[nodiscard]] absl::StatusOr<Json> Update(const Resource& r, const std::string& ns,
                                            const Json& object);
  [[nodiscard]] absl::StatusOr<Json> UpdateStatus(const Resource& r, const std::string& ns,
                                                  const Json& object);
  [[nodiscard]] absl::StatusOr<Json> Patch(const Resource& r, const std::string& ns,
                                           const std::string& name, PatchType type,
                                           const Json& patch, const std::string& subresource = "");
  // The same patch when the caller does not need the patched object: the answer's body is
  // not parsed (a status writer at a thousand writes a second saves the JSON work).
  [[nodiscard]] absl::Status PatchNoResult(const Resource& r, const std::string& ns,
                                           const std::string& name, PatchType type,
                                           const Json& patch, const std::string& subresource = "");
  // OK also when the object was only marked for deletion (finalizers pending).
  [[nodiscard]] absl::Status Delete(const Resource& r, const std::string& ns,
                                    const std::string& name, const DeleteOptions& options = {});
  // The scale subresource: spec.replicas of the Scale object, and setting it.
  [[nodiscard]] absl::StatusOr<int64_t> GetScale(const Resource& r, const std::string& ns,
                                                 const std::string& name);
  [[nodiscard]] absl::StatusOr<Json> SetScale(const Resource& r, const std::string& ns,
                                              const std::string& name, int64_t replicas);
  // Opens a watch (on its own connection). Errors as for List; a too-old
  // resourceVersion may also come as OUT_OF_RANGE from Watch::Next.
  [[nodiscard]] absl::StatusOr<std::unique_ptr<Watch>> StartWatch(const Resource& r,
                                                                  const std::string& ns,
                                                                  const WatchOptions& options);

  // For informers: counts a watch restart of `r` for `reason` ("expired", "error", "end").
  void RecordWatchRestart(const Resource& r, const std::string& reason);

  // Fences every later write with `fence` (null: none). A fenced write that may not be sent
  // fails with FAILED_PRECONDITION without reaching the API server and is counted in
  // sbx_k8s_requests_total with code "fenced". `fence` must outlive its use here: set
  // another (or null) before destroying it.
  void SetWriteFence(const WriteFence* fence) { fence_.store(fence, std::memory_order_release); }

 private:
  Client(ClusterConfig cluster, ClientOptions options, std::unique_ptr<HttpTransport> transport);

  struct Call {
    std::string verb;  // get, list, create, update, patch, delete, watch
    const Resource* resource;
    std::string subresource;
    std::string what;  // for messages: `create sandboxes "x" in "ns"`
    HttpRequest request;
    bool retry_unanswered = true;  // repeat after 5xx / connection errors / timeouts
  };
  [[nodiscard]] absl::StatusOr<HttpResponse> Do(Call call);
  // Do, with a non-2xx answer turned into its error (the server's reason and message).
  [[nodiscard]] absl::StatusOr<HttpResponse> DoOk(Call call);
  // DoOk, with the answer's body parsed.
  [[nodiscard]] absl::StatusOr<Json> DoJson(Call call);
  [[nodiscard]] absl::StatusOr<Call> CreateCall(const Resource& r, const std::string& ns,
                                                const Json& object);
  Call PatchCall(const Resource& r, const std::string& ns, const std::string& name, PatchType type,
                 const Json& patch, const std::string& subresource);
  // PUT of `object` to its name (and `subresource`, "" for the object itself).
  [[nodiscard]] absl::StatusOr<Json> Put(const Resource& r, const std::string& ns,
                                         const Json& object, const std::string& subresource);
  void Authorize(HttpRequest* request, bool force_reload);
  std::string Path(const Resource& r, const std::string& ns, const std::string& name,
                   const std::string& subresource) const;
  absl::Duration Backoff(int attempt);

  const ClusterConfig cluster_;
  const ClientOptions options_;
  std::unique_ptr<HttpTransport> transport_;
  std::unique_ptr<ClientMetrics> metrics_;
  RateLimiter limiter_;
  // Read before every write; set rarely (at start, at stop). acquire/release: the fence
  // object is fully built before a writer can see it.
  std::atomic<const WriteFence*> fence_{nullptr};

  absl::Mutex token_mu_;
  std::string token_ ABSL_GUARDED_BY(token_mu_);
  absl::Time token_checked_ ABSL_GUARDED_BY(token_mu_) = absl::InfinitePast();
  int64_t token_mtime_ns_ ABSL_GUARDED_BY(token_mu_) = -1;

  absl::Mutex rng_mu_;
  absl::BitGen rng_ ABSL_GUARDED_BY(rng_mu_);
};

// A Status built from an API server answer: the code mapping above, and a message with
// `what`, the HTTP code, the reason and the server's message.
[[nodiscard]] absl::Status StatusFromResponse(const std::string& what, int http_status,
                                              const std::string& body);

// Percent-encodes a query value (RFC 3986 unreserved characters are kept).
std::string QueryEscape(std::string_view value);

}  // namespace sbx::k8s

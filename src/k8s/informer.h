#pragma once
// Informer: keeps a local cache of one resource (in one namespace or all, optionally
// filtered by selectors) in step with the API server — list, then watch from the list's
// resourceVersion, resuming from the last version seen when a stream ends (at once when
// it delivered events before it broke), relisting on 410 Gone, reconnecting with
// exponential backoff and jitter after errors with nothing delivered (reset by the next
// stream that delivers). The cache is indexed by namespace/name, by label and by owner
// uid, and handlers hear every change.
//
// After a relist the cache is replaced and handlers hear the difference (adds, updates of
// objects whose resourceVersion changed, deletes of objects that are gone), so a handler
// sees each object's life in order even across dropped watches.
//
// Thread-safety: the read methods may be called from any thread. Handlers run on the
// informer's thread, one at a time, with no informer lock held (they may call the read
// methods). AddHandler before Start.
// Lifetime: Stop (or the destructor) joins the thread; the client must outlive it.

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "src/common/clock.h"
#include "src/k8s/client.h"

namespace sbx::k8s {

using ObjectPtr = std::shared_ptr<const Json>;

struct InformerOptions {
  Resource resource;
  std::string ns;  // "" = all namespaces
  std::string label_selector;
  std::string field_selector;
  int64_t page_size = 500;
  // Each watch stream asks the server to end after this long (then it is resumed).
  absl::Duration watch_timeout = absl::Minutes(5);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(10);
  // Time of the backoffs and of a stream's age (one that ends at once is a fault); the
  // real clock when null. Must outlive the informer.
  const Clock* clock = nullptr;
};

struct InformerHandler {
  std::function<void(const ObjectPtr&)> on_add;
  std::function<void(const ObjectPtr& old_object, const ObjectPtr& new_object)> on_update;
  std::function<void(const ObjectPtr&)> on_delete;
};

struct InformerStats {
  int64_t lists = 0;    // full lists (the first one and every relist)
  int64_t watches = 0;  // watch streams opened
  int64_t expired = 0;  // 410 Gone answers (each led to a relist)
  int64_t errors = 0;   // failed lists or watches (each led to a backoff)
  int64_t events = 0;   // watch events applied (bookmarks excluded)
};

class Informer {
 public:
  Informer(Client* client, InformerOptions options);
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  void AddHandler(InformerHandler handler);
  void Start();
  void Stop();
  // True once the first list is in the cache; false if `timeout` passed first.
  bool WaitForSync(absl::Duration timeout) const;
  bool HasSynced() const;

  ObjectPtr Get(const std::string& ns, const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<ObjectPtr> List() const ABSL_LOCKS_EXCLUDED(mu_);
  // Objects whose label `key` has value `value`.
  std::vector<ObjectPtr> ByLabel(const std::string& key, const std::string& value) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // Objects with an ownerReference to `uid`.
  std::vector<ObjectPtr> ByOwner(const std::string& uid) const ABSL_LOCKS_EXCLUDED(mu_);
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);
  // The last resourceVersion seen (from a list, an event or a bookmark).
  std::string ResourceVersion() const ABSL_LOCKS_EXCLUDED(mu_);
  // The resourceVersion of the last list, event or bookmark whose handlers have all
  // returned: once it has reached a write's version, every handler has heard of that
  // write (a controller has queued its key). For tests that wait for a positive marker.
  std::string HandledResourceVersion() const ABSL_LOCKS_EXCLUDED(mu_);
  InformerStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  template <class T>
  friend class TypedCache;
  // The typed caches made over this informer, by type tag (the first of each type), so that
  // a reader handed the informer shares the decoded copies of its owner's cache.
  void RegisterTyped(const void* tag, const void* cache) ABSL_LOCKS_EXCLUDED(typed_mu_);
  void UnregisterTyped(const void* cache) ABSL_LOCKS_EXCLUDED(typed_mu_);
  const void* FindTyped(const void* tag) const ABSL_LOCKS_EXCLUDED(typed_mu_);

  enum class Change { kAdd, kUpdate, kDelete };
  struct Notice {
    Change change;
    ObjectPtr old_object;
    ObjectPtr object;
  };

  void Run();
  // Lists every page; replaces the cache; returns the notices of what differs.
  [[nodiscard]] absl::Status Relist(std::vector<Notice>* notices) ABSL_LOCKS_EXCLUDED(mu_);
  // Watches until the stream ends or fails; applies events as they come. `progressed`
  // says whether the stream delivered anything (an event or a bookmark) before it ended.
  [[nodiscard]] absl::Status WatchOnce(bool* progressed) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the event's object into the cache (moved, not copied).
  void Apply(WatchEvent event, std::vector<Notice>* notices) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs the handlers for `notices`, then records the cache's version as handled.
  void Notify(const std::vector<Notice>& notices) ABSL_LOCKS_EXCLUDED(mu_);
  void Put(const std::string& key, ObjectPtr object) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Remove(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SleepBackoff(int* failures);
  std::vector<ObjectPtr> Lookup(
      const absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>>& index,
      const std::string& index_key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Client* const client_;
  const InformerOptions options_;
  const Clock* const clock_;
  std::vector<InformerHandler> handlers_;
  std::thread thread_;
  absl::Notification synced_;
  absl::BitGen rng_;  // backoff jitter; used by the informer's thread only

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<Watch> watch_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, ObjectPtr> objects_ ABSL_GUARDED_BY(mu_);
  // "label=value" -> keys, owner uid -> keys.
  absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>> by_label_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>> by_owner_ ABSL_GUARDED_BY(mu_);
  std::string resource_version_ ABSL_GUARDED_BY(mu_);
  std::string handled_resource_version_ ABSL_GUARDED_BY(mu_);
  InformerStats stats_ ABSL_GUARDED_BY(mu_);

  mutable absl::Mutex typed_mu_;
  std::vector<std::pair<const void*, const void*>> typed_ ABSL_GUARDED_BY(typed_mu_);
};

// The options of an informer on every `resource` object of namespace `ns`.
inline InformerOptions NamespaceInformer(const Resource& resource, const std::string& ns) {
  InformerOptions options;
  options.resource = resource;
  options.ns = ns;
  return options;
}

// "namespace/name" (or "name" for cluster-scoped objects): the cache key of an object.
std::string KeyOf(const Json& object);

// The typed objects of an informer's cache (T as `decode` makes them; objects_types.h):
// each object is decoded once per version that someone reads, and the copy answered is
// always of the version the informer's cache holds (an entry is valid while the cache
// holds the very object it was decoded from). Entries go with the informer's deletes.
// The first TypedCache of a T over an informer is found by Over(informer): a reader handed
// only the informer (the Kubernetes runtime, given the Sandbox controller's informer) reads
// the same decoded copies as the informer's owner.
// Thread-safety: Get and Of may be called from any thread. Lifetime: the informer must
// outlive it; construct it before the informer starts (it adds a handler).
template <class T>
class TypedCache {
 public:
  using Ptr = std::shared_ptr<const T>;
  using DecodeFn = absl::StatusOr<T> (*)(const Json&);

  TypedCache(Informer* informer, DecodeFn decode) : informer_(informer), decode_(decode) {
    InformerHandler forget;
    forget.on_delete = [this](const ObjectPtr& o) {
      absl::MutexLock lock(&mu_);
      entries_.erase(KeyOf(*o));
    };
    informer->AddHandler(std::move(forget));
    informer->RegisterTyped(&kTag, this);
  }
  ~TypedCache() { informer_->UnregisterTyped(this); }
  TypedCache(const TypedCache&) = delete;
  TypedCache& operator=(const TypedCache&) = delete;

  // The first TypedCache<T> made over `informer` (and not destroyed), or null.
  static const TypedCache* Over(const Informer* informer) {
    return static_cast<const TypedCache*>(informer->FindTyped(&kTag));
  }

  // The object `ns/name` as the informer's cache holds it, typed; null when the cache does
  // not hold it. INVALID_ARGUMENT (naming the object and field) when it does not decode.
  [[nodiscard]] absl::StatusOr<Ptr> Get(const std::string& ns, const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    ObjectPtr source = informer_->Get(ns, name);
    if (source == nullptr) return Ptr();
    return Typed(ns.empty() ? name : ns + "/" + name, std::move(source));
  }

  // `source` typed: an object the informer holds or held (a handler's argument, an entry of
  // List, ByLabel or ByOwner). The entry's copy when it was decoded from `source`, else
  // decoded now (and kept while the informer's cache holds `source`). INVALID_ARGUMENT
  // (naming the object and field) when it does not decode.
  [[nodiscard]] absl::StatusOr<Ptr> Of(const ObjectPtr& source) const ABSL_LOCKS_EXCLUDED(mu_) {
    return Typed(KeyOf(*source), source);
  }

 private:
  static constexpr size_t kMaxEntries = 1 << 20;
  // The address that tells the caches of T from those of other types (Informer::FindTyped).
  static inline const char kTag = 0;
  struct Entry {
    ObjectPtr source;  // the informer's object it was decoded from
    Ptr typed;
  };

  // `source` (the informer's object of cache key `key`) typed: Get and Of.
  [[nodiscard]] absl::StatusOr<Ptr> Typed(const std::string& key, ObjectPtr source) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(key);
      if (it != entries_.end() && it->second.source == source) return it->second.typed;
    }
    absl::StatusOr<T> decoded = decode_(*source);  // outside the lock: may take a while
    if (!decoded.ok()) return decoded.status();
    Ptr typed = std::make_shared<const T>(*std::move(decoded));
    // Kept only while the informer still holds that version (an object deleted meanwhile
    // must not leave an entry behind; one deleted between this check and the store can, so
    // the map also starts over past a bound, which costs a decode each).
    if (informer_->Get(typed->metadata.Namespace(), typed->metadata.Name()) != source) {
      return typed;
    }
    absl::MutexLock lock(&mu_);
    if (entries_.size() >= kMaxEntries) entries_.clear();
    entries_[key] = Entry{std::move(source), typed};
    return typed;
  }

  Informer* const informer_;
  const DecodeFn decode_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sbx::k8s

#include "src/k8s/informer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "src/k8s/thread_priority.h"

namespace sbx::k8s {
namespace {

const Json& MetadataOf(const Json& object) {
  static const Json kEmpty = Json::object();
  auto it = object.find("metadata");
  return it != object.end() && it->is_object() ? *it : kEmpty;
}

std::string ResourceVersionOf(const Json& object) {
  return MetadataOf(object).value("resourceVersion", std::string());
}

}  // namespace

std::string KeyOf(const Json& object) {
  const Json& meta = MetadataOf(object);
  const std::string ns = meta.value("namespace", std::string());
  const std::string name = meta.value("name", std::string());
  return ns.empty() ? name : absl::StrCat(ns, "/", name);
}

Informer::Informer(Client* client, InformerOptions options)
    : client_(client),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : &Clock::Real()) {}

Informer::~Informer() { Stop(); }

void Informer::AddHandler(InformerHandler handler) { handlers_.push_back(std::move(handler)); }

void Informer::RegisterTyped(const void* tag, const void* cache) {
  absl::MutexLock lock(&typed_mu_);
  for (const auto& [t, c] : typed_) {
    if (t == tag) return;  // the first one of its type is the one found
  }
  typed_.emplace_back(tag, cache);
}

void Informer::UnregisterTyped(const void* cache) {
  absl::MutexLock lock(&typed_mu_);
  std::erase_if(typed_, [cache](const auto& entry) { return entry.second == cache; });
}

const void* Informer::FindTyped(const void* tag) const {
  absl::MutexLock lock(&typed_mu_);
  for (const auto& [t, c] : typed_) {
    if (t == tag) return c;
  }
  return nullptr;
}

void Informer::Start() {
  thread_ = BackgroundThread("sbx-k8s-inform", [this] { Run(); });
}

void Informer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (watch_ != nullptr) watch_->Cancel();
  }
  if (thread_.joinable()) thread_.join();
}

bool Informer::WaitForSync(absl::Duration timeout) const {
  return synced_.WaitForNotificationWithTimeout(timeout);
}

bool Informer::HasSynced() const { return synced_.HasBeenNotified(); }

ObjectPtr Informer::Get(const std::string& ns, const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = objects_.find(ns.empty() ? name : absl::StrCat(ns, "/", name));
  return it == objects_.end() ? nullptr : it->second;
}

std::vector<ObjectPtr> Informer::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<ObjectPtr> out;
  out.reserve(objects_.size());
  for (const auto& [key, object] : objects_) out.push_back(object);
  return out;
}

std::vector<ObjectPtr> Informer::Lookup(
    const absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>>& index,
    const std::string& index_key) const {
  std::vector<ObjectPtr> out;
  auto it = index.find(index_key);
  if (it == index.end()) return out;
  for (const std::string& key : it->second) {
    auto object = objects_.find(key);
    if (object != objects_.end()) out.push_back(object->second);
  }
  return out;
}

std::vector<ObjectPtr> Informer::ByLabel(const std::string& key, const std::string& value) const {
  absl::MutexLock lock(&mu_);
  return Lookup(by_label_, absl::StrCat(key, "=", value));
}

std::vector<ObjectPtr> Informer::ByOwner(const std::string& uid) const {
  absl::MutexLock lock(&mu_);
  return Lookup(by_owner_, uid);
}

size_t Informer::size() const {
  absl::MutexLock lock(&mu_);
  return objects_.size();
}

std::string Informer::ResourceVersion() const {
  absl::MutexLock lock(&mu_);
  return resource_version_;
}

std::string Informer::HandledResourceVersion() const {
  absl::MutexLock lock(&mu_);
  return handled_resource_version_;
}

InformerStats Informer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Informer::Put(const std::string& key, ObjectPtr object) {
  Remove(key);
  const Json& meta = MetadataOf(*object);
  if (auto labels = meta.find("labels"); labels != meta.end() && labels->is_object()) {
    for (const auto& [label, value] : labels->items()) {
      if (value.is_string()) {
        by_label_[absl::StrCat(label, "=", value.get<std::string>())].insert(key);
      }
    }
  }
  if (auto owners = meta.find("ownerReferences"); owners != meta.end() && owners->is_array()) {
    for (const Json& owner : *owners) {
      if (owner.is_object() && owner.contains("uid") && owner["uid"].is_string()) {
        by_owner_[owner["uid"].get<std::string>()].insert(key);
      }
    }
  }
  objects_[key] = std::move(object);
}

void Informer::Remove(const std::string& key) {
  auto it = objects_.find(key);
  if (it == objects_.end()) return;
  auto unindex = [&key](absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>>& index,
                        const std::string& index_key) {
    auto entry = index.find(index_key);
    if (entry == index.end()) return;
    entry->second.erase(key);
    if (entry->second.empty()) index.erase(entry);
  };
  const Json& meta = MetadataOf(*it->second);
  if (auto labels = meta.find("labels"); labels != meta.end() && labels->is_object()) {
    for (const auto& [label, value] : labels->items()) {
      if (value.is_string()) unindex(by_label_, absl::StrCat(label, "=", value.get<std::string>()));
    }
  }
  if (auto owners = meta.find("ownerReferences"); owners != meta.end() && owners->is_array()) {
    for (const Json& owner : *owners) {
      if (owner.is_object() && owner.contains("uid") && owner["uid"].is_string()) {
        unindex(by_owner_, owner["uid"].get<std::string>());
      }
    }
  }
  objects_.erase(it);
}

absl::Status Informer::Relist(std::vector<Notice>* notices) {
  ListOptions list;
  list.label_selector = options_.label_selector;
  list.field_selector = options_.field_selector;
  list.limit = options_.page_size;
  std::string version;
  absl::StatusOr<std::vector<Json>> items =
      client_->ListAll(options_.resource, options_.ns, list, &version);
  absl::MutexLock lock(&mu_);
  ++stats_.lists;
  if (!items.ok()) return items.status();
  absl::flat_hash_set<std::string> seen;
  for (Json& item : *items) {
    const std::string key = KeyOf(item);
    seen.insert(key);
    auto fresh = std::make_shared<const Json>(std::move(item));
    auto old = objects_.find(key);
    if (old == objects_.end()) {
      notices->push_back({Change::kAdd, nullptr, fresh});
    } else if (ResourceVersionOf(*old->second) != ResourceVersionOf(*fresh)) {
      notices->push_back({Change::kUpdate, old->second, fresh});
    } else {
      continue;  // unchanged: keep the cached object (and its identity)
    }
    Put(key, std::move(fresh));
  }
  std::vector<std::string> gone;
  for (const auto& [key, object] : objects_) {
    if (!seen.contains(key)) gone.push_back(key);
  }
  for (const std::string& key : gone) {
    notices->push_back({Change::kDelete, nullptr, objects_[key]});
    Remove(key);
  }
  resource_version_ = version;
  return absl::OkStatus();
}

void Informer::Apply(WatchEvent event, std::vector<Notice>* notices) {
  absl::MutexLock lock(&mu_);
  const std::string version = ResourceVersionOf(event.object);
  if (!version.empty()) resource_version_ = version;
  if (event.type == WatchEvent::Type::kBookmark) return;
  ++stats_.events;
  const std::string key = KeyOf(event.object);
  auto old = objects_.find(key);
  ObjectPtr previous = old == objects_.end() ? nullptr : old->second;
  if (event.type == WatchEvent::Type::kDeleted) {
    if (previous == nullptr) return;
    Remove(key);
    notices->push_back(
        {Change::kDelete, nullptr, std::make_shared<const Json>(std::move(event.object))});
    return;
  }
  if (previous != nullptr && ResourceVersionOf(*previous) == version) return;
  auto fresh = std::make_shared<const Json>(std::move(event.object));
  Put(key, fresh);
  if (previous == nullptr) {
    notices->push_back({Change::kAdd, nullptr, std::move(fresh)});
  } else {
    notices->push_back({Change::kUpdate, std::move(previous), std::move(fresh)});
  }
}

void Informer::Notify(const std::vector<Notice>& notices) {
  for (const Notice& notice : notices) {
    for (const InformerHandler& handler : handlers_) {
      switch (notice.change) {
        case Change::kAdd:
          if (handler.on_add) handler.on_add(notice.object);
          break;
        case Change::kUpdate:
          if (handler.on_update) handler.on_update(notice.old_object, notice.object);
          break;
        case Change::kDelete:
          if (handler.on_delete) handler.on_delete(notice.object);
          break;
      }
    }
  }
  // Only this thread changes resource_version_ (in Relist and Apply), so the version read
  // after the handlers is the one of the list or event they were told about.
  absl::MutexLock lock(&mu_);
  handled_resource_version_ = resource_version_;
}

absl::Status Informer::WatchOnce(bool* progressed) {
  *progressed = false;
  WatchOptions options;
  options.label_selector = options_.label_selector;
  options.field_selector = options_.field_selector;
  options.resource_version = ResourceVersion();
  options.allow_bookmarks = true;
  options.timeout = options_.watch_timeout;
  absl::StatusOr<std::unique_ptr<Watch>> watch =
      client_->StartWatch(options_.resource, options_.ns, options);
  if (!watch.ok()) return watch.status();
  {
    absl::MutexLock lock(&mu_);
    ++stats_.watches;
    if (stopping_) return absl::CancelledError("informer stopping");
    watch_ = *std::move(watch);
  }
  // The stream is read without the lock; Stop cancels it through watch_ under the lock,
  // and watch_ is only reset here, under the lock, so Cancel never meets a dead stream.
  Watch* stream;
  {
    absl::MutexLock lock(&mu_);
    stream = watch_.get();
  }
  absl::Status result = absl::OkStatus();
  int64_t events = 0;
  const absl::Time start = clock_->Now();
  while (true) {
    WatchEvent event;
    absl::StatusOr<bool> more = stream->Next(&event);
    if (!more.ok()) {
      result = more.status();
      break;
    }
    if (!*more) break;
    ++events;
    *progressed = true;
    std::vector<Notice> notices;
    Apply(std::move(event), &notices);
    Notify(notices);
  }
  std::unique_ptr<Watch> done;
  {
    absl::MutexLock lock(&mu_);
    done = std::move(watch_);
  }
  if (result.ok() && events == 0 && clock_->Now() - start < absl::Seconds(1)) {
    // A stream that ends at once with nothing in it is a fault, not a timeout; back off
    // instead of spinning.
    return absl::UnavailableError("watch ended at once without events");
  }
  return result;
}

bool Informer::SleepBackoff(int* failures) {
  absl::Duration cap = options_.initial_backoff * (int64_t{1} << std::min(*failures, 20));
  cap = std::min(cap, options_.max_backoff);
  ++*failures;
  const absl::Duration delay = cap * absl::Uniform(rng_, 0.5, 1.0);
  absl::MutexLock lock(&mu_);
  clock_->AwaitUntil(mu_, &stopping_, clock_->Now() + delay);
  return !stopping_;
}

void Informer::Run() {
  const std::string& resource = options_.resource.resource;
  int failures = 0;
  int expired_in_a_row = 0;
  bool need_list = true;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (need_list) {
      std::vector<Notice> notices;
      absl::Status listed = Relist(&notices);
      if (!listed.ok()) {
        {
          absl::MutexLock lock(&mu_);
          ++stats_.errors;
        }
        spdlog::warn("informer {}: list failed (retrying): {}", resource, listed.ToString());
        if (!SleepBackoff(&failures)) return;
        continue;
      }
      need_list = false;
      if (!synced_.HasBeenNotified()) synced_.Notify();
      Notify(notices);
    }
    bool progressed = false;
    absl::Status watched = WatchOnce(&progressed);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (progressed) {
      // The stream worked before it ended: whatever failed before is over. Without this
      // reset, watch drops (each after some events) would add up to the maximum backoff
      // and the cache would fall seconds behind at every drop (issue 23).
      failures = 0;
      expired_in_a_row = 0;
    }
    if (watched.ok()) {
      failures = 0;
      client_->RecordWatchRestart(options_.resource, "end");
      continue;
    }
    if (absl::IsOutOfRange(watched)) {
      {
        absl::MutexLock lock(&mu_);
        ++stats_.expired;
      }
      client_->RecordWatchRestart(options_.resource, "expired");
      need_list = true;
      // A fresh list's version should not be too old; if it is again at once, the server
      // is in trouble: back off rather than list in a tight loop.
      if (expired_in_a_row++ > 0 && !SleepBackoff(&failures)) return;
      continue;
    }
    expired_in_a_row = 0;
    {
      absl::MutexLock lock(&mu_);
      ++stats_.errors;
    }
    client_->RecordWatchRestart(options_.resource, "error");
    spdlog::debug("informer {}: watch failed (resuming): {}", resource, watched.ToString());
    // A stream that broke after delivering events is resumed at once, from where it
    // stopped: the server answered, and every pause here is time the cache lags. Only a
    // watch that fails with nothing to show backs off, longer each time.
    if (progressed) continue;
    if (!SleepBackoff(&failures)) return;
  }
}

}  // namespace sbx::k8s

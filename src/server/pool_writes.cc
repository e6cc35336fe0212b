#include "src/server/pool_writes.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace sbx::server {

std::shared_ptr<PoolWrites> PoolWrites::Create(allocator::Allocator* allocator, std::string what) {
  return std::shared_ptr<PoolWrites>(new PoolWrites(allocator, std::move(what)));
}

bool PoolWrites::Join(const std::string& name, Done done) {
  absl::MutexLock lock(&mu_);
  auto [it, first] = flights_.try_emplace(name);
  it->second.push_back(std::move(done));
  return first;
}

void PoolWrites::Write(std::optional<store::TemplateRecord> t, store::PoolRecord p) {
  if (!t.has_value()) return WritePool(std::move(p));
  const std::string name = p.name;
  allocator_->PutTemplate(
      *std::move(t), [self = shared_from_this(), name, p = std::move(p)](absl::Status s) mutable {
        if (!s.ok()) return self->Finish(name, s);
        self->WritePool(std::move(p));
      });
}

void PoolWrites::WritePool(store::PoolRecord p) {
  const std::string name = p.name;
  if (allocator_->GetPool(name).ok()) return Finish(name, absl::OkStatus());
  allocator_->PutPool(std::move(p),
                      [self = shared_from_this(), name](absl::Status s) { self->Finish(name, s); });
}

void PoolWrites::Finish(const std::string& name, const absl::Status& result) {
  std::vector<Done> waiting;
  {
    absl::MutexLock lock(&mu_);
    auto it = flights_.find(name);
    if (it == flights_.end()) return;
    waiting = std::move(it->second);
    flights_.erase(it);
  }
  absl::Status s = result;
  if (!s.ok()) {
    s = absl::Status(s.code(), absl::StrCat("making ", what_, " \"", name, "\": ", s.message()));
  }
  for (Done& done : waiting) std::move(done)(s);
}

}  // namespace sbx::server

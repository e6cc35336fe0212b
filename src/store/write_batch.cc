// WriteBatch, Store::CommitAndWait and the batch checks every Store runs.

#include <string>
#include <utility>
#include <variant>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "src/store/batch_check.h"
#include "src/store/store.h"

namespace sbx::store {
namespace {

// The name or id a record carries, and the kind it belongs to.
struct Identity {
  Mutation::Kind kind;
  std::string key;
};

Identity IdentityOf(const TemplateRecord& r) { return {Mutation::Kind::kTemplate, r.name}; }
Identity IdentityOf(const PoolRecord& r) { return {Mutation::Kind::kPool, r.name}; }
Identity IdentityOf(const SandboxRecord& r) { return {Mutation::Kind::kSandbox, r.id}; }
Identity IdentityOf(const ClaimRecord& r) {
  return {Mutation::Kind::kClaim, ClaimKey(r.owner, r.id)};
}
Identity IdentityOf(const SnapshotRecord& r) { return {Mutation::Kind::kSnapshot, r.id}; }
Identity IdentityOf(const RevisionRecord&) {
  return {Mutation::Kind::kRevision, std::string(kRevisionRecordKey)};
}

}  // namespace

void WriteBatch::Put(TemplateRecord r) {
  std::string key = r.name;
  mutations_.push_back({Mutation::Kind::kTemplate, std::move(key), std::move(r)});
}

void WriteBatch::Put(PoolRecord r) {
  std::string key = r.name;
  mutations_.push_back({Mutation::Kind::kPool, std::move(key), std::move(r)});
}

void WriteBatch::Put(SandboxRecord r) {
  std::string key = r.id;
  mutations_.push_back({Mutation::Kind::kSandbox, std::move(key), std::move(r)});
}

void WriteBatch::Put(ClaimRecord r) {
  std::string key = ClaimKey(r.owner, r.id);
  mutations_.push_back({Mutation::Kind::kClaim, std::move(key), std::move(r)});
}

void WriteBatch::Put(RevisionRecord r) {
  mutations_.push_back({Mutation::Kind::kRevision, std::string(kRevisionRecordKey), r});
}

void WriteBatch::Put(SnapshotRecord r) {
  std::string key = r.id;
  mutations_.push_back({Mutation::Kind::kSnapshot, std::move(key), std::move(r)});
}

void WriteBatch::DeleteSnapshot(std::string id) {
  mutations_.push_back({Mutation::Kind::kSnapshot, std::move(id), std::monostate{}});
}

void WriteBatch::DeleteTemplate(std::string name) {
  mutations_.push_back({Mutation::Kind::kTemplate, std::move(name), std::monostate{}});
}

void WriteBatch::DeletePool(std::string name) {
  mutations_.push_back({Mutation::Kind::kPool, std::move(name), std::monostate{}});
}

void WriteBatch::DeleteSandbox(std::string id) {
  mutations_.push_back({Mutation::Kind::kSandbox, std::move(id), std::monostate{}});
}

void WriteBatch::DeleteClaim(absl::string_view owner, absl::string_view id) {
  mutations_.push_back({Mutation::Kind::kClaim, ClaimKey(owner, id), std::monostate{}});
}

const char* KindName(Mutation::Kind kind) {
  switch (kind) {
    case Mutation::Kind::kTemplate:
      return "template";
    case Mutation::Kind::kPool:
      return "pool";
    case Mutation::Kind::kSandbox:
      return "sandbox";
    case Mutation::Kind::kClaim:
      return "claim";
    case Mutation::Kind::kRevision:
      return "revision";
    case Mutation::Kind::kSnapshot:
      return "snapshot";
  }
  return "unknown kind";
}

absl::Status CheckBatch(const WriteBatch& batch) {
  const std::vector<Mutation>& mutations = batch.mutations();
  for (size_t i = 0; i < mutations.size(); ++i) {
    const Mutation& m = mutations[i];
    const char* kind = KindName(m.kind);
    if (m.kind != Mutation::Kind::kTemplate && m.kind != Mutation::Kind::kPool &&
        m.kind != Mutation::Kind::kSandbox && m.kind != Mutation::Kind::kClaim &&
        m.kind != Mutation::Kind::kRevision && m.kind != Mutation::Kind::kSnapshot) {
      return absl::InvalidArgumentError(
          absl::StrCat("mutation ", i, ": unknown kind ", static_cast<int>(m.kind)));
    }
    if (m.key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("mutation ", i, ": empty ", kind, " key"));
    }
    if (std::holds_alternative<std::monostate>(m.record)) continue;
    const Identity id = std::visit(
        [](const auto& r) -> Identity {
          if constexpr (std::is_same_v<std::decay_t<decltype(r)>, std::monostate>) {
            return {};  // unreachable: deletes were skipped above
          } else {
            return IdentityOf(r);
          }
        },
        m.record);
    if (id.kind != m.kind) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mutation ", i, ": a ", kind, " mutation carries a ", KindName(id.kind), " record"));
    }
    // A claim's key is never empty ("<owner>/"), so check its id: a claim stored under a key
    // with no id after the owner could not be loaded again.
    if (m.kind == Mutation::Kind::kClaim && std::get<ClaimRecord>(m.record).id.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("mutation ", i, ": empty claim id"));
    }
    // An owner with a '/' would make keys ambiguous: ("a/b", "c") and ("a", "b/c").
    if (m.kind == Mutation::Kind::kClaim &&
        std::get<ClaimRecord>(m.record).owner.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("mutation ", i, ": claim owner \"",
                       absl::CHexEscape(std::get<ClaimRecord>(m.record).owner), "\" contains '/'"));
    }
    if (id.key != m.key) {
      return absl::InvalidArgumentError(
          absl::StrCat("mutation ", i, ": key \"", absl::CHexEscape(m.key), "\" differs from the ",
                       kind, "'s own name or id \"", absl::CHexEscape(id.key), "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status Store::CommitAndWait(WriteBatch batch) {
  absl::Notification done;
  absl::Status result;
  Commit(std::move(batch), [&](absl::Status s) {
    result = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

}  // namespace sbx::store

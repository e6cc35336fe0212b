#pragma once
// Checks shared by the Store implementations before they accept a WriteBatch. Internal to
// src/store/.

#include "absl/status/status.h"
#include "src/store/store.h"

namespace sbx::store {

// OK if every mutation of `batch` is well formed: a non-empty key, and for a put a record
// of the mutation's kind whose name or id equals the key (for a claim: ClaimKey(owner,
// id), with a non-empty id and an owner without '/'). Otherwise INVALID_ARGUMENT naming
// the mutation's index and what is wrong. A batch that fails this check is applied by no
// store, not even in part.
[[nodiscard]] absl::Status CheckBatch(const WriteBatch& batch);

// "template", "pool", "sandbox" or "claim".
const char* KindName(Mutation::Kind kind);

}  // namespace sbx::store

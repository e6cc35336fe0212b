#pragma once
// RETURN_IF_ERROR and ASSIGN_OR_RETURN for absl::Status / absl::StatusOr.
// abseil 20220623 ships no status macros, so sbx defines the two it uses.

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SBX_STATUS_CONCAT_INNER(a, b) a##b
#define SBX_STATUS_CONCAT(a, b) SBX_STATUS_CONCAT_INNER(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function if not OK.
#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::absl::Status sbx_status_ = (expr);       \
    if (!sbx_status_.ok()) return sbx_status_; \
  } while (false)

// `ASSIGN_OR_RETURN(lhs, expr)`: evaluates `expr` (an absl::StatusOr<T>); on error returns
// its status, otherwise moves the value into `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, expr) \
  SBX_ASSIGN_OR_RETURN_IMPL(SBX_STATUS_CONCAT(sbx_statusor_, __LINE__), lhs, expr)

// `lhs` may be a declaration (`auto x`): it cannot be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define SBX_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr)     \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()
// NOLINTEND(bugprone-macro-parentheses)

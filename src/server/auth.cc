#include "src/server/auth.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "src/allocator/allocator.h"
#include "src/common/errno_text.h"
#include "src/common/ids.h"

namespace sbx::server {

absl::Status AuthOptions::Validate() const {
  if (tokens_file.empty() && !insecure_no_auth) {
    return absl::InvalidArgumentError(
        "authentication needs a tokens file (tokens_file), or insecure_no_auth for a local "
        "single-user server");
  }
  if (!tokens_file.empty() && insecure_no_auth) {
    return absl::InvalidArgumentError(absl::StrCat("tokens_file \"", tokens_file,
                                                   "\" and insecure_no_auth are both set; "
                                                   "choose one"));
  }
  return absl::OkStatus();
}

bool MayClaimFrom(const Caller& caller, absl::string_view ns) {
  const std::vector<std::string>& allowed = caller.limits.namespaces;
  return caller.admin || allowed.empty() || std::binary_search(allowed.begin(), allowed.end(), ns);
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(const AuthOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;
  std::unique_ptr<Authenticator> auth(new Authenticator(options));
  if (!options.insecure_no_auth) {
    absl::StatusOr<std::shared_ptr<const Table>> table = Load(options.tokens_file);
    if (!table.ok()) return table.status();
    absl::MutexLock lock(&auth->mu_);
    auth->table_ = std::move(*table);
  }
  return auth;
}

absl::StatusOr<std::shared_ptr<const Authenticator::Table>> Authenticator::Load(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    const std::string why = absl::StrCat("cannot read tokens file \"", path,
                                         "\": ", err != 0 ? sbx::ErrnoText(err) : "open failed");
    if (err == ENOENT) return absl::NotFoundError(why);
    if (err == EACCES) return absl::PermissionDeniedError(why);
    return absl::InternalError(why);
  }
  auto table = std::make_shared<Table>();
  // Tenant -> its limits and the line that first named it.
  absl::flat_hash_map<std::string, std::pair<TenantLimits, int>> limits_of;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const absl::string_view text = absl::StripAsciiWhitespace(line);
    if (text.empty() || text[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(text, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", lineno, ": ", why));
    };
    if (fields.size() < 2) {
      return bad(
          absl::StrCat("want \"<token> <tenant> [admin] [claim_rate=R] [claim_burst=B] "
                       "[max_claims=N] [weight=W] [namespaces=N1,N2] [image_claim_rate=R] "
                       "[image_claim_burst=B] [image_cache_bytes=N]\", got ",
                       fields.size(), " field(s)"));
    }
    Caller caller;
    caller.tenant = std::string(fields[1]);
    if (absl::Status s = ValidateKey("tenant", caller.tenant); !s.ok()) return bad(s.message());
    if (IsKubeClaimOwner(caller.tenant)) {
      return bad(absl::StrCat("tenant \"", caller.tenant, "\" starts with \"",
                              kKubeClaimOwnerPrefix,
                              "\", which is reserved for the owners of the Kubernetes claim "
                              "controller's claims (\"",
                              kKubeClaimOwnerPrefix, "<namespace>\"); choose another name"));
    }
    bool burst_set = false;
    bool image_burst_set = false;
    for (size_t i = 2; i < fields.size(); ++i) {
      const absl::string_view field = fields[i];
      if (field == "admin" && i == 2) {
        caller.admin = true;
        continue;
      }
      const size_t eq = field.find('=');
      const absl::string_view key = field.substr(0, eq);
      const absl::string_view value = eq == absl::string_view::npos ? "" : field.substr(eq + 1);
      if (key == "claim_rate") {
        double rate = 0;
        if (!absl::SimpleAtod(value, &rate) || !(rate > 0) || rate > 1e9) {
          return bad(absl::StrCat("claim_rate \"", value,
                                  "\" is not a number of claims per second above 0"));
        }
        caller.limits.claim_rate = rate;
      } else if (key == "claim_burst") {
        int burst = 0;
        if (!absl::SimpleAtoi(value, &burst) || burst < 1) {
          return bad(absl::StrCat("claim_burst \"", value, "\" is not a whole number above 0"));
        }
        caller.limits.claim_burst = burst;
        burst_set = true;
      } else if (key == "max_claims") {
        int64_t max = 0;
        if (!absl::SimpleAtoi(value, &max) || max < 1) {
          return bad(absl::StrCat("max_claims \"", value, "\" is not a whole number above 0"));
        }
        caller.limits.max_claims = max;
      } else if (key == "weight") {
        int weight = 0;
        if (!absl::SimpleAtoi(value, &weight) || weight < 1 || weight > allocator::kMaxWeight) {
          return bad(absl::StrCat("weight \"", value, "\" is not a whole number in 1..",
                                  allocator::kMaxWeight));
        }
        caller.limits.weight = weight;
      } else if (key == "namespaces") {
        std::vector<std::string>& namespaces = caller.limits.namespaces;
        for (absl::string_view ns : absl::StrSplit(value, ',')) {
          if (absl::Status s = ValidateName("namespaces: namespace", ns); !s.ok()) {
            return bad(s.message());
          }
          namespaces.emplace_back(ns);
        }
        std::sort(namespaces.begin(), namespaces.end());
        namespaces.erase(std::unique(namespaces.begin(), namespaces.end()), namespaces.end());
      } else if (key == "image_claim_rate") {
        double rate = 0;
        if (!absl::SimpleAtod(value, &rate) || !(rate > 0) || rate > 1e9) {
          return bad(absl::StrCat("image_claim_rate \"", value,
                                  "\" is not a number of claims per second above 0"));
        }
        caller.limits.image_claim_rate = rate;
      } else if (key == "image_claim_burst") {
        int burst = 0;
        if (!absl::SimpleAtoi(value, &burst) || burst < 1) {
          return bad(
              absl::StrCat("image_claim_burst \"", value, "\" is not a whole number above 0"));
        }
        caller.limits.image_claim_burst = burst;
        image_burst_set = true;
      } else if (key == "image_cache_bytes") {
        int64_t bytes = 0;
        if (!absl::SimpleAtoi(value, &bytes) || bytes < 1) {
          return bad(absl::StrCat("image_cache_bytes \"", value,
                                  "\" is not a whole number of bytes above 0"));
        }
        caller.limits.image_cache_bytes = bytes;
      } else {
        return bad(
            absl::StrCat("field \"", field,
                         "\" is none of admin (third field only), claim_rate=R, claim_burst=B, "
                         "max_claims=N, weight=W, namespaces=N1,N2, image_claim_rate=R, "
                         "image_claim_burst=B, image_cache_bytes=N"));
      }
    }
    if (burst_set && caller.limits.claim_rate == 0) {
      return bad("claim_burst without claim_rate");
    }
    if (caller.limits.claim_rate > 0 && !burst_set) {
      caller.limits.claim_burst =
          std::max(1, static_cast<int>(std::ceil(caller.limits.claim_rate)));
    }
    if (image_burst_set && caller.limits.image_claim_rate == 0) {
      return bad("image_claim_burst without image_claim_rate");
    }
    if (caller.limits.image_claim_rate > 0 && !image_burst_set) {
      caller.limits.image_claim_burst =
          std::max(1, static_cast<int>(std::ceil(caller.limits.image_claim_rate)));
    }
    // One tenant, one set of limits: the first line that names the tenant decides what
    // every other line of it must say (none, or the same).
    if (auto [it, first] = limits_of.try_emplace(caller.tenant, caller.limits, lineno); !first) {
      if (!(it->second.first == caller.limits)) {
        return bad(absl::StrCat("tenant \"", caller.tenant, "\" has other limits on line ",
                                it->second.second,
                                "; limits belong to the tenant, so every "
                                "line of it must give the same"));
      }
    }
    if (!table->emplace(std::string(fields[0]), std::move(caller)).second) {
      return bad("token appears twice (tokens must be unique)");
    }
  }
  if (in.bad())
    return absl::InternalError(absl::StrCat("error reading tokens file \"", path, "\""));
  return std::shared_ptr<const Table>(std::move(table));
}

absl::StatusOr<Caller> Authenticator::Authenticate(
    std::optional<absl::string_view> authorization) const {
  if (options_.insecure_no_auth) return Caller{std::string(kAnonymousTenant), true, {}};
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError(
        "missing \"authorization: Bearer <token>\" metadata (this server has auth enabled)");
  }
  absl::string_view value = absl::StripAsciiWhitespace(*authorization);
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWithIgnoreCase(value, kBearer)) {
    return absl::UnauthenticatedError(
        "\"authorization\" metadata is not of the form \"Bearer <token>\"");
  }
  const absl::string_view token = absl::StripAsciiWhitespace(value.substr(kBearer.size()));
  std::shared_ptr<const Table> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  if (table != nullptr) {
    auto it = table->find(token);
    if (it != table->end()) return it->second;
  }
  // The token itself is never echoed: it is a secret, even when wrong.
  return absl::UnauthenticatedError("unknown bearer token");
}

std::optional<std::string> Authenticator::BearerOf(absl::string_view tenant) const {
  if (options_.insecure_no_auth) return std::string();
  std::shared_ptr<const Table> table;
  {
    absl::MutexLock lock(&mu_);
    table = table_;
  }
  const std::string* best = nullptr;
  if (table != nullptr) {
    for (const auto& [token, caller] : *table) {
      if (caller.tenant == tenant && (best == nullptr || token < *best)) best = &token;
    }
  }
  if (best == nullptr) return std::nullopt;
  return absl::StrCat("Bearer ", *best);
}

absl::Status Authenticator::Reload() {
  if (options_.insecure_no_auth) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<const Table>> table = Load(options_.tokens_file);
  if (!table.ok()) return table.status();
  absl::MutexLock lock(&mu_);
  table_ = std::move(*table);
  return absl::OkStatus();
}

size_t Authenticator::size() const {
  absl::MutexLock lock(&mu_);
  return table_ == nullptr ? 0 : table_->size();
}

}  // namespace sbx::server

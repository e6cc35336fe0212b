#pragma once
// E2B's control plane (REST, spec/openapi.yml of e2b-dev/infra) on sbx's ClaimService,
// SandboxService and Snapshots. Internal to src/gateway/e2b; e2b.h says what maps onto what.
//
// Thread-safety: Handle may be called concurrently (the stubs are thread-safe).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "sbx/v1/claims.grpc.pb.h"
#include "sbx/v1/sandboxes.grpc.pb.h"
#include "sbx/v1/snapshots.grpc.pb.h"
#include "src/gateway/e2b/e2b.h"
#include "src/gateway/e2b/http.h"

namespace sbx::e2b {

// The HTTP status E2B answers for what a gRPC status code means.
int HttpStatusOf(grpc::StatusCode code);

// E2B's error body {"code": status, "message": message}.
void RespondError(HttpResponder& out, int status, absl::string_view message);

// Percent-decodes `in` ('+' as a space when `plus_is_space`); nullopt for a malformed
// escape.
std::optional<std::string> PercentDecode(absl::string_view in, bool plus_is_space);

// The value of query parameter `name` (decoded), if present. nullopt also for a malformed
// escape in it.
std::optional<std::string> QueryParam(absl::string_view query, absl::string_view name);

// The gRPC context of a call made for `req`: its X-API-Key (or an Authorization: Bearer
// header) as the sbx bearer token, and `timeout` as the deadline.
void PrepareContext(const HttpRequest& req, absl::Duration timeout, grpc::ClientContext* ctx);

class ControlPlane {
 public:
  ControlPlane(FrontOptions options, FrontDeps deps);

  // Answers a control-plane request (anything not addressed to a sandbox).
  void Handle(const HttpRequest& req, HttpResponder& out);

 private:
  void Create(const HttpRequest& req, HttpResponder& out);
  void List(const HttpRequest& req, HttpResponder& out, bool v2);
  void Get(const HttpRequest& req, HttpResponder& out, const std::string& id);
  void Kill(const HttpRequest& req, HttpResponder& out, const std::string& id);
  void SetTimeout(const HttpRequest& req, HttpResponder& out, const std::string& id);
  void Pause(const HttpRequest& req, HttpResponder& out, const std::string& id);
  void Connect(const HttpRequest& req, HttpResponder& out, const std::string& id);
  // Snapshots: POST /sandboxes/{id}/snapshots, GET /snapshots, DELETE /templates/{id} of a
  // snapshot id.
  void CreateSnapshot(const HttpRequest& req, HttpResponder& out, const std::string& id);
  void ListSnapshots(const HttpRequest& req, HttpResponder& out);
  void DeleteSnapshot(const HttpRequest& req, HttpResponder& out, const std::string& id);
  // Whether `claim`'s pool names one of the caller's snapshots (Sandbox.create(snapshotId)):
  // then answers with a fork of it (sbx's Fork, count 1, with the claim's ttl, labels and
  // env) and returns true, as when asking failed; false to go on with a pool of that name.
  bool CreateFromSnapshot(const HttpRequest& req, HttpResponder& out,
                          const v1::ClaimRequest& claim);
  // POST /sandboxes/{id}/fork: sbx's Fork of the claim, `count` forks.
  void Fork(const HttpRequest& req, HttpResponder& out, const std::string& id);
  // Calls Fork with a batch id of the front's (E2bSandboxId); on failure answers the
  // error and returns false.
  bool RunFork(const HttpRequest& req, HttpResponder& out, v1::ForkRequest fork,
               std::vector<v1::Claim>* forks);

  // GetClaim of an ACTIVE claim; else answers 404 (or the error) and returns nullopt.
  std::optional<v1::Claim> ActiveClaim(const HttpRequest& req, HttpResponder& out,
                                       const std::string& id);

  const FrontOptions options_;
  const FrontDeps deps_;
  std::unique_ptr<v1::ClaimService::Stub> claims_;
  std::unique_ptr<v1::SandboxService::Stub> sandboxes_;
  std::unique_ptr<v1::Snapshots::Stub> snapshots_;
};

}  // namespace sbx::e2b

#include "src/server/server.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "spdlog/spdlog.h"
#include "src/server/diagnostics_service.h"
#include "src/server/pending_services.h"

namespace sbx::server {
namespace {

absl::Status WritePortFile(const std::string& path, int port) {
  const std::string tmp = absl::StrCat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write port file \"", tmp, "\""));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename \"", tmp, "\" to \"", path, "\""));
  }
  return absl::OkStatus();
}

class GrpcServer final : public Server {
 public:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port,
             std::unique_ptr<DiagnosticsService> diagnostics,
             std::unique_ptr<PendingServices> pending)
      : server_(std::move(server)),
        port_(port),
        diagnostics_(std::move(diagnostics)),
        pending_(std::move(pending)) {}

  ~GrpcServer() override { Shutdown(absl::ZeroDuration()); }

  int port() const override { return port_; }

  void Shutdown(absl::Duration grace) override {
    // Atomic so that concurrent Shutdown calls (signal thread, destructor) run it once;
    // acq_rel orders the shutdown after whatever the winning caller did before.
    if (shut_down_.exchange(true, std::memory_order_acq_rel)) return;
    if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
    const auto deadline = std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace);
    server_->Shutdown(deadline);
    server_->Wait();
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  const int port_;
  // Services must outlive server_; they are destroyed after it (members in reverse order).
  std::unique_ptr<DiagnosticsService> diagnostics_;
  std::unique_ptr<PendingServices> pending_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace

absl::Status ServerOptions::Validate() const {
  const size_t colon = listen.rfind(':');
  int port = 0;
  if (listen.empty() || colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(listen).substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address \"", listen, "\" is not host:port with a port from 0 to 65535"));
  }
  if (max_receive_message_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_receive_message_bytes ", max_receive_message_bytes, " is below the minimum of 1024"));
  }
  if (max_send_message_bytes < 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_send_message_bytes ", max_send_message_bytes, " is below the minimum of 1024"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return s;

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  auto diagnostics = std::make_unique<DiagnosticsService>();
  auto pending = std::make_unique<PendingServices>();

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options.max_send_message_bytes);
  builder.RegisterService(diagnostics.get());
  pending->RegisterWith(builder);

  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on \"", options.listen,
                     "\" (address in use, not local, or not resolvable)"));
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  auto result = std::make_unique<GrpcServer>(std::move(server), port, std::move(diagnostics),
                                             std::move(pending));
  if (!options.port_file.empty()) {
    if (absl::Status s = WritePortFile(options.port_file, port); !s.ok()) return s;
  }
  spdlog::info("sbx-server serving on port {} (listen \"{}\")", port, options.listen);
  return result;
}

}  // namespace sbx::server

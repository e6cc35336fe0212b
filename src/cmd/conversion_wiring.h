#pragma once
// The CRD conversion webhook of sbx-server (src/k8s/conversion_webhook.h): its flags, and
// starting it; with --conversion_webhook_service and --conversion_webhook_ca_file, the
// agents.x-k8s.io CRDs are pointed at it first (src/k8s/crd_conversion.h).
//
// Every replica serves it, leader or standby: conversion is a pure function.

#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "src/k8s/client.h"
#include "src/k8s/conversion_webhook.h"

namespace sbx::cmd {

struct ConversionFlags {
  sbx::k8s::ConversionWebhookOptions webhook;  // webhook.listen "" = no webhook
  // "NAMESPACE/NAME[:PORT]" of the webhook's Service and the PEM file of the CA that signed
  // its certificate: written into the CRDs' spec.conversion at start.
  std::string service;
  std::string ca_file;
};

void AddConversionFlags(CLI::App& app, ConversionFlags* flags);

// The webhook, or null when no --conversion_webhook_listen is given. `kube` (may be null
// when no cluster is configured) writes the CRDs' conversion first when the flags ask for
// it. Errors name the flag, file or CRD at fault; the server should stop on them.
[[nodiscard]] absl::StatusOr<std::unique_ptr<sbx::k8s::ConversionWebhook>> StartConversion(
    const ConversionFlags& flags, sbx::k8s::Client* kube, prometheus::Registry* registry);

}  // namespace sbx::cmd

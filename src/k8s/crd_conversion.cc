#include "src/k8s/crd_conversion.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "src/k8s/json_fields.h"
#include "src/k8s/resources.h"

namespace sbx::k8s {

absl::Status CrdConversionOptions::Validate() const {
  if (service_namespace.empty() || service_name.empty()) {
    return absl::InvalidArgumentError(
        "conversion webhook: the Service's namespace and name are required");
  }
  if (service_port <= 0 || service_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("conversion webhook: Service port ", service_port, " is not 1-65535"));
  }
  if (!absl::StartsWith(path, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("conversion webhook: path \"", path, "\" does not start with /"));
  }
  if (!absl::StrContains(ca_bundle_pem, "-----BEGIN CERTIFICATE-----")) {
    return absl::InvalidArgumentError("conversion webhook: the CA bundle holds no PEM certificate");
  }
  return absl::OkStatus();
}

Json CrdConversionPatch(const CrdConversionOptions& options) {
  Json service = {{"namespace", options.service_namespace},
                  {"name", options.service_name},
                  {"path", options.path},
                  {"port", options.service_port}};
  Json webhook = {
      {"conversionReviewVersions", Json::array({"v1"})},
      {"clientConfig",
       {{"service", service}, {"caBundle", absl::Base64Escape(options.ca_bundle_pem)}}}};
  return Json{{"spec", {{"conversion", {{"strategy", "Webhook"}, {"webhook", webhook}}}}}};
}

namespace {

// The patch that also removes a clientConfig.url (a CRD names a url or a service).
Json WithoutUrl(Json patch) {
  patch["spec"]["conversion"]["webhook"]["clientConfig"]["url"] = nullptr;
  return patch;
}

}  // namespace

absl::Status PointCrdsAtWebhook(Client& client, const CrdConversionOptions& options) {
  if (absl::Status valid = options.Validate(); !valid.ok()) return valid;
  const Json patch = CrdConversionPatch(options);
  const Json& want = patch["spec"]["conversion"];
  for (const char* name : kConvertedCrds) {
    absl::StatusOr<Json> crd = client.Get(kCustomResourceDefinitions, "", name);
    if (!crd.ok()) {
      return absl::Status(crd.status().code(), absl::StrCat("CustomResourceDefinition ", name, ": ",
                                                            crd.status().message()));
    }
    const Json& have = json_fields::Field(json_fields::Field(*crd, "spec"), "conversion");
    const Json& have_webhook = json_fields::Field(have, "webhook");
    if (json_fields::Str(have, "strategy") == "Webhook" &&
        json_fields::Field(have_webhook, "clientConfig") == want["webhook"]["clientConfig"] &&
        json_fields::Field(have_webhook, "conversionReviewVersions") ==
            want["webhook"]["conversionReviewVersions"]) {
      continue;
    }
    absl::Status patched = client.PatchNoResult(kCustomResourceDefinitions, "", name,
                                                PatchType::kMerge, WithoutUrl(patch));
    if (!patched.ok()) {
      return absl::Status(patched.code(), absl::StrCat("patching CustomResourceDefinition ", name,
                                                       ": ", patched.message()));
    }
    spdlog::info("conversion webhook: CustomResourceDefinition {} now converts through {}/{}:{}{}",
                 name, options.service_namespace, options.service_name, options.service_port,
                 options.path);
  }
  return absl::OkStatus();
}

}  // namespace sbx::k8s

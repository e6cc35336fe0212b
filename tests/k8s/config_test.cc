#include "src/k8s/config.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sbx::k8s {
namespace {

using ::testing::HasSubstr;

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "sbx_k8s_config_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path) << text;
    return path;
  }

  std::string dir_;
};

constexpr char kKubeconfig[] = R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: dev-cluster
  cluster:
    server: https://127.0.0.1:6443/
    certificate-authority-data: Q0EtUEVN
- name: prod-cluster
  cluster:
    server: https://prod.example:443
    certificate-authority: certs/ca.pem
    insecure-skip-tls-verify: true
contexts:
- name: dev
  context: {cluster: dev-cluster, user: dev-user, namespace: agents}
- name: prod
  context: {cluster: prod-cluster, user: prod-user}
- name: broken
  context: {cluster: nowhere, user: dev-user}
users:
- name: dev-user
  user: {token: abc123}
- name: prod-user
  user:
    client-certificate: certs/client.pem
    client-key-data: S0VZLVBFTQ==
    tokenFile: token
)";

TEST_F(ConfigTest, CurrentContextWithInlineData) {
  std::string path = Write("kubeconfig", kKubeconfig);
  absl::StatusOr<ClusterConfig> config = LoadKubeconfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://127.0.0.1:6443");  // trailing slash dropped
  EXPECT_EQ(config->ca_pem, "CA-PEM");
  EXPECT_EQ(config->token, "abc123");
  EXPECT_EQ(config->default_namespace, "agents");
  EXPECT_FALSE(config->insecure_skip_tls_verify);
  EXPECT_THAT(config->source, HasSubstr("context dev"));
}

TEST_F(ConfigTest, NamedContextWithFilesRelativeToTheKubeconfig) {
  std::string path = Write("conf/kubeconfig", kKubeconfig);
  Write("conf/certs/ca.pem", "CA FROM FILE");
  Write("conf/certs/client.pem", "CLIENT CERT");
  absl::StatusOr<ClusterConfig> config = LoadKubeconfig(path, "prod");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://prod.example:443");
  EXPECT_EQ(config->ca_pem, "CA FROM FILE");
  EXPECT_TRUE(config->insecure_skip_tls_verify);
  EXPECT_EQ(config->client_cert_pem, "CLIENT CERT");
  EXPECT_EQ(config->client_key_pem, "KEY-PEM");
  EXPECT_EQ(config->token_file, dir_ + "/conf/token");
  EXPECT_EQ(config->default_namespace, "default");
}

TEST_F(ConfigTest, ErrorsNameWhatIsWrong) {
  std::string path = Write("kubeconfig", kKubeconfig);
  absl::Status missing_context = LoadKubeconfig(path, "staging").status();
  EXPECT_EQ(missing_context.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing_context.message(), HasSubstr("no context named \"staging\""));

  absl::Status missing_cluster = LoadKubeconfig(path, "broken").status();
  EXPECT_EQ(missing_cluster.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing_cluster.message(), HasSubstr("no cluster named \"nowhere\""));

  // prod names certificate files that do not exist here.
  absl::Status missing_file = LoadKubeconfig(path, "prod").status();
  EXPECT_EQ(missing_file.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing_file.message(), HasSubstr("certs/ca.pem"));

  EXPECT_EQ(LoadKubeconfig(dir_ + "/absent").status().code(), absl::StatusCode::kNotFound);

  std::string garbage = Write("garbage", "clusters: [unclosed");
  EXPECT_EQ(LoadKubeconfig(garbage).status().code(), absl::StatusCode::kInvalidArgument);

  std::string plugin = Write("plugin", R"(current-context: c
clusters: [{name: k, cluster: {server: "https://x"}}]
contexts: [{name: c, context: {cluster: k, user: u}}]
users: [{name: u, user: {exec: {command: aws}}}]
)");
  absl::Status exec = LoadKubeconfig(plugin).status();
  EXPECT_EQ(exec.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(exec.message(), HasSubstr("exec or auth-provider plugin"));

  std::string bad_base64 = Write("b64", R"(current-context: c
clusters: [{name: k, cluster: {server: "https://x", certificate-authority-data: "!!"}}]
contexts: [{name: c, context: {cluster: k}}]
)");
  EXPECT_THAT(LoadKubeconfig(bad_base64).status().message(),
              HasSubstr("certificate-authority-data is not base64"));
}

TEST_F(ConfigTest, InCluster) {
  Write("sa/token", "sa-token\n");
  Write("sa/ca.crt", "SA CA");
  Write("sa/namespace", "sbx-system\n");
  std::map<std::string, std::string> env = {{"KUBERNETES_SERVICE_HOST", "10.0.0.1"},
                                            {"KUBERNETES_SERVICE_PORT", "443"}};
  auto getenv = [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  absl::StatusOr<ClusterConfig> config = LoadInCluster(getenv, dir_ + "/sa");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://10.0.0.1:443");
  EXPECT_EQ(config->ca_pem, "SA CA");
  EXPECT_EQ(config->token_file, dir_ + "/sa/token");
  EXPECT_EQ(config->default_namespace, "sbx-system");

  env["KUBERNETES_SERVICE_HOST"] = "fd00::1";
  config = LoadInCluster(getenv, dir_ + "/sa");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->server, "https://[fd00::1]:443");

  env.clear();
  EXPECT_EQ(LoadInCluster(getenv, dir_ + "/sa").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sbx::k8s

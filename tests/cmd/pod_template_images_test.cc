// PodTemplateImages (src/cmd/config.cc): the images a kubernetes template stored through
// the API runs, from its pod template as JSON or YAML, which a claim by image is matched
// against (issue 34). Containers only, in order; nothing from what is not a pod template.

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/cmd/config.h"

namespace sbx::cmd {
namespace {

using Images = std::vector<std::string>;

TEST(PodTemplateImagesTest, AreTheContainersImagesOfYamlOrJson) {
  EXPECT_EQ(PodTemplateImages(R"(
metadata: {labels: {app: py}}
spec:
  initContainers:
    - {name: init, image: "busybox:1"}
  containers:
    - name: main
      image: python:3.12
    - name: side
      image: envoyproxy/envoy:v1.30
)"),
            (Images{"python:3.12", "envoyproxy/envoy:v1.30"}));
  EXPECT_EQ(PodTemplateImages(
                R"({"spec": {"containers": [{"name": "m", "image": "ghcr.io/a/b@sha256:00"}]}})"),
            Images{"ghcr.io/a/b@sha256:00"});
}

TEST(PodTemplateImagesTest, WhatIsNoPodTemplateRunsNoImage) {
  for (const char* text : {"", "[1, 2]", "spec: 3", "spec: {containers: {}}",
                           "spec: {containers: [x, {name: y}, {image: {a: b}}]}", "{unclosed"}) {
    EXPECT_EQ(PodTemplateImages(text), Images{}) << text;
  }
}

}  // namespace
}  // namespace sbx::cmd

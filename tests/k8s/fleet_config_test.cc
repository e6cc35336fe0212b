// The --cluster flag's value (src/k8s/fleet_config.h): what it accepts, and that every bad
// value is refused naming the value and what is wrong.
#include "src/k8s/fleet_config.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace sbx::k8s {
namespace {

TEST(FleetConfigTest, ParsesNameKubeconfigAndKeys) {
  absl::StatusOr<ClusterSpec> s = ParseClusterSpec("east=/etc/sbx/east.yaml");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "east");
  EXPECT_EQ(s->kubeconfig, "/etc/sbx/east.yaml");
  EXPECT_FALSE(s->qps.has_value());
  EXPECT_EQ(s->weight, 1);
  EXPECT_EQ(s->max, 0);

  s = ParseClusterSpec(
      "west-2=k.yaml,context=gke-west,qps=50,burst=100,write_qps=20.5,write_burst=10,"
      "weight=2.5,min=1,max=40");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "west-2");
  EXPECT_EQ(s->context, "gke-west");
  EXPECT_EQ(*s->qps, 50);
  EXPECT_EQ(*s->burst, 100);
  EXPECT_EQ(*s->write_qps, 20.5);
  EXPECT_EQ(*s->write_burst, 10);
  EXPECT_EQ(s->weight, 2.5);
  EXPECT_EQ(s->min, 1);
  EXPECT_EQ(s->max, 40);
}

TEST(FleetConfigTest, RefusesBadValuesNamingWhatIsWrong) {
  const struct {
    const char* text;
    const char* says;
  } cases[] = {
      {"east.yaml", "no NAME="},
      {"East=k.yaml", "East"},
      {"a:b=k.yaml", "a:b"},
      {"=k.yaml", "cluster name"},
      {"east=", "no kubeconfig"},
      {"east=in-cluster", "in-cluster"},
      {"east=k.yaml,color=red", "unknown key \"color\""},
      {"east=k.yaml,qps", "\"qps\" is not key=value"},
      {"east=k.yaml,qps=0", "qps \"0\""},
      {"east=k.yaml,qps=fast", "qps \"fast\""},
      {"east=k.yaml,weight=-1", "weight \"-1\""},
      {"east=k.yaml,weight=nan", "weight \"nan\""},
      {"east=k.yaml,weight=inf", "weight \"inf\""},
      {"east=k.yaml,burst=0", "burst \"0\""},
      {"east=k.yaml,write_burst=2000000", "above 1000000"},
      {"east=k.yaml,min=-2", "min \"-2\""},
      {"east=k.yaml,max=1.5", "max \"1.5\""},
      {"east=k.yaml,min=5,max=2", "min 5 is above max 2"},
      {"east=k.yaml,min=1,min=2", "\"min\" given twice"},
      {"east=k.yaml,context=", "context is empty"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<ClusterSpec> s = ParseClusterSpec(c.text);
    ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    const std::string m(s.status().message());
    EXPECT_NE(m.find(absl::StrCat("--cluster \"", c.text, "\"")), std::string::npos) << m;
    EXPECT_NE(m.find(c.says), std::string::npos) << c.text << ": " << m;
  }
  // max 0 is "no maximum", so any min goes with it.
  EXPECT_TRUE(ParseClusterSpec("east=k.yaml,min=5,max=0").ok());
}

}  // namespace
}  // namespace sbx::k8s

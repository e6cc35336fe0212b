#include "tests/kube_emulator/json_ops.h"

#include <gtest/gtest.h>

namespace kube_emulator {
namespace {

TEST(LabelSelectorTest, ParsesAndMatchesAllOperators) {
  auto sel = ParseLabelSelector("app=web,tier!=db,env in (prod, staging),!legacy,team");
  ASSERT_TRUE(sel.ok()) << sel.status();
  ASSERT_EQ(sel->size(), 5u);
  EXPECT_TRUE(LabelsMatch(*sel, {{"app", "web"}, {"env", "prod"}, {"team", "x"}}));
  EXPECT_FALSE(LabelsMatch(*sel, {{"app", "web"}, {"env", "dev"}, {"team", "x"}}));
  EXPECT_FALSE(
      LabelsMatch(*sel, {{"app", "web"}, {"env", "prod"}, {"team", "x"}, {"legacy", "1"}}));
  EXPECT_FALSE(LabelsMatch(*sel, {{"app", "web"}, {"env", "prod"}, {"tier", "db"}, {"team", "x"}}));
  auto notin = ParseLabelSelector("env notin (a,b)");
  ASSERT_TRUE(notin.ok());
  EXPECT_TRUE(LabelsMatch(*notin, json::object()));
  EXPECT_FALSE(LabelsMatch(*notin, {{"env", "a"}}));
  EXPECT_FALSE(ParseLabelSelector("a in b)").ok());
}

TEST(FieldSelectorTest, MatchesDottedPaths) {
  auto sel = ParseFieldSelector("metadata.name=x,status.phase!=Running,spec.nodeName==");
  ASSERT_TRUE(sel.ok());
  json pod = {{"metadata", {{"name", "x"}}}, {"status", {{"phase", "Pending"}}}};
  EXPECT_TRUE(FieldsMatch(*sel, pod));
  pod["spec"]["nodeName"] = "n1";
  EXPECT_FALSE(FieldsMatch(*sel, pod));
}

TEST(PatchTest, MergePatchRemovesNulls) {
  json a = {{"a", 1}, {"b", {{"c", 2}, {"d", 3}}}};
  EXPECT_EQ(MergePatch(a, {{"b", {{"c", nullptr}}}, {"e", 5}}),
            json({{"a", 1}, {"b", {{"d", 3}}}, {"e", 5}}));
}

TEST(PatchTest, JsonPatchTestOpFails) {
  json a = {{"a", 1}};
  EXPECT_FALSE(JsonPatch(a, json::parse(R"([{"op":"test","path":"/a","value":2}])")).ok());
  auto ok = JsonPatch(a, json::parse(R"([{"op":"test","path":"/a","value":1},
                                         {"op":"add","path":"/b","value":2}])"));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)["b"], 2);
}

TEST(PatchTest, StrategicMergeByKeyAndDirectives) {
  json pod = json::parse(R"({"spec":{"containers":[
      {"name":"a","image":"x","env":[{"name":"A","value":"1"}]},
      {"name":"b","image":"y"}]}})");
  json patch = json::parse(R"({"spec":{
      "$setElementOrder/containers":[{"name":"a"},{"name":"b"}],
      "containers":[{"name":"a","image":"x2","env":[{"name":"B","value":"2"}]},
                    {"name":"b","$patch":"delete"}]}})");
  json out = StrategicMergePatch(pod, patch);
  ASSERT_EQ(out["spec"]["containers"].size(), 1u);
  EXPECT_EQ(out["spec"]["containers"][0]["image"], "x2");
  EXPECT_EQ(out["spec"]["containers"][0]["env"].size(), 2u);
  EXPECT_FALSE(out["spec"].contains("$setElementOrder/containers"));
  json replaced = StrategicMergePatch(pod, json::parse(R"({"spec":{"$patch":"replace","x":1}})"));
  EXPECT_EQ(replaced["spec"], json({{"x", 1}}));
}

TEST(SchemaTest, PrunesDefaultsAndValidates) {
  json schema = json::parse(R"({"type":"object","properties":{
      "spec":{"type":"object","required":["ref"],"properties":{
        "replicas":{"type":"integer","minimum":0,"default":1},
        "mode":{"type":"string","enum":["A","B"]},
        "ref":{"type":"object","properties":{"name":{"type":"string"}}},
        "free":{"type":"object","x-kubernetes-preserve-unknown-fields":true},
        "port":{"x-kubernetes-int-or-string":true}}}}})");
  json obj = json::parse(R"({"apiVersion":"g/v1","kind":"K","metadata":{"name":"x"},
      "spec":{"ref":{"name":"t","junk":1},"free":{"any":{"x":1}},"port":"http","junk":2}})");
  EXPECT_TRUE(ApplySchema(obj, schema).empty());
  EXPECT_EQ(obj["spec"]["replicas"], 1);
  EXPECT_FALSE(obj["spec"].contains("junk"));
  EXPECT_FALSE(obj["spec"]["ref"].contains("junk"));
  EXPECT_EQ(obj["spec"]["free"]["any"]["x"], 1);
  json bad = json::parse(R"({"spec":{"replicas":-1,"mode":"C"}})");
  auto errors = ApplySchema(bad, schema);
  ASSERT_EQ(errors.size(), 3u);
  std::vector<std::string> fields;
  for (const auto& e : errors) fields.push_back(e.field);
  EXPECT_NE(std::find(fields.begin(), fields.end(), "spec.ref"), fields.end());
  EXPECT_NE(std::find(fields.begin(), fields.end(), "spec.replicas"), fields.end());
  EXPECT_NE(std::find(fields.begin(), fields.end(), "spec.mode"), fields.end());
}

// After a conversion the API server prunes with the target version's schema but neither
// defaults nor validates.
TEST(SchemaTest, PruneToSchemaNeitherDefaultsNorValidates) {
  json schema = json::parse(R"({"type":"object","properties":{"spec":{"type":"object",
      "properties":{"size":{"type":"string","enum":["S"]},"n":{"type":"integer","default":1}}}}})");
  json obj = json::parse(R"({"apiVersion":"g/v2","kind":"K","metadata":{"name":"x"},
      "spec":{"size":"XL","junk":1},"other":2})");
  PruneToSchema(obj, schema);
  EXPECT_EQ(obj, json::parse(R"({"apiVersion":"g/v2","kind":"K","metadata":{"name":"x"},
      "spec":{"size":"XL"}})"));
}

// A Quantity is int-or-string with a pattern: the pattern applies to a string value.
TEST(SchemaTest, AnIntOrStringStringMeetsItsPattern) {
  json schema = json::parse(R"({"type":"object","properties":{"memory":{
      "anyOf":[{"type":"integer"},{"type":"string"}],"x-kubernetes-int-or-string":true,
      "pattern":"^[0-9]+(Mi|Gi)?$"}}})");
  for (const char* ok : {R"({"memory":512})", R"({"memory":"512Mi"})"}) {
    json obj = json::parse(ok);
    EXPECT_TRUE(ApplySchema(obj, schema).empty()) << ok;
  }
  json bad = json::parse(R"({"memory":"lots"})");
  auto errors = ApplySchema(bad, schema);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].field, "memory");
  json wrong = json::parse(R"({"memory":[1]})");
  EXPECT_EQ(ApplySchema(wrong, schema).size(), 1u);
}

TEST(SchemaTest, ImmutabilityTransitionRule) {
  json schema = json::parse(R"({"type":"object","properties":{"spec":{"type":"object",
      "properties":{"claims":{"type":"array","items":{"type":"string"},
        "x-kubernetes-validations":[{"rule":"self == oldSelf","message":"claims is immutable"}]},
        "free":{"type":"string"}}}}})");
  json old = json::parse(R"({"spec":{"claims":["a"],"free":"x"}})");
  json same = json::parse(R"({"spec":{"claims":["a"],"free":"y"}})");
  EXPECT_TRUE(CheckTransitionRules(same, old, schema).empty());
  json changed = json::parse(R"({"spec":{"claims":["a","b"]}})");
  auto errors = CheckTransitionRules(changed, old, schema);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].field, "spec.claims");
  EXPECT_NE(errors[0].message.find("claims is immutable"), std::string::npos);
  // Setting it for the first time is allowed ("immutable once set").
  json unset = json::parse(R"({"spec":{"free":"x"}})");
  EXPECT_TRUE(CheckTransitionRules(changed, unset, schema).empty());
}

// Upstream's Sandbox CRD says volumeClaimTemplates is immutable with a rule on spec that
// uses has(): neither added, removed nor changed once the Sandbox exists.
TEST(SchemaTest, TransitionRuleWithHasOnTheParent) {
  json schema = json::parse(R"js({"type":"object","properties":{"spec":{"type":"object",
      "x-kubernetes-validations":[{"message":"volumeClaimTemplates is immutable",
        "rule":"has(self.volumeClaimTemplates) == has(oldSelf.volumeClaimTemplates) &&\n (!has(self.volumeClaimTemplates) || self.volumeClaimTemplates ==\n oldSelf.volumeClaimTemplates)"}],
      "properties":{"volumeClaimTemplates":{"type":"array","items":{"type":"string"}},
        "free":{"type":"string"}}}}})js");
  json none = json::parse(R"({"spec":{"free":"x"}})");
  json one = json::parse(R"({"spec":{"volumeClaimTemplates":["a"],"free":"x"}})");
  json two = json::parse(R"({"spec":{"volumeClaimTemplates":["a","b"],"free":"x"}})");
  json other = json::parse(R"({"spec":{"volumeClaimTemplates":["a"],"free":"y"}})");
  EXPECT_TRUE(CheckTransitionRules(none, none, schema).empty());
  EXPECT_TRUE(CheckTransitionRules(other, one, schema).empty());
  for (const auto& [now, before] :
       {std::pair{one, none}, std::pair{none, one}, std::pair{two, one}}) {
    auto errors = CheckTransitionRules(now, before, schema);
    ASSERT_EQ(errors.size(), 1u) << now.dump() << " from " << before.dump();
    EXPECT_EQ(errors[0].field, "spec");
    EXPECT_NE(errors[0].message.find("volumeClaimTemplates is immutable"), std::string::npos);
  }
  // Outside the subset: not evaluated (no error), as before.
  json unknown = json::parse(R"js({"type":"object","properties":{"spec":{"type":"object",
      "x-kubernetes-validations":[{"rule":"self.size() == oldSelf.size()"}]}}})js");
  EXPECT_TRUE(CheckTransitionRules(two, one, unknown).empty());
  // != and a missing field compared (an error: the rule fails).
  json ne = json::parse(R"js({"type":"object","properties":{"spec":{"type":"object",
      "x-kubernetes-validations":[{"rule":"self.free != oldSelf.free"}]}}})js");
  EXPECT_TRUE(CheckTransitionRules(other, one, ne).empty());
  EXPECT_EQ(CheckTransitionRules(one, one, ne).size(), 1u);
  json missing = json::parse(R"js({"type":"object","properties":{"spec":{"type":"object",
      "x-kubernetes-validations":[{"rule":
        "self.volumeClaimTemplates == oldSelf.volumeClaimTemplates"}]}}})js");
  EXPECT_EQ(CheckTransitionRules(one, none, missing).size(), 1u);
}

TEST(YamlTest, ScalarsFollowTheCoreSchema) {
  auto j = YamlToJson("a: 1\nb: \"1\"\nc: true\nd: null\ne: [x, 2.5]\nf: {g: h}\n");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(*j, json::parse(R"({"a":1,"b":"1","c":true,"d":null,"e":["x",2.5],"f":{"g":"h"}})"));
  EXPECT_FALSE(YamlToJson("a: [").ok());
}

}  // namespace
}  // namespace kube_emulator

#include "src/common/ids.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sbx {
namespace {

using ::testing::HasSubstr;

TEST(QualifiedNameTest, APoolOfTheDefaultNamespaceHasItsBareName) {
  EXPECT_EQ(QualifiedName("default", "py", "default"), "py");
  EXPECT_EQ(QualifiedName("team-a", "py", "default"), "team-a/py");
  EXPECT_EQ(QualifiedName("default", "py", "team-a"), "default/py");
}

TEST(QualifiedNameTest, SplitGivesTheDefaultNamespaceToABareName) {
  EXPECT_EQ(SplitQualifiedName("py", "default"), (NamespacedName{"default", "py"}));
  EXPECT_EQ(SplitQualifiedName("team-a/py", "default"), (NamespacedName{"team-a", "py"}));
  for (const char* name : {"py", "team-a/py"}) {
    NamespacedName parts = SplitQualifiedName(name, "default");
    EXPECT_EQ(QualifiedName(parts.ns, parts.name, "default"), name);
  }
}

TEST(QualifiedNameTest, TheDefaultNamespaceSpelledOutIsTheBareName) {
  EXPECT_EQ(*CanonicalQualifiedName("pool", "default/py", "default"), "py");
  EXPECT_EQ(*CanonicalQualifiedName("pool", "py", "default"), "py");
  EXPECT_EQ(*CanonicalQualifiedName("pool", "team-a/py", "default"), "team-a/py");
  EXPECT_EQ(*CanonicalQualifiedName("pool", "team-a/py", "team-a"), "py");
}

TEST(QualifiedNameTest, EachPartMustBeALabelAndTheErrorNamesIt) {
  EXPECT_TRUE(ValidateQualifiedName("pool", "a/b").ok());
  struct Case {
    const char* name;
    const char* says;
  } cases[] = {
      {"", "pool is empty"},
      {"/py", "namespace is empty"},
      {"team-a/", "name is empty"},
      {"Team/py", "pool \"Team/py\": namespace \"Team\" may contain only"},
      {"a/b/c", "pool \"a/b/c\": name \"b/c\" may contain only"},
      {"a/-b", "must start and end"},
  };
  for (const Case& c : cases) {
    absl::Status s = ValidateQualifiedName("pool", c.name);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.name;
    EXPECT_THAT(s.message(), HasSubstr(c.says)) << c.name;
    EXPECT_TRUE(
        absl::IsInvalidArgument(CanonicalQualifiedName("pool", c.name, "default").status()));
  }
}

}  // namespace
}  // namespace sbx

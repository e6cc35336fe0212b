#include "src/common/sandbox_secret.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sbx {
namespace {

using ::testing::HasSubstr;

class SandboxSecretsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/sbx-secret-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(SandboxSecretsTest, MakesAPrivateKeyOnceAndKeepsIt) {
  const std::string path = dir_ + "/sandbox.key";
  auto first = SandboxSecrets::LoadOrCreate(path);
  ASSERT_TRUE(first.ok()) << first.status();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  auto again = SandboxSecrets::LoadOrCreate(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(first->For("lb-a"), again->For("lb-a"));
  EXPECT_NE(first->For("lb-a"), first->For("lb-b"));
  EXPECT_EQ(first->For("lb-a").size(), 64u);
  // No temporary file is left beside it.
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(SandboxSecretsNewKeyTest, NewKeysAreKeySizedAndDiffer) {
  absl::StatusOr<std::string> a = SandboxSecrets::NewKey();
  absl::StatusOr<std::string> b = SandboxSecrets::NewKey();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->size(), SandboxSecrets::kKeyBytes);
  EXPECT_EQ(b->size(), SandboxSecrets::kKeyBytes);
  EXPECT_NE(*a, *b);
}

TEST_F(SandboxSecretsTest, IsHmacSha256OfTheIdInHex) {
  // Python: hmac.new(b'k' * 32, b'lb-0123456789abcdef', hashlib.sha256).hexdigest()
  EXPECT_EQ(SandboxSecrets::FromKey(std::string(32, 'k')).For("lb-0123456789abcdef"),
            "76b728992b5ea808baf3ba33f5560af683938de751c0cc23a1c94dddddd17982");
}

TEST_F(SandboxSecretsTest, RefusesKeysOthersCanReadOrOfTheWrongSize) {
  const std::string open_key = dir_ + "/open.key";
  std::ofstream(open_key) << std::string(32, 'x');
  chmod(open_key.c_str(), 0644);
  auto s = SandboxSecrets::LoadOrCreate(open_key);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("0600"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(open_key));

  const std::string short_key = dir_ + "/short.key";
  std::ofstream(short_key) << "tooshort";
  chmod(short_key.c_str(), 0600);
  s = SandboxSecrets::LoadOrCreate(short_key);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("holds 8 bytes"));

  // A symbolic link is not followed (the key could be swapped for another file).
  const std::string link = dir_ + "/link.key";
  ASSERT_EQ(symlink(short_key.c_str(), link.c_str()), 0);
  EXPECT_EQ(SandboxSecrets::LoadOrCreate(link).status().code(),
            absl::StatusCode::kFailedPrecondition);

  EXPECT_EQ(SandboxSecrets::LoadOrCreate(dir_).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SandboxSecrets::LoadOrCreate(dir_ + "/missing/dir/key").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sbx

// Signed port URL tokens (src/server/port_token.h): a token works for its claim, owner
// and port until it expires; an altered payload, another key or a flipped signature bit
// is refused.
#include "src/server/port_token.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"

namespace sbx::server {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

PortGrant Grant() {
  PortGrant g;
  g.owner = "tenant-a";
  g.claim_id = "web-a";
  g.port = 8000;
  g.expires = kNow + absl::Hours(1);
  return g;
}

TEST(PortTokens, RoundTrip) {
  PortTokens tokens(std::string(32, 'k'));
  absl::StatusOr<PortGrant> g = tokens.Verify(tokens.Sign(Grant()), kNow);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->owner, "tenant-a");
  EXPECT_EQ(g->claim_id, "web-a");
  EXPECT_EQ(g->port, 8000);
  EXPECT_EQ(g->expires, kNow + absl::Hours(1));
}

TEST(PortTokens, ExpiredIsRefused) {
  PortTokens tokens(std::string(32, 'k'));
  const std::string t = tokens.Sign(Grant());
  EXPECT_TRUE(tokens.Verify(t, kNow + absl::Minutes(59)).ok());
  absl::StatusOr<PortGrant> g = tokens.Verify(t, kNow + absl::Hours(1));
  EXPECT_EQ(g.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(g.status().message().find("expired"), std::string::npos) << g.status();
}

TEST(PortTokens, AnotherKeyIsRefused) {
  PortTokens tokens(std::string(32, 'k'));
  PortTokens other(std::string(32, 'x'));
  EXPECT_EQ(other.Verify(tokens.Sign(Grant()), kNow).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(PortTokens, AlteredPayloadIsRefused) {
  PortTokens tokens(std::string(32, 'k'));
  const std::string t = tokens.Sign(Grant());
  const size_t dot = t.find('.');
  std::string payload;
  ASSERT_TRUE(absl::WebSafeBase64Unescape(t.substr(0, dot), &payload));
  for (const auto& [from, to] : std::initializer_list<std::pair<std::string, std::string>>{
           {"|8000|", "|9000|"}, {"|web-a|", "|web-b|"}, {"|tenant-a|", "|tenant-b|"}}) {
    const std::string altered = absl::StrReplaceAll(payload, {{from, to}});
    ASSERT_NE(altered, payload);
    const std::string forged = absl::WebSafeBase64Escape(altered) + t.substr(dot);
    EXPECT_EQ(tokens.Verify(forged, kNow).status().code(), absl::StatusCode::kUnauthenticated)
        << from;
  }
  std::string flipped = t;
  flipped.back() = flipped.back() == 'A' ? 'B' : 'A';
  EXPECT_EQ(tokens.Verify(flipped, kNow).status().code(), absl::StatusCode::kUnauthenticated);
  for (const char* bad : {"", ".", "abc", "abc.def", "x.y.z"}) {
    EXPECT_EQ(tokens.Verify(bad, kNow).status().code(), absl::StatusCode::kUnauthenticated) << bad;
  }
}

}  // namespace
}  // namespace sbx::server

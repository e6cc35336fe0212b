// src/gateway/e2b/multipart.cc: the strict multipart/form-data parser of the E2B front's uploads,
// against what the E2B SDK sends (FormData) and against bad input.
#include "src/gateway/e2b/multipart.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace sbx::e2b {
namespace {

using ::testing::HasSubstr;

TEST(MultipartTest, BoundaryFromContentType) {
  auto b = MultipartBoundary("multipart/form-data; boundary=----formdata-undici-0123");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, "----formdata-undici-0123");
  b = MultipartBoundary("Multipart/Form-Data; charset=utf-8; boundary=\"a b:c\"");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(*b, "a b:c");
  for (const char* bad :
       {"application/json", "multipart/form-data",
        "multipart/form-data; boundary=", "multipart/form-data; boundary=\"open",
        "multipart/form-data; boundary=a\x01z", "multipart/form-data; boundary=\"trailing \""}) {
    EXPECT_EQ(MultipartBoundary(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(
      MultipartBoundary(std::string("multipart/form-data; boundary=") + std::string(71, 'x')).ok());
}

TEST(MultipartTest, PartsAsTheSdkSendsThem) {
  const std::string body =
      "--XyZ\r\n"
      "Content-Disposition: form-data; name=\"file\"; filename=\"/home/user/a.txt\"\r\n"
      "Content-Type: application/octet-stream\r\n"
      "\r\n"
      "line 1\r\n--not the boundary\r\n"
      "\r\n--XyZ\r\n"
      "Content-Disposition: form-data; name=\"file\"; filename=\"b\\\"q.txt\"\r\n"
      "\r\n"
      "\r\n--XyZ--\r\nepilogue ignored";
  auto parts = ParseMultipart(body, "XyZ");
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "file");
  EXPECT_EQ((*parts)[0].filename, "/home/user/a.txt");
  EXPECT_EQ((*parts)[0].data, "line 1\r\n--not the boundary\r\n");
  EXPECT_EQ((*parts)[1].filename, "b\"q.txt");
  EXPECT_EQ((*parts)[1].data, "");
}

TEST(MultipartTest, BadBodiesNameTheProblem) {
  const std::string d = "Content-Disposition: form-data; name=\"file\"\r\n\r\n";
  struct Case {
    std::string body;
    const char* why;
  } cases[] = {
      {"", "does not start with the boundary"},
      {"preamble\r\n--B\r\n" + d + "x\r\n--B--", "does not start with the boundary"},
      {"--B", "not followed by CRLF"},
      {"--Bjunk\r\n" + d + "x\r\n--B--", "not followed by CRLF"},
      {"--B\r\nContent-Disposition: form-data; name=\"file\"\r\n", "headers do not end"},
      {"--B\r\n" + d + "no end", "does not end with the boundary"},
      {"--B\r\nContent-Type: text/plain\r\n\r\nx\r\n--B--", "no Content-Disposition"},
      {"--B\r\nContent-Disposition: attachment; name=\"f\"\r\n\r\nx\r\n--B--", "not form-data"},
      {"--B\r\nContent-Disposition: form-data; filename=\"f\"\r\n\r\nx\r\n--B--", "no name"},
      {"--B\r\nContent-Disposition: form-data; name=\"open\r\n\r\nx\r\n--B--", "unterminated"},
      {"--B\r\nno colon here\r\n\r\nx\r\n--B--", "has no name"},
      {"--B\r\nContent-Disposition: form-data; name=\"a\"\r\n" + d + "x\r\n--B--",
       "two Content-Disposition"},
      {"--B\r\nX-Big: " + std::string(kMaxPartHeaderBytes, 'h') + "\r\n" + d + "x\r\n--B--",
       "exceed"},
  };
  for (const Case& c : cases) {
    auto parts = ParseMultipart(c.body, "B");
    ASSERT_FALSE(parts.ok()) << c.body;
    EXPECT_EQ(parts.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parts.status().message()), HasSubstr(c.why)) << c.body;
  }
  std::string many;
  for (int i = 0; i <= kMaxParts; ++i) many += "--B\r\n" + d + "x\r\n";
  many += "--B--";
  auto parts = ParseMultipart(many, "B");
  ASSERT_FALSE(parts.ok());
  EXPECT_THAT(std::string(parts.status().message()), HasSubstr("more than"));
}

}  // namespace
}  // namespace sbx::e2b

// src/gateway/e2b/multipart.cc: the strict multipart/form-data parser of the E2B front's
// uploads, against what the E2B SDK sends (FormData) and against bad input, whole and
// streamed (MultipartReader) whatever the sizes of the pieces the body arrives in.
#include "src/gateway/e2b/multipart.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

// A body handed out `step` bytes per Read (1: every delimiter split at every byte).
class Trickle final : public BodyReader {
 public:
  Trickle(std::string body, size_t step) : body_(std::move(body)), step_(step) {}
  absl::StatusOr<size_t> Read(char* buf, size_t n) override {
    n = std::min({n, step_, body_.size() - at_});
    std::memcpy(buf, body_.data() + at_, n);
    at_ += n;
    return n;
  }

 private:
  const std::string body_;
  const size_t step_;
  size_t at_ = 0;
};

// The parts of `body` through MultipartReader, reading `read` bytes at a time from a
// body given `step` bytes at a time: "name=data" each.
absl::StatusOr<std::vector<std::string>> Stream(const std::string& body, size_t step, size_t read) {
  Trickle trickle(body, step);
  MultipartReader reader(&trickle, "B");
  std::vector<std::string> out;
  while (true) {
    absl::StatusOr<std::optional<FormPart>> part = reader.NextPart();
    if (!part.ok()) return part.status();
    if (!part->has_value()) return out;
    std::string data;
    std::string buf(read, '\0');
    while (true) {
      absl::StatusOr<size_t> n = reader.data()->Read(buf.data(), buf.size());
      if (!n.ok()) return n.status();
      if (*n == 0) break;
      data.append(buf.data(), *n);
    }
    out.push_back((*part)->name + "=" + data);
  }
}

TEST(MultipartTest, StreamedWhateverTheReadSizes) {
  // Data that holds every prefix of the delimiter "\r\n--B" but never all of it.
  const std::string tricky = "\r\r\n\r\n-\r\n--\r\n--\r\n--C--B\r\n";
  const std::string body = "\r\n--B\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n" +
                           tricky +
                           "\r\n--B  \r\nContent-Disposition: form-data; name=\"b\"\r\n\r\n" +
                           "\r\n--B\r\nContent-Disposition: form-data; name=\"c\"\r\n\r\n" +
                           std::string(200000, 'x') + "\r\n--B--";
  for (size_t step : {size_t{1}, size_t{2}, size_t{5}, size_t{4096}, body.size()}) {
    for (size_t read : {size_t{1}, size_t{3}, size_t{1} << 20}) {
      absl::StatusOr<std::vector<std::string>> parts = Stream(body, step, read);
      ASSERT_TRUE(parts.ok()) << parts.status() << " step " << step << " read " << read;
      ASSERT_EQ(parts->size(), 3u);
      EXPECT_EQ((*parts)[0], "a=" + tricky);
      EXPECT_EQ((*parts)[1], "b=");
      EXPECT_EQ((*parts)[2], "c=" + std::string(200000, 'x'));
    }
  }
}

TEST(MultipartTest, StreamedBadBodiesByteByByte) {
  const std::string d = "Content-Disposition: form-data; name=\"file\"\r\n\r\n";
  const std::pair<std::string, const char*> cases[] = {
      {"", "does not start with the boundary"},
      {"--B", "not followed by CRLF"},
      {"--B\r\n" + d + "no end", "does not end with the boundary"},
      {"--B\r\n" + d + "almost\r\n--", "does not end with the boundary"},
      {"--B\r\nContent-Disposition: form-data; name=\"file\"\r\n", "headers do not end"},
      {"--B\r\nX-Big: " + std::string(kMaxPartHeaderBytes, 'h') + "\r\n" + d + "x\r\n--B--",
       "exceed"},
      {"--B\r\nX-Endless: " + std::string(1 << 20, 'h'), "exceed"},
  };
  for (const auto& [body, why] : cases) {
    absl::StatusOr<std::vector<std::string>> parts = Stream(body, 1, 7);
    ASSERT_FALSE(parts.ok()) << body.substr(0, 80);
    EXPECT_EQ(parts.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parts.status().message()), HasSubstr(why)) << body.substr(0, 80);
  }
}

// An error of the body itself (the client went away) comes back as it is.
TEST(MultipartTest, StreamedBodyErrorsPassThrough) {
  class Broken final : public BodyReader {
   public:
    absl::StatusOr<size_t> Read(char* buf, size_t n) override {
      if (sent_) return absl::UnavailableError("the client went away");
      sent_ = true;
      const std::string head = "--B\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nsome";
      n = std::min(n, head.size());
      std::memcpy(buf, head.data(), n);
      return n;
    }

   private:
    bool sent_ = false;
  };
  Broken broken;
  MultipartReader reader(&broken, "B");
  absl::StatusOr<std::optional<FormPart>> part = reader.NextPart();
  ASSERT_TRUE(part.ok() && part->has_value()) << part.status();
  char buf[64];
  absl::StatusOr<size_t> n;
  do {
    n = reader.data()->Read(buf, sizeof(buf));
  } while (n.ok() && *n > 0);
  EXPECT_EQ(n.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace sbx::e2b

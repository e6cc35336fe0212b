#include "src/gateway/e2b/connect.h"

#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace sbx::e2b {

using json = nlohmann::json;
namespace pbutil = google::protobuf::util;

namespace {

// The media type without parameters, lower-case.
std::string MediaType(const HttpRequest& req) {
  std::string type(req.Header("content-type").value_or(""));
  const size_t semi = type.find(';');
  if (semi != std::string::npos) type.resize(semi);
  return absl::AsciiStrToLower(absl::StripAsciiWhitespace(type));
}

json ErrorJson(const grpc::Status& status) {
  json e;
  e["code"] = ConnectCode(status.error_code());
  e["message"] = status.error_message();
  return e;
}

bool ParseJson(absl::string_view text, google::protobuf::Message* msg, std::string* error) {
  pbutil::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // newer clients may send fields we do not serve
  const auto s = pbutil::JsonStringToMessage(std::string(text), msg, options);
  if (!s.ok()) {
    *error = absl::StrCat("the request is not a valid ", msg->GetDescriptor()->full_name(),
                          " in JSON: ", std::string(s.message()));
    return false;
  }
  return true;
}

std::string ToJson(const google::protobuf::Message& msg) {
  std::string out;
  // Cannot fail for a message of a compiled type.
  (void)pbutil::MessageToJsonString(msg, &out, pbutil::JsonPrintOptions());
  return out;
}

}  // namespace

const char* ConnectCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
      return "ok";
    case grpc::StatusCode::CANCELLED:
      return "canceled";
    case grpc::StatusCode::INVALID_ARGUMENT:
      return "invalid_argument";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return "deadline_exceeded";
    case grpc::StatusCode::NOT_FOUND:
      return "not_found";
    case grpc::StatusCode::ALREADY_EXISTS:
      return "already_exists";
    case grpc::StatusCode::PERMISSION_DENIED:
      return "permission_denied";
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return "resource_exhausted";
    case grpc::StatusCode::FAILED_PRECONDITION:
      return "failed_precondition";
    case grpc::StatusCode::ABORTED:
      return "aborted";
    case grpc::StatusCode::OUT_OF_RANGE:
      return "out_of_range";
    case grpc::StatusCode::UNIMPLEMENTED:
      return "unimplemented";
    case grpc::StatusCode::INTERNAL:
      return "internal";
    case grpc::StatusCode::UNAVAILABLE:
      return "unavailable";
    case grpc::StatusCode::DATA_LOSS:
      return "data_loss";
    case grpc::StatusCode::UNAUTHENTICATED:
      return "unauthenticated";
    default:
      return "unknown";
  }
}

int ConnectHttpStatus(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::CANCELLED:
      return 499;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE:
      return 400;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return 504;
    case grpc::StatusCode::NOT_FOUND:
      return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::ABORTED:
      return 409;
    case grpc::StatusCode::PERMISSION_DENIED:
      return 403;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return 429;
    case grpc::StatusCode::UNIMPLEMENTED:
      return 501;
    case grpc::StatusCode::UNAVAILABLE:
      return 503;
    case grpc::StatusCode::UNAUTHENTICATED:
      return 401;
    default:
      return 500;
  }
}

void RespondConnectError(HttpResponder& out, const grpc::Status& status) {
  out.Respond(ConnectHttpStatus(status.error_code()), "application/json", ErrorJson(status).dump());
}

bool ParseUnary(const HttpRequest& req, HttpResponder& out, google::protobuf::Message* msg) {
  if (req.method != "POST") {
    out.Respond(405, "application/json",
                ErrorJson(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                       absl::StrCat(req.method, " is not a Connect call: POST")))
                    .dump(),
                {{"Allow", "POST"}});
    return false;
  }
  if (MediaType(req) != "application/json") {
    out.Respond(415, "application/json",
                ErrorJson(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                       absl::StrCat("content type \"",
                                                    req.Header("content-type").value_or(""),
                                                    "\" is not served: application/json")))
                    .dump(),
                {{"Accept-Post", "application/json"}});
    return false;
  }
  std::string error;
  if (!ParseJson(req.body.empty() ? "{}" : req.body, msg, &error)) {
    RespondConnectError(out, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, error));
    return false;
  }
  return true;
}

void RespondUnary(HttpResponder& out, const google::protobuf::Message& msg) {
  out.Respond(200, "application/json", ToJson(msg));
}

bool ParseStreamRequest(const HttpRequest& req, HttpResponder& out,
                        google::protobuf::Message* msg) {
  if (req.method != "POST" || MediaType(req) != "application/connect+json") {
    out.Respond(415, "application/json",
                ErrorJson(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                       absl::StrCat("a streaming call is a POST of "
                                                    "application/connect+json, not ",
                                                    req.method, " of \"",
                                                    req.Header("content-type").value_or(""), "\"")))
                    .dump());
    return false;
  }
  // Errors of a streaming call go in the end-stream message of a 200 answer.
  auto fail = [&](const std::string& message) {
    StreamWriter w(out);
    w.Start();
    w.End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message));
    return false;
  };
  const std::string& body = req.body;
  if (body.size() < 5) return fail("the request is not an enveloped message (under 5 bytes)");
  const uint8_t flags = static_cast<uint8_t>(body[0]);
  const uint32_t length = (static_cast<uint32_t>(static_cast<uint8_t>(body[1])) << 24) |
                          (static_cast<uint32_t>(static_cast<uint8_t>(body[2])) << 16) |
                          (static_cast<uint32_t>(static_cast<uint8_t>(body[3])) << 8) |
                          static_cast<uint32_t>(static_cast<uint8_t>(body[4]));
  if (flags != 0) {
    return fail(
        absl::StrCat("envelope flags ", flags, " are not served (no compression; one message)"));
  }
  if (length != body.size() - 5) {
    return fail(absl::StrCat("the envelope says ", length, " bytes but ", body.size() - 5,
                             " follow (one message per request)"));
  }
  std::string error;
  if (!ParseJson(absl::string_view(body).substr(5), msg, &error)) return fail(error);
  return true;
}

absl::Duration ConnectTimeout(const HttpRequest& req, absl::Duration fallback) {
  int64_t ms = 0;
  if (auto h = req.Header("connect-timeout-ms");
      h.has_value() && absl::SimpleAtoi(*h, &ms) && ms > 0 && ms <= 9999999999) {
    return absl::Milliseconds(ms);
  }
  return fallback;
}

bool StreamWriter::Start() {
  if (started_) return ok_;
  started_ = true;
  ok_ = out_.StartStream(200, "application/connect+json");
  return ok_;
}

bool StreamWriter::Envelope(char flags, absl::string_view payload) {
  if (!Start()) return false;
  std::string frame;
  frame.reserve(5 + payload.size());
  frame.push_back(flags);
  const uint32_t n = static_cast<uint32_t>(payload.size());
  frame.push_back(static_cast<char>(n >> 24));
  frame.push_back(static_cast<char>(n >> 16));
  frame.push_back(static_cast<char>(n >> 8));
  frame.push_back(static_cast<char>(n));
  frame.append(payload.data(), payload.size());
  ok_ = out_.WriteChunk(frame);
  return ok_;
}

bool StreamWriter::Send(const google::protobuf::Message& msg) { return Envelope(0, ToJson(msg)); }

void StreamWriter::End(const grpc::Status& status) {
  json end = json::object();
  if (!status.ok()) end["error"] = ErrorJson(status);
  Envelope(0x02, end.dump());
  out_.FinishStream();
}

}  // namespace sbx::e2b

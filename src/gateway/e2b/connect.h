#pragma once
// The Connect protocol (connectrpc.com/docs/protocol) with JSON, as the E2B SDK speaks it
// to envd (`useBinaryFormat: false`), over the front's HTTP server. Internal to src/gateway/e2b.
//
// Unary: POST /<package>.<Service>/<Method>, Content-Type application/json, the request
// message as Protobuf JSON; the answer 200 with the response message, or an error status
// with {"code": "<connect code>", "message": "..."}.
// Server streaming: Content-Type application/connect+json; the request and each response
// message in an envelope (1 flag byte, 4-byte big-endian length, JSON); the stream ends
// with an end-stream envelope (flag 0x02) holding {} or {"error": {code, message}}.
//
// Thread-safety: the functions are; a StreamWriter is used by one thread.

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "src/gateway/e2b/http.h"

namespace sbx::e2b {

// "not_found", "invalid_argument", ... for a gRPC code.
const char* ConnectCode(grpc::StatusCode code);
// The HTTP status of a unary error with that code (Connect's table).
int ConnectHttpStatus(grpc::StatusCode code);

// Answers a unary call with an error.
void RespondConnectError(HttpResponder& out, const grpc::Status& status);

// Parses the request message of a unary call (Content-Type application/json) into `msg`.
// On failure answers the error (415 for another content type, invalid_argument for bad
// JSON, naming the problem) and returns false.
bool ParseUnary(const HttpRequest& req, HttpResponder& out, google::protobuf::Message* msg);
// Answers a unary call with `msg`.
void RespondUnary(HttpResponder& out, const google::protobuf::Message& msg);

// Parses the single enveloped request message of a server-streaming call. On failure
// answers the error and returns false.
bool ParseStreamRequest(const HttpRequest& req, HttpResponder& out, google::protobuf::Message* msg);

// The timeout a Connect client set (Connect-Timeout-Ms), if any, else `fallback`.
absl::Duration ConnectTimeout(const HttpRequest& req, absl::Duration fallback);

// Writes a server-streaming answer: Start once, Send per message, End once.
class StreamWriter {
 public:
  explicit StreamWriter(HttpResponder& out) : out_(out) {}
  // False once the client is gone.
  bool Start();
  bool Send(const google::protobuf::Message& msg);
  // The end-stream message: {} for OK, else the error.
  void End(const grpc::Status& status);

 private:
  bool Envelope(char flags, absl::string_view json);
  HttpResponder& out_;
  bool started_ = false;
  bool ok_ = true;
};

}  // namespace sbx::e2b

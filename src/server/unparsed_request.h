#pragma once
// Makes a request that does not parse INVALID_ARGUMENT instead of gRPC's UNIMPLEMENTED.
//
// gRPC 1.51's callback handlers (grpcpp/impl/codegen/server_callback_handlers.h) answer a
// unary or server-streaming call whose request message fails to deserialize with a
// reactor that finishes UNIMPLEMENTED and an empty message: the handler is never called,
// so the service cannot answer itself. Protobuf refuses, for example, a proto3 `string`
// field holding bytes that are not UTF-8, or a field longer than the bytes that follow.
// This server interceptor notices the missing request (the server hands interceptors a
// null message at POST_RECV_MESSAGE when deserialization failed) and rewrites that one
// status, at PRE_SEND_STATUS, to INVALID_ARGUMENT naming the method.
//
// Client- and bidi-streaming methods (Exec) are not covered: there a message that does
// not parse ends the reactor's reads like the end of the stream, and the reactor decides.
//
// Thread-safety: the factory may be used from any thread; each interceptor belongs to one
// call. Lifetime: give the factory to grpc::ServerBuilder, which owns it.

#include <memory>

#include "grpcpp/support/server_interceptor.h"

namespace sbx::server {

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
NewUnparsedRequestInterceptorFactory();

}  // namespace sbx::server

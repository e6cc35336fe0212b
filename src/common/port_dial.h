#pragma once
// The port-dial exchange between sbx-server's port proxy and a sandbox's daemon
// (sbx-sandboxd) on the daemon's unix socket: the daemon, which lives in the sandbox's
// network namespace, connects to 127.0.0.1:PORT there and passes the connected socket to
// the server (SCM_RIGHTS). The server then moves bytes between that socket and its client
// itself; the daemon is out of the data path, and the sandbox never gets the host's
// network.
//
// The daemon's socket also carries gRPC: a connection whose first byte is kPortDialMagic[0]
// ('S'; gRPC's HTTP/2 preface starts with 'P') is a port dial. One dial per connection:
//
//   server -> daemon: "SBXDIAL1" | u16 secret length (big-endian) | secret | u16 port
//   daemon -> server: one byte kPortDialOk with the connected socket attached, or
//                     one byte kPortDialError | u16 length | message (UTF-8, at most 512)
//
// The secret is the sandbox's (src/common/sandbox_secret.h), compared in constant time.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace sbx {

inline constexpr absl::string_view kPortDialMagic = "SBXDIAL1";
inline constexpr uint8_t kPortDialOk = 0;
inline constexpr uint8_t kPortDialError = 1;
inline constexpr size_t kMaxPortDialSecretBytes = 256;
inline constexpr size_t kMaxPortDialMessageBytes = 512;

// The server's request for `port` under `secret` (at most kMaxPortDialSecretBytes).
inline std::string EncodePortDial(absl::string_view secret, uint16_t port) {
  std::string out(kPortDialMagic);
  out.push_back(static_cast<char>((secret.size() >> 8) & 0xff));
  out.push_back(static_cast<char>(secret.size() & 0xff));
  out.append(secret.data(), secret.size());
  out.push_back(static_cast<char>(port >> 8));
  out.push_back(static_cast<char>(port & 0xff));
  return out;
}

}  // namespace sbx

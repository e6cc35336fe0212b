#pragma once
// The daemon's side of the port dial (src/common/port_dial.h): given a connection whose
// first byte announced a dial, read the request, check the secret, connect to
// 127.0.0.1:PORT in the daemon's (the sandbox's) network namespace and pass the socket
// back. Every step is bounded in time (`timeout` in total); errors are answered on the
// connection when it still works, and logged.
//
// Thread-safety: reentrant. Lifetime: takes ownership of `conn_fd` (closed on return).

#include <string>

#include "absl/time/time.h"

namespace sbx::sandboxd {

// `secret` empty: no check (a daemon serving without a secret, development only).
void ServePortDial(int conn_fd, const std::string& secret, absl::Duration timeout);

}  // namespace sbx::sandboxd

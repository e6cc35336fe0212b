#pragma once
// Version and source revision of this build, for logs, Ping and metrics.

namespace sbx {

const char* Version();    // "0.1.0"
const char* GitCommit();  // short hash, or "unknown" outside a git checkout

}  // namespace sbx

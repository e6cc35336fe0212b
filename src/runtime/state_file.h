#pragma once
// The state file of a sandbox (root_dir/<id>/state.json): what a later runtime needs to
// adopt the sandbox or clean it up (id, pool, its top process and the pid 1 of its
// namespace with their start times, whether it is suspended), and the template it was
// started from (name and spec, up to 256 KiB of spec) so that a later runtime can Reset it. Paths
// (socket, cgroups) are not in it: they follow from the id. It lies in the sandbox's host folder,
// which no sandbox reaches, and is written and read without following symbolic links; a file that
// is not a regular file of this process's user, or of another version, is not believed.
//
// Thread-safety: the functions may run on any thread; the caller serializes writes of one
// sandbox's file (its op_mu, or before the sandbox is in the table).
// Lifetime: the file lives and dies with the sandbox's host folder.
// Internal to sbx::runtime_local; consumers use bubblewrap_runtime.h.

#include <string>

#include "src/runtime/local_sandbox.h"

namespace sbx::runtime::local {

// The state file's text for `sb`.
std::string EncodeState(const Sandbox& sb);

// Fills `sb` from a state file's text; false if it is empty, unreadable or of another
// version.
bool DecodeState(const std::string& text, Sandbox* sb);

// Reads a file of ours in `dir`: a regular file owned by this process's user, reached
// without symbolic links, at most 1 MiB. Empty when it is anything else.
std::string ReadOwnFile(const std::string& dir, const char* name);

// Writes the state file atomically (a reader sees the old file or the new one), in the
// sandbox's host folder, following no symbolic link. False on any error.
bool WriteState(const Sandbox& sb);

}  // namespace sbx::runtime::local

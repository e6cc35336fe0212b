#pragma once
// How local sandboxes end and what they leave: the reaper's wait (the pidfds of the
// sandboxes' top processes and their output FIFOs, polled together), the drain of each
// sandbox's output FIFO into its bounded log (sandboxd.log and sandboxd.log.1, at most
// 1 MiB each), reaping a top process, and KillSandbox, which kills every process of a
// sandbox and removes its cgroups and host folder.
//
// Thread-safety: every function may run on any thread. DrainOutput and KillSandbox
// serialize on the sandbox's log_mu; the caller of KillSandbox holds its op_mu (or is its
// only user), so a kill never overlaps a suspension.
// Lifetime: KillSandbox ends the sandbox for good; its Sandbox record stays valid (and its
// output descriptor open) until the last SandboxPtr lets go.
// Internal to sbx::runtime_local; consumers use bubblewrap_runtime.h.

#include <atomic>
#include <cstdint>
#include <vector>

#include "src/runtime/local_sandbox.h"

namespace sbx::runtime::local {

// One round of the reaper: waits until the top process of one of `sandboxes` ends, one
// of their output FIFOs has data, or `wake_fd` (an eventfd) is signalled (whose count it
// reads) — without a timeout, or for at most 50 ms when a sandbox has no pidfd (its
// process is then checked by its start time). Drains the outputs that have data, adding
// what their logs did not keep to `dropped`. Returns the sandboxes whose top process has
// ended (not reaped yet).
std::vector<SandboxPtr> WaitForEnds(const std::vector<SandboxPtr>& sandboxes, int wake_fd,
                                    std::atomic<uint64_t>* dropped);

// Moves what the sandbox's output FIFO holds into its log: sandboxd.log, which at 1 MiB
// becomes sandboxd.log.1 (replacing the previous one) and starts again. So the host keeps
// at most 2 MiB of a sandbox's output however much it writes; what is dropped is counted
// in `dropped`. Reads at most 1 MiB per call (the reaper serves every sandbox in turn); a
// closed FIFO (every writer gone) sets output_ended. Does nothing once KillSandbox ran.
void DrainOutput(Sandbox& sb, std::atomic<uint64_t>* dropped);

// Opens the log of a sandbox found running (adopted): its output FIFO and the current log
// file, both reached without symbolic links and made by this user. Logs when the sandbox
// has no FIFO (started by a version that wrote its output to the log file directly).
void OpenOutput(Sandbox& sb);

// Reaps the top process if it is a child of this process (started here, or adopted by
// this process's second runtime); returns its wait status, or -1.
int ReapIfChild(Sandbox& sb, bool block);

// Kills every process of the sandbox, reaps its top process and removes its cgroups and
// folder. Safe on a half-started sandbox and on one frozen by Suspend.
void KillSandbox(Sandbox& sb);

}  // namespace sbx::runtime::local

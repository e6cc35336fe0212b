#pragma once
// The local runtime's cgroups (v1): which controllers the machine lets it use (memory and
// pids limits, the freezer), a sandbox's cgroups with its template's limits, the processes
// they hold, suspension (the freezer, or SIGSTOP/SIGCONT of every process where there is
// none) and the pruning of empty cgroups left behind by a killed runtime.
//
// Thread-safety: a Cgroups is fixed after Detect() and may be read from any thread. The
// functions on a Sandbox may run on any thread; the caller serializes suspension and the
// kill of one sandbox (its op_mu).
// Lifetime: cgroups outlive the runtime with their sandboxes; KillSandbox (reaper.h)
// removes them.
// Internal to sbx::runtime_local; consumers use bubblewrap_runtime.h.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "src/runtime/bubblewrap_runtime.h"
#include "src/runtime/local_sandbox.h"

namespace sbx::runtime::local {

// cgroup v1 controllers this runtime uses, when the machine has them.
struct Cgroups {
  std::string memory;  // e.g. /sys/fs/cgroup/memory/sbx, empty if unusable
  std::string pids;
  std::string freezer;  // suspension; empty: SIGSTOP/SIGCONT

  // The controllers found writable (making each one's sbx folder); the freezer only with
  // use_freezer.
  static Cgroups Detect(bool use_freezer);

  // The folders a sandbox `id` may have (whether made or not).
  std::vector<std::string> DirsOf(const std::string& id) const;
};

// The pids in a cgroup (v1 cgroup.procs), empty if it is gone.
std::vector<pid_t> CgroupProcs(const std::string& dir);

// Makes the sandbox's cgroups: the freezer one (for Suspend, stored in `*freezer`) and
// those that carry its limits. Returns the folders made. What cannot be applied is logged,
// not fatal (the machine may not delegate cgroups).
std::vector<std::string> MakeCgroups(const Cgroups& cgroups, const std::string& id,
                                     const LocalSpec& spec, std::string* freezer);

// Removes the empty sandbox cgroups older than a minute, whatever root they came from.
void PruneEmptyCgroups(const Cgroups& cgroups);

// The processes of a sandbox: the members of its cgroups where it has one, else its top
// process and everything below it.
std::vector<pid_t> Members(const Sandbox& sb);

// Freezer cgroup: asks for `state` (FROZEN or THAWED) and waits until the cgroup is in
// it. UNAVAILABLE when the freezer cannot be written, DEADLINE_EXCEEDED when it does not
// settle within kSettleTimeout.
[[nodiscard]] absl::Status SetFreezer(const Sandbox& sb, const std::string& state);

// The fallback without a freezer: SIGSTOP every process of the sandbox and wait until
// each one has stopped; DEADLINE_EXCEEDED naming a process that did not.
[[nodiscard]] absl::Status StopAll(const Sandbox& sb);

// SIGCONT to every process of the sandbox.
void ContinueAll(const Sandbox& sb);

}  // namespace sbx::runtime::local

#pragma once
// Synchronous signal handling for main(): block the given signals in the calling thread
// before any other thread starts (threads inherit the mask), then wait for them with
// sigwait. No handler runs, so nothing has to be async-signal-safe.

#include <csignal>
#include <initializer_list>

namespace sbx {

// Blocks `signals` in the calling thread and returns the set, for sigwait.
inline sigset_t BlockSignals(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

}  // namespace sbx

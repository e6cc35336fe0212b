#include "src/runtime/seccomp_filter.h"

#include <sched.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "src/common/errno_text.h"
#include "src/runtime/proc.h"

namespace sbx::runtime::local {

absl::StatusOr<std::string> SeccompProgram() {
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
  if (ctx == nullptr) return absl::FailedPreconditionError("libseccomp: seccomp_init failed");
  auto release = absl::MakeCleanup([ctx] { seccomp_release(ctx); });
  static constexpr const char* kDenied[] = {"mount",
                                            "umount",
                                            "umount2",
                                            "pivot_root",
                                            "chroot",
                                            "move_mount",
                                            "open_tree",
                                            "fsopen",
                                            "fsconfig",
                                            "fsmount",
                                            "fspick",
                                            "mount_setattr",
                                            "ptrace",
                                            "process_vm_readv",
                                            "process_vm_writev",
                                            "pidfd_getfd",
                                            "kcmp",
                                            "keyctl",
                                            "add_key",
                                            "request_key",
                                            "bpf",
                                            "perf_event_open",
                                            "userfaultfd",
                                            "open_by_handle_at",
                                            "name_to_handle_at",
                                            "kexec_load",
                                            "kexec_file_load",
                                            "init_module",
                                            "finit_module",
                                            "delete_module",
                                            "create_module",
                                            "query_module",
                                            "get_kernel_syms",
                                            "reboot",
                                            "swapon",
                                            "swapoff",
                                            "acct",
                                            "syslog",
                                            "iopl",
                                            "ioperm",
                                            "quotactl",
                                            "quotactl_fd",
                                            "lookup_dcookie",
                                            "setns",
                                            "vhangup",
                                            "nfsservctl",
                                            "uselib",
                                            "settimeofday",
                                            "clock_settime",
                                            "clock_adjtime",
                                            "adjtimex",
                                            "fanotify_init",
                                            "io_uring_setup",
                                            "io_uring_enter",
                                            "io_uring_register"};
  for (const char* name : kDenied) {
    const int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR) continue;  // not a system call of this architecture
    if (int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0); rc != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("libseccomp: cannot add a rule for ", name, ": ", sbx::ErrnoText(-rc)));
    }
  }
  const uint64_t newuser = CLONE_NEWUSER;
  int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1,
                            SCMP_A0(SCMP_CMP_MASKED_EQ, newuser, newuser));
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                          SCMP_A0(SCMP_CMP_MASKED_EQ, newuser, newuser));
  }
  if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
  if (rc == 0) {
    rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                          SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffU, TIOCSTI));
  }
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("libseccomp: cannot add an argument rule: ", sbx::ErrnoText(-rc)));
  }
  Fd mem(static_cast<int>(syscall(SYS_memfd_create, "sbx-seccomp", MFD_CLOEXEC)));
  if (!mem.valid()) {
    return absl::FailedPreconditionError(absl::StrCat("memfd_create: ", sbx::ErrnoText(errno)));
  }
  if (rc = seccomp_export_bpf(ctx, mem.get()); rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("libseccomp: cannot export the filter: ", sbx::ErrnoText(-rc)));
  }
  std::string program;
  char buf[4096];
  ssize_t n;
  lseek(mem.get(), 0, SEEK_SET);
  while ((n = read(mem.get(), buf, sizeof(buf))) > 0) program.append(buf, static_cast<size_t>(n));
  if (program.empty()) return absl::FailedPreconditionError("libseccomp: an empty filter");
  return program;
}

}  // namespace sbx::runtime::local

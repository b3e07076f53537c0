"""The sandbox's seccomp filter: system calls a graded program never needs and an escape would.

Everything else is allowed (a denylist): programs are ordinary Python, and the namespaces, mounts, user
and cgroups already bound what the allowed calls can reach. A denied call fails with EPERM (ENOSYS for
clone3, so the C library falls back to clone, whose flags the filter can read). The filter is compiled by
libseccomp (through pyseccomp) once per process and handed to bubblewrap as BPF.
"""

from __future__ import annotations

import errno
import functools
import os

# Sockets of every family (TCP, UDP, unix, netlink, raw): the sandbox has no network of any kind.
NETWORK = ("socket", "socketpair")
# New namespaces, mounts and root changes: the sandbox's view is fixed by bubblewrap.
NAMESPACES = ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsmount",
              "fsconfig", "fspick", "move_mount", "open_tree", "mount_setattr")
# Other processes' memory and kernel interfaces that have carried privilege escalations.
KERNEL = ("ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key", "bpf",
          "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "acct",
          "swapon", "swapoff", "reboot", "syslog", "quotactl", "name_to_handle_at", "open_by_handle_at",
          "fanotify_init", "lookup_dcookie", "iopl", "ioperm", "vhangup", "uselib", "personality")
DENIED = NETWORK + NAMESPACES + KERNEL
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
TIOCSTI = 0x5412  # push characters into a terminal's input: denied on any descriptor


class SeccompUnavailable(RuntimeError):
    """libseccomp or its Python binding is missing."""


@functools.cache
def filter_program() -> bytes:
    """The filter as BPF, as bubblewrap's `--seccomp FD` reads it."""
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as exc:  # OSError: the binding loads libseccomp.so.2 on import
        raise SeccompUnavailable(f"libseccomp is not usable ({exc})") from exc
    box = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    deny = seccomp.ERRNO(errno.EPERM)
    for name in DENIED:
        try:
            box.add_rule(deny, name)
        except (ValueError, RuntimeError):  # not a system call on this architecture
            continue
    for flag in CLONE_NAMESPACE_FLAGS:
        box.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    box.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    box.add_rule(deny, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, TIOCSTI))
    with os.fdopen(os.memfd_create("swarmnode-seccomp"), "w+b") as program:
        box.export_bpf(program)
        program.seek(0)
        return program.read()

"""What this machine offers the sandbox, found once per process: bubblewrap, the interpreter, the user the
program runs as, cgroups and the seccomp filter. Anything missing is `SandboxUnavailable`, naming the fix."""

from __future__ import annotations

import functools
import os
import shutil
import sys
from dataclasses import dataclass, field

from swarmnode.node.sandbox.cgroups import CgroupsUnavailable, Layout, detect_layout, sweep
from swarmnode.node.sandbox.seccomp import SeccompUnavailable, filter_program

SANDBOX_UID_ENV = "SWARMNODE_SANDBOX_UID"  # the unprivileged user a root node runs programs as
DEFAULT_SANDBOX_UID = 65534  # nobody


class SandboxUnavailable(RuntimeError):
    """This machine cannot run untrusted code safely; the message names what to install or change."""


@dataclass(frozen=True)
class HostSandbox:
    """Everything a run needs that does not change between runs."""

    bwrap: str
    python: str  # the interpreter's real path
    python_prefix: str  # its install, mounted read-only
    as_root: bool  # the node is root: programs run as `uid`/`gid` inside `cgroups`
    uid: int
    gid: int
    cgroups: Layout | None  # None: a non-root node (rlimits bound each process, spec/bounds.md)
    seccomp: bytes = field(repr=False)


@functools.cache
def host_sandbox() -> HostSandbox:
    """This machine's sandbox, or SandboxUnavailable. Found once; a node checks it before joining a run
    whose tasks execute code."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed, and code is never run unsandboxed: "
            "install it (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"
        )
    python = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    if not python.startswith(prefix + os.sep):
        raise SandboxUnavailable(f"the interpreter {python} is not inside its install {prefix}")
    try:
        seccomp = filter_program()
    except SeccompUnavailable as exc:
        raise SandboxUnavailable(f"{exc}: install libseccomp2 and the pyseccomp package") from exc
    as_root = os.geteuid() == 0
    cgroups = None
    if as_root:
        uid = int(os.environ.get(SANDBOX_UID_ENV, DEFAULT_SANDBOX_UID))
        if uid == 0:
            raise SandboxUnavailable(f"{SANDBOX_UID_ENV}=0: programs must run as an unprivileged user")
        try:
            cgroups = detect_layout()
        except CgroupsUnavailable as exc:
            raise SandboxUnavailable(
                f"{exc}: a node running as root bounds each program's memory and processes with cgroups "
                "(mount cgroup v2 with the memory and pids controllers, or run the node as a normal user)"
            ) from exc
        sweep(cgroups)
    else:
        uid = DEFAULT_SANDBOX_UID  # the user inside the namespace; outside it is the node's own
    return HostSandbox(bwrap, python, prefix, as_root, uid, uid, cgroups, seccomp)

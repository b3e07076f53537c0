"""Run one Python program in the sandbox and report how it ended.

The parent's side of a run:
1. stage the program, the launcher and the seccomp filter as memory files (no host path is shared);
2. start bubblewrap (its own session; as root, after moving nothing yet) and read the sandbox's first pid
   from `--info-fd` while bubblewrap waits on `--block-fd`;
3. move that pid into the run's cgroup, so every process the program starts is bounded and counted, then
   let it go;
4. wait up to the wall bound; then kill the sandbox's first process (the kernel ends its whole PID
   namespace, `setsid` grandchildren included), bubblewrap's session and whatever is left in the cgroup.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from swarmnode.node.sandbox.bwrap import BwrapFds, bwrap_argv
from swarmnode.node.sandbox.cgroups import RunCgroup
from swarmnode.node.sandbox.host import HostSandbox, SandboxUnavailable, host_sandbox
from swarmnode.node.sandbox.launcher import BUDGET_EXIT, LAUNCHER
from swarmnode.node.sandbox.limits import Outcome, RunResult, SandboxLimits

START_TIMEOUT_S = 10.0  # bubblewrap reports the sandbox's pid within this, or the start failed
DEFAULT_LIMITS = SandboxLimits()


def _memory_file(name: str, data: bytes) -> int:
    fd = os.memfd_create(name)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _read_ready(fd: int) -> bytes:
    """What the launcher wrote on its ready pipe (every writer is gone once the run ended)."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 16)
    except BlockingIOError:
        return b""


def _read_info(fd: int, deadline: float) -> dict[str, int] | None:
    """bubblewrap's JSON with `child-pid`, or None when it exited first (its stderr says why)."""
    data = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        try:
            info = json.loads(data)
        except ValueError:
            continue
        return info if isinstance(info, dict) and isinstance(info.get("child-pid"), int) else None
    return None


def _wait_unreaped(pid: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for `pid` to exit without reaping it (its process group id stays ours)."""
    deadline = time.monotonic() + timeout_s
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)
    return True


def _read_capped(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _exit_status(code: int) -> int:
    """bubblewrap's exit status as the program's: 128+N (killed by signal N) becomes -N."""
    return -(code - 128) if 128 < code < 128 + signal.NSIG else code


def classify(returncode: int | None, stderr: str, oom_killed: bool) -> Outcome:
    """How a run ended, from its status (None: the wall bound), its stderr and the cgroup's OOM count."""
    if oom_killed:  # the aggregate bound: whatever the program then did depended on the machine
        return Outcome.MEMORY
    if returncode is None or returncode == -signal.SIGXCPU:
        return Outcome.TIMEOUT
    if returncode == 0:
        return Outcome.OK
    if "MemoryError" in stderr:
        return Outcome.MEMORY
    if returncode == BUDGET_EXIT:
        return Outcome.BUDGET
    return Outcome.FAILED if returncode > 0 else Outcome.KILLED


def run_python(source: str, stdin: str = "", limits: SandboxLimits = DEFAULT_LIMITS,
               read_only: Sequence[str] = ()) -> RunResult:
    """Run `source` as a Python program in the sandbox and report how it ended. `read_only`: host paths it
    also sees, read-only, at `read_only_path(0)`, `read_only_path(1)`, ... (not on `sys.path`: `-S`).

    SandboxUnavailable when this machine cannot run it safely (nothing runs then).
    """
    return _run(host_sandbox(), source, stdin, limits, read_only)


def _run(host: HostSandbox, source: str, stdin: str, limits: SandboxLimits,
         read_only: Sequence[str] = ()) -> RunResult:
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="swarmnode-sandbox-")))
        (work / "stdin").write_text(stdin)
        info_read, info_write = os.pipe()
        block_read, block_write = os.pipe()
        ready_read, ready_write = os.pipe()
        ours = [info_read, block_write, ready_read]
        launcher = _memory_file("launcher", LAUNCHER.encode())
        program = _memory_file("program", source.encode())
        seccomp = _memory_file("seccomp", host.seccomp)
        passed = BwrapFds(launcher, program, seccomp, info_write, block_read, ready_write)
        theirs = list(dataclasses.astuple(passed))  # the child's: ours to close once it holds them
        stack.callback(_close_all, ours)
        stack.callback(_close_all, theirs)
        launcher_args = [str(host.uid), str(host.gid), str(limits.memory_bytes), str(limits.cpu_time_s),
                         str(limits.file_size_bytes), str(0 if host.as_root else limits.max_processes),
                         str(limits.line_budget), str(ready_write)]
        argv = bwrap_argv(host.bwrap, host.python, host.python_prefix, passed, as_root=host.as_root,
                          sandbox_uid=host.uid, sandbox_gid=host.gid, scratch_bytes=limits.scratch_bytes,
                          launcher_args=launcher_args, read_only=read_only)
        cgroup = None
        if host.cgroups is not None:
            cgroup = RunCgroup(host.cgroups, limits.aggregate_memory_bytes, limits.max_processes)
            stack.callback(cgroup.kill_and_remove)
        fin = stack.enter_context(open(work / "stdin", "rb"))
        fout = stack.enter_context(open(work / "out", "wb"))
        ferr = stack.enter_context(open(work / "err", "wb"))
        proc = subprocess.Popen(argv, stdin=fin, stdout=fout, stderr=ferr, env={}, start_new_session=True,
                                pass_fds=tuple(theirs))
        _close_all(theirs)
        theirs.clear()
        first = -1  # a pidfd of the sandbox's first process: signalling it can never hit a reused pid
        try:
            info = _read_info(info_read, time.monotonic() + START_TIMEOUT_S)
            if info is not None:
                first = os.pidfd_open(info["child-pid"])  # alive: it waits on the block fd
                ours.append(first)
                if cgroup is not None:
                    cgroup.attach(info["child-pid"])
                os.write(block_write, b"go")
            exited = _wait_unreaped(proc.pid, limits.wall_time_s if info is not None else START_TIMEOUT_S)
        finally:
            if first >= 0:
                signal.pidfd_send_signal(first, signal.SIGKILL)  # ends its whole PID namespace
            os.killpg(proc.pid, signal.SIGKILL)  # bubblewrap's session; not reaped yet, so the id is ours
            status = proc.wait()
        stderr = _read_capped(work / "err", limits.max_output_chars)
        if _read_ready(ready_read) != b"ready":
            raise SandboxUnavailable(f"the sandbox did not start (status {status}): {stderr.strip()[:500]}")
        stdout = _read_capped(work / "out", limits.max_output_chars)
        oom = cgroup is not None and cgroup.oom_killed()
    returncode = _exit_status(status) if exited else None
    return RunResult(classify(returncode, stderr, oom), returncode, stdout, stderr)


@functools.cache
def check_sandbox() -> HostSandbox:
    """`host_sandbox()` after one trivial program ran in it: a node calls this before it takes a run whose
    tasks execute code, so a machine that cannot run the sandbox says so at start, not at the first item."""
    host = host_sandbox()
    result = _run(host, "print(6 * 7)\n", "", SandboxLimits(wall_time_s=START_TIMEOUT_S))
    if result.outcome is not Outcome.OK or result.stdout != "42\n":
        raise SandboxUnavailable(f"a trivial program failed in the sandbox ({result.outcome}): "
                                 f"{result.stderr.strip()[:500]}")
    return host

"""Code tasks: run the completion against the task's tests in a subprocess sandbox; reward 1 iff they pass.

Rewards are recomputed by validators, so what decides one must not depend on the machine:
- deterministic bounds give a reward of 0: the program's own failure, a budget of `LINE_BUDGET` executed
  Python lines (a trace function in the sandbox counts them and exits with `BUDGET_EXIT`: an endless loop
  ends there, the same on every machine running the same Python), and the output cap (RLIMIT_FSIZE: a
  write past it fails in the program);
- machine-dependent bounds are only a safety net: wall time, CPU time, memory (RLIMIT_AS) or a signal
  from outside end the run with `GraderFault`, which is no verdict on the answer (a validator quarantines
  the item, a worker does not submit it). The net is set well above what the line budget costs
  (`CODE_LIMITS`: about 0.15 s per million lines here, 5 s of CPU), so only work the trace cannot see
  reaches it (long C calls like `2**10**10`, a program that turns the trace off).

How the sandbox works, and what it is not:
- A fresh temp dir as cwd, `python -I` (no PYTHON* env, no user site), an empty environment but PATH, stdin
  given, stdout/stderr to files in the temp dir (capped by RLIMIT_FSIZE, so a flood cannot fill our memory).
- Inside the child, a launcher sets its own limits before running the program (no `preexec_fn`, which is
  unsafe in a threaded parent): RLIMIT_AS (memory), RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0.
  (CPU: SIGXCPU at the soft limit, SIGKILL a second later.) It then cuts the network: a new network
  namespace with no interfaces (unshare CLONE_NEWNET, or CLONE_NEWUSER|CLONE_NEWNET unprivileged); where
  the kernel refuses both, it falls back to replacing the socket module's constructors, which stops honest
  mistakes only. `RunResult.network` says which one applied.
- The parent enforces wall time and kills the whole process group (the child runs in a new session).
- Not a security boundary against hostile code: no seccomp, no filesystem isolation, no process-count limit
  (RLIMIT_NPROC counts the whole user's processes). Workers that grade untrusted code should run inside a
  container or VM; validators only re-grade, which for code tasks they should do in the same kind of box.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from swarmnode.node.rl.tasks.core import Grade, GraderFault, Task

KIND = "code"
LINE_BUDGET = 5_000_000  # Python line events a graded program may execute (deterministic bound)
BUDGET_EXIT = 113  # the sandbox's exit status when the line budget is spent

_LAUNCHER = r"""
import ctypes, resource, sys
mem, cpu, fsize, budget = (int(a) for a in sys.argv[2:6])
for lim, soft, hard in ((resource.RLIMIT_AS, mem, mem), (resource.RLIMIT_CPU, cpu, cpu + 1),
                        (resource.RLIMIT_FSIZE, fsize, fsize), (resource.RLIMIT_NOFILE, 64, 64),
                        (resource.RLIMIT_CORE, 0, 0)):
    resource.setrlimit(lim, (soft, hard))
net = "socket-guard"
try:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x40000000) == 0 or libc.unshare(0x10000000 | 0x40000000) == 0:
        net = "namespace"
except (OSError, AttributeError):
    pass
if net != "namespace":
    import socket
    def _deny(*a, **k):
        raise OSError("network disabled in sandbox")
    socket.socket = socket.create_connection = socket.socketpair = _deny
sys.stderr.write("@@net=" + net + "\n"); sys.stderr.flush()
del ctypes, resource, libc
path = sys.argv[1]
sys.argv = [path]
with open(path, encoding="utf-8") as f:
    program = compile(f.read(), path, "exec")
namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
if budget:  # count the program's lines only: everything above is the same for every program
    import os, threading
    lines = 0
    def _count(frame, event, arg):
        global lines
        if event == "line":
            lines += 1
            if lines > budget:
                sys.stderr.write("line budget spent\n"); sys.stderr.flush(); os._exit(@BUDGET_EXIT@)
        return _count
    sys.settrace(_count); threading.settrace(_count)
exec(program, namespace)
""".replace("@BUDGET_EXIT@", str(BUDGET_EXIT))


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed run."""

    wall_time_s: float = 5.0
    cpu_time_s: int = 5
    memory_bytes: int = 512 * 2**20
    file_size_bytes: int = 4 * 2**20
    max_output_chars: int = 8192
    line_budget: int = 0  # Python lines the program may execute (0: no budget)


CODE_LIMITS = SandboxLimits(wall_time_s=10.0, cpu_time_s=5, line_budget=LINE_BUDGET)  # what grading uses


class Outcome(StrEnum):
    """How a sandboxed run ended."""

    OK = "ok"
    FAILED = "failed"  # non-zero exit (an assertion, an exception)
    TIMEOUT = "timeout"  # wall time or CPU time exceeded
    MEMORY = "memory"  # MemoryError under RLIMIT_AS
    KILLED = "killed"  # some other signal
    BUDGET = "budget"  # the line budget was spent (exit status BUDGET_EXIT)


@dataclass(frozen=True)
class RunResult:
    """What a sandboxed run did; stdout/stderr are truncated to the limit."""

    outcome: Outcome
    returncode: int | None
    stdout: str
    stderr: str
    network: str  # "namespace" or "socket-guard" (see module docstring); "" if the launcher never reported


def _wait_unreaped(pid: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for `pid` to exit without reaping it (so its process group id stays ours)."""
    deadline = time.monotonic() + timeout_s
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def _read_capped(path: Path, limit: int) -> str:
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace")


def _classify(returncode: int | None, stderr: str) -> Outcome:
    if returncode is None or returncode == -signal.SIGXCPU:
        return Outcome.TIMEOUT
    if returncode == 0:
        return Outcome.OK
    if returncode == BUDGET_EXIT:
        return Outcome.BUDGET
    if "MemoryError" in stderr:
        return Outcome.MEMORY
    return Outcome.FAILED if returncode > 0 else Outcome.KILLED


def run_python(source: str, stdin: str = "", limits: SandboxLimits = SandboxLimits()) -> RunResult:
    """Run `source` as a Python program in the sandbox and report how it ended."""
    with tempfile.TemporaryDirectory(prefix="swarmnode-sandbox-") as tmp:
        work = Path(tmp)
        (work / "launcher.py").write_text(_LAUNCHER)
        (work / "main.py").write_text(source)
        (work / "stdin").write_text(stdin)
        argv = [
            sys.executable,
            "-I",
            str(work / "launcher.py"),
            str(work / "main.py"),
            str(limits.memory_bytes),
            str(limits.cpu_time_s),
            str(limits.file_size_bytes),
            str(limits.line_budget),
        ]
        with (
            open(work / "stdin", "rb") as fin,
            open(work / "out", "wb") as fout,
            open(work / "err", "wb") as ferr,
        ):
            proc = subprocess.Popen(
                argv,
                cwd=work,
                env={"PATH": "/usr/bin:/bin"},
                stdin=fin,
                stdout=fout,
                stderr=ferr,
                start_new_session=True,
            )
            try:
                exited = _wait_unreaped(proc.pid, limits.wall_time_s)
            finally:
                os.killpg(proc.pid, signal.SIGKILL)  # the leader is not reaped yet, so its group id is ours
                status = proc.wait()
        returncode = status if exited else None
        stdout = _read_capped(work / "out", limits.max_output_chars)
        stderr = _read_capped(work / "err", limits.max_output_chars)
    match = re.match(r"@@net=([\w-]+)\n", stderr)
    network = match.group(1) if match else ""
    stderr = stderr[match.end() :] if match else stderr
    return RunResult(_classify(returncode, stderr), returncode, stdout, stderr, network)


def extract_code(completion: str) -> str:
    """The last fenced code block of a completion (```python ... ```), or the whole text without fences."""
    blocks = re.findall(r"```[a-zA-Z0-9_+-]*\n(.*?)```", completion, flags=re.DOTALL)
    return blocks[-1] if blocks else completion


MACHINE_BOUND = (Outcome.TIMEOUT, Outcome.MEMORY, Outcome.KILLED)  # outcomes no reward may follow from


def grade(task: Task, completion: str, limits: SandboxLimits = CODE_LIMITS) -> Grade:
    """1.0 iff the completion's code followed by the task's tests (`target`) exits 0 in the sandbox.

    GraderFault when the run hit a machine-dependent limit (module docstring).
    """
    code = extract_code(completion)
    if not code.strip():
        return Grade(0.0, "empty answer")
    result = run_python(code + "\n\n" + task.target + "\n", limits=limits)
    if result.outcome is Outcome.OK:
        return Grade(1.0, "tests passed")
    last = result.stderr.strip().splitlines()[-1:]
    reason = result.outcome.value + (f": {last[0][:120]}" if last else "")
    if result.outcome in MACHINE_BOUND:
        raise GraderFault(f"the code sandbox stopped on a machine-dependent limit ({reason})")
    return Grade(0.0, reason)

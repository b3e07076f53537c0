"""What one sandboxed run may use, and how it ended: plain data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed run (spec/bounds.md, The code sandbox).

    Per process: `memory_bytes` of address space, `cpu_time_s` of CPU, `file_size_bytes` per file written.
    For the whole run: `wall_time_s`, `max_processes` alive at once and `aggregate_memory_bytes` (cgroups),
    `scratch_bytes` of files in the scratch directory (a tmpfs of that size).
    """

    wall_time_s: float = 5.0
    cpu_time_s: int = 5
    memory_bytes: int = 512 * 2**20
    file_size_bytes: int = 4 * 2**20
    max_output_chars: int = 8192
    line_budget: int = 0  # Python lines the program may execute (0: no budget)
    max_processes: int = 16
    aggregate_memory_bytes: int = 768 * 2**20
    scratch_bytes: int = 16 * 2**20


class Outcome(StrEnum):
    """How a sandboxed run ended."""

    OK = "ok"
    FAILED = "failed"  # non-zero exit (an assertion, an exception)
    TIMEOUT = "timeout"  # wall time or CPU time exceeded
    MEMORY = "memory"  # MemoryError under RLIMIT_AS, or the cgroup's OOM killer
    KILLED = "killed"  # some other signal
    BUDGET = "budget"  # the line budget was spent (exit status BUDGET_EXIT)


@dataclass(frozen=True)
class RunResult:
    """What a sandboxed run did; stdout/stderr are truncated to the limit."""

    outcome: Outcome
    returncode: int | None  # the program's exit status; -N for signal N; None when the wall bound ended it
    stdout: str
    stderr: str

"""One cgroup per sandboxed run: the aggregate memory and process bounds, and a kill that reaches every
process the run started.

Both layouts are handled: cgroup v2 (one directory with `memory.max`, `pids.max`, `cgroup.kill`) and v1
(a directory under the `memory` and one under the `pids` hierarchy). Runs live under a `swarmnode-sandbox`
parent, named after the node's pid; a node's first run removes what a crashed node left (`sweep`).
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PARENT = "swarmnode-sandbox"
log = logging.getLogger(__name__)
REMOVE_WAIT_S = 5.0  # how long a finished run's processes may take to leave before the directory stays


class CgroupsUnavailable(RuntimeError):
    """This node cannot create cgroups with the memory and pids controllers."""


@dataclass(frozen=True)
class Layout:
    """Where the runs' cgroups go: one directory (v2) or one per controller (v1)."""

    version: int
    parents: tuple[Path, ...]  # v2: (ROOT/PARENT,); v1: (ROOT/memory/PARENT, ROOT/pids/PARENT)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def detect_layout(root: Path = ROOT) -> Layout:
    """The layout this machine offers, with the parent directories created; CgroupsUnavailable if none."""
    try:
        if (root / "cgroup.controllers").exists():  # v2
            available = (root / "cgroup.controllers").read_text().split()
            if not {"memory", "pids"} <= set(available):
                raise CgroupsUnavailable(f"cgroup v2 at {root} lacks the memory or pids controller")
            parent = root / PARENT
            parent.mkdir(exist_ok=True)
            _write(root / "cgroup.subtree_control", "+memory +pids")
            _write(parent / "cgroup.subtree_control", "+memory +pids")
            return Layout(2, (parent,))
        parents = (root / "memory" / PARENT, root / "pids" / PARENT)
        for parent in parents:
            if not parent.parent.is_dir():
                raise CgroupsUnavailable(f"no cgroup v1 hierarchy at {parent.parent}")
            parent.mkdir(exist_ok=True)
        return Layout(1, parents)
    except OSError as exc:
        raise CgroupsUnavailable(f"cannot create cgroups under {root}: {exc}") from exc


class RunCgroup:
    """The cgroup(s) of one run: created with its limits, joined by the sandbox's first process, killed
    and removed when the run ends."""

    def __init__(self, layout: Layout, memory_bytes: int, max_processes: int) -> None:
        self.layout = layout
        name = f"{os.getpid()}-{secrets.token_hex(6)}"  # the node's pid first: see `sweep`
        self.dirs = tuple(parent / name for parent in layout.parents)
        for d in self.dirs:
            d.mkdir()
        if layout.version == 2:
            (d,) = self.dirs
            _write(d / "memory.max", str(memory_bytes))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
            _write(d / "pids.max", str(max_processes))
        else:
            memory, pids = self.dirs
            _write(memory / "memory.limit_in_bytes", str(memory_bytes))
            if (memory / "memory.memsw.limit_in_bytes").exists():
                _write(memory / "memory.memsw.limit_in_bytes", str(memory_bytes))
            _write(pids / "pids.max", str(max_processes))

    def attach(self, pid: int) -> None:
        """Move `pid` (before it starts the program) into the run's cgroup(s); its children follow."""
        for d in self.dirs:
            _write(d / "cgroup.procs", str(pid))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            try:
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except FileNotFoundError:
                pass
        return found

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer ended a process of this run (the aggregate memory bound)."""
        events = self.dirs[0] / ("memory.events" if self.layout.version == 2 else "memory.oom_control")
        try:
            for line in events.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        except (FileNotFoundError, ValueError):
            pass
        return False

    def kill_and_remove(self) -> None:
        """SIGKILL whatever is left and remove the directories; a process that outlives the wait (the
        kernel's, not the program's doing) leaves them for `sweep`, with a warning."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        while True:
            if self.layout.version == 2 and (self.dirs[0] / "cgroup.kill").exists():
                _write(self.dirs[0] / "cgroup.kill", "1")
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if all(_try_rmdir(d) for d in self.dirs):
                return
            if time.monotonic() >= deadline:
                left = [str(d) for d in self.dirs]
                log.warning("a sandbox cgroup outlived its run", extra={"cgroups": left})
                return
            time.sleep(0.002)


def _try_rmdir(d: Path) -> bool:
    try:
        d.rmdir()
    except FileNotFoundError:
        pass
    except OSError:  # EBUSY: a process is still leaving
        return False
    return True


def sweep(layout: Layout) -> None:
    """Remove run directories left by a node that crashed: those named after a pid no longer alive (a
    live node's directories are its own to remove; several nodes may share a machine)."""
    for parent in layout.parents:
        for child in parent.iterdir():
            owner = child.name.partition("-")[0]
            if child.is_dir() and owner.isdigit() and not Path(f"/proc/{owner}").exists():
                _try_rmdir(child)

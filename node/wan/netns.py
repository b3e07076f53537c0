"""Network namespaces, veth pairs and the bridge, through the `ip` tool; crash-safe cleanup by prefix.

Everything a WAN makes is named from one run prefix `swan<pid>-<n>`: its namespaces are `<prefix>-core`
and `<prefix>-<node>`, and the one interface it puts in the root namespace (the host link) is
`sw<pid>h<n>`. Deleting the namespaces deletes every veth end, bridge and TUN inside them, and with them
the host link and its route, so `destroy(prefix)` needs nothing but the prefix and is safe to repeat, and
`destroy_stale()` removes what a crashed run (its pid gone) left behind.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from typing import Any

IP_TIMEOUT_S = 30.0
KILL_GRACE_S = 5.0
_PREFIX = re.compile(r"^swan(\d+)-(\d+)$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class WanError(RuntimeError):
    """Building or tearing down a WAN failed: the command, and what the tool said."""


class WanUnavailable(WanError):
    """This machine cannot make network namespaces here (not root, no `ip`, no netns support)."""


def run_ip(args: Sequence[str], *, namespace: str | None = None, stdin: str | None = None) -> str:
    """Run `ip [-n NS] ARGS` (or `ip -batch -` with `stdin`); its stdout, or `WanError` with its stderr."""
    argv = ["ip", *(("-n", namespace) if namespace else ()), *args]
    return _run(argv, stdin=stdin)


def run_in(namespace: str, argv: Sequence[str], *, stdin: str | None = None) -> str:
    """Run a short command inside a namespace and wait for it (for `tc`, `sh -c` sysctls)."""
    return _run(["ip", "netns", "exec", namespace, *argv], stdin=stdin)


def _run(argv: Sequence[str], *, stdin: str | None = None) -> str:
    try:
        done = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False
        )
    except FileNotFoundError as err:
        raise WanUnavailable(f"{argv[0]!r} is not installed (iproute2 is needed for a WAN)") from err
    if done.returncode != 0:
        raise WanError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def check_available() -> None:
    """Raise `WanUnavailable` unless this process can create (and so delete) a network namespace."""
    if shutil.which("ip") is None:
        raise WanUnavailable("the `ip` tool (iproute2) is not installed: a WAN needs it")
    probe = f"swan{os.getpid()}-probe"
    try:
        run_ip(["netns", "add", probe])
    except WanError as err:
        raise WanUnavailable(
            f"cannot create a network namespace here (a WAN needs root or CAP_SYS_ADMIN): {err}"
        ) from err
    run_ip(["netns", "del", probe])


def valid_node_name(name: str) -> str:
    if not _NAME.match(name) or name == "core":
        raise ValueError(f"bad WAN node name {name!r}: 1-64 of [A-Za-z0-9_.-], and not 'core'")
    return name


def namespaces() -> list[str]:
    """Every named network namespace on this machine."""
    out = run_ip(["netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def add_namespace(name: str) -> None:
    try:
        run_ip(["netns", "add", name])
    except WanError as err:
        raise WanUnavailable(f"cannot create network namespace {name!r}: {err}") from err


def set_sysctls(namespace: str, values: Iterable[tuple[str, str]]) -> None:
    """Write /proc/sys values inside a namespace (one process for all; no `sysctl` binary needed)."""
    script = "; ".join(f"echo {value} > /proc/sys/{key.replace('.', '/')}" for key, value in values)
    run_in(namespace, ["sh", "-ec", script])


def namespace_pids(namespace: str) -> list[int]:
    try:
        out = run_ip(["netns", "pids", namespace])
    except WanError:
        return []
    return [int(token) for token in out.split() if token.isdigit()]


def stop_pids(pids: Iterable[int], grace: float = KILL_GRACE_S) -> None:
    """SIGTERM these processes (ones a WAN started in its own namespaces), SIGKILL what outlives `grace`."""
    alive = set(pids)
    for pid in list(alive):
        _signal(pid, signal.SIGTERM, alive)
    deadline = time.monotonic() + grace
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            if not _exists(pid):
                alive.discard(pid)
        time.sleep(0.05)
    for pid in list(alive):
        _signal(pid, signal.SIGKILL, alive)


def _signal(pid: int, signum: int, alive: set[int]) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        alive.discard(pid)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours is gone for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_namespaces(prefix: str, existing: Iterable[str] | None = None) -> list[str]:
    names = namespaces() if existing is None else list(existing)
    return [name for name in names if name.startswith(prefix + "-")]


def destroy(prefix: str, grace: float = KILL_GRACE_S) -> list[str]:
    """Remove every namespace of run `prefix` (stopping the processes left inside); the names removed.

    Idempotent: a second call, or a call for a run that never finished building, removes what is there.
    """
    if not _PREFIX.match(prefix):
        raise ValueError(f"not a WAN run prefix: {prefix!r} (expected swan<pid>-<n>)")
    removed = []
    owned = run_namespaces(prefix)
    stop_pids([pid for name in owned for pid in namespace_pids(name) if pid != os.getpid()], grace)
    for name in owned:
        try:
            run_ip(["netns", "del", name])
            removed.append(name)
        except WanError:
            if name in namespaces():
                raise
    link = host_link_name(prefix)
    if _root_link_exists(link):  # normally gone with the core namespace, which takes its peer
        try:
            run_ip(["link", "del", link])
        except WanError:
            if _root_link_exists(link):
                raise
    return removed


def destroy_stale() -> list[str]:
    """Remove what WAN runs whose process is gone left behind (after a crash or SIGKILL)."""
    prefixes = set()
    for name in namespaces():
        parts = name.split("-")
        if len(parts) >= 3 and _PREFIX.match(f"{parts[0]}-{parts[1]}"):
            prefixes.add(f"{parts[0]}-{parts[1]}")
    removed: list[str] = []
    for prefix in sorted(prefixes):
        match = _PREFIX.match(prefix)
        if match is not None and not _exists(int(match.group(1))):
            removed += destroy(prefix)
    return removed


def host_link_name(prefix: str) -> str:
    """The root-namespace end of a run's host link: at most 15 characters (IFNAMSIZ)."""
    match = _PREFIX.match(prefix)
    if match is None:
        raise ValueError(f"not a WAN run prefix: {prefix!r}")
    return f"sw{match.group(1)}h{match.group(2)}"[:15]


def _root_link_exists(name: str) -> bool:
    try:
        run_ip(["link", "show", "dev", name])
    except WanError:
        return False
    return True


def spawn_in(namespace: str, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """Start `argv` inside a namespace (`ip netns exec` execs it: the Popen's pid is the process's own)."""
    if not argv:
        raise ValueError("spawn_in needs a command")
    return subprocess.Popen(["ip", "netns", "exec", namespace, *argv], **popen)

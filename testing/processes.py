"""Run data-plane roles as real processes and read their JSON-line events (tests and the benchmark)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.protocol.shards import STATS_PATH


def role_key(n: int) -> NodeIdentity:
    """A deterministic key for process n (never for real use)."""
    return NodeIdentity((n + 1).to_bytes(32, "big"))


@dataclass
class RoleProcess:
    """One `swarmnode dataplane <role>` child; a reader thread queues its stdout events."""

    name: str
    popen: subprocess.Popen[str]
    events: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    seen: list[dict[str, Any]] = field(default_factory=list)
    endpoint: str = ""

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            try:
                self.events.put(json.loads(line))
            except json.JSONDecodeError:
                continue

    def wait_event(self, kind: str, timeout: float, **match: Any) -> dict[str, Any]:
        """The next event of `kind` with fields equal to `match`; unmatched ones are kept in `seen`."""
        for event in self.seen:
            if event.get("event") == kind and all(event.get(k) == v for k, v in match.items()):
                self.seen.remove(event)
                return event
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"{self.name}: no {kind} {match} within {timeout} s (rc={self.popen.poll()}); "
                    f"its stats: {self.diagnostics()}"
                )
            try:
                event = self.events.get(timeout=min(left, 0.5))
            except queue.Empty:
                if self.popen.poll() is not None and self.events.empty():
                    raise RuntimeError(
                        f"{self.name} exited with {self.popen.returncode} before {kind}"
                    ) from None
                continue
            if event.get("event") == kind and all(event.get(k) == v for k, v in match.items()):
                return event
            self.seen.append(event)

    def diagnostics(self) -> str:
        """The process's live stats (for a failure message), or why they could not be read."""
        if not self.endpoint:
            return "(not listening yet)"
        try:
            with urllib.request.urlopen(self.endpoint + STATS_PATH, timeout=3) as response:
                return json.dumps(msgpack.unpackb(response.read()), default=str)[:4000]
        except (OSError, ValueError) as exc:
            return f"(unreadable: {exc})"

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def kill(self) -> None:
        """SIGKILL: the process dies mid-whatever, as a crashed or unplugged node would."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)

    def stop(self, timeout: float = 10) -> dict[str, Any] | None:
        """SIGTERM and collect the final `stats` event (None if the process was already gone)."""
        if self.popen.poll() is not None:
            return None
        self.popen.send_signal(signal.SIGTERM)
        try:
            stats = self.wait_event("stats", timeout)
        except (TimeoutError, RuntimeError):
            stats = None
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        return stats


def spawn(
    name: str, role: str, args: list[str], *, timeout: float = 60, env: dict[str, str] | None = None
) -> RoleProcess:
    """Start a role and wait for its `listening` event."""
    command = [sys.executable, "-m", "swarmnode.node.cli", "dataplane", role, *args]
    popen = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=Path(__file__).resolve().parents[1],
    )
    proc = RoleProcess(name, popen)
    threading.Thread(target=proc._read, daemon=True).start()
    proc.endpoint = proc.wait_event("listening", timeout)["endpoint"]
    return proc


def stop_all(procs: list[RoleProcess]) -> None:
    for proc in procs:
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.popen.wait(10)
        except subprocess.TimeoutExpired:
            proc.popen.kill()
            proc.popen.wait()

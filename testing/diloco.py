"""Run DiLoCo trainers as real processes and read their JSON-line events (tests, demos)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.diloco.weights import FINAL_FILE
from swarmnode.node.p2p.ports import free_port
from swarmnode.testing.processes import RoleProcess

ROOT = Path(__file__).resolve().parents[1]


def trainer_key(n: int) -> NodeIdentity:
    """A deterministic key for trainer n (never for real use)."""
    return NodeIdentity((0xD1_0C0 + n).to_bytes(32, "big"))


@dataclass
class TrainerSpec:
    """How to start one trainer process; the same spec restarts it (same key, port and data dir)."""

    name: str
    key: NodeIdentity
    data_dir: Path
    data_seed: int
    args: tuple[str, ...] = ()
    port: int = 0

    def __post_init__(self) -> None:
        if not self.port:
            self.port = free_port()

    @property
    def addr(self) -> str:
        return f"/ip4/127.0.0.1/tcp/{self.port}/p2p/{self.key.peer_id}"

    def final_theta(self) -> dict[str, torch.Tensor]:
        return safetensors.torch.load_file(str(self.data_dir / FINAL_FILE))


def spawn_trainer(
    spec: TrainerSpec, plan: Path, owner: bytes, bootstrap: list[str], *, timeout: float | None = 90
) -> RoleProcess:
    """Start `swarmnode diloco trainer`; wait for its `listening` event if `timeout`."""
    command = [
        sys.executable, "-m", "swarmnode.node.cli", "diloco", "trainer",
        "--key", spec.key.private_key.hex(),
        "--plan", str(plan),
        "--owner", "0x" + owner.hex(),
        "--data-dir", str(spec.data_dir),
        "--listen", f"/ip4/127.0.0.1/tcp/{spec.port}",
        "--data-seed", str(spec.data_seed),
        *[arg for addr in bootstrap for arg in ("--bootstrap", addr)],
        *spec.args,
    ]  # fmt: skip
    popen = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=ROOT,
    )
    proc = RoleProcess(spec.name, popen)
    threading.Thread(target=proc._read, daemon=True).start()
    if timeout is not None:
        proc.endpoint = proc.wait_event("listening", timeout)["endpoint"]
    return proc

"""The devnet's plan: how many nodes of each role, what the run trains, and each node's record.

`DevnetPlan` is pure data: the nodes' names and roles (bootstrap first), their WAN profiles and each
training node's [work] table. `DevnetNode` is one node of a devnet: its folder, ports, addresses and
process, and the `status.json` it writes every second. `default_folder` is where a run goes unless
`--out` names another folder.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swarmnode.node.status_view import STATUS_FILE

LOOPBACK = "127.0.0.1"
HOME_PROFILE = "home"


@dataclass(frozen=True)
class DevnetPlan:
    trainers: int = 1
    relays: int = 2
    workers: int = 2
    validators: int = 1
    run: str = "devnet"
    record_deliveries: bool = False
    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # extra [discovery]/[liveness]...
    steps: int = 0  # > 0: a training run of this many trainer steps (the nodes do real work)
    cheaters: tuple[str, ...] = ()  # one extra worker per entry, cheating that way
    ledger: str = ""  # "signed" | "evm" | "" (no ledger: discovery-only runs)
    threads: int = 1
    shard_mb: float = 1.0
    # Signal groups per trainer step: 24 of a submission's 32 prompts (about 31 have signal) make a step
    # take one submission, as the synchronous baseline does, so the two compare at equal data per step.
    min_batch_groups: int = 24
    # A trainer whose step waited this long on a step's worth of groups without signal reports the run as
    # without learning signal (spec/rollouts.md), and the devnet stops on that report.
    no_signal_after_s: float = 120.0
    # Several trainers (DiLoCo, spec/diloco.md): H GRPO steps per round, then an fp16 all-reduce; `steps`
    # counts each trainer's GRPO steps, so the run is ceil(steps / H) rounds.
    inner_steps: int = 3
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    round_timeout_ms: int = 60_000
    # The run's model folder and task file, and the held-out tasks the report measures on ("": the
    # devnet's built-in model, generated additions and their held-out set).
    model: str = ""
    tasks: str = ""
    eval_tasks: str = ""
    engine: str = "auto"
    max_new_tokens: int = 6
    environment: str = ""  # a built-in environment the run's episodes play ("": single-turn)
    trainer_nproc: int = 1  # ranks of each trainer's FSDP2 group
    wan: str = ""  # a node.wan profile name: every node in its own namespace on a WAN of that kind
    home_workers: int = 0  # with `wan`: the first K workers are behind NAT (the home profile)
    wan_seed: int = 0

    @property
    def rounds(self) -> int:
        return -(-self.steps // self.inner_steps)

    def roles(self) -> list[tuple[str, str]]:
        """(name, role) of every node, bootstrap first."""
        nodes = [("bootstrap", "bootstrap")]
        for role, count in (
            ("trainer", self.trainers),
            ("relay", self.relays),
            ("worker", self.workers),
            ("validator", self.validators),
        ):
            nodes += [(f"{role}-{i}", role) for i in range(1, count + 1)]
        nodes += [(f"cheater-{i}", "worker") for i in range(1, len(self.cheaters) + 1)]
        return nodes

    def wan_profiles(self) -> dict[str, str]:
        """Each node's WAN profile, bootstrap first: the plan's, the first `home_workers` workers home."""
        homes = {f"worker-{i}" for i in range(1, self.home_workers + 1)}
        return {name: HOME_PROFILE if name in homes else self.wan for name, _ in self.roles()}

    def cheat_of(self, name: str) -> str:
        if name.startswith("cheater-"):
            return self.cheaters[int(name.split("-")[1]) - 1]
        return ""

    def work_section(
        self, name: str, role: str, *, plan_path: Path | None = None, lead: str = ""
    ) -> dict[str, Any]:
        """The [work] table of a node in a training run (`plan_path`, `lead`: its DiLoCo plan, if any)."""
        work: dict[str, Any] = {"threads": self.threads, "engine": self.engine}
        work |= {key: value for key, value in (("model", self.model), ("tasks", self.tasks)) if value}
        if role == "trainer":
            work |= {
                "steps": self.steps,
                "shard_mb": self.shard_mb,
                "min_batch_groups": self.min_batch_groups,
                "no_signal_after_s": self.no_signal_after_s,
                "max_new_tokens": self.max_new_tokens,
                "environment": self.environment,
                "nproc": self.trainer_nproc,
            }
            if self.trainers > 1:
                work |= {"diloco_plan": str(plan_path), "diloco_lead": lead}
        if role == "worker" and self.trainers > 1:
            # A version lasts a round of H steps on every trainer, so workers may send H times more on it.
            work["submissions_per_version"] = 4 * self.inner_steps
        if self.cheat_of(name):
            work["cheat"] = self.cheat_of(name)
        return work


@dataclass
class DevnetNode:
    name: str
    role: str
    directory: Path
    port: int
    peer_id: str
    address: str = ""
    http_port: int = 0
    cheat: str = ""
    metrics_port: int = 0  # /metrics and the dashboard on 127.0.0.1 (0: none, as on a WAN's namespaces)
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    host: str = LOOPBACK  # the address it listens on and announces
    dialable: bool = True  # False behind NAT: it announces no address at all

    @property
    def config_path(self) -> Path:
        return self.directory / "node.toml"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def addr(self) -> str:
        return f"/ip4/{self.host}/tcp/{self.port}/p2p/{self.peer_id}"

    def status(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.data_dir / STATUS_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            return None

    @property
    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()


def default_folder() -> Path:
    return Path("devnet-runs") / time.strftime("%Y%m%d-%H%M%S")

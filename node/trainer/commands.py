"""Rank 0's commands to the other ranks: one msgpack command at a time, the same one run on every rank.

Rank 0 (the node) sends each command (`Commands.run`) and runs it itself; ranks 1..N-1 only run
`serve_rank`'s loop, receiving and running them (`execute`). A ping whenever rank 0 has sent nothing for a
while keeps a waiting rank from reaching the group's collective timeout (`node.trainer.group`).

A package above the trainer adds its own commands as a family (`RankCommand`, by op prefix: DiLoCo's
`diloco_*`), handed to `serve_rank` and `Commands.add_family` by whoever knows it: the trainer never
imports the packages built on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

import msgpack

from swarmnode.node.rl.learner import OptimizerParams
from swarmnode.node.trainer.group import (
    GroupInfo,
    all_gather_bytes,
    broadcast_bytes,
    exit_rank,
    join_group,
    leave_group,
)
from swarmnode.node.trainer.rank import RankMemory, ShardedPolicy
from swarmnode.protocol.codec import decode
from swarmnode.protocol.messages import GrpoParams, RolloutGroup, ShardInfo

log = logging.getLogger(__name__)

RankCommand = Callable[[ShardedPolicy, GroupInfo, Mapping[str, Any]], Any]
"""Runs one command of a family on this rank (every rank alike); returns its result."""
NO_FAMILIES: Mapping[str, RankCommand] = MappingProxyType({})


def _grpo_from(fields: Mapping[str, Any]) -> GrpoParams:
    return GrpoParams(**fields)


def optim_from(fields: Mapping[str, Any]) -> OptimizerParams:
    return OptimizerParams(
        betas=(float(fields["betas"][0]), float(fields["betas"][1])),
        eps=float(fields["eps"]),
        weight_decay=float(fields["weight_decay"]),
        warmup_steps=int(fields["warmup_steps"]),
    )


def execute(
    policy: ShardedPolicy | None,
    group: GroupInfo,
    command: Mapping[str, Any],
    families: Mapping[str, RankCommand] = NO_FAMILIES,
) -> tuple[ShardedPolicy | None, Any]:
    """Run one command on this rank (rank 0 and the others alike); returns the policy and a result.

    `families`: op prefix -> the runner of that family's commands (added above the trainer)."""
    op = command["op"]
    if op == "ping":  # rank 0 is idle; the wait for its next command starts again
        return policy, None
    if op == "init":
        grpo, optim = _grpo_from(command["grpo"]), optim_from(command["optim"])
        policy = ShardedPolicy.open(group, Path(command["model_dir"]), grpo, optim)
        if command["resume_step"] is not None:
            policy.load_state(Path(command["trainer_dir"]), int(command["resume_step"]))
        return policy, None
    if policy is None:
        raise RuntimeError(f"command {op!r} before init")
    if op == "step":
        groups = [decode(RolloutGroup, g) for g in command["groups"]]
        return policy, policy.step(groups)
    if op == "save":
        return policy, policy.save_state(Path(command["trainer_dir"]))
    if op == "measure":
        mine = msgpack.packb(asdict(RankMemory.of(policy)))
        return policy, [RankMemory(**msgpack.unpackb(b)) for b in all_gather_bytes(mine, group.device)]
    family = next((run for prefix, run in families.items() if op.startswith(prefix)), None)
    if family is not None:
        return policy, family(policy, group, command)
    if op == "write":
        infos = policy.write_model(Path(command["partial_dir"]), int(command["shard_size"]), command["files"])
        packed = msgpack.packb([[i.name, i.size, i.sha256] for i in infos])
        gathered = all_gather_bytes(packed, group.device)
        every = [ShardInfo(n, s, h) for part in gathered for n, s, h in msgpack.unpackb(part)]
        return policy, every
    raise RuntimeError(f"unknown command {op!r}")


def serve_rank(families: Mapping[str, RankCommand] = NO_FAMILIES) -> NoReturn:
    """Ranks 1..N-1: join the group and run rank 0's commands until it says stop or the group breaks;
    `families` are the command families rank 0 may send beside the trainer's own."""
    group = join_group()
    policy: ShardedPolicy | None = None
    try:
        while True:
            command = msgpack.unpackb(broadcast_bytes(None, group.device), raw=False)
            if command["op"] == "stop":
                leave_group(together=True)
                exit_rank(0)
            policy, _ = execute(policy, group, command, families)
    finally:
        leave_group()


class Commands:
    """Rank 0's line to the other ranks: one command at a time, and a ping whenever it has sent nothing
    for a while, so that a rank waiting for work (rank 0 waiting for rollouts, or a finished trainer
    still serving) never reaches the group's collective timeout."""

    def __init__(self, group: GroupInfo, idle_s: float) -> None:
        self.group = group
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._stopping = threading.Event()
        self._families: dict[str, RankCommand] = {}
        self._pinger = threading.Thread(target=self._ping_while_idle, name="group-ping", daemon=True)
        self._pinger.start()

    def run(self, policy: ShardedPolicy | None, command: dict[str, Any]) -> tuple[ShardedPolicy | None, Any]:
        """Send `command` to the other ranks, then run it here."""
        with self._lock:
            try:
                self._send(command)
                return execute(policy, self.group, command, self._families)
            finally:
                self._last = time.monotonic()

    def add_family(self, prefix: str, run: RankCommand) -> None:
        """Run commands whose op starts with `prefix` here too (the other ranks got it from `serve_rank`)."""
        self._families[prefix] = run

    def stop(self) -> None:
        """No more pings; tell the other ranks to stop."""
        self._stopping.set()
        self._pinger.join()
        with self._lock:
            self._send({"op": "stop"})

    def _send(self, command: dict[str, Any]) -> None:
        broadcast_bytes(msgpack.packb(command, use_bin_type=True), self.group.device)

    def _ping_while_idle(self) -> None:
        while not self._stopping.wait(self.idle_s / 2):
            if time.monotonic() - self._last < self.idle_s or not self._lock.acquire(blocking=False):
                continue
            try:
                self._send({"op": "ping"})
                self._last = time.monotonic()
            except Exception:  # the group is broken: the next command fails and the launcher restarts us
                log.exception("cannot ping the trainer group")
                return
            finally:
                self._lock.release()


"""The validator role's work (`SwarmValidatorWork`): knows the run, holds its checkpoints, runs the loops.

It is its parts together (`Judge` with `Settlement`, `Intake`, `AcceptedLog`, over `ValidatorState`);
this module adds what ties them to the network: the run's record, the follower, the checkpoints held.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
import trio

from swarmnode.node.dataplane.checkpoint import load_checkpoint
from swarmnode.node.dataplane.follower import VerifiedCheckpoint
from swarmnode.node.p2p.endpoints import ACCEPTED
from swarmnode.node.p2p.gossip import Delivery
from swarmnode.node.rl.run import RunSetup, load_run_setup
from swarmnode.node.roles.base import RoleNet
from swarmnode.node.roles.common import set_threads
from swarmnode.node.roles.follow import SwarmFollower
from swarmnode.node.validator.accepted_log import AcceptedLog
from swarmnode.node.validator.engines import CheckpointEngines
from swarmnode.node.validator.intake import Intake
from swarmnode.node.validator.judge import Judge, VerdictOut
from swarmnode.node.validator.limits import VERDICT_BACKLOG
from swarmnode.protocol.messages import Verdict
from swarmnode.protocol.runs import run_trainers

log = logging.getLogger(__name__)


class SwarmValidatorWork(Judge, Intake, AcceptedLog):
    """The validator role's work (`node.validator.service.ValidatorWork`)."""

    async def prepare(self, setup: RunSetup) -> None:
        """Know the run and build the engines (loads the base architecture in a thread)."""
        self.setup = setup
        self.trainers = frozenset(run_trainers(setup.descriptor))
        self._dataset = setup.dataset
        self._dataset_ids = setup.dataset_ids
        keep = setup.descriptor.async_level + 1
        self.engines = await trio.to_thread.run_sync(CheckpointEngines, self.model_dir, keep)

    async def hold(self, version: int, merkle_root: bytes, state: Mapping[str, torch.Tensor]) -> bool:
        """Load a checkpoint version's weights into an engine; wakes submissions waiting for it."""
        engines = self.engines
        assert engines is not None, "prepare() first"
        async with self._torch_lock():
            loaded = await trio.to_thread.run_sync(engines.load, version, merkle_root, state)
        if loaded:
            log.info("holding checkpoint", extra={"version": version, "held": engines.versions()})
            self._wake()
        return loaded

    async def hold_verified(self, checkpoint: VerifiedCheckpoint) -> bool:
        """`hold` a checkpoint the follower verified on disk (its manifest must name the run's model)."""
        assert self.setup is not None
        manifest = checkpoint.manifest
        if manifest.model_config_hash != self.setup.descriptor.model_config_hash:
            log.warning("checkpoint names another model config", extra={"version": manifest.version})
            return False
        state = await trio.to_thread.run_sync(load_checkpoint, checkpoint.directory, manifest)
        return await self.hold(manifest.version, manifest.merkle_root, state)

    async def _hold_all(self, receive: trio.MemoryReceiveChannel[VerifiedCheckpoint]) -> None:
        async for checkpoint in receive:
            await self.hold_verified(checkpoint)

    async def judge_forever(
        self, out: VerdictOut, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Judge queued submissions as their checkpoints become available; gossip verdicts through `out`;
        prune the store every `prune_every_s`; commit the queued credits and finalize the pending slashes.

        Total: whatever an item holds, it ends judged. An exception on one item's path (but a ledger
        that cannot answer, which defers it) quarantines that item as a JUDGE_FAULT ignore, and the loop
        goes on with the next one.
        """
        assert self.setup is not None and self.engines is not None, "prepare() first"
        send, receive = trio.open_memory_channel[Verdict](VERDICT_BACKLOG)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._gossip_verdicts, out, receive)
            nursery.start_soon(self._prune_forever)
            if self.ledger.ledger is not None:
                nursery.start_soon(self._commit_forever)
                nursery.start_soon(self._finalize_forever)
            task_status.started()
            while True:
                item = await self._next_ready()
                try:
                    await self._judge(item, out, send)
                except Exception as exc:  # one item's fault: quarantine it, never stop the judge
                    log.exception("judging an item failed", extra={"digest": item.digest.hex()[:16]})
                    await self._quarantine(item, exc)

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        set_threads(self.config.work.threads)
        net.serve(ACCEPTED, self.serve_accepted, admit=self.admits_puller)
        task_status.started()
        record = await net.wait_run_record()
        await self.wait_run_on_ledger(record.descriptor)  # RunMismatch: another trainer owns the run
        self.trainers = frozenset(run_trainers(record.descriptor))
        setup = await trio.to_thread.run_sync(load_run_setup, record.descriptor, self.model_dir, self.tasks)
        await self.prepare(setup)
        self.follower = SwarmFollower(net, self.config, newest_only=False, serve=True)
        send, receive = trio.open_memory_channel[VerifiedCheckpoint](8)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.follower.run, send)
            nursery.start_soon(self._hold_all, receive)
            await self.judge_forever(net)

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        if self.follower is not None and delivery.kind in ("checkpoints", "shards"):
            await self.follower.on_gossip(delivery)

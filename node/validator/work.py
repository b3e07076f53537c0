"""The validator role's work (`SwarmValidatorWork`): its parts composed, and the one loop that runs them.

The parts, each with its own state and the collaborators it is handed:
- `Intake` (SUBMIT): cheap checks, then the durable `PendingQueue`;
- `JudgingLoop`: the next queued submission judged, stored, settled, gossiped;
- `Settlement`: the run on the ledger, slashes filed and finalized, credits committed in batches;
- `AcceptedLog` (ACCEPTED): the accepted submissions served to the run's trainers, the store pruned.
This module adds what ties them to the network: the run's record, the follower, the checkpoints held.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
import trio
from libp2p.peer.id import ID

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.ledger import Ledger
from swarmnode.node.config import NodeConfig
from swarmnode.node.dataplane.checkpoint import load_checkpoint
from swarmnode.node.dataplane.follower import VerifiedCheckpoint
from swarmnode.node.p2p.endpoints import ACCEPTED
from swarmnode.node.p2p.gossip import Delivery
from swarmnode.node.rl.run import RunSetup, load_run_setup
from swarmnode.node.rl.tasks import Task, require_sandbox_for
from swarmnode.node.roles.base import RoleNet
from swarmnode.node.roles.common import run_model_dir, run_tasks, set_threads
from swarmnode.node.roles.follow import SwarmFollower
from swarmnode.node.validator.accepted_log import AcceptedLog
from swarmnode.node.validator.engines import CheckpointEngines
from swarmnode.node.validator.intake import Intake
from swarmnode.node.validator.judging_loop import JudgingLoop, VerdictOut
from swarmnode.node.validator.ledger_access import LedgerAccess
from swarmnode.node.validator.limits import (
    ACCEPTED_RETENTION_VERSIONS,
    CREDIT_INTERVAL_S,
    ELIGIBILITY_TTL_S,
    LEDGER_RETRY_MAX_S,
    LEDGER_RETRY_S,
    MAX_ACCEPTED_BYTES,
    MAX_QUEUED_CREDITS,
    PRUNE_EVERY_S,
    SLASH_CHECK_S,
    STORE_FILE,
    VERDICT_FLUSH_S,
    WAIT_FOR_CHECKPOINT_S,
)
from swarmnode.node.validator.settlement import Settlement
from swarmnode.node.validator.state import CreditBacklog, OutcomeCounts, PendingQueue, RunContext
from swarmnode.node.validator.store import AcceptedStore
from swarmnode.protocol.envelope import Opened
from swarmnode.protocol.ledger_messages import MAX_CREDITS_PER_BATCH
from swarmnode.protocol.messages import VERDICT_BATCH_MAX_ITEMS, SubmitAck
from swarmnode.protocol.runs import run_trainers

log = logging.getLogger(__name__)


def check_limits(
    *,
    retention_versions: int,
    max_accepted_bytes: int,
    prune_every_s: float,
    max_credits_per_batch: int,
    max_queued_credits: int,
    credit_interval_s: float,
    slash_check_s: float,
    verdict_flush_s: float,
    verdict_batch_items: int,
) -> None:
    """Refuse bounds no part could work with, before anything is opened."""
    if retention_versions < 0 or max_accepted_bytes < 0 or not prune_every_s > 0:
        raise ValueError("retention_versions and max_accepted_bytes >= 0, prune_every_s > 0")
    if not 1 <= max_credits_per_batch <= MAX_CREDITS_PER_BATCH or max_queued_credits < 1:
        raise ValueError(f"max_credits_per_batch 1..{MAX_CREDITS_PER_BATCH}, max_queued_credits >= 1")
    if not credit_interval_s > 0 or not slash_check_s > 0:
        raise ValueError("credit_interval_s and slash_check_s > 0")
    if not verdict_flush_s > 0 or not 1 <= verdict_batch_items <= VERDICT_BATCH_MAX_ITEMS:
        raise ValueError(f"verdict_flush_s > 0, verdict_batch_items 1..{VERDICT_BATCH_MAX_ITEMS}")


class SwarmValidatorWork:
    """The validator role's work (`node.validator.service.ValidatorWork`): its parts, and `run`."""

    def __init__(
        self,
        config: NodeConfig,
        identity: NodeIdentity,
        ledger: Ledger | None,
        *,
        model_dir: Path | None = None,
        tasks: Sequence[Task] | None = None,
        wait_for_checkpoint_s: float = WAIT_FOR_CHECKPOINT_S,
        ledger_retry_s: float = LEDGER_RETRY_S,
        ledger_retry_max_s: float = LEDGER_RETRY_MAX_S,
        eligibility_ttl_s: float = ELIGIBILITY_TTL_S,
        retention_versions: int = ACCEPTED_RETENTION_VERSIONS,
        max_accepted_bytes: int = MAX_ACCEPTED_BYTES,
        prune_every_s: float = PRUNE_EVERY_S,
        credit_interval_s: float = CREDIT_INTERVAL_S,
        max_credits_per_batch: int = MAX_CREDITS_PER_BATCH,
        max_queued_credits: int = MAX_QUEUED_CREDITS,
        slash_check_s: float = SLASH_CHECK_S,
        verdict_flush_s: float = VERDICT_FLUSH_S,
        verdict_batch_items: int = VERDICT_BATCH_MAX_ITEMS,
    ) -> None:
        check_limits(
            retention_versions=retention_versions,
            max_accepted_bytes=max_accepted_bytes,
            prune_every_s=prune_every_s,
            max_credits_per_batch=max_credits_per_batch,
            max_queued_credits=max_queued_credits,
            credit_interval_s=credit_interval_s,
            slash_check_s=slash_check_s,
            verdict_flush_s=verdict_flush_s,
            verdict_batch_items=verdict_batch_items,
        )
        self.config = config
        self.identity = identity
        self.model_dir = model_dir or run_model_dir(config.work)
        self.tasks = list(tasks) if tasks is not None else run_tasks(config.work)
        require_sandbox_for(self.tasks)  # code tasks: the sandbox must work here, or no run
        self.ledger_access = LedgerAccess(ledger)
        self.store = AcceptedStore(config.data_dir / "validator" / STORE_FILE)
        self.run_context = RunContext(config.run)
        self.queue = PendingQueue(self.store.pending())
        self.credits = CreditBacklog(
            self.store.credit_counts().queued,
            max_per_batch=max_credits_per_batch,
            max_queued=max_queued_credits,
        )
        self.counts = OutcomeCounts(self.store.judged_counts())
        self.intake = Intake(
            self.run_context,
            self.store,
            self.queue,
            self.credits,
            self.ledger_access,
            eligibility_ttl_s=eligibility_ttl_s,
        )
        self.settlement = Settlement(
            self.run_context,
            identity,
            self.ledger_access,
            self.store,
            self.credits,
            max_challenge_window_epochs=config.work.max_challenge_window_epochs,
            credit_interval_s=credit_interval_s,
            slash_check_s=slash_check_s,
            ledger_retry_s=ledger_retry_s,
            ledger_retry_max_s=ledger_retry_max_s,
        )
        self.judging = JudgingLoop(
            self.run_context,
            self.store,
            self.queue,
            self.counts,
            self.credits,
            self.settlement,
            self.ledger_access,
            wait_for_checkpoint_s=wait_for_checkpoint_s,
            ledger_retry_s=ledger_retry_s,
            ledger_retry_max_s=ledger_retry_max_s,
            verdict_flush_s=verdict_flush_s,
            verdict_batch_items=verdict_batch_items,
        )
        self.accepted_log = AcceptedLog(
            self.run_context,
            self.store,
            retention_versions=retention_versions,
            max_accepted_bytes=max_accepted_bytes,
            prune_every_s=prune_every_s,
        )

    # --- the loop ------------------------------------------------------------------------------------

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve ACCEPTED, learn the run (its record, then the ledger's), load it, then hold checkpoints as
        the follower brings them and judge forever."""
        set_threads(self.config.work.threads)
        net.serve(ACCEPTED, self.accepted_log.serve_accepted, admit=self.accepted_log.admits_puller)
        task_status.started()
        record = await net.wait_run_record()
        await self.settlement.wait_run_on_ledger(record.descriptor)  # RunMismatch: another trainer's run
        self.run_context.trainers = frozenset(run_trainers(record.descriptor))
        setup = await trio.to_thread.run_sync(load_run_setup, record.descriptor, self.model_dir, self.tasks)
        await self.prepare(setup)
        follower = self.run_context.follower = SwarmFollower(net, self.config, newest_only=False, serve=True)
        send, receive = trio.open_memory_channel[VerifiedCheckpoint](8)
        async with trio.open_nursery() as nursery:
            await nursery.start(follower.run, send)
            nursery.start_soon(self._hold_all, receive)
            await self.judge_forever(net)

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        follower = self.run_context.follower
        if follower is not None and delivery.kind in ("checkpoints", "shards"):
            await follower.on_gossip(delivery)

    async def submit(self, peer: ID, opened: Opened, digest: bytes) -> SubmitAck:
        return await self.intake.submit(peer, opened, digest)

    def admits_submitter(self, peer: ID) -> bool:
        return self.intake.admits_submitter(peer)

    # --- the run and its checkpoints -----------------------------------------------------------------

    async def prepare(self, setup: RunSetup) -> None:
        """Know the run and build the engines (loads the base architecture in a thread)."""
        context = self.run_context
        context.setup = setup
        context.trainers = frozenset(run_trainers(setup.descriptor))
        keep = setup.descriptor.async_level + 1
        context.engines = await trio.to_thread.run_sync(CheckpointEngines, self.model_dir, keep)

    async def hold(self, version: int, merkle_root: bytes, state: Mapping[str, torch.Tensor]) -> bool:
        """Load a checkpoint version's weights into an engine; wakes submissions waiting for it."""
        engines = self.run_context.engines
        assert engines is not None, "prepare() first"
        async with self.run_context.engines_lock():
            loaded = await trio.to_thread.run_sync(engines.load, version, merkle_root, state)
        if loaded:
            log.info("holding checkpoint", extra={"version": version, "held": engines.versions()})
            self.queue.wake()
        return loaded

    async def hold_verified(self, checkpoint: VerifiedCheckpoint) -> bool:
        """`hold` a checkpoint the follower verified on disk (its manifest must name the run's model)."""
        setup = self.run_context.setup
        assert setup is not None
        manifest = checkpoint.manifest
        if manifest.model_config_hash != setup.descriptor.model_config_hash:
            log.warning("checkpoint names another model config", extra={"version": manifest.version})
            return False
        state = await trio.to_thread.run_sync(load_checkpoint, checkpoint.directory, manifest)
        return await self.hold(manifest.version, manifest.merkle_root, state)

    async def _hold_all(self, receive: trio.MemoryReceiveChannel[VerifiedCheckpoint]) -> None:
        async for checkpoint in receive:
            await self.hold_verified(checkpoint)

    # --- judging, settling, pruning ------------------------------------------------------------------

    async def judge_forever(
        self, out: VerdictOut, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Judge queued submissions as their checkpoints become available, gossiping verdicts through
        `out`; beside it, prune the store, commit the queued credits and finalize the pending slashes."""
        assert self.run_context.setup is not None and self.run_context.engines is not None, "prepare() first"
        gossip, verdicts = self.judging.verdict_channel()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.judging.gossip_verdicts, out, verdicts)
            nursery.start_soon(self.accepted_log.prune_forever)
            if self.ledger_access.ledger is not None:
                nursery.start_soon(self.settlement.commit_forever)
                nursery.start_soon(self.settlement.finalize_forever)
            task_status.started()
            await self.judging.judge_each(out, gossip)

    # --- status --------------------------------------------------------------------------------------

    def status(self) -> dict[str, object]:
        counts, judging, settlement = self.counts, self.judging, self.settlement
        accepted_log, ledger_access, context = self.accepted_log, self.ledger_access, self.run_context
        engines, follower = context.engines, context.follower
        stats = accepted_log.store_stats
        return {
            "queued": len(self.queue),
            "judged": counts.judged,
            "accepted": counts.accepted,
            "rejected": counts.rejected,
            "ignored": counts.ignored,
            "refused": self.intake.refused,
            "by_reason": dict(sorted(counts.by_reason.items())),
            "slashes": counts.slashes,
            "slashes_pending": len(settlement.pending_slashes),
            "slashes_finalized": settlement.slashes_finalized,
            "slashes_voided": settlement.slashes_voided,
            "slashes_settled_elsewhere": settlement.slashes_settled_elsewhere,
            "contributions": settlement.contributions,
            "credits": {
                "queued": self.credits.queued,
                "committed": settlement.contributions,
                "batches": settlement.batches,
                "dropped": dict(sorted(settlement.credits_dropped.items())),
                "blocked": settlement.credit_blocked,
            },
            "ledger_errors": ledger_access.errors,
            "ledger_refusals": ledger_access.refusals,
            "ledger_retries": judging.ledger_retries,
            "ledger_deferred": len(judging.retry_at),
            "ledger_last_error": ledger_access.last_error,
            "cpu_s": round(counts.cpu_s, 3),
            "cpu_s_per_full_check": (
                round(counts.cpu_full_s / counts.full_checks, 4) if counts.full_checks else 0.0
            ),
            "full_checks": counts.full_checks,
            "cheap_checks": counts.cheap_checks,
            "tokens": counts.tokens,
            "per_worker": {
                "0x" + worker.hex(): {"accepted": t.accepted, "rejected": t.rejected, "slashed": t.slashed}
                for worker, t in sorted(counts.per_worker.items())
            },
            "versions_held": engines.versions() if engines is not None else [],
            "accepted_newest": self.store.newest,
            "accepted_refused": accepted_log.refused,
            "quarantined": judging.quarantined,
            "store": {
                "floor_version": stats.floor,
                "judged_rows": stats.judged,
                "accepted_rows": stats.accepted,
                "accepted_bytes": stats.accepted_bytes,
                "pruned_judged": accepted_log.pruned_judged,
                "pruned_accepted": accepted_log.pruned_accepted,
            },
            "verdicts_gossiped": judging.verdicts_gossiped,
            "verdicts_dropped": judging.verdicts_dropped,
            "verdict_batches": judging.verdict_batches,
            "data_plane": follower.statistics() if follower is not None else {},
        }

"""The worker's work: follow the newest checkpoint, generate the assigned groups with proofs, submit them.

One loop, in the order of a worker's part of a run (spec/rollouts.md):
1. wait for the run descriptor and check it names the dataset, model and base this node holds;
2. follow checkpoints (`SwarmFollower`, newest only, not serving); load each verified one in a thread
   (`build.prepare_weights`);
3. between submissions only, hot-swap the newest loaded weights into the one engine;
4. for the loaded version v, counters 0 .. budget - 1 (`pacing`: the budget being `submissions_per_version`
   capped by the run's `max_submissions_per_version`, and cut to what can still reach the trainer in time
   by the `Pacer`), each persisted before use (`counters`): build the submission in a thread
   (`build.make_submission`, as the worker's `conduct` builds it: honest but for a devnet cheat), send it to a
   validator found through the DHT (`delivery.deliver`), and count the ack (`stats`);
5. then wait for a newer checkpoint. A version more than `async_level` behind the newest known one is
   never generated on: a validator would drop it as stale.

Verdicts naming this worker are counted once per submission digest, whoever gossips them: they feed
this node's status display and the pacer's latency median, never a verdict of its own; a validator
gossiping them late or early can only move that median (they come in `VerdictBatch`es, at most one
flush interval after the judgement). Accepted verdicts naming any worker set the count N behind the
pacer's share of each version.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.ledger import Ledger
from swarmnode.node.config import NodeConfig
from swarmnode.node.dataplane.follower import VerifiedCheckpoint
from swarmnode.node.p2p.gossip import Delivery
from swarmnode.node.rl.engine import InferenceEngine
from swarmnode.node.rl.engines import choose_engine, open_engine
from swarmnode.node.rl.run import RunSetup, load_run_setup
from swarmnode.node.rl.tasks import GraderFault, Task, require_sandbox_for
from swarmnode.node.roles.base import RoleNet
from swarmnode.node.roles.common import run_model_dir, run_tasks, set_threads, wait_run_owner
from swarmnode.node.roles.follow import SwarmFollower
from swarmnode.node.worker.build import (
    CheckpointRef,
    LoadedWeights,
    make_submission,
    prepare_weights,
    timed_build,
)
from swarmnode.node.worker.conduct import HONEST, Conduct
from swarmnode.node.worker.counters import STATE_FILE, Counters
from swarmnode.node.worker.delivery import NetTransport, Rotation, SubmitTransport, deliver
from swarmnode.node.worker.eligibility import require_eligible
from swarmnode.node.worker.pacing import Pacer, now_ms, plan_counter, submission_budget, within_async_level
from swarmnode.node.worker.stats import WorkerStats
from swarmnode.protocol.messages import CheckpointHead, VerdictBatch
from swarmnode.protocol.pacing import SWARM_SUBMISSIONS_PER_VERSION
from swarmnode.protocol.runs import run_trainers

log = logging.getLogger(__name__)


class SwarmWorkerWork:
    """The worker role's `RoleWork`: generation and submission on the newest checkpoint it holds."""

    def __init__(
        self,
        config: NodeConfig,
        identity: NodeIdentity,
        ledger: Ledger | None,
        *,
        model_dir: Path | None = None,
        tasks: Sequence[Task] | None = None,
        conduct: Conduct = HONEST,
    ) -> None:
        self.config = config
        self.identity = identity
        self.address = identity.address
        self.ledger = ledger
        self.model_dir = model_dir or run_model_dir(config.work)
        self.tasks = list(tasks) if tasks is not None else run_tasks(config.work)
        require_sandbox_for(self.tasks)  # code tasks: the sandbox must work here, or no run
        self.conduct = conduct
        self.cheat = conduct.name
        self.stats = WorkerStats()
        self.rotation = Rotation()
        self.follower: SwarmFollower | None = None
        self.setup: RunSetup | None = None
        self.engine: InferenceEngine | None = None
        self.counters: Counters | None = None
        self.loaded: CheckpointRef | None = None
        self._pending: LoadedWeights | None = None
        self._newest: int | None = None
        self._changed = trio.Event()
        self.pacer = Pacer(me=self.address)

    # -- state the loop decides on

    def newest_known(self) -> int | None:
        """The newest checkpoint version signed by the trainer that this node has heard of."""
        versions = [v for v in (self._newest, self.loaded.version if self.loaded else None) if v is not None]
        node = self.follower.node if self.follower is not None else None
        if node is not None and node.catalog.latest_version is not None:
            versions.append(node.catalog.latest_version)
        return max(versions) if versions else None

    def _note_version(self, version: int, created_ms: int | None = None) -> None:
        if created_ms is not None:
            self.pacer.heard(version, created_ms, now_ms())
        if self._newest is None or version > self._newest:
            self._newest = version
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _async_level(self) -> int:
        assert self.setup is not None
        return self.setup.descriptor.async_level

    def next_counter(self) -> int | None:
        """Reserve (and persist) the next counter on the loaded version; None when there is nothing to do."""
        assert self.counters is not None and self.setup is not None
        loaded = self.loaded.version if self.loaded is not None else None
        used = self.counters.used(loaded) if loaded is not None else 0
        budget = submission_budget(self.config.work.submissions_per_version, self.setup.descriptor)
        if not self.conduct.paced:  # devnet role abuse: no pace, no share, every counter the run allows
            budget = self.setup.descriptor.max_submissions_per_version
        elif loaded is not None:
            run_max = self.setup.descriptor.max_submissions_per_version
            budget = self.pacer.budget(loaded, self._async_level(), used, budget, now_ms(), run_max)
        if plan_counter(loaded, self.newest_known(), self._async_level(), used, budget) is None:
            return None
        assert loaded is not None
        return self.counters.reserve(loaded)

    def _recheck_s(self) -> float:
        """Seconds until the loaded version allows another counter (its share, or a cap that grows while the
        trainer is overdue); inf if only a new version can."""
        if self.loaded is None or self.counters is None:
            return math.inf
        assert self.setup is not None
        version, descriptor = self.loaded.version, self.setup.descriptor
        wait = self.pacer.recheck_in_ms(
            version, self.counters.used(version), now_ms(), async_level=self._async_level(),
            cap=submission_budget(self.config.work.submissions_per_version, descriptor),
            run_max=descriptor.max_submissions_per_version,
        )
        return math.inf if wait is None else (wait + 1) / 1000

    # -- RoleWork

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if self.ledger is not None:
            require_eligible(self.ledger, self.address, self.config)  # sqlite handles stay on this thread
        set_threads(self.config.work.threads)
        self.follower = follower = SwarmFollower(net, self.config, newest_only=True, serve=False)
        completed_send, completed_receive = trio.open_memory_channel[VerifiedCheckpoint](8)
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follower.run, completed_send)
            nursery.start_soon(self._load_checkpoints, completed_receive)
            record = await net.wait_run_record()
            self.setup = setup = await trio.to_thread.run_sync(
                load_run_setup, record.descriptor, self.model_dir, self.tasks
            )
            if self.ledger is not None:  # work only for a run its descriptor's signer owns on the ledger
                window = self.config.work.max_challenge_window_epochs  # and the run's terms are ours
                await wait_run_owner(self.ledger, record.descriptor, window)
            # each of the run's trainers (DiLoCo) takes its own batches from every version
            self.pacer.wanted = SWARM_SUBMISSIONS_PER_VERSION * len(run_trainers(setup.descriptor))
            self.counters = Counters.load(self.config.data_dir / STATE_FILE, net.run, self.address)
            kind = choose_engine(self.config.work.engine)  # EngineUnavailable: says what is missing
            self.engine = await trio.to_thread.run_sync(
                partial(open_engine, kind, self.model_dir, role="worker")
            )
            log.info(
                "worker ready",
                extra={"run": net.run, "engine": type(self.engine).__name__, "cheat": self.cheat,
                       "async_level": setup.descriptor.async_level},
            )
            nursery.start_soon(self._work, NetTransport(net))

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        message = delivery.opened.message
        if isinstance(message, VerdictBatch):  # checked whole by the topic (protocol.verdicts)
            for verdict in message.verdicts:
                if verdict.accepted and verdict.run == self.config.run:
                    self.pacer.accepted(verdict.worker, verdict.checkpoint_version)
                if self.stats.observe_verdict(verdict, self.address, self.config.run):
                    self.pacer.judged(verdict.step, now_ms())
            return
        if (
            isinstance(message, CheckpointHead)
            and self.setup is not None
            and delivery.opened.sender == self.setup.descriptor.trainer
            and message.run == self.config.run
        ):
            self._note_version(message.version, message.created_ms)
        if self.follower is not None:
            await self.follower.on_gossip(delivery)

    def status(self) -> dict[str, Any]:
        return {
            "version": self.loaded.version if self.loaded is not None else None,
            "newest_known": self.newest_known(),
            "cheat": self.cheat,
            **self.stats.as_dict(),
            "pace": self.pacer.statistics(),
            "follower": self.follower.statistics() if self.follower is not None else {},
        }

    # -- the loops

    async def _load_checkpoints(self, completed: trio.MemoryReceiveChannel[VerifiedCheckpoint]) -> None:
        """Read each verified checkpoint (the newest of what is waiting) into memory for the next swap."""
        async for checkpoint in completed:
            while True:
                try:
                    later = completed.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                if later.manifest.version > checkpoint.manifest.version:
                    checkpoint = later
            version = checkpoint.manifest.version
            self._note_version(version, checkpoint.manifest.created_ms)
            if not self._is_news(version):
                continue
            weights = await trio.to_thread.run_sync(prepare_weights, checkpoint, self.conduct)
            if self._is_news(version):
                self._pending = weights
                log.info("checkpoint loaded", extra={"version": version, "cheat": self.cheat})
                self._wake()

    def _is_news(self, version: int) -> bool:
        held = [
            w.version for w in (self.loaded, self._pending.ref if self._pending else None) if w is not None
        ]
        return not held or version > max(held)

    async def _swap_in(self) -> None:
        """Put the pending weights into the engine (only ever called between submissions)."""
        pending, self._pending = self._pending, None
        if pending is None or (self.loaded is not None and pending.ref.version <= self.loaded.version):
            return
        assert self.engine is not None and self.counters is not None
        try:
            await trio.to_thread.run_sync(self.engine.load_weights, pending.state)
        except Exception as exc:  # noqa: BLE001 - an engine's failure must not stop the worker
            # The engine may hold half of each version's weights: generating on them would fail every
            # TOPLOC check (a slash). Nothing is generated until a later checkpoint swaps in whole.
            self.loaded = None
            self.stats.swap_failures += 1
            log.error(
                "checkpoint swap failed: waiting for the next checkpoint",
                extra={"version": pending.ref.version, "error": repr(exc)},
            )
            return
        self.loaded = pending.ref
        self.counters.forget_below(pending.ref.version - self._async_level())
        log.info("checkpoint swapped in", extra={"version": pending.ref.version})

    async def _work(self, transport: SubmitTransport) -> None:
        assert self.setup is not None and self.engine is not None
        setup, engine = self.setup, self.engine
        dataset, dataset_ids = setup.dataset, setup.dataset_ids
        async_level = setup.descriptor.async_level
        while True:
            changed = self._changed
            await self._swap_in()
            counter = self.next_counter()
            if counter is None:
                with trio.move_on_after(self._recheck_s()):  # a share grows while a version stands
                    await changed.wait()
                continue
            assert self.loaded is not None
            ref = self.loaded
            make = partial(
                make_submission,
                engine,
                setup.descriptor,
                dataset,
                dataset_ids,
                self.address,
                ref,
                counter,
                self.conduct,
            )
            try:
                built = await trio.to_thread.run_sync(timed_build, make)
            except GraderFault as exc:
                # A machine-dependent limit decided the reward: a validator would not recompute it. The
                # counter is spent (never reused for other tokens), nothing is submitted.
                self.stats.grader_faults += 1
                log.warning("grader fault, counter skipped", extra={"counter": counter, "error": str(exc)})
                continue
            self.stats.record_build(built)
            self.pacer.built(built.wall_s)
            self.pacer.handed(built.submission.step, now_ms())

            def fresh(version: int = ref.version) -> bool:
                newest = self.newest_known()
                return newest is None or within_async_level(version, newest, async_level)

            ack = await deliver(transport, self.rotation, built.submission, self.stats, fresh=fresh)
            log.info(
                "submission sent",
                extra={
                    "version": ref.version,
                    "counter": counter,
                    "status": ack.status if ack is not None else None,
                    "generate_s": round(built.wall_s, 3),
                    "tokens": built.tokens,
                },
            )

"""The trainer role's work (`SwarmTrainerWork`): the `TrainerWork` seam, serving, and the hooks a
multi-trainer run overrides.

It is its parts together (`StepLoop` with `Publishing`, `Pulling`, `Registration`, over `TrainerState`);
this module adds what ties them to the node: the run's descriptor, MANIFEST, gossip in, and `serve`,
which loads the trainer and the inbox, starts the origin and publishes the current version.
`node.diloco.rl` subclasses it and overrides the hooks (`_descriptor` ... `_announces`).
"""

from __future__ import annotations

import logging

import trio
from libp2p.peer.id import ID

from swarmnode.node.dataplane.http_server import Handler, ServerConfig
from swarmnode.node.dataplane.roles import OriginNode
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.node.errors import RunMismatch
from swarmnode.node.p2p.gossip import Delivery
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.learner import GrpoTrainer
from swarmnode.node.rl.run import load_run_setup
from swarmnode.node.roles.base import RoleNet
from swarmnode.node.roles.common import set_threads
from swarmnode.node.trainer.disk import load_or_create_descriptor, restore_published
from swarmnode.node.trainer.group import launched_rank
from swarmnode.node.trainer.inbox import RolloutInbox
from swarmnode.node.trainer.limits import MANIFEST_OK
from swarmnode.node.trainer.pull import Pulling
from swarmnode.node.trainer.registration import Registration
from swarmnode.node.trainer.sharded import ShardedGrpoTrainer
from swarmnode.node.trainer.state import Policy, count_verdict
from swarmnode.node.trainer.steps import StepLoop
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.messages import (
    LATEST_VERSION,
    ManifestRequest,
    ManifestResponse,
    RunDescriptor,
    VerdictBatch,
)
from swarmnode.protocol.types import MIB

log = logging.getLogger(__name__)


class SwarmTrainerWork(StepLoop, Pulling, Registration):
    """The trainer role's work (`node.trainer.service.TrainerWork`)."""

    # --- TrainerWork ---------------------------------------------------------------------------------

    def run_descriptor(self, run: str, trainer: bytes) -> RunDescriptor:
        """The devnet descriptor, stored on first start so that a restarted trainer publishes the same."""
        if self.descriptor is None:
            self.descriptor = load_or_create_descriptor(
                self.descriptor_path,
                run,
                trainer,
                self.model_dir,
                self.tasks,
                max_new_tokens=self.config.work.max_new_tokens,
                environment=self.config.work.environment,
            )
        return self.descriptor

    async def manifest(self, peer: ID, request: ManifestRequest) -> ManifestResponse:
        if request.run != self.config.run:
            return ManifestResponse(status=int(Reason.WRONG_RUN), manifest=b"")
        catalog = self.origin_node.catalog if self.origin_node is not None else None
        entry = None
        if catalog is not None:
            entry = catalog.latest if request.version == LATEST_VERSION else catalog.get(request.version)
        if entry is None:
            return ManifestResponse(status=int(Reason.UNKNOWN_CHECKPOINT), manifest=b"")
        return ManifestResponse(status=MANIFEST_OK, manifest=entry.envelope)

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if net.identity.address != self.identity.address:
            raise ValueError("the trainer work must sign with the node's own identity")
        self._net = net
        async with trio.open_nursery() as nursery:
            self._background = nursery
            await nursery.start(self.serve)  # publishes (and so announces) the current version
            nursery.start_soon(self._republish_forever)
            nursery.start_soon(self._pull_validators, net)
            nursery.start_soon(self.train)
            task_status.started()

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        message = delivery.opened.message
        if delivery.kind == "verdicts" and isinstance(message, VerdictBatch):  # checked whole by the topic
            for verdict in message.verdicts:
                outcome = "accepted" if verdict.accepted else "rejected"
                worker = "0x" + verdict.worker.hex()
                count_verdict(self.tallies.verdicts, worker, outcome, self.bounds.verdict_workers)
        else:
            self.tallies.gossip[f"{delivery.kind}/{delivery.opened.envelope.type}"] += 1

    # --- serving (no network needed) -----------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Load the trainer and the inbox, start the origin, publish the current policy; serve forever."""
        cfg = self.config
        set_threads(cfg.work.threads)
        descriptor = await self._descriptor()
        await trio.to_thread.run_sync(load_run_setup, descriptor, self.model_dir, self.tasks)
        trainer = await trio.to_thread.run_sync(self._load_trainer, descriptor)
        self.trainer = trainer
        self.model_config = trainer.info
        if self.ledger is not None:
            parameters = trainer.parameter_count()
            self.ledger_run = await self.register_run(self.ledger, descriptor, parameters)
        self.inbox = inbox = RolloutInbox(
            self.inbox_path, retention_versions=self.bounds.inbox_retention_versions
        )
        self._release_unsaved(inbox, trainer)
        self.done = self._finished()
        self.origin_node = origin = OriginNode(
            self.checkpoints_dir,
            self.identity,
            cfg.run,
            server=ServerConfig(host=cfg.http_host, port=cfg.http_port),
            shard_size=max(1, int(cfg.work.shard_mb * MIB)),
            async_level=descriptor.async_level,
            mount=self._mount,
        )
        try:
            async with trio.open_nursery() as nursery:
                self.endpoint = await nursery.start(origin.run)
                current = self._current_version(trainer, origin.store)
                restored = restore_published(
                    origin.store,
                    origin.catalog,
                    run=cfg.run,
                    trainer=self.identity.address,
                    step=current,
                    async_level=descriptor.async_level,
                )
                if current not in restored:
                    await self._publish(current)
                self._prune_inbox(current)
                task_status.started(self.endpoint)
        finally:
            self._last_status = self.status()  # the node writes a final status after the work stops
            self.inbox = None
            inbox.close()

    # --- what a multi-trainer run (node.diloco.rl) does differently ---------------------------
    # (and `Pulling._before_check`, `_mine`, `_blames`; `Publishing._announces`)

    async def _descriptor(self) -> RunDescriptor:
        """The run this trainer trains: its own (persisted) descriptor."""
        return self.run_descriptor(self.config.run, self.identity.address)

    def _release_unsaved(self, inbox: RolloutInbox, trainer: Policy) -> None:
        """Rows used by steps whose weights were never saved go back into the pool."""
        released = inbox.release_from(trainer.step_count)
        if released:
            log.info(
                "released rollouts of unsaved steps", extra={"step": trainer.step_count, "rows": released}
            )

    def _current_version(self, trainer: Policy, store: ShardStore) -> int:
        """The version the restored weights are (one per GRPO step here)."""
        return trainer.step_count

    def _mount(self, shards: Handler) -> Handler:
        """The HTTP handler of our endpoint: the checkpoint shards alone here."""
        return shards

    def _load_trainer(self, descriptor: RunDescriptor) -> Policy:
        if launched_rank() == 0:  # rank 0 of a process group: every rank loads its shard
            sharded = ShardedGrpoTrainer.start(self.trainer_dir, self.model_dir, descriptor.grpo, self.optim)
            if sharded.info.config_hash != descriptor.model_config_hash:
                raise RunMismatch(f"the model in {self.model_dir} is not the run's")
            return sharded
        trainer = GrpoTrainer.resume(self.trainer_dir, self.model_dir, descriptor.grpo)
        if trainer is None:
            engine = TransformersEngine.from_folder(self.model_dir)
            trainer = GrpoTrainer(engine, descriptor.grpo, optim=self.optim)
        if trainer.info.config_hash != descriptor.model_config_hash:
            raise RunMismatch(f"the trainer state in {self.trainer_dir} is for another model than the run's")
        return trainer

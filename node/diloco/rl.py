"""A trainer of an RL run with several trainers: DiLoCo rounds around GRPO (spec/diloco.md, RL runs).

The run's lead trainer (the `RunDescriptor`'s `trainer`, which also signs the run's `DilocoRun`) names
the others as `co_trainers`. Every trainer:

- pulls ACCEPTED from every validator in good standing, verifies each item exactly as a lone trainer
  does (`node.trainer`), and keeps its share: `rollout_owner(digest, trainers)`, so each accepted
  rollout is trained on once across the run;
- plays DiLoCo round r (`node.diloco.rounds.DilocoTrainerWork`): loads the outer weights θ_r, takes H
  GRPO inner steps, each on a batch of its share of versions [r - async_level, r] (inner step r·H + h
  marks the rows it used), and contributes θ_r − θ to the round's fp16 (or int8) all-reduce over HTTP;
- after the outer step holds θ_{r+1}, publishes it as checkpoint version r+1 into its own store.

Only the lead announces its versions (gossip, DHT) and signs the manifests workers and validators follow
(gossiped as `CheckpointHead`s, whose signed Merkle root is all a co-trainer needs of them);
the co-trainers publish the same weights locally so that they know each version's Merkle root (what the
submissions they take must name) and so a co-trainer that sees a root other than the lead's would be
visible. Version = outer round: workers generate with the outer weights after each sync.

A trainer that restarts resumes from its last outer state (or a peer's newer one), releases the rows of
the round it had not contributed yet, and takes them again. Each new outer state settles the rounds
below it (`RolloutInbox.settle`): the rows of our contribution stay used when the round averaged it;
rows of a contribution left out, or of a round abandoned for a newer outer state, go back to the pool.
So nothing accepted is lost, and nothing is trained into the run twice. Each published outer version
prunes the inbox as a lone trainer's does (`SwarmTrainerWork._prune_inbox`): rounds never go back below
the newest published outer state, so rows past the async window plus the retention are never needed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
import trio
from libp2p.peer.id import ID

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.ledger import Ledger
from swarmnode.node.config import NodeConfig, run_validator_addresses
from swarmnode.node.dataplane.http_server import Handler
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.node.diloco.contribution_endpoints import DilocoService, mounted
from swarmnode.node.diloco.exchange import TrainerSettings
from swarmnode.node.diloco.holdings import Holdings
from swarmnode.node.diloco.participant import GroupParticipant, Participant
from swarmnode.node.diloco.plan import read_plan
from swarmnode.node.diloco.role import trainer_endpoints
from swarmnode.node.diloco.rounds import DilocoTrainerWork
from swarmnode.node.diloco.weights import load_trainable, trainable_state
from swarmnode.node.errors import RunMismatch
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.node.p2p.endpoints import MANIFEST
from swarmnode.node.p2p.gossip import Delivery
from swarmnode.node.p2p.reqresp import RequestFailed
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.learner import GrpoTrainer, OptimizerParams
from swarmnode.node.rl.tasks import Task
from swarmnode.node.roles.base import RoleNet, RoleService
from swarmnode.node.roles.common import CHALLENGE_WINDOW_EPOCHS
from swarmnode.node.trainer import (
    Policy,
    SwarmTrainerWork,
    TrainerBounds,
    load_or_create_descriptor,
    submission_of,
    trainer_bounds,
)
from swarmnode.node.trainer.group import launched_rank
from swarmnode.node.trainer.inbox import InboxEntry, RolloutInbox
from swarmnode.node.trainer.service import Trainer
from swarmnode.node.trainer.sharded import ShardedGrpoTrainer
from swarmnode.protocol.codec import encode
from swarmnode.protocol.diloco import check_rl_plan, rollout_owner
from swarmnode.protocol.errors import ProtocolError, Reason
from swarmnode.protocol.messages import (
    AcceptedBatch,
    CheckpointHead,
    DilocoEntry,
    ManifestRequest,
    ManifestResponse,
    RolloutSubmission,
    RunDescriptor,
)
from swarmnode.protocol.runs import run_trainers
from swarmnode.protocol.shards import verify_head, verify_manifest
from swarmnode.protocol.types import MIB

log = logging.getLogger(__name__)

DILOCO_DIR = "diloco"
GROUP_DIR = "group"  # a trainer group's start directory (never saved into: the outer state is the resume)
HISTORY_KEPT = 10  # rounds shown in the status
LEAD_MANIFEST_WAIT_S = 60.0  # how long a pulled batch waits for the lead's manifests of its versions
LEAD_ASK_PAUSE_S = 2.0  # between two MANIFEST requests to the lead for a version it has not published


class RolloutInnerRound:
    """The H GRPO steps of one round, on this trainer's share of the accepted rollouts."""

    def __init__(self, work: DilocoSwarmTrainerWork) -> None:
        self.work = work
        self.last_losses: list[float] = []
        self.rounds = 0

    async def __call__(
        self, round_index: int, theta: dict[str, torch.Tensor] | None
    ) -> dict[str, torch.Tensor] | None:
        """θ given: load it, train, return the trained weights. None (a trainer group): the ranks' model
        holds θ already and keeps the trained weights, which the group reads from there."""
        work = self.work
        trainer, inbox, descriptor = work._parts()
        inner_steps = work.plan.inner_steps
        first = round_index * inner_steps
        released = inbox.release_from(first)  # an earlier, uncontributed attempt at this round
        if released:
            log.info(
                "released rollouts of an unfinished round", extra={"round": round_index, "rows": released}
            )
        if theta is not None:
            await trio.to_thread.run_sync(load_trainable, _whole(trainer).engine.model, theta)
        need = work.config.work.min_batch_groups or descriptor.grpo.prompts_per_step
        losses: list[float] = []
        for h in range(inner_steps):
            step = first + h
            record, stats = await work._train_step(step, need, version=round_index)
            losses.append(stats.loss)
            log.info(
                "inner step",
                extra={
                    "round": round_index,
                    "step": step,
                    "submissions": record.submissions,
                    "signal_groups": stats.groups_used,
                    "mean_reward": round(stats.mean_reward, 4),
                    "wait_s": round(record.wait_s, 2),
                },
            )
        self.last_losses = losses
        self.rounds += 1
        if theta is None:
            return None
        return await trio.to_thread.run_sync(trainable_state, _whole(trainer).engine.model)

    def statistics(self) -> dict[str, Any]:
        last = self.last_losses
        return {
            "rounds": self.rounds,
            "last_round_mean_loss": sum(last) / len(last) if last else float("nan"),
        }


class DilocoSwarmTrainerWork(SwarmTrainerWork):
    """`SwarmTrainerWork` whose training is DiLoCo rounds with the run's other trainers."""

    def __init__(
        self,
        config: NodeConfig,
        identity: NodeIdentity,
        *,
        model_dir: Path | None = None,
        tasks: Sequence[Task] | None = None,
        optim: OptimizerParams | None = None,
        ledger: Ledger | None = None,
        settings: TrainerSettings | None = None,
        bounds: TrainerBounds | None = None,
        run_validators: Sequence[bytes] = (),
        challenge_window_epochs: int = CHALLENGE_WINDOW_EPOCHS,
    ) -> None:
        super().__init__(
            config,
            identity,
            model_dir=model_dir,
            tasks=tasks,
            optim=optim,
            ledger=ledger,
            bounds=bounds,
            run_validators=run_validators,
            challenge_window_epochs=challenge_window_epochs,
        )
        work = config.work
        self.lead = bytes.fromhex(work.diloco_lead.removeprefix("0x"))
        try:
            self.plan, plan_envelope = read_plan(Path(work.diloco_plan), self.lead)
        except (ProtocolError, OSError) as exc:
            raise RunMismatch(
                f"{work.diloco_plan} is not a DiLoCo plan signed by the lead {work.diloco_lead}: {exc}"
            ) from exc
        if self.plan.run != config.run:
            raise RunMismatch(
                f"the DiLoCo plan is for run {self.plan.run!r}, this node's run is {config.run!r}"
            )
        if identity.address not in self.plan.trainers:
            raise RunMismatch(f"{identity.checksum_address} is not a trainer of the DiLoCo plan")
        if self.lead not in self.plan.trainers:
            raise RunMismatch("the plan's signer is not one of its trainers, so it cannot lead the run")
        self.is_lead = identity.address == self.lead
        self.co_trainers = tuple(t for t in self.plan.trainers if t != self.lead)
        self.settings = settings or TrainerSettings()
        self.holdings = Holdings(
            config.data_dir / DILOCO_DIR,
            identity,
            self.plan,
            plan_envelope,
            shard_size=max(1, int(work.shard_mb * MIB)),
        )
        self.service = DilocoService(self.holdings)
        self.inner = RolloutInnerRound(self)
        self.diloco: DilocoTrainerWork | None = None
        self.trainers: tuple[bytes, ...] = (self.lead, *self.co_trainers)
        self.not_mine = 0  # verified items that are another trainer's share
        self.lead_roots: dict[int, bytes] = {}  # co-trainer: version → root of the lead's manifest
        self.manifests_refused = 0
        self.roots_compared: set[int] = set()  # co-trainer: versions both we and the lead published
        self.root_forks: list[int] = []  # ... whose roots differed
        self._roots_changed = trio.Event()
        self._events: list[dict[str, Any]] = []

    # --- the run and its descriptor ------------------------------------------------------------------

    def run_descriptor(self, run: str, trainer: bytes) -> RunDescriptor:
        if not self.is_lead:
            raise RuntimeError("only the lead trainer describes the run; co-trainers fetch its record")
        if self.descriptor is None:
            self.descriptor = load_or_create_descriptor(
                self.descriptor_path, run, trainer, self.model_dir, self.tasks, self.co_trainers
            )
            self._check_plan(self.descriptor)
        return self.descriptor

    async def _descriptor(self) -> RunDescriptor:
        if self.is_lead:
            return self.run_descriptor(self.config.run, self.identity.address)
        assert self._net is not None, "co-trainers learn the run from the lead's record"
        descriptor = (await self._net.wait_run_record()).descriptor
        if descriptor.trainer != self.lead:
            raise RunMismatch(
                f"the run record is signed by 0x{descriptor.trainer.hex()}, not the plan's lead"
            )
        self._check_plan(descriptor)
        self.descriptor = descriptor
        return descriptor

    def _check_plan(self, descriptor: RunDescriptor) -> None:
        try:
            check_rl_plan(self.plan, descriptor)
        except ProtocolError as exc:
            raise RunMismatch(f"the DiLoCo plan does not fit the run: {exc.detail}") from exc
        self.trainers = run_trainers(descriptor)

    def _load_trainer(self, descriptor: RunDescriptor) -> Policy:
        """Always the model folder's base weights: the outer state (holdings) says where the run is.

        Rank 0 of a process group starts the group from a directory nothing saves into, so that it too
        starts from the folder's weights (DiLoCo resumes from its outer state, not from a trainer save).
        """
        if launched_rank() == 0:
            group_dir = self.config.data_dir / DILOCO_DIR / GROUP_DIR
            sharded = ShardedGrpoTrainer.start(group_dir, self.model_dir, descriptor.grpo, self.optim)
            if sharded.info.config_hash != descriptor.model_config_hash:
                raise RunMismatch(f"the model in {self.model_dir} is not the run's")
            return sharded
        engine = TransformersEngine.from_folder(self.model_dir)
        return GrpoTrainer(engine, descriptor.grpo, optim=self.optim)

    def _release_unsaved(self, inbox: RolloutInbox, trainer: Policy) -> None:
        """Nothing here: each round releases what an unfinished attempt at it used."""

    def _current_version(self, trainer: Policy, store: ShardStore) -> int:
        """The newest complete version on disk: published outer weights are never taken back."""
        complete = [v for v, done in store.versions_on_disk().items() if done]
        return max(complete, default=0)

    def _mount(self, shards: Handler) -> Handler:
        return mounted(shards, self.service)

    def _announces(self) -> bool:
        return self.is_lead

    def _finished(self) -> bool:
        return self.diloco is not None and self.diloco.finished.is_set()

    # --- taking our share --------------------------------------------------------------------------

    def published_roots(self) -> dict[int, bytes]:
        """What submissions must name: the lead's manifests (its own catalog, for the lead)."""
        if self.is_lead:
            return super().published_roots()
        return dict(self.lead_roots)

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        message = delivery.opened.message
        if isinstance(message, CheckpointHead) and not self.is_lead:
            self._take_lead_head(encode(delivery.opened.envelope))
            return
        await super().on_gossip(net, delivery)

    def _take_lead_head(self, envelope: bytes) -> bool:
        """The root of a version from the lead's gossiped head: the lead signed it, so no manifest fetch."""
        try:
            head = verify_head(envelope, run=self.config.run, trainer=self.lead, now_ms=wall_ms())
        except ProtocolError:
            self.manifests_refused += 1
            return False
        self._take_lead_root(head.version, head.merkle_root)
        return True

    def _take_lead_manifest(self, envelope: bytes) -> bool:
        """Remember the root of a version the lead signed; False (counted) when it is not the lead's."""
        try:
            manifest = verify_manifest(envelope, run=self.config.run, trainer=self.lead, now_ms=wall_ms())
        except ProtocolError:
            self.manifests_refused += 1
            return False
        self._take_lead_root(manifest.version, manifest.merkle_root)
        return True

    def _take_lead_root(self, version: int, root: bytes) -> None:
        if version not in self.lead_roots:
            self.lead_roots[version] = root
            newest = max(self.lead_roots)
            async_level = self.descriptor.async_level if self.descriptor is not None else 2
            for old in [v for v in self.lead_roots if v < newest - async_level - 1]:
                del self.lead_roots[old]
            self._roots_changed.set()
            self._roots_changed = trio.Event()
            self._compare_root(version)

    def _compare_root(self, version: int) -> None:
        """A co-trainer's own publication of `version` against the lead's: the same outer weights give the
        same root (same shard size), so a difference means we left the run's lineage (or shard_mb differs)."""
        if self.is_lead or version in self.roots_compared or self.origin_node is None:
            return
        own, lead = self.origin_node.catalog.get(version), self.lead_roots.get(version)
        if own is None or lead is None:
            return
        self.roots_compared.add(version)
        if own.manifest.merkle_root != lead:
            self.root_forks.append(version)
            log.warning(
                "our outer weights differ from the lead's checkpoint (a fork, or another shard_mb)",
                extra={"version": version},
            )

    async def _before_check(self, batch: AcceptedBatch) -> None:
        """A co-trainer first learns the lead's manifest of every version the batch names.

        Gossip usually brought it already; otherwise ask the lead (MANIFEST). Bounded: a version still
        unknown after `LEAD_MANIFEST_WAIT_S` is checked (and refused) as is.
        """
        if self.is_lead:
            return
        wanted = {_version_of(item.submission) for item in batch.items}
        with trio.move_on_after(LEAD_MANIFEST_WAIT_S):
            while missing := sorted(v for v in wanted if v not in self.lead_roots and v >= self._oldest()):
                changed = self._roots_changed
                for version in missing:
                    await self._ask_lead(version)
                if any(v not in self.lead_roots for v in missing):
                    with trio.move_on_after(LEAD_ASK_PAUSE_S):
                        await changed.wait()

    def _oldest(self) -> int:
        """Versions below this are stale anyway (the check ignores them)."""
        return min(self.lead_roots, default=0)

    async def _ask_lead(self, version: int) -> None:
        net = self._net
        lead = next((r for r in net.peers("trainer") if r.address == self.lead), None) if net else None
        if net is None or lead is None:
            return
        try:
            opened = await net.request(
                ID.from_base58(lead.peer_id), MANIFEST, ManifestRequest(self.config.run, version)
            )
        except RequestFailed:
            return
        answer: ManifestResponse = opened.message
        if answer.manifest:
            self._take_lead_manifest(answer.manifest)

    def _mine(self, entries: Sequence[InboxEntry]) -> Sequence[InboxEntry]:
        mine = [e for e in entries if rollout_owner(e.digest, self.trainers) == self.identity.address]
        self.not_mine += len(entries) - len(mine)
        return mine

    def _blames(self, reason: Reason) -> bool:
        """A version we could not learn from the lead in time is not the validator's fault."""
        return super()._blames(reason) and (self.is_lead or reason is not Reason.UNKNOWN_CHECKPOINT)

    # --- the rounds ----------------------------------------------------------------------------------

    async def _on_outer(
        self, round: int, theta: dict[str, torch.Tensor] | None, contributors: tuple[DilocoEntry, ...]
    ) -> None:
        """New outer weights: the policy from now on, published as version `round` (θ None: a trainer
        group, whose ranks' model holds them already and writes its own files of the version).

        Rows our earlier rounds used but no averaged contribution carried go back to the pool.
        """
        trainer, inbox, _ = self._parts()
        counted = any(e.trainer == self.identity.address for e in contributors)
        inner_steps = self.plan.inner_steps
        upto = round * inner_steps
        released = inbox.settle(upto, upto - inner_steps if counted else upto)
        if released:
            log.info("released rollouts of uncounted rounds", extra={"round": round, "rows": released})
        if theta is not None:
            await trio.to_thread.run_sync(load_trainable, _whole(trainer).engine.model, theta)
        latest = self.origin_node.catalog.latest_version if self.origin_node is not None else None
        if latest is None or round > latest:
            await self._publish(round)
        self._compare_root(round)

    def _emit(self, event: str, **fields: Any) -> None:
        self._events.append({"event": event, **fields})
        del self._events[:-HISTORY_KEPT]
        level = logging.WARNING if event in ("fork", "incomplete", "skipped", "refused") else logging.INFO
        log.log(level, f"diloco {event}", extra=fields)

    async def train(self) -> None:
        trainer, _, _ = self._parts()
        net = self._net
        assert net is not None, "DiLoCo rounds need the network (run, not serve alone)"
        self.holdings.set_endpoint(self.endpoint)
        participant: torch.nn.Module | Participant
        if isinstance(trainer, ShardedGrpoTrainer):
            participant = await trio.to_thread.run_sync(GroupParticipant.start_group, self.holdings, trainer)
        else:
            participant = trainer.engine.model
        self.diloco = DilocoTrainerWork(
            self.holdings,
            participant,
            self.inner,
            settings=self.settings,
            emit=self._emit,
            on_outer=self._on_outer,
        )
        peers = {t for t in self.plan.trainers if t != self.identity.address}
        await self.diloco.train(lambda: {a: e for a, e in trainer_endpoints(net).items() if a in peers})
        self.done = True
        log.info("DiLoCo rounds done; still serving", extra={"round": self.diloco.round})

    def status(self) -> dict[str, Any]:
        status = super().status()
        diloco = self.diloco.status() if self.diloco is not None else {}
        status["diloco"] = {
            "lead": self.is_lead,
            "trainers": len(self.plan.trainers),
            "inner_steps": self.plan.inner_steps,
            "not_mine": self.not_mine,
            "lead_versions": sorted(self.lead_roots),
            "manifests_refused": self.manifests_refused,
            "roots_agreed": len(self.roots_compared) - len(self.root_forks),
            "root_forks": self.root_forks[-HISTORY_KEPT:],
            "events": self._events[-HISTORY_KEPT:],
            **diloco,
        }
        return status


def _whole(trainer: Policy) -> GrpoTrainer:
    """The one-process trainer, whose model θ is loaded into and read from."""
    if not isinstance(trainer, GrpoTrainer):
        raise TypeError("a trainer group's weights stay in its ranks; it is given no θ")
    return trainer


def _version_of(envelope: bytes) -> int:
    """The checkpoint version a pulled submission names (0 when it cannot be read: the check refuses it)."""
    try:
        submission: RolloutSubmission = submission_of(envelope)
    except (ProtocolError, ValueError, TypeError):
        return 0
    return submission.checkpoint_version


class LeadTrainer(Trainer):
    """The lead of a multi-trainer run: the trainer role, which also finds its co-trainers."""

    NEEDS: ClassVar[tuple[str, ...]] = ("relay", "validator", "trainer")


class CoTrainer(RoleService):
    """Another trainer of the run: announced as a trainer, learns the run from the lead's record."""

    ROLE: ClassVar[str] = "trainer"
    SUBSCRIBES: ClassVar[tuple[str, ...]] = ("verdicts", "ledger", "checkpoints")
    NEEDS: ClassVar[tuple[str, ...]] = ("relay", "validator", "trainer")
    FETCH_RUN_RECORD: ClassVar[bool] = True


def make_diloco_trainer(config: NodeConfig, identity: NodeIdentity, ledger: Ledger | None) -> RoleService:
    work = DilocoSwarmTrainerWork(
        config,
        identity,
        ledger=ledger,
        bounds=trainer_bounds(config),
        run_validators=run_validator_addresses(config.work),
        challenge_window_epochs=config.work.challenge_window_epochs,
    )
    return LeadTrainer(work) if work.is_lead else CoTrainer(work)

"""Trainer: owns the run. Publishes the signed RunDescriptor in the DHT, serves checkpoint manifests,
gossips the heads of new checkpoints (`checkpoints` topic, via the work), and listens to verdicts and the
ledger.

Needs: relays (to fan its shards out) and validators (whose accepted rollouts it trains on).
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from libp2p.peer.id import ID

from swarmnode.node.p2p.clock import wall_ms
from swarmnode.node.p2p.endpoints import MANIFEST
from swarmnode.node.p2p.records import open_run_record, run_record_key
from swarmnode.node.roles.base import IdleWork, RoleNet, RoleService, RoleWork
from swarmnode.protocol.envelope import Opened
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.messages import (
    GrpoParams,
    ManifestRequest,
    ManifestResponse,
    RunDescriptor,
    ValidatorPolicy,
)


class TrainerWork(RoleWork, Protocol):
    def run_descriptor(self, run: str, trainer: bytes) -> RunDescriptor:
        """The descriptor of the run this trainer owns (signed and stored in the DHT at start)."""
        ...

    async def manifest(self, peer: ID, request: ManifestRequest) -> ManifestResponse:
        """Answer a manifest request with the signed CheckpointManifest envelope, or a status."""
        ...


def dev_run_descriptor(run: str, trainer: bytes, *, created_ms: int | None = None) -> RunDescriptor:
    """A placeholder descriptor for devnets until the RL issue supplies the real model and dataset hashes."""
    zero = bytes(32)
    return RunDescriptor(
        run=run,
        trainer=trainer,
        model_config_hash=zero,
        tokenizer_files=(),
        base_checkpoint_hash=zero,
        dataset_hash=zero,
        task_kind="devnet-placeholder",
        grpo=GrpoParams(
            group_size=4,
            prompts_per_step=8,
            max_new_tokens=64,
            temperature=1.0,
            learning_rate=1e-5,
            clip_epsilon=0.2,
            clip_delta=4.0,
            max_grad_norm=1.0,
            token_budget=4096,
            length_target=0,
            length_penalty=0.0,
        ),
        async_level=2,
        policy=ValidatorPolicy(
            toploc_k=128,
            toploc_chunk=32,
            max_mean_exp_mismatches=38.0,
            max_mean_mant_err=10.0,
            sampling_tolerance=0.0,
            eos_min_prob=0.0,
            sample_fraction=1.0,
            min_stake_gwei=0,
            slash_gwei=0,
        ),
        created_ms=wall_ms() if created_ms is None else created_ms,
    )


class IdleTrainerWork(IdleWork):
    """No training yet: publishes the placeholder descriptor and has no checkpoints to serve."""

    def run_descriptor(self, run: str, trainer: bytes) -> RunDescriptor:
        return dev_run_descriptor(run, trainer)

    async def manifest(self, peer: ID, request: ManifestRequest) -> ManifestResponse:
        return ManifestResponse(status=int(Reason.UNKNOWN_CHECKPOINT), manifest=b"")


class Trainer(RoleService):
    ROLE: ClassVar[str] = "trainer"
    SUBSCRIBES: ClassVar[tuple[str, ...]] = ("verdicts", "ledger")
    NEEDS: ClassVar[tuple[str, ...]] = ("relay", "validator")
    FETCH_RUN_RECORD: ClassVar[bool] = False

    def __init__(self, work: TrainerWork | None = None) -> None:
        self.trainer_work: TrainerWork = work if work is not None else IdleTrainerWork()
        super().__init__(self.trainer_work)

    def register(self, net: RoleNet) -> None:
        async def on_manifest(peer: ID, opened: Opened) -> ManifestResponse:
            return await self.trainer_work.manifest(peer, opened.message)

        net.serve(MANIFEST, on_manifest)

    async def start(self, net: RoleNet) -> None:
        descriptor = self.trainer_work.run_descriptor(net.run, net.identity.address)
        envelope = net.seal(descriptor)
        await net.discovery.put_run_record(net.run, envelope)
        net.set_run_record(open_run_record(run_record_key(net.run), envelope))

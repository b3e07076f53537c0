"""Build, sign and read the `DilocoRun` a run's owner hands to its trainers (spec/diloco.md, The run)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from crypto.identity import NodeIdentity
from node.p2p.clock import wall_ms
from node.rl.diloco import content_digest, trainable_state
from node.rl.model import ModelConfig, build_model, load_checkpoint, model_config_hash
from protocol.codec import decode
from protocol.diloco import check_plan, verify_plan
from protocol.envelope import Envelope, seal
from protocol.messages import DilocoRun


def initial_digest(cfg: ModelConfig, seed: int) -> bytes:
    """The content digest of θ_0 for a model built from (config, seed): what every trainer starts from."""
    return content_digest(trainable_state(build_model(cfg, seed)))


def build_plan(
    run: str,
    trainers: Iterable[bytes],
    *,
    cfg: ModelConfig,
    model_seed: int,
    rounds: int,
    inner_steps: int,
    inner_lr: float = 1e-3,
    outer_lr: float = 0.7,
    outer_momentum: float = 0.9,
    nesterov: bool = True,
    compression: str = "fp16",
    collect_timeout_ms: int = 30_000,
    vote_timeout_ms: int = 30_000,
    created_ms: int | None = None,
    initial: bytes | None = None,
) -> DilocoRun:
    """The run's settings; θ_0 is the model built from (cfg, model_seed) unless `initial` names its digest."""
    plan = DilocoRun(
        run=run,
        trainers=tuple(sorted(set(trainers))),
        model_config_hash=model_config_hash(cfg),
        initial_digest=initial_digest(cfg, model_seed) if initial is None else initial,
        rounds=rounds,
        inner_steps=inner_steps,
        inner_lr=float(inner_lr),
        outer_lr=float(outer_lr),
        outer_momentum=float(outer_momentum),
        nesterov=nesterov,
        compression=compression,
        collect_timeout_ms=collect_timeout_ms,
        vote_timeout_ms=vote_timeout_ms,
        created_ms=wall_ms() if created_ms is None else created_ms,
    )
    check_plan(plan)
    return plan


def checkpoint_digest(path: Path) -> tuple[ModelConfig, bytes]:
    """The model config and θ_0 content digest of a checkpoint file: what an RL run's trainers start from."""
    cfg, state = load_checkpoint(path)
    model = build_model(cfg, 0)
    model.load_state_dict(state)
    return cfg, content_digest(trainable_state(model))


def sign_plan(owner: NodeIdentity, plan: DilocoRun) -> bytes:
    """The owner's signed envelope of the run (sequence number from its creation time)."""
    return seal(owner, plan, run=plan.run, seq=plan.created_ms * 1000, ts=plan.created_ms)


def read_plan(path: Path, owner: bytes, now_ms: int | None = None) -> tuple[DilocoRun, bytes]:
    """A signed run from a file, verified against the owner the operator pins."""
    envelope = Path(path).read_bytes()
    run = decode(Envelope, envelope).run
    plan = verify_plan(envelope, run=run, owner=owner, now_ms=wall_ms() if now_ms is None else now_ms)
    return plan, envelope

"""Build, sign and read the `DilocoRun` a run's owner hands to its trainers (spec/diloco.md, The run).

The run's model is a Hugging Face folder (`node.rl.model`): the plan names the sha256 of its `config.json`
(as a RunDescriptor does) and the content digest of θ_0, either a fresh model of that config built from a
seed (pre-training, `initial_digest`) or the folder's own weights (an RL run's base, `checkpoint_digest`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from transformers import PreTrainedModel

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.diloco.algorithm import content_digest
from swarmnode.node.diloco.weights import trainable_state
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.node.rl.model import build_model, config_hash, load_model, read_config
from swarmnode.protocol.codec import decode
from swarmnode.protocol.diloco import check_plan, verify_plan
from swarmnode.protocol.envelope import Envelope, seal
from swarmnode.protocol.messages import DilocoRun


def plan_config_hash(folder: str | os.PathLike[str]) -> bytes:
    """The plan's `model_config_hash` of a folder, refusing one that is not a supported model."""
    read_config(folder)
    return config_hash(folder)


def fresh_model(folder: str | os.PathLike[str], seed: int) -> PreTrainedModel:
    """A model of the folder's config initialised from `seed` (its `initializer_range` as the std)."""
    config = read_config(folder)
    return build_model(config, seed, float(config.initializer_range))


def initial_digest(folder: str | os.PathLike[str], seed: int) -> bytes:
    """The content digest of θ_0 for `fresh_model(folder, seed)`: a pre-training run's start."""
    return content_digest(trainable_state(fresh_model(folder, seed)))


def checkpoint_digest(folder: str | os.PathLike[str]) -> bytes:
    """The content digest of the folder's own weights in float32: θ_0 of an RL run (its base)."""
    return content_digest(trainable_state(load_model(folder)))


def build_plan(
    run: str,
    trainers: Iterable[bytes],
    *,
    model: str | os.PathLike[str],
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
    """The run's settings for the model folder `model`; θ_0 is a fresh model of its config from `model_seed`
    unless `initial` names its digest (`checkpoint_digest(model)` for an RL run)."""
    plan = DilocoRun(
        run=run,
        trainers=tuple(sorted(set(trainers))),
        model_config_hash=plan_config_hash(model),
        initial_digest=initial_digest(model, model_seed) if initial is None else initial,
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


def sign_plan(owner: NodeIdentity, plan: DilocoRun) -> bytes:
    """The owner's signed envelope of the run (sequence number from its creation time)."""
    return seal(owner, plan, run=plan.run, seq=plan.created_ms * 1000, ts=plan.created_ms)


def read_plan(path: Path, owner: bytes, now_ms: int | None = None) -> tuple[DilocoRun, bytes]:
    """A signed run from a file, verified against the owner the operator pins."""
    envelope = Path(path).read_bytes()
    run = decode(Envelope, envelope).run
    plan = verify_plan(envelope, run=run, owner=owner, now_ms=wall_ms() if now_ms is None else now_ms)
    return plan, envelope

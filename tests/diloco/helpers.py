"""In-process DiLoCo trainers for the fast tests: real HTTP servers on loopback, fixed peer maps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch
import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.dataplane.http_server import HttpServer, ServerConfig
from swarmnode.node.diloco.contribution_endpoints import DilocoService
from swarmnode.node.diloco.exchange import TrainerSettings
from swarmnode.node.diloco.holdings import Holdings
from swarmnode.node.diloco.participant import params_of
from swarmnode.node.diloco.plan import build_plan, fresh_model, sign_plan
from swarmnode.node.diloco.pretraining import LmBatch, lm_loss, pretraining_batches
from swarmnode.node.diloco.rounds import DataInnerRound, DilocoTrainerWork
from swarmnode.node.rl.model import ModelInfo
from swarmnode.node.rl.tokenizer import ChatTokenizer, load_tokenizer
from swarmnode.protocol.messages import DilocoRun
from tests.tinymodel import tiny_folder

RUN = "diloco-test"
MODEL_SEED = 3
OWNER = NodeIdentity((999).to_bytes(32, "big"))
FAST = TrainerSettings(
    poll_wait_s=1, retry_s=0.05, join_wait_s=2.0, fetch_timeout_s=5.0, resync_timeout_s=5.0
)


def identities(n: int) -> list[NodeIdentity]:
    """n trainer keys, ascending by address (the run's order)."""
    keys = [NodeIdentity((100 + i).to_bytes(32, "big")) for i in range(n)]
    return sorted(keys, key=lambda k: k.address)


def model() -> torch.nn.Module:
    """θ_0 of the test runs: a fresh model of the tiny folder's config from MODEL_SEED."""
    return fresh_model(tiny_folder(), MODEL_SEED)


@cache
def _tokenizer() -> tuple[ChatTokenizer, ModelInfo]:
    return load_tokenizer(tiny_folder())


def lines(seed: int, batches: int, batch_size: int) -> list[LmBatch]:
    """Pre-training batches in the tiny folder's tokens."""
    return pretraining_batches(*_tokenizer(), seed, batches, batch_size)


def tiny_plan(trainers: Sequence[NodeIdentity], **changes: Any) -> tuple[DilocoRun, bytes]:
    fields: dict[str, Any] = dict(
        model=tiny_folder(),
        model_seed=MODEL_SEED,
        rounds=2,
        inner_steps=2,
        inner_lr=1e-3,
        compression="fp16",
        collect_timeout_ms=3000,
        vote_timeout_ms=3000,
        created_ms=1_767_225_600_000,
    )
    fields.update(changes)
    plan = build_plan(RUN, [t.address for t in trainers], **fields)
    return plan, sign_plan(OWNER, plan)


def trainer_data(index: int, batches: int = 4, batch_size: int = 4) -> list[LmBatch]:
    return lines(1000 + index, batches, batch_size)


@dataclass
class LocalTrainer:
    identity: NodeIdentity
    holdings: Holdings
    work: DilocoTrainerWork
    events: list[dict[str, Any]] = field(default_factory=list)
    endpoint: str = ""
    theta: dict[str, torch.Tensor] | None = None

    def kinds(self) -> list[str]:
        return [e["event"] for e in self.events]


def make_trainer(
    tmp: Path,
    identity: NodeIdentity,
    plan: DilocoRun,
    envelope: bytes,
    data: list[LmBatch],
    settings: TrainerSettings = FAST,
) -> LocalTrainer:
    events: list[dict[str, Any]] = []
    holdings = Holdings(tmp / identity.address.hex()[:8], identity, plan, envelope, shard_size=64 * 1024)
    local = model()
    work = DilocoTrainerWork(
        holdings,
        local,
        DataInnerRound(local, params_of(plan), data, lm_loss),
        settings=settings,
        emit=lambda event, **fields: events.append({"event": event, **fields}),
    )
    return LocalTrainer(identity, holdings, work, events)


async def serve(trainer: LocalTrainer, nursery: trio.Nursery) -> str:
    server = HttpServer(DilocoService(trainer.holdings), ServerConfig(port=0))
    port = await nursery.start(server.serve)
    trainer.endpoint = f"http://127.0.0.1:{port}"
    trainer.holdings.set_endpoint(trainer.endpoint)
    return trainer.endpoint


async def train(trainer: LocalTrainer, peers: dict[bytes, str]) -> None:
    trainer.theta = await trainer.work.train(lambda: peers)

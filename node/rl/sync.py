"""The synchronous single-process baseline: same model, tasks, seeds and GRPO step, no network.

Each step one honest worker generates its assigned groups on the current policy (version = step), and
the trainer takes one GRPO step on them. The distributed devnet is compared against this loop at equal
numbers of trainer steps (benchmarks/bench_rl.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from node.rl.engine import TransformersEngine
from node.rl.rollouts import build_submission
from node.rl.run import RunSetup
from node.rl.trainer import GrpoTrainer, StepStats


@dataclass(frozen=True)
class SyncStep:
    stats: StepStats
    generate_s: float
    train_s: float


def run_sync(setup: RunSetup, base_checkpoint: Path, steps: int, worker: bytes, *, out_dir: Path | None = None,
             on_step: Callable[[SyncStep], None] | None = None) -> list[SyncStep]:
    """Train for `steps` GRPO steps; checkpoints go to `out_dir` when given."""
    descriptor = setup.descriptor
    trainer = GrpoTrainer(TransformersEngine.from_checkpoint(base_checkpoint), descriptor.grpo)
    dataset, ids = setup.dataset, setup.dataset_ids
    history = []
    for version in range(steps):
        started = time.perf_counter()
        submission = build_submission(trainer.engine, descriptor, dataset, ids, worker, version, b"\0" * 32, 0)
        generated = time.perf_counter()
        stats = trainer.step(submission.groups)
        record = SyncStep(stats, generated - started, time.perf_counter() - generated)
        history.append(record)
        if on_step is not None:
            on_step(record)
    if out_dir is not None:
        trainer.save(out_dir)
    return history

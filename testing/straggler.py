"""Fault injection for tests and demos: a trainer that is slow in one round (a straggler)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from swarmnode.node.diloco.algorithm import LossFn
from swarmnode.node.diloco.pretraining import LmBatch, round_batches


def straggling(
    loss_fn: LossFn[LmBatch], data: Sequence[LmBatch], round: int, inner_steps: int, seconds: float
) -> LossFn[LmBatch]:
    """`loss_fn`, except that the first inner step of `round` takes `seconds` longer.

    The batch identifies the round (`round_batches` is a pure function of data, round and H), so nothing
    else in the trainer has to know. With fewer batches than rounds x H the marker batch recurs; give the
    trainer at least that many batches.
    """
    marker = round_batches(data, round, inner_steps)[0]

    def slow(model: torch.nn.Module, batch: LmBatch) -> torch.Tensor:
        if batch is marker:
            time.sleep(seconds)  # runs in the trainer's worker thread, as a slow device would
        return loss_fn(model, batch)

    return slow

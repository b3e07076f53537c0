"""The batch of one step: which pending inbox rows a step takes (`plan_batch`), and their groups.

Pure: the rows, the step and the bounds are arguments; the step loop (`steps`) does the waiting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swarmnode.node.trainer.inbox import InboxRow
from swarmnode.node.trainer.limits import BATCH_LIMIT_FACTOR
from swarmnode.protocol.codec import decode
from swarmnode.protocol.envelope import Envelope
from swarmnode.protocol.messages import RolloutGroup, RolloutSubmission


@dataclass(frozen=True)
class BatchPlan:
    take: tuple[InboxRow, ...]  # whole submissions in arrival order
    stale: tuple[InboxRow, ...]  # too old for this step: dropped
    signal_groups: int  # groups with signal in `take`
    ready: bool  # `take` reaches the number of signal groups a step needs


def batch_limit(need: int, configured: int = 0) -> int:
    """The most signal groups one step takes: `configured`, else `BATCH_LIMIT_FACTOR` times `need`; at
    least `need` (a limit below what a step waits for would never let it start)."""
    if need < 1 or configured < 0:
        raise ValueError(f"a step needs >= 1 signal groups and a limit >= 0, not {need} and {configured}")
    return max(need, configured or BATCH_LIMIT_FACTOR * need)


def plan_batch(
    pending: Sequence[InboxRow], step: int, async_level: int, need: int, limit: int | None = None
) -> BatchPlan:
    """Pick step `step`'s submissions: versions in [step - async_level, step], oldest arrivals first.

    The step waits for `need` signal groups; once it has them it takes every usable row, whole
    submissions, until it holds `limit` (`batch_limit`; None: `need`, a fixed-size batch), so what
    the swarm supplied beyond one step's need is trained on instead of ageing out of the window: the
    last row taken may pass `limit` by less than one submission's groups. Oldest first, since they
    leave the window first. Versions newer than `step` (only after a trainer lost its state) wait;
    older ones are stale.
    """
    stale = tuple(r for r in pending if r.checkpoint_version < step - async_level)
    cap = need if limit is None else max(limit, need)
    take: list[InboxRow] = []
    signal = 0
    for row in pending:
        if signal >= cap:
            break
        if step - async_level <= row.checkpoint_version <= step:
            take.append(row)
            signal += row.signal_groups
    ready = signal >= need
    return BatchPlan(tuple(take) if ready else (), stale, signal, ready)


def submission_of(envelope: bytes) -> RolloutSubmission:
    """The body of a stored (already verified) submission envelope."""
    return decode(RolloutSubmission, decode(Envelope, envelope).body)


def groups_of(envelopes: Sequence[bytes]) -> list[RolloutGroup]:
    return [group for envelope in envelopes for group in submission_of(envelope).groups]

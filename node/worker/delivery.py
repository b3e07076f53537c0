"""Delivering a submission: SUBMIT to one validator after another until one gives a final answer.

Validators are tried round-robin (`Rotation`), starting one further each submission, so load spreads; a
validator that cannot take the submission now (unreachable, busy or not validating, checkpoint not held
yet, authentication trouble) passes it to the next. A rejection is final: the checks are deterministic,
and another validator would reach the same verdict. `deliver` is a plain function over a
`SubmitTransport`, so it runs without a network (`NetTransport` is the swarm's).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio
from libp2p.peer.id import ID

from swarmnode.node.p2p.endpoints import SUBMIT
from swarmnode.node.p2p.peers import PeerRecord
from swarmnode.node.p2p.reqresp import RequestFailed
from swarmnode.node.roles.base import RoleNet
from swarmnode.node.worker.stats import WorkerStats
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.messages import RolloutSubmission, SubmitAck

log = logging.getLogger(__name__)

QUEUED = 100
SUBMIT_ROUNDS = 6  # passes over every known validator before a submission is given up
FIRST_RETRY_DELAY = 1.0
MAX_RETRY_DELAY = 8.0

# Answers that say "not here, not now", not "no": another validator (or this one later) may take it.
TRY_ANOTHER = frozenset(
    {Reason.NOT_FOR_US, Reason.CLOCK_SKEW, Reason.REPLAYED_SEQ, Reason.UNKNOWN_CHECKPOINT, Reason.BUSY}
)


def try_another(status: int) -> bool:
    """Whether an ack of `status` passes the submission on to the next validator."""
    return status // 100 == 5 or status in TRY_ANOTHER


class SubmitTransport(Protocol):
    """How a submission reaches validators: `NetTransport` over the swarm, anything else in tests."""

    def validators(self) -> list[PeerRecord]: ...

    async def wait_for_validators(self) -> list[PeerRecord]: ...

    async def send(self, peer_id: str, submission: RolloutSubmission) -> SubmitAck:
        """One SUBMIT exchange; raises `RequestFailed` when no valid ack comes back."""
        ...


RESEAL_AFTER_S = 120.0  # well inside the envelope's 5-minute clock-skew window


@dataclass
class NetTransport:
    """SUBMIT over the swarm. A submission is sealed once and every retry sends the same envelope: a
    validator that queued it before our request timed out and the one we retry with then name it by one
    digest, so the ledger credits it and the trainer trains on it once."""

    net: RoleNet
    _sealed: tuple[RolloutSubmission, bytes, float] | None = None

    def validators(self) -> list[PeerRecord]:
        return self.net.peers("validator")

    async def wait_for_validators(self) -> list[PeerRecord]:
        return await self.net.wait_for_role("validator")

    async def send(self, peer_id: str, submission: RolloutSubmission) -> SubmitAck:
        now = trio.current_time()
        if (
            self._sealed is None
            or self._sealed[0] is not submission
            or now - self._sealed[2] > RESEAL_AFTER_S
        ):
            self._sealed = (submission, self.net.seal(submission), now)  # stale envelopes meet the skew check
        opened = await self.net.request(ID.from_base58(peer_id), SUBMIT, submission, sealed=self._sealed[1])
        ack: SubmitAck = opened.message
        return ack


@dataclass
class Rotation:
    """Round-robin over the validators known at each submission, one further each time."""

    turn: int = 0

    def order(self, peers: Sequence[PeerRecord]) -> list[PeerRecord]:
        if not peers:
            return []
        start = self.turn % len(peers)
        self.turn += 1
        return list(peers[start:]) + list(peers[:start])


async def deliver(
    transport: SubmitTransport,
    rotation: Rotation,
    submission: RolloutSubmission,
    stats: WorkerStats,
    *,
    fresh: Callable[[], bool] = lambda: True,
    rounds: int = SUBMIT_ROUNDS,
    first_delay: float = FIRST_RETRY_DELAY,
    max_delay: float = MAX_RETRY_DELAY,
) -> SubmitAck | None:
    """Hand `submission` to the first validator that gives a final answer; None if none did in time.

    Each round tries every known validator once (starting at the rotation's turn); between rounds it
    backs off, and it stops early once the submission is no longer `fresh` (it would only be dropped).
    """
    delay = first_delay
    for _ in range(rounds):
        if not fresh():
            break
        peers = transport.validators()
        if not peers:
            with trio.move_on_after(delay):
                peers = await transport.wait_for_validators()
        for peer in rotation.order(peers):
            try:
                ack = await transport.send(peer.peer_id, submission)
            except RequestFailed as exc:
                stats.submit_failures += 1
                log.info("submission not delivered", extra={"peer": peer.peer_id, "error": str(exc)})
                continue
            stats.acks[ack.status] += 1
            if try_another(ack.status):
                continue
            if ack.status == QUEUED:
                stats.delivered += 1
            return ack
        await trio.sleep(delay)
        delay = min(delay * 2, max_delay)
    stats.undelivered += 1
    return None

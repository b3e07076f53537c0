"""What every phase of a DiLoCo trainer's rounds shares: its state, its requests to peers, its refusals.

`DilocoTrainerWork` (node/diloco/rounds.py) plays the rounds; its network phases live beside it, each in
its own module, as bases of that one class: `collect` (collect contributions, gather votes, fetch what the
decision names) and `resync` (join, adopt a newer outer state, skip a round). This base declares the
trainer's state they read (the constructor is `DilocoTrainerWork`'s) and the few methods they all call: one
HTTP request to a peer (`_get`), the clock, counting a peer's refused message, publishing our outer state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import torch

from swarmnode.node.dataplane.errors import PeerFault
from swarmnode.node.diloco.holdings import Holdings
from swarmnode.node.diloco.participant import Participant
from swarmnode.protocol.envelope import ENVELOPE_OVERHEAD
from swarmnode.protocol.errors import ProtocolError
from swarmnode.protocol.messages import DilocoEntry, DilocoOuterState, DilocoRun

PeerSource = Callable[[], Mapping[bytes, str]]
Emit = Callable[..., None]
# θ is None for a trainer group: its ranks hold it
OnOuter = Callable[[int, dict[str, torch.Tensor] | None, tuple[DilocoEntry, ...]], Awaitable[None]]
MAX_MESSAGE_BYTES = DilocoOuterState.MAX_SIZE + ENVELOPE_OVERHEAD


@dataclass(frozen=True)
class TrainerSettings:
    poll_wait_s: int = 5  # how long one long-poll request is held by the peer
    retry_s: float = 0.25  # pause after a failed or empty answer
    join_wait_s: float = 10.0  # at start, how long to wait for every other trainer to answer
    fetch_timeout_s: float = 30.0  # fetching contributions the votes name that we lack; loading a state
    resync_timeout_s: float = 60.0  # waiting for a newer outer state before skipping the failed round
    resync_grace_s: float = 0.5  # after the first newer offer, how long to wait for the others' offers


def hex_address(address: bytes) -> str:
    return "0x" + address.hex()


class Exchange:
    """The trainer's state its phases share, and their requests to peers (see the module docstring)."""

    holdings: Holdings
    plan: DilocoRun
    me: bytes
    participant: Participant
    settings: TrainerSettings
    emit: Emit
    on_outer: OnOuter | None
    round: int
    verdicts: Counter[str]

    def _count(self, verdict: ProtocolError, what: str, peer: bytes) -> None:
        self.verdicts[f"{verdict.verdict}:{verdict.reason.name}"] += 1
        self.emit(
            "refused",
            what=what,
            peer=hex_address(peer),
            verdict=verdict.verdict,
            reason=verdict.reason.name,
            detail=str(verdict),
        )

    async def _publish_outer(self, parent: bytes, contributors: tuple[DilocoEntry, ...]) -> None:
        theta = await self.participant.publish_outer(self.round, parent, contributors)
        if self.on_outer is not None:
            await self.on_outer(self.round, theta, contributors)

    # --- HTTP --------------------------------------------------------------------------------------

    async def _get(self, endpoint: str, target: str, wait_s: int) -> tuple[int, bytes] | None:
        """Status and body, or None when the peer failed (unreachable, broken answer)."""
        try:
            status, _, body = await self.holdings.client.get(
                endpoint, target, MAX_MESSAGE_BYTES, head_timeout=wait_s + 5
            )
        except (PeerFault, ProtocolError):
            return None
        return status, body

    def _now(self) -> int:
        return self.holdings.clock_ms()

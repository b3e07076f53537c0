"""What each gossip topic carries and how fast (spec/gossip.md, Topics), and the router's settings.

py-libp2p caps each (forwarding peer, topic) at 10 msg/s (gossipsub.py:190, checked at gossipsub.py:975):
over it the router silently stops *forwarding* (local delivery already happened), and the cap applies to
our own publications too. We raise it to `forward_cap_per_topic` and enforce the rates that matter
ourselves (`node.p2p.gossip.hub`): per envelope sender and topic in the validator
(`TopicPolicy.sender_rate`), and per topic on our own publications, where `publish` waits for a token
(`publish_rate`) instead of letting the router drop the message.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from swarmnode.protocol.envelope import ENVELOPE_OVERHEAD, Opened
from swarmnode.protocol.ledger_messages import LedgerEntry
from swarmnode.protocol.messages import CheckpointHead, ShardHave, VerdictBatch
from swarmnode.protocol.types import KIB
from swarmnode.protocol.verdicts import check_opened_verdicts

MAX_GOSSIP_ENVELOPE = 960 * KIB  # py-libp2p splits outbound RPCs at 1 MiB and cannot split one message


@dataclass(frozen=True)
class TopicPolicy:
    """What a topic carries and how fast (spec/gossip.md, Topics)."""

    kind: str
    types: tuple[type, ...]
    max_bytes: int  # whole envelope
    sender_rate: float  # accepted messages per second per envelope sender
    sender_burst: int
    publish_rate: float  # our own publications per second on this topic
    queue_size: int  # delivered messages waiting for the role
    # the topic's body rule on a verified envelope (check 11b): raises Reject/Ignore; None: the codec's only
    check: Callable[[Opened], object] | None = None

    @property
    def type_map(self) -> Mapping[str, type]:
        return MappingProxyType({cls.TYPE: cls for cls in self.types})  # type: ignore[attr-defined]


def _cap(cls: type) -> int:
    return min(int(cls.MAX_SIZE) + ENVELOPE_OVERHEAD, MAX_GOSSIP_ENVELOPE)  # type: ignore[attr-defined]


DEFAULT_POLICIES: Mapping[str, TopicPolicy] = MappingProxyType(
    {
        "checkpoints": TopicPolicy("checkpoints", (CheckpointHead,), _cap(CheckpointHead), 2.0, 10, 2.0, 64),
        "shards": TopicPolicy("shards", (ShardHave,), _cap(ShardHave), 100.0, 200, 100.0, 1024),
        # one batch per validator per flush interval, or sooner when full (spec/gossip.md, Verdict batches)
        "verdicts": TopicPolicy(
            "verdicts", (VerdictBatch,), _cap(VerdictBatch), 10.0, 20, 10.0, 64, check_opened_verdicts
        ),
        "ledger": TopicPolicy("ledger", (LedgerEntry,), _cap(LedgerEntry), 50.0, 100, 50.0, 1024),
    }
)


@dataclass(frozen=True)
class GossipSettings:
    degree: int = 6
    degree_low: int = 4
    degree_high: int = 12
    heartbeat_interval: int = 1  # seconds (GossipSub takes an int)
    seen_ttl: int = 600
    forward_cap_per_topic: float = 2000.0
    pending_ttl: float = 30.0
    max_pending: int = 8192  # accepted messages awaiting delivery; beyond it a message is not accepted
    outbound_high_water: int = 16  # publish waits while a topic peer has this many RPCs queued (of 32)
    backpressure_timeout: float = 5.0  # then publishes anyway (the router may drop; counted)
    deliver_own: bool = False
    policies: Mapping[str, TopicPolicy] = field(default_factory=lambda: DEFAULT_POLICIES)

"""The pubsub validator hook, called directly: every verdict, its counter, and who pays for it."""

from __future__ import annotations

import dataclasses
import secrets

import pytest
import trio
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.clock import SeqCounter
from swarmnode.node.p2p.gossip import DEFAULT_POLICIES, Gossip, GossipSettings, content_id
from swarmnode.node.p2p.host import build_host
from swarmnode.node.p2p.peers import PeerActivity
from swarmnode.node.p2p.scoring import PeerGuard
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.envelope import Envelope, seal
from swarmnode.protocol.messages import ShardHave, Verdict
from tests.p2p.adversary import forged_envelopes

RUN = "gossip-test"
NOW = 1_800_000_000_000


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def gossip() -> Gossip:
    me = NodeIdentity(secrets.token_bytes(32))
    host = build_host(me, ["/ip4/127.0.0.1/tcp/0"])
    clock = Clock()
    guard = PeerGuard(host, clock=clock)
    policies = dict(DEFAULT_POLICIES)
    policies["shards"] = dataclasses.replace(policies["shards"], sender_rate=1.0, sender_burst=3)
    return Gossip(
        host,
        me,
        RUN,
        SeqCounter(),
        guard,
        PeerActivity(clock),
        subscribe=("shards",),
        settings=GossipSettings(policies=policies),
        now_ms=lambda: NOW,
        clock=clock,
    )


SENDER = NodeIdentity(secrets.token_bytes(32))
FORWARDER = ID.from_base58(NodeIdentity(secrets.token_bytes(32)).peer_id)


def have(seq: int, *, run: str = RUN, ts: int = NOW, sender: NodeIdentity = SENDER) -> bytes:
    message = ShardHave(run=run, version=1, merkle_root=bytes(32), bitfield=b"\x01", endpoint="http://x")
    return seal(sender, message, run=run, seq=seq, ts=ts)


def rpc(data: bytes) -> rpc_pb2.Message:
    return rpc_pb2.Message(data=data, topicIDs=[f"swarm/{RUN}/shards"])


def score(g: Gossip) -> float:
    return g.guard.scores.score(str(FORWARDER), 0.0)


def test_valid_message_is_accepted_and_waits_for_the_drain(gossip: Gossip) -> None:
    message = rpc(have(1))
    assert gossip._validate("shards", FORWARDER, message)
    assert gossip.stats["shards"].accepted == 1
    assert content_id(message) in gossip._pending
    assert score(gossip) == 0.0


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: have(1, run="other-run"), "WRONG_RUN"),
        (lambda: have(1, ts=NOW - 10 * 60 * 1000), "CLOCK_SKEW"),
    ],
)
def test_ignored_messages_cost_nothing(gossip: Gossip, make, reason: str) -> None:  # type: ignore[no-untyped-def]
    assert not gossip._validate("shards", FORWARDER, rpc(make()))
    assert gossip.stats["shards"].ignored[reason] == 1
    assert score(gossip) == 0.0


def test_replays_are_ignored(gossip: Gossip) -> None:
    data = have(5)
    assert gossip._validate("shards", FORWARDER, rpc(data))
    assert not gossip._validate("shards", FORWARDER, rpc(data))
    assert gossip.stats["shards"].ignored["REPLAYED_SEQ"] == 1 and score(gossip) == 0.0


def test_rejections_charge_the_forwarder(gossip: Gossip) -> None:
    verdict = Verdict(
        run=RUN,
        submission_digest=bytes(32),
        worker=bytes(20),
        step=0,
        checkpoint_version=0,
        accepted=True,
        reason_code=0,
        detail="",
        failing_chunks=(),
        tokens=0,
        mean_exp_mismatches=0.0,
        mean_mant_err=0.0,
    )
    cases = [
        (b"\xc1", "UNDECODABLE"),
        (b"\x00" * 5000, "OVERSIZED"),
        (seal(SENDER, verdict, run=RUN, seq=9, ts=NOW), "UNKNOWN_TYPE"),  # a verdict is not carried on shards
        (have(10) + b"\x00", "TRAILING_BYTES"),
    ]
    for data, reason in cases:
        assert not gossip._validate("shards", FORWARDER, rpc(data))
        assert gossip.stats["shards"].rejected[reason] == 1, reason
    assert score(gossip) == pytest.approx(-40.0)


def test_forgeries_ban_the_forwarder(gossip: Gossip) -> None:
    for _kind, data in forged_envelopes(RUN, SENDER, NodeIdentity(secrets.token_bytes(32)), 2):
        assert not gossip._validate("shards", FORWARDER, rpc(data))
    assert gossip.stats["shards"].rejected["BAD_SIGNATURE"] == 4
    assert gossip.guard.is_banned(FORWARDER)
    assert not gossip._validate("shards", FORWARDER, rpc(have(99)))  # in flight when the ban landed
    assert gossip.stats["shards"].from_banned == 1


def test_sender_rate_limit(gossip: Gossip) -> None:
    results = [gossip._validate("shards", FORWARDER, rpc(have(seq))) for seq in range(1, 6)]
    assert results == [True, True, True, False, False]
    assert gossip.stats["shards"].throttled == 2 and score(gossip) == 0.0
    gossip.clock.t = 1.0  # type: ignore[attr-defined]
    assert gossip._validate("shards", FORWARDER, rpc(have(6)))


def test_our_own_messages_are_not_charged_or_throttled(gossip: Gossip) -> None:
    me = gossip.host.get_id()
    for seq in range(1, 10):
        assert gossip._validate("shards", me, rpc(have(seq, sender=gossip.identity)))
    assert not gossip._validate("shards", me, rpc(b"\xc1"))
    assert gossip.guard.scores.statistics(0.0)["tracked_peers"] == 0


def test_forged_envelope_shapes() -> None:
    forged = forged_envelopes(RUN, SENDER, NodeIdentity(secrets.token_bytes(32)), 1)
    assert [k for k, _ in forged] == ["forged_sender", "tampered_body"]
    assert all(decode(Envelope, d).type == "shard_have" for _, d in forged)
    assert encode(decode(Envelope, forged[0][1])) == forged[0][1]


def test_publish_refuses_wrong_types(gossip: Gossip) -> None:
    verdict = Verdict(
        run=RUN,
        submission_digest=bytes(32),
        worker=bytes(20),
        step=0,
        checkpoint_version=0,
        accepted=True,
        reason_code=0,
        detail="",
        failing_chunks=(),
        tokens=0,
        mean_exp_mismatches=0.0,
        mean_mant_err=0.0,
    )

    async def main() -> None:
        with pytest.raises(TypeError):
            await gossip.publish("shards", verdict)

    trio.run(main)

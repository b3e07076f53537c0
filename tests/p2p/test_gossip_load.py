"""Gossip at load: the frame splitter and the batching outbound queue as pure parts, then real hosts.

The swarm test runs real libp2p hosts (Noise, yamux, our `Gossip`) in one trio process: one CPU core for
all of them, so a burst at 100 msg/s outruns the CPU, which is the point: the queues must absorb it, not
drop it (spec/gossip.md, Delivery and back-pressure).
"""

from __future__ import annotations

import dataclasses
import random
import secrets
import time
from contextlib import AsyncExitStack

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.exceptions import ParseError
from libp2p.io.exceptions import MessageTooLarge
from libp2p.peer.peerinfo import PeerInfo
from libp2p.pubsub.pb import rpc_pb2
from libp2p.utils.varint import encode_varint_prefixed

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.clock import SeqCounter
from swarmnode.node.p2p.gossip import (
    DEFAULT_POLICIES,
    BatchingRpcQueue,
    Gossip,
    GossipSettings,
    publish_size,
    take_frames,
)
from swarmnode.node.p2p.host import build_host, listen_addrs
from swarmnode.node.p2p.peers import PeerActivity
from swarmnode.node.p2p.ports import free_port
from swarmnode.node.p2p.scoring import PeerGuard
from swarmnode.protocol.messages import ShardHave

# --- take_frames ----------------------------------------------------------------------------------


@given(
    frames=st.lists(st.binary(max_size=600), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=8000), max_size=20),
)
def test_frames_come_out_whole_however_the_stream_is_cut(frames: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(encode_varint_prefixed(f) for f in frames)
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    buffer = bytearray()
    out: list[bytes] = []
    for a, b in zip(points, points[1:], strict=False):
        buffer += stream[a:b]
        out += take_frames(buffer, 600)
        assert len(buffer) <= 600 + 2 + (b - a)  # at most one partial frame (and its prefix) waits
    assert out == frames
    assert buffer == bytearray()


@given(size=st.integers(min_value=101, max_value=2**40), before=st.lists(st.binary(max_size=100), max_size=3))
def test_a_prefix_over_the_cap_raises_before_its_body_arrives(size: int, before: list[bytes]) -> None:
    head = b"".join(encode_varint_prefixed(f) for f in before)
    value, prefix = size, bytearray()  # the uvarint alone: the body never arrives
    while True:
        prefix.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            break
    buffer = bytearray(head + bytes(prefix))
    with pytest.raises(MessageTooLarge):
        take_frames(buffer, 100)


def test_an_eleven_byte_prefix_is_a_parse_error_and_a_partial_one_waits() -> None:
    with pytest.raises(ParseError):
        take_frames(bytearray(b"\x80" * 10 + b"\x01"), 1 << 20)
    partial = bytearray(b"\x80" * 9)
    assert take_frames(partial, 1 << 20) == [] and partial == bytearray(b"\x80" * 9)


# --- BatchingRpcQueue -----------------------------------------------------------------------------


def _publish(index: int, size: int) -> rpc_pb2.RPC:
    message = rpc_pb2.Message(data=index.to_bytes(4, "big") + bytes(size), topicIDs=["t"])
    rpc = rpc_pb2.RPC(publish=[message])
    rpc.senderRecord = b"r" * 40
    return rpc


def _control(index: int) -> rpc_pb2.RPC:
    rpc = rpc_pb2.RPC()
    rpc.control.ihave.append(rpc_pb2.ControlIHave(topicID="t", messageIDs=[index.to_bytes(4, "big")]))
    return rpc


@settings(max_examples=60)
@given(
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("publish"), st.integers(min_value=0, max_value=3000)),
            st.tuples(st.just("control"), st.just(0)),
            st.tuples(st.just("pop"), st.just(0)),
        ),
        max_size=120,
    )
)
def test_batching_queue_keeps_order_and_bounds(ops: list[tuple[str, int]]) -> None:
    """Every accepted message comes out once, in order; controls first; no batch over the byte cap
    unless it is one message; a push is refused only when `max_size` RPCs wait and it cannot merge."""

    async def main() -> None:
        queue = BatchingRpcQueue(max_size=4, batch_bytes=2048)
        accepted: list[int] = []
        controls: list[int] = []
        popped: list[int] = []
        popped_controls: list[int] = []
        for n, (op, size) in enumerate(ops):
            if op == "pop":
                if not len(queue):
                    continue
                rpc = await queue.pop()
                assert rpc is not None
                if rpc.HasField("control"):
                    popped_controls += [int.from_bytes(i.messageIDs[0], "big") for i in rpc.control.ihave]
                    continue
                assert not any(c not in popped_controls for c in controls), "a control waited behind data"
                indices = [int.from_bytes(m.data[:4], "big") for m in rpc.publish]
                assert len(indices) == 1 or rpc.ByteSize() <= 2048
                popped += indices
                continue
            before = len(queue)
            rpc = _publish(n, size) if op == "publish" else _control(n)
            ok = queue.push(rpc, priority=op == "control")
            assert len(queue) <= 4
            if ok:
                (accepted if op == "publish" else controls).append(n)
            else:
                assert before == 4
        while len(queue):
            rpc = await queue.pop()
            assert rpc is not None
            if rpc.HasField("control"):
                popped_controls += [int.from_bytes(i.messageIDs[0], "big") for i in rpc.control.ihave]
            else:
                assert not any(c not in popped_controls for c in controls)
                popped += [int.from_bytes(m.data[:4], "big") for m in rpc.publish]
        assert popped == accepted and popped_controls == controls

    trio.run(main)


def test_thirty_two_small_messages_fit_one_rpc_of_the_queue() -> None:
    """The failure mode measured: a burst of small messages to one peer no longer overflows it."""
    queue = BatchingRpcQueue()
    rpcs = [_publish(i, 250) for i in range(1000)]
    assert all(queue.push(rpc) for rpc in rpcs)  # 1000 RPCs to a queue of 32
    per_batch = queue.batch_bytes // publish_size(rpcs[0])
    assert len(queue) == -(-1000 // per_batch)
    assert queue.merged == 1000 - len(queue)


def test_popped_batch_takes_no_more_messages() -> None:
    async def main() -> None:
        queue = BatchingRpcQueue()
        queue.push(_publish(0, 10))
        first = await queue.pop()
        queue.push(_publish(1, 10))
        assert first is not None and len(first.publish) == 1
        second = await queue.pop()
        assert second is not None and [m.data[:4] for m in second.publish] == [(1).to_bytes(4, "big")]

    trio.run(main)


# --- real hosts -----------------------------------------------------------------------------------

RUN = "load"
SETTINGS = GossipSettings(
    policies={
        **DEFAULT_POLICIES,
        "shards": dataclasses.replace(DEFAULT_POLICIES["shards"], sender_rate=1000.0, sender_burst=2000),
    }
)
"""The per-sender rate is charged when a message is validated, so a receiver more than burst / rate
(2 s) behind the sender would throttle it: that is policy (test_gossip_validation.py), and on a slow
machine it would hide what this test is about, the queues."""


async def _burst(n_nodes: int, count: int, rate: float) -> dict[str, object]:
    """`n_nodes` hosts, each dialing 3 others; node 0 publishes `count` ShardHaves at `rate` per second."""
    identities = [NodeIdentity(secrets.token_bytes(32)) for _ in range(n_nodes)]
    received: dict[int, set[int]] = {i: set() for i in range(1, n_nodes)}
    gossips: list[Gossip] = []
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        hosts = []
        for identity in identities:
            addr = f"/ip4/127.0.0.1/tcp/{free_port()}"
            host = build_host(identity, [addr])
            await stack.enter_async_context(host.run(listen_addrs([addr])))
            guard = PeerGuard(host)
            gossip = Gossip(
                host,
                identity,
                RUN,
                SeqCounter(),
                guard,
                PeerActivity(),
                subscribe=("shards",),
                settings=SETTINGS,
            )
            await nursery.start(guard.run)
            await nursery.start(gossip.run)
            hosts.append(host)
            gossips.append(gossip)
        rng = random.Random(7)
        for i, host in enumerate(hosts):
            for j in rng.sample([k for k in range(n_nodes) if k != i], 3):
                await host.connect(PeerInfo(hosts[j].get_id(), hosts[j].get_addrs()))
        with trio.fail_after(20):
            while min(g.mesh_peers("shards") for g in gossips) < 3:  # noqa: ASYNC110 - libp2p state
                await trio.sleep(0.1)

        async def collect(i: int) -> None:
            async for delivery in gossips[i].messages("shards"):
                received[i].add(int(delivery.opened.message.endpoint.rsplit("/", 1)[1]))

        for i in received:
            nursery.start_soon(collect, i)
        started = trio.current_time()
        cpu = time.process_time()
        for index in range(count):
            await trio.sleep_until(started + index / rate)
            message = ShardHave(
                run=RUN, version=0, merkle_root=bytes(32), bitfield=b"", endpoint=f"p/{index}"
            )
            await gossips[0].publish("shards", message)
        with trio.move_on_after(30):
            while sum(map(len, received.values())) < count * (n_nodes - 1):  # noqa: ASYNC110
                await trio.sleep(0.05)
        elapsed = trio.current_time() - started
        result = {
            "lost": count * (n_nodes - 1) - sum(map(len, received.values())),
            "elapsed": elapsed,
            "cpu": time.process_time() - cpu,
            "stats": [g.statistics()["shards"] for g in gossips],
            "merged": sum(q.merged for g in gossips for q in g.pubsub.peer_queues.values()),  # type: ignore[attr-defined]
            "copies": sum(g.pubsub.copies for g in gossips),
            "records_verified": sum(g.pubsub.records_verified for g in gossips),
        }
        nursery.cancel_scope.cancel()
    return result


@pytest.mark.timeout(120)
def test_a_burst_that_outruns_the_cpu_loses_nothing() -> None:
    """8 hosts on one core, 400 messages at 100/s: all delivered to all 7 subscribers, no drop counted."""
    result = trio.run(_burst, 8, 400, 100.0)
    stats = result["stats"]
    assert isinstance(stats, list)
    assert result["lost"] == 0, result
    for key in ("outbound_drops", "upstream_drops", "queue_drops", "pending_full", "throttled", "duplicates"):
        assert sum(s[key] for s in stats) == 0, (key, stats)
    assert sum(s["delivered"] for s in stats) == 400 * 7
    assert sum(s["rejected"].get(k, 0) for s in stats for k in s["rejected"]) == 0
    copies, verified = result["copies"], result["records_verified"]
    assert isinstance(copies, int) and isinstance(verified, int)
    assert copies >= 400 * 7 and verified <= 8 * 7  # a peer record is verified per peer, not per copy

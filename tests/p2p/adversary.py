"""A misbehaving peer, as a real process: `python -m tests.p2p.adversary TARGET_ADDR RUN REPORT.json`.

It speaks Noise/yamux/GossipSub like an honest node but runs no validators. Against the target it
sends, in rounds until the target disconnects it: garbage and truncated request/response frames, a frame
whose length prefix claims 4 GiB, undecodable gossip, oversized gossip, envelopes whose signature does
not match the claimed sender, and envelopes with a tampered body. Then it tries to reconnect. The report
says what it sent, whether and when it was disconnected, and whether reconnecting was refused.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio
from libp2p.abc import INetConn, INetStream, INetwork, INotifee
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.tools.anyio_service import background_trio_service

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.node.p2p.host import TRANSPORT_ERRORS, build_host, listen_addrs, parse_peer_addr
from swarmnode.protocol import ids
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.envelope import Envelope, seal
from swarmnode.protocol.messages import ShardHave


def forged_envelopes(run: str, me: NodeIdentity, victim: NodeIdentity, n: int) -> list[tuple[str, bytes]]:
    """Envelopes that must be rejected with BAD_SIGNATURE: claimed sender mismatch, tampered body."""
    out: list[tuple[str, bytes]] = []
    for i in range(n):
        message = ShardHave(run=run, version=i, merkle_root=bytes(32), bitfield=b"", endpoint=f"forged/{i}")
        envelope = decode(Envelope, seal(me, message, run=run, seq=time.time_ns() // 1000 + i, ts=wall_ms()))
        out.append(("forged_sender", encode(replace(envelope, sender=victim.address))))
        body = bytearray(envelope.body)
        body[-1] ^= 0x01
        out.append(("tampered_body", encode(replace(envelope, body=bytes(body)))))
    return out


class DisconnectCounter(INotifee):
    """Counts the target closing connections on us (py-libp2p's pubsub redials, so state flaps)."""

    def __init__(self, target: ID) -> None:
        self.target = target
        self.count = 0
        self.event = trio.Event()

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        await trio.lowlevel.checkpoint()

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        await trio.lowlevel.checkpoint()

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        await trio.lowlevel.checkpoint()

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        if conn.muxed_conn.peer_id == self.target:
            self.count += 1
            self.event.set()
            self.event = trio.Event()
        await trio.lowlevel.checkpoint()

    async def listen(self, network: INetwork, multiaddr: Any) -> None:
        await trio.lowlevel.checkpoint()

    async def listen_close(self, network: INetwork, multiaddr: Any) -> None:
        await trio.lowlevel.checkpoint()


async def attack(target: str, run: str, *, rounds: int = 20) -> dict[str, Any]:
    me = NodeIdentity(secrets.token_bytes(32))
    victim = NodeIdentity(secrets.token_bytes(32))
    info = parse_peer_addr(target)
    sent: dict[str, int] = {}
    report: dict[str, Any] = {"peer_id": me.peer_id, "sent": sent, "disconnected": False}
    host = build_host(me, ["/ip4/127.0.0.1/tcp/0"])
    disconnects = DisconnectCounter(info.peer_id)
    host.get_network().register_notifee(disconnects)
    async with host.run(listen_addrs(["/ip4/127.0.0.1/tcp/0"])):
        router = GossipSub(
            [TProtocol(PROTOCOL_ID_V11), TProtocol(PROTOCOL_ID)],
            6,
            4,
            12,
            heartbeat_interval=1,
            max_messages_per_topic_per_second=1e6,
            adaptive_gossip_enabled=False,
        )
        pubsub = Pubsub(host, router)
        async with background_trio_service(pubsub), background_trio_service(router):
            await pubsub.wait_until_ready()
            await host.connect(info)
            topic = ids.topic(run, "shards")
            await pubsub.wait_for_subscription(info.peer_id, topic, timeout=20)
            report["connected_at"] = time.time()

            def connected() -> bool:
                return info.peer_id in host.get_connected_peers()

            async def raw_frame(kind: str, data: bytes, *, stall: float = 0.0) -> None:
                sent[kind] = sent.get(kind, 0) + 1
                try:
                    stream = await host.new_stream(info.peer_id, [TProtocol(ids.HELLO)])
                    await stream.write(data)
                    if stall:
                        await trio.sleep(stall)
                    with trio.move_on_after(2):
                        await stream.read(1)
                except (EOFError, *TRANSPORT_ERRORS):
                    pass

            async def gossip(kind: str, data: bytes) -> None:
                sent[kind] = sent.get(kind, 0) + 1
                await pubsub.publish(topic, data)

            for round_no in range(rounds):
                if disconnects.count:
                    break
                await raw_frame("frame_4gib", b"\xff\xff\xff\xff")
                await raw_frame("frame_garbage", (40).to_bytes(4, "big") + os.urandom(40))
                await gossip("gossip_garbage", os.urandom(200))
                await gossip("gossip_oversized", os.urandom(6000))
                for kind, data in forged_envelopes(run, me, victim, 1):
                    await gossip(kind, data)
                await trio.sleep(0.3)
                report["rounds"] = round_no + 1
            with trio.move_on_after(10):
                while not disconnects.count:
                    await disconnects.event.wait()
            report["disconnected"] = disconnects.count > 0
            report["disconnected_at"] = time.time()
            # reconnect: a banned peer must be dropped again at once
            before = disconnects.count
            try:
                with trio.move_on_after(5):
                    await host.connect(info)
            except TRANSPORT_ERRORS:
                pass
            with trio.move_on_after(5):
                while disconnects.count == before and connected():  # noqa: ASYNC110 - libp2p state
                    await trio.sleep(0.1)
            report["reconnect_refused"] = disconnects.count > before or not connected()
            report["target_disconnects"] = disconnects.count
    return report


def main() -> None:
    target, run, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    report = trio.run(attack, target, run)
    out.write_text(json.dumps(report))


if __name__ == "__main__":
    main()

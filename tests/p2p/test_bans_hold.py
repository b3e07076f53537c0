"""Bans hold below every protocol, with real hosts: a banned peer that redials at once keeps no
connection and reaches no handler; we never dial it; it leaves the routing table and stays out.

Also: a peer whose pubsub RPC does not parse costs its stream, never the node (py-libp2p's pubsub
raises out of its stream handler and, unguarded, takes the whole host down).
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path

import pytest
import trio
from libp2p.abc import INetStream
from libp2p.custom_types import TProtocol
from libp2p.kad_dht.common import PROTOCOL_ID as KAD_PROTOCOL
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
from libp2p.utils.varint import encode_varint_prefixed

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.clock import SeqCounter, wall_ms
from swarmnode.node.p2p.endpoints import HELLO, PING
from swarmnode.node.p2p.host import TRANSPORT_ERRORS, build_host, listen_addrs, parse_peer_addr
from swarmnode.node.p2p.peers import PeerDirectory
from swarmnode.node.p2p.reqresp import RequestResponse
from swarmnode.node.p2p.scoring import PeerBanned, PeerGuard
from swarmnode.protocol import ids
from swarmnode.protocol.envelope import open_envelope, seal
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.messages import Hello, Ping
from tests.p2p.helpers import RUN, swarm, wait_until

pytestmark = pytest.mark.timeout(120)
PROBE = TProtocol("/test/probe/1.0.0")


def ban(guard, peer: ID) -> None:  # type: ignore[no-untyped-def]
    while not guard.is_banned(peer):
        guard.report(peer, Reason.BAD_SIGNATURE, "test")


def test_a_banned_peer_that_redials_keeps_no_connection_and_reaches_no_handler(tmp_path: Path) -> None:
    async def main() -> None:
        async with swarm(tmp_path, ["bootstrap", "relay"]) as nodes:
            relay = nodes[1].net
            assert relay is not None
            network = relay.host.get_network()
            attacker = NodeIdentity(secrets.token_bytes(32))
            attacker_id = ID.from_base58(attacker.peer_id)
            host = build_host(attacker, ["/ip4/127.0.0.1/tcp/0"])
            async with host.run(listen_addrs(["/ip4/127.0.0.1/tcp/0"])):
                handled: list[ID] = []

                async def probe_handler(stream: INetStream) -> None:
                    handled.append(stream.muxed_conn.peer_id)
                    await stream.close()

                relay.host.set_stream_handler(PROBE, probe_handler)

                async def kad_handler(stream: INetStream) -> None:
                    await stream.close()

                host.set_stream_handler(KAD_PROTOCOL, kad_handler)  # identify lists KAD: a DHT server
                target = parse_peer_addr(str(relay.host.get_addrs()[0]))
                await host.connect(target)
                await wait_until(lambda: bool(network.get_connections(attacker_id)), timeout=5)
                protocols = relay.host.get_peerstore().get_protocols
                await wait_until(lambda: str(KAD_PROTOCOL) in protocols(attacker_id), timeout=10)
                await host.new_stream(target.peer_id, [PROBE])
                await wait_until(lambda: handled == [attacker_id], timeout=5)  # served before the ban
                # it is a DHT server like any peer: in the routing table before the ban
                assert await relay.discovery.dht.routing_table.add_peer(
                    attacker_id, skip_server_mode_check=True
                )
                assert relay.discovery.dht.routing_table.peer_in_table(attacker_id)

                # a stream from a peer banned while connected is reset before anything reads it
                scores, now = relay.guard.scores, trio.current_time()
                while not scores.is_banned(attacker.peer_id, now):
                    scores.penalize(attacker.peer_id, Reason.BAD_SIGNATURE, now)  # no disconnect yet
                with pytest.raises((*TRANSPORT_ERRORS, EOFError)):  # type: ignore[misc]
                    stream = await host.new_stream(target.peer_id, [PROBE])
                    await stream.read(1)
                assert relay.guard.statistics()["streams_refused"] >= 1 and handled == [attacker_id]
                scores.expire_bans(now + 10**6)  # lift it, then ban it for real

                ban(relay.guard, attacker_id)
                assert not relay.discovery.dht.routing_table.peer_in_table(attacker_id)
                # redial at once and keep trying, opening our protocols' streams each time
                with trio.move_on_after(3):
                    while True:
                        try:
                            await host.connect(target)
                            for protocol in (PROBE, TProtocol(ids.HELLO)):
                                stream = await host.new_stream(target.peer_id, [protocol])
                                await stream.write(b"\x00\x00\x00\x10" + bytes(16))
                                await stream.read(1)
                        except (*TRANSPORT_ERRORS, EOFError, Exception):  # noqa: BLE001 - any refusal
                            pass
                        await trio.sleep(0.05)
                await trio.sleep(0.5)
                assert network.get_connections(attacker_id) == []
                assert attacker_id not in relay.host.get_connected_peers()
                assert relay.guard.statistics()["connections_refused"] >= 1  # it did redial
                # no handler ran: not ours, not reqresp's (which would count even a refusal), no Hello kept
                assert handled == [attacker_id]
                served = {f"{ids.HELLO}:{k}" for k in ("served", "refused_banned", "rejected", "bad_frame")}
                assert not served & set(relay.reqresp.statistics())
                assert relay.directory is not None and attacker.peer_id not in relay.directory.records

                # the relay never dials it, by any path, and the DHT will not take it back
                with pytest.raises(PeerBanned):
                    await relay.host.connect(PeerInfo(attacker_id, host.get_addrs()))
                with pytest.raises(PeerBanned):
                    await relay.reqresp.host.new_stream(attacker_id, [TProtocol(PING.protocol)])
                assert relay.guard.statistics()["dials_refused"] >= 2
                assert not await relay.discovery.dht.routing_table.add_peer(
                    attacker_id, skip_server_mode_check=True
                )
                assert not relay.discovery.dht.routing_table.peer_in_table(attacker_id)
                assert relay.discovery.stats["routing_banned_refused"] >= 1

            # an honest peer is still served
            rtt = await nodes[0].liveness.ping(relay.host.get_id())  # type: ignore[union-attr]
            assert rtt < 5

    trio.run(main)


def test_garbage_pubsub_rpc_costs_the_stream_not_the_node(tmp_path: Path) -> None:
    async def main() -> None:
        async with swarm(tmp_path, ["bootstrap", "relay"]) as nodes:
            relay = nodes[1].net
            assert relay is not None
            attacker = NodeIdentity(secrets.token_bytes(32))
            host = build_host(attacker, ["/ip4/127.0.0.1/tcp/0"])
            async with host.run(listen_addrs(["/ip4/127.0.0.1/tcp/0"])):
                target = parse_peer_addr(str(relay.host.get_addrs()[0]))
                await host.connect(target)
                for _ in range(3):
                    stream = await host.new_stream(target.peer_id, [TProtocol(PROTOCOL_ID_V11)])
                    await stream.write(encode_varint_prefixed(b"\xff" * 64))  # not a protobuf RPC
                    with trio.move_on_after(2):
                        try:
                            await stream.read(1)
                        except Exception:  # noqa: BLE001 - the reset surfaces as any stream error
                            pass
                await wait_until(lambda: relay.guard.statistics()["handler_failures"] >= 3, timeout=10)
            assert relay.guard.scores.score(attacker.peer_id, trio.current_time()) < 0
            # the relay is alive and serving
            pong = await nodes[0].net.reqresp.request(relay.host.get_id(), PING, Ping(bytes(8)))  # type: ignore[union-attr]
            assert pong.message.nonce == bytes(8)
            assert HELLO.protocol == ids.HELLO

    trio.run(main)


def test_hellos_from_free_identities_do_not_grow_the_directory() -> None:
    me = NodeIdentity(secrets.token_bytes(32))
    host = build_host(me, ["/ip4/127.0.0.1/tcp/0"])
    clock = iter(range(10**6)).__next__  # each Hello is seen later than the one before
    guard = PeerGuard(host, clock=clock)
    reqresp = RequestResponse(host, me, RUN, SeqCounter(), guard)
    hello = Hello(run=RUN, role="relay", http_endpoint="http://me", agent="t")
    directory = PeerDirectory(reqresp, hello, max_records=3, clock=clock)
    keep = NodeIdentity(secrets.token_bytes(32))
    identities = [keep] + [NodeIdentity(secrets.token_bytes(32)) for _ in range(10)]
    for i, identity in enumerate(identities):
        data = seal(identity, dataclasses.replace(hello, role="worker"), run=RUN, seq=1, ts=wall_ms())
        opened = open_envelope(data, run=RUN, now_ms=wall_ms(), replay=None, expect=Hello)
        directory._remember(ID.from_base58(identity.peer_id), opened)
        if i == 0:
            directory.stale.clear()  # `keep` stays connected; the others disconnect at once
        else:
            directory.stale.add(identity.peer_id)
        assert len(directory.records) <= 3 and directory.stale <= set(directory.records)
    assert keep.peer_id in directory.records  # the connected peer outlives the churn
    assert directory.evicted == len(identities) - 3

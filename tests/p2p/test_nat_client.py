"""A node that cannot be dialed (behind NAT) runs the DHT as a client: real hosts, one trio.run, loopback.

spec/discovery.md "Reachable addresses": it queries and finds providers, but identify lists no KAD
protocol, so no peer keeps it in its routing table (and later sends it queries it would refuse), and it
provides no key.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from libp2p.kad_dht.common import PROTOCOL_ID as KAD_PROTOCOL
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.assemble import ROLE_CLASSES
from swarmnode.node.p2p.dht import Discovery, DiscoverySettings
from swarmnode.node.p2p.host import build_host, listen_addrs
from swarmnode.node.p2p.ports import free_port
from swarmnode.node.p2p.records import role_key
from swarmnode.node.p2p.scoring import PeerGuard
from swarmnode.node.runtime import NodeRuntime
from tests.p2p.helpers import RUN, node_config, replaced, wait_until

pytestmark = pytest.mark.timeout(120)

SERVERS = ("bootstrap", "trainer", "relay", "validator")


def record_admissions(discovery: Discovery) -> set[ID]:
    """Every peer the routing table ever admitted (a peer may be admitted, then evicted, between polls)."""
    admitted: set[ID] = set()
    table = discovery.dht.routing_table
    add_peer = table.add_peer

    async def recording(peer_obj: PeerInfo | ID, *, skip_server_mode_check: bool = False) -> bool:
        added = await add_peer(peer_obj, skip_server_mode_check=skip_server_mode_check)
        if added:
            admitted.add(peer_obj.peer_id if isinstance(peer_obj, PeerInfo) else peer_obj)
        return added

    table.add_peer = recording  # type: ignore[method-assign]
    return admitted


def test_nat_worker_queries_as_dht_client_and_stays_out_of_routing_tables(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)

    worker_ids: list[ID] = []

    async def main() -> None:
        identities = [NodeIdentity(secrets.token_bytes(32)) for _ in range(len(SERVERS) + 1)]
        ports = [free_port() for _ in identities]
        bootstrap = f"/ip4/127.0.0.1/tcp/{ports[0]}/p2p/{identities[0].peer_id}"
        admitted: list[set[ID]] = []
        async with trio.open_nursery() as nursery:
            servers = []
            for i, role in enumerate(SERVERS):
                config = node_config(
                    tmp_path, f"n{i}-{role}", role, port=ports[i], bootstrap=(bootstrap,) if i else ()
                )
                runtime = NodeRuntime(config, identities[i], ROLE_CLASSES[role]())
                await nursery.start(runtime.run)
                assert runtime.net is not None
                admitted.append(record_admissions(runtime.net.discovery))
                servers.append(runtime)
            home = replaced(
                node_config(tmp_path, "home-worker", "worker", port=ports[-1], bootstrap=(bootstrap,)),
                dialable=False,
            )
            worker = NodeRuntime(home, identities[-1], ROLE_CLASSES["worker"]())
            await nursery.start(worker.run)
            net = worker.net
            assert net is not None and net.discovery.client

            # it finds the providers it needs (relay, validator) by querying as a client
            await wait_until(lambda: all(net.finder.found(r) for r in worker.role.NEEDS), timeout=30)
            assert [r.peer_id for r in net.peers("relay")] == [identities[2].peer_id]
            assert net.discovery.stats["lookups"] > 0 and net.discovery.dht.get_routing_table_size() > 0

            worker_id = ID.from_base58(identities[-1].peer_id)
            worker_ids.append(worker_id)
            server_nets = [s.net for s in servers]
            assert all(n is not None for n in server_nets)
            bootstrap_net = server_nets[0]
            assert bootstrap_net is not None
            # identify told the bootstrap the worker does not serve KAD, and it refused the worker's queries
            await wait_until(
                lambda: bool(bootstrap_net.host.get_peerstore().get_protocols(worker_id)), timeout=20
            )
            assert str(KAD_PROTOCOL) not in bootstrap_net.host.get_peerstore().get_protocols(worker_id)
            # a few refresh rounds later it has never been in anybody's routing table
            await trio.sleep(2.5)
            for server, ever in zip(server_nets, admitted, strict=True):
                assert server is not None
                assert worker_id not in ever, server.role
                assert not server.discovery.dht.routing_table.peer_in_table(worker_id), server.role
            assert bootstrap_net.discovery.stats["routing_client_refused"] > 0  # it did query the bootstrap
            # while the servers do keep each other
            relay_id = ID.from_base58(identities[2].peer_id)
            assert bootstrap_net.discovery.dht.routing_table.peer_in_table(relay_id)

            # it announced nothing, and asked to, it still announces nothing: no worker provider anywhere
            assert net.discovery.provided == {}
            await net.discovery.provide(role_key(RUN, "worker"), "worker")
            assert net.discovery.provided == {} and net.discovery.stats["provides_skipped_client"] == 1
            relay_net = server_nets[2]
            assert relay_net is not None
            assert await relay_net.discovery.find_providers(role_key(RUN, "worker")) == []
            nursery.cancel_scope.cancel()

    trio.run(main)
    # and no server ever tried to query it (py-libp2p logs each failed KAD stream at WARNING or ERROR)
    worker_id = str(worker_ids[0])
    refused = [r.getMessage() for r in caplog.records if worker_id in r.getMessage()]
    assert refused == []


def test_dht_client_with_addresses_is_refused_by_the_gate_and_still_finds_providers() -> None:
    """Only the admission check keeps this client out: it announces an address, so the peerstore has one.

    py-libp2p admits the sender of any inbound query unchecked; ours admits it only once identify lists KAD.
    """

    async def main() -> None:
        server_id, client_id = (NodeIdentity(secrets.token_bytes(32)) for _ in range(2))
        port = free_port()
        server_host = build_host(server_id, [f"/ip4/127.0.0.1/tcp/{port}"])
        client_host = build_host(client_id, ["/ip4/127.0.0.1/tcp/0"])
        settings = DiscoverySettings(early_refresh=(0.2, 0.4), retry_interval=0.5)
        client_settings = replace(settings, bootstrap=(f"/ip4/127.0.0.1/tcp/{port}/p2p/{server_id.peer_id}",))
        async with (
            server_host.run(listen_addrs([f"/ip4/127.0.0.1/tcp/{port}"])),
            client_host.run(listen_addrs(["/ip4/127.0.0.1/tcp/0"])),
            trio.open_nursery() as nursery,
        ):
            server = Discovery(server_host, PeerGuard(server_host), settings)
            client = Discovery(client_host, PeerGuard(client_host), client_settings, client=True)
            admitted = record_admissions(server)
            key = role_key(RUN, "relay")
            await nursery.start(server.run)
            await server.provide(key, "relay")
            await nursery.start(client.run)
            client_peer = client_host.get_id()
            assert client_host.get_peerstore().peer_ids()  # it reached the bootstrap
            await wait_until(lambda: bool(server_host.get_peerstore().get_protocols(client_peer)), timeout=10)
            assert server_host.get_peerstore().addrs(client_peer)  # so py-libp2p's own check would admit it
            found = await client.find_providers(key)  # queries the server again, now identified
            assert [p.peer_id for p in found] == [server_host.get_id()]
            assert client.dht.routing_table.peer_in_table(server_host.get_id())
            assert client_peer not in admitted
            assert not server.dht.routing_table.peer_in_table(client_peer)
            assert server.stats["routing_client_refused"] > 0
            nursery.cancel_scope.cancel()

    trio.run(main)

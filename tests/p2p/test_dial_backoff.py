"""A failed dial blocks a peer for `HostSettings.failed_dial_backoff`, not py-libp2p's 60 s.

Under load a validator's handshake can time out once; the worker that dialled it must reach it again
seconds later, or its submissions to that validator stop for a minute (the hostile devnet's attacker
met the same wall from the other side).
"""

from __future__ import annotations

import secrets

import pytest
import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.host import TRANSPORT_ERRORS, HostSettings, build_host, listen_addrs, parse_peer_addr
from swarmnode.node.p2p.ports import free_port

ANY_PORT = ["/ip4/127.0.0.1/tcp/0"]


def test_a_peer_whose_dial_failed_is_dialled_again_once_the_backoff_passed() -> None:
    async def main() -> None:
        settings = HostSettings(failed_dial_backoff=1.0)
        dialer = build_host(NodeIdentity(secrets.token_bytes(32)), ANY_PORT, settings)
        target_key = NodeIdentity(secrets.token_bytes(32))
        port = free_port()
        target = parse_peer_addr(f"/ip4/127.0.0.1/tcp/{port}/p2p/{target_key.peer_id}")
        async with dialer.run(listen_addrs(ANY_PORT)):
            with pytest.raises(TRANSPORT_ERRORS):  # nothing listens yet
                await dialer.connect(target)
            with pytest.raises(TRANSPORT_ERRORS, match="negative cache"):  # within the backoff: refused
                await dialer.connect(target)
            listen = [f"/ip4/127.0.0.1/tcp/{port}"]
            async with build_host(target_key, listen).run(listen_addrs(listen)):
                # py-libp2p's 60 s would keep refusing well past this deadline
                with trio.fail_after(15):
                    while True:
                        try:
                            await dialer.connect(target)
                            break
                        except TRANSPORT_ERRORS:
                            await trio.sleep(0.2)
                assert dialer.get_network().get_connections(target.peer_id)

    trio.run(main)


def test_the_node_default_backoff_is_seconds_not_a_minute() -> None:
    host = build_host(NodeIdentity(secrets.token_bytes(32)), ANY_PORT)
    assert host.get_network()._negative_peer_cache._ttl == HostSettings().failed_dial_backoff <= 10.0

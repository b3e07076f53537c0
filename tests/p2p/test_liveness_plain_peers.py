"""Liveness for peers that do not speak swarmnode: a plain libp2p host answering only `/ipfs/ping`
stays connected and uncharged; one that answers nothing is dropped and charged (the control)."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
import trio
from libp2p.custom_types import TProtocol
from libp2p.identity.identify.identify import ID as IDENTIFY
from libp2p.identity.identify_push.identify_push import ID_PUSH as IDENTIFY_PUSH
from libp2p.peer.id import ID

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.host import build_host, listen_addrs, parse_peer_addr
from swarmnode.node.p2p.peers import IPFS_PING
from tests.p2p.helpers import swarm, wait_until

pytestmark = pytest.mark.timeout(120)


def plain_host(*, answers_ping: bool):  # type: ignore[no-untyped-def]
    """A libp2p host with no swarmnode protocol: only `/ipfs/ping` (or nothing at all)."""
    identity = NodeIdentity(secrets.token_bytes(32))
    host = build_host(identity, ["/ip4/127.0.0.1/tcp/0"])
    for protocol in (IDENTIFY, IDENTIFY_PUSH) + (() if answers_ping else (IPFS_PING,)):
        host.remove_stream_handler(TProtocol(protocol))
    return identity, host


@pytest.mark.parametrize("answers_ping", [True, False])
def test_plain_libp2p_peers_are_pinged_with_ipfs_ping(tmp_path: Path, answers_ping: bool) -> None:
    async def main() -> None:
        async with swarm(tmp_path, ["bootstrap"]) as nodes:
            node = nodes[0]
            net, liveness = node.net, node.liveness
            assert net is not None and liveness is not None
            identity, host = plain_host(answers_ping=answers_ping)
            peer = ID.from_base58(identity.peer_id)
            async with host.run(listen_addrs(["/ip4/127.0.0.1/tcp/0"])):
                await host.connect(parse_peer_addr(str(net.host.get_addrs()[0])))
                # liveness: every 1 s, peers idle for 2 s, dropped after 2 missed rounds (tests/p2p/helpers)
                if answers_ping:
                    await wait_until(lambda: liveness.ipfs_pings_answered >= 3, timeout=20)
                    assert peer in net.host.get_connected_peers()
                    assert liveness.dropped == 0 and liveness.strikes.get(peer, 0) == 0
                    assert net.guard.scores.score(identity.peer_id, trio.current_time()) == 0.0
                else:
                    await wait_until(lambda: liveness.dropped == 1, timeout=20)
                    await wait_until(lambda: peer not in net.host.get_connected_peers(), timeout=5)
                    assert net.guard.scores.score(identity.peer_id, trio.current_time()) < 0

    trio.run(main)

"""A node whose bootstrap address is wrong says which mistake it is (issue #32): a real libp2p host
listens, and nodes dial it at a wrong port and with a wrong peer id."""

from __future__ import annotations

import logging
import secrets

import pytest
import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.bootstrap import explain
from swarmnode.node.runtime import NodeRuntime
from swarmnode.node.status_view import waiting_line
from tests.p2p.helpers import ROLE_CLASSES, free_port, node_config, wait_until


def _alone(tmp_path, bootstrap: str) -> tuple[str, str]:
    """Start a bootstrap node and a relay given `bootstrap`; the relay's explanation and waiting line."""
    found: dict[str, str] = {}

    async def main() -> None:
        good = NodeIdentity(secrets.token_bytes(32))
        port = free_port()
        address = bootstrap.format(port=port, wrong_port=free_port(), peer=good.peer_id,
                                   other=NodeIdentity(secrets.token_bytes(32)).peer_id)
        async with trio.open_nursery() as nursery:
            boot = NodeRuntime(node_config(tmp_path, "boot", "bootstrap", port=port), good,
                               ROLE_CLASSES["bootstrap"]())
            await nursery.start(boot.run)
            config = node_config(tmp_path, "relay", "relay", port=free_port(), bootstrap=(address,))
            relay = NodeRuntime(config, NodeIdentity(secrets.token_bytes(32)), ROLE_CLASSES["relay"]())
            await nursery.start(relay.run)
            await wait_until(lambda: relay.net.discovery.stats["bootstrap_failures"] >= 3, timeout=30)
            status = relay.status()
            assert status["started"] and not status["ready"]  # ready means connected
            assert boot.status()["ready"]  # the bootstrap itself connects to no one: ready once started
            found["why"] = status["bootstrap_unreachable"][address]
            found["waiting"] = waiting_line(status) or ""
            nursery.cancel_scope.cancel()

    trio.run(main)
    return found["why"], found["waiting"]


def test_a_wrong_port_is_named_as_nothing_listening(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="swarmnode.node.p2p.bootstrap")
    why, waiting = _alone(tmp_path, "/ip4/127.0.0.1/tcp/{wrong_port}/p2p/{peer}")
    assert why.startswith("nothing accepts connections at /ip4/127.0.0.1/tcp/")
    assert "the port or host is wrong" in why and waiting == f"a first peer: {why}"
    said = [r.getMessage() for r in caplog.records if r.name == "swarmnode.node.p2p.bootstrap"]
    assert said == [f"bootstrap unreachable: {why}"]  # said once, not every round


def test_a_wrong_peer_id_is_named_as_another_node(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="swarmnode.node.p2p.bootstrap")
    why, _ = _alone(tmp_path, "/ip4/127.0.0.1/tcp/{port}/p2p/{other}")
    assert why.startswith("something at /ip4/127.0.0.1/tcp/") and "answered but is not peer 16Uiu2" in why
    assert "the peer id in the bootstrap address is wrong" in why


def test_a_silent_address_and_a_cached_failure() -> None:
    address = "/ip4/10.9.9.9/tcp/4001/p2p/16Uiu2HAmX"
    assert explain(address, None, 5.0).startswith("no answer from /ip4/10.9.9.9/tcp/4001 within 5s")
    assert explain(address, RuntimeError("recently failed all addresses (negative cache)"), 5.0) is None

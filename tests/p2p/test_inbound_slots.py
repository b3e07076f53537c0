"""A node accepts new inbound connections however many came and went before (node/p2p/inbound.py).

py-libp2p 0.8.1 held each upgraded connection's inbound slot until the swarm stopped: after 250
connections in its life a node refused every new one, with nothing connected.
"""

from __future__ import annotations

import secrets

import trio
import trio.testing
from libp2p.peer.peerinfo import PeerInfo

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.host import HostSettings, build_host, listen_addrs, parse_peer_addr
from swarmnode.node.p2p.inbound import InboundSlots
from swarmnode.node.p2p.ports import free_port

ANY_PORT = ["/ip4/127.0.0.1/tcp/0"]
DIALERS = 13  # at once: the handshakes' waits overlap (about 10 s for 260 connections on 2 cores)


async def _come_and_go(target: PeerInfo, times: int, refused: list[int]) -> None:
    """One peer connecting and disconnecting `times` times; each refusal noted."""
    settings = HostSettings(failed_dial_backoff=0.01)
    dialer = build_host(NodeIdentity(secrets.token_bytes(32)), ANY_PORT, settings)
    async with dialer.run(listen_addrs(ANY_PORT)):
        for _ in range(times):
            try:
                with trio.fail_after(15):
                    await dialer.connect(target)
            except Exception:  # noqa: BLE001  # the refusal under test, whatever py-libp2p calls it
                refused.append(1)
                continue
            await dialer.disconnect(target.peer_id)


def test_connections_that_came_and_went_leave_room_for_new_ones() -> None:
    async def main() -> None:
        key = NodeIdentity(secrets.token_bytes(32))
        listen = [f"/ip4/127.0.0.1/tcp/{free_port()}"]
        target = parse_peer_addr(f"{listen[0]}/p2p/{key.peer_id}")
        host = build_host(key, listen)  # the default 300 connections: 250 inbound slots
        slots = host.get_network()._inbound_limiter
        assert isinstance(slots, InboundSlots) and slots.total_tokens == 250
        refused: list[int] = []
        async with host.run(listen_addrs(listen)):
            each = (slots.total_tokens + 10) // DIALERS + 1
            async with trio.open_nursery() as nursery:
                for _ in range(DIALERS):
                    nursery.start_soon(_come_and_go, target, each, refused)
            assert refused == []  # py-libp2p's own limiter refused the last 10
            with trio.fail_after(10):  # every connection closed: every slot is free again
                while slots.borrowed_tokens:  # noqa: ASYNC110  # closes are seen by polling only
                    await trio.sleep(0.05)

    trio.run(main)


def test_slots_bound_connections_being_upgraded_and_live() -> None:
    """The bound holds while connections stay: a full set of holders refuses the next one."""

    async def main() -> None:
        slots = InboundSlots(2)
        started: list[trio.lowlevel.Task] = []

        async def holder(done: trio.Event) -> None:
            slots.acquire_nowait()
            started.append(trio.lowlevel.current_task())
            await done.wait()
            slots.release()

        done = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder, done)
            nursery.start_soon(holder, done)
            await trio.testing.wait_all_tasks_blocked()
            assert slots.borrowed_tokens == 2
            try:
                slots.acquire_nowait()
                raise AssertionError("a third holder was let in")
            except trio.WouldBlock:
                pass
            done.set()
        assert slots.borrowed_tokens == 0

    trio.run(main)

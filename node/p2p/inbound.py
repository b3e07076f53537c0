"""Inbound connection slots that a closed connection gives back.

py-libp2p 0.8.1 bounds inbound connections with a capacity limiter of `max_connections - min_connections`
slots (`Swarm._inbound_limiter`), taken when a connection arrives. But the handler of a connection that
upgraded waits for the whole swarm to stop while it holds its slot, so the slot is never given back: a node
that had accepted 250 connections in its life refused every new one at the handshake, with nothing
connected. Connections are free to open, so any peer could wall a validator off from new workers within
seconds (the hostile devnet's poisoner met that wall), and a long run would reach it without an attacker.

`InboundSlots` stands in for that limiter with the same bound on what it meant to bound: a slot is held by
a connection being upgraded or live, and a closed connection's slot is free again.
"""

from __future__ import annotations

from typing import Any

import trio
from libp2p.abc import IHost, IMuxedConn


class InboundSlots:
    """`total_tokens` slots, each held by one inbound connection's handler task from its arrival until it
    fails to upgrade, its connection closes, or the swarm stops (the calls py-libp2p makes: `acquire_nowait`
    and `release` from that task)."""

    def __init__(self, total: int) -> None:
        self.total_tokens = total
        self._holders: dict[trio.lowlevel.Task, IMuxedConn | None] = {}  # None: still upgrading

    def acquire_nowait(self) -> None:
        self._forget_closed()
        if len(self._holders) >= self.total_tokens:
            raise trio.WouldBlock
        self._holders[trio.lowlevel.current_task()] = None

    def release(self) -> None:
        self._holders.pop(trio.lowlevel.current_task(), None)

    def upgraded(self, conn: IMuxedConn) -> None:
        """The calling handler's connection is up: its slot is free once `conn` closes."""
        task = trio.lowlevel.current_task()
        if task in self._holders:
            self._holders[task] = conn

    @property
    def borrowed_tokens(self) -> int:
        self._forget_closed()
        return len(self._holders)

    def _forget_closed(self) -> None:
        closed = [task for task, conn in self._holders.items() if conn is not None and conn.is_closed]
        for task in closed:
            del self._holders[task]


def free_inbound_slots_on_close(host: IHost) -> InboundSlots:
    """Give `host`'s swarm `InboundSlots` in place of py-libp2p's limiter, with the same number of slots;
    fails loudly if a py-libp2p upgrade moved what this replaces (tests/p2p/test_inbound_slots.py)."""
    swarm: Any = host.get_network()
    limiter = getattr(swarm, "_inbound_limiter", None)
    upgrade = getattr(swarm, "upgrade_inbound_raw_conn", None)
    if not isinstance(limiter, trio.CapacityLimiter) or upgrade is None:
        raise RuntimeError("py-libp2p moved Swarm._inbound_limiter (see free_inbound_slots_on_close)")
    slots = InboundSlots(int(limiter.total_tokens))

    async def upgrade_and_note(raw_conn: Any, maddr: Any) -> IMuxedConn:
        conn: IMuxedConn = await upgrade(raw_conn, maddr)
        slots.upgraded(conn)
        return conn

    swarm._inbound_limiter = slots
    swarm.upgrade_inbound_raw_conn = upgrade_and_note
    return slots

"""Peer scores fed by typed rejections: who sent us bad input, how often, and what we do about it.

py-libp2p's gossipsub scorer ships with every weight at zero and every threshold at -inf, and it cannot
tell a `Reject` (peer at fault) from an `Ignore` (nobody at fault). So the score that matters is ours:
every `Reject` a component raises against a peer costs that peer points by its error class, scores decay
back toward zero with a half-life, and a peer at or below the ban threshold is disconnected, blacklisted
in pubsub, dropped from the routing table and refused on reconnect for `ban_seconds`. (No graylist
level: a peer whose messages we stopped reading could never sink to the ban threshold.)

`PeerScores` is pure (time is an argument); `PeerGuard` applies its verdicts to the live host.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import trio
from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.peer.id import ID
from multiaddr import Multiaddr  # type: ignore[import-untyped]

from node.p2p.clock import Clock
from protocol.errors import Reason

log = logging.getLogger(__name__)


class Fault(Enum):
    """Faults below the message layer, which carry no protocol Reason."""

    BAD_FRAME = "bad_frame"  # length prefix over the cap, truncated frame
    STALLED = "stalled"  # opened a request stream and stopped sending mid-message
    UNRESPONSIVE = "unresponsive"  # failed liveness pings (not malice: small, decays)


@dataclass(frozen=True)
class ScoreParams:
    """Penalties per offence and the thresholds acted on (spec/gossip.md, Peer scoring)."""

    malformed_penalty: float = 10.0  # Reason 4xx
    forged_penalty: float = 25.0  # Reason 5xx: bad or mismatched signature
    rule_penalty: float = 10.0  # Reason 6xx
    bad_frame_penalty: float = 20.0
    stalled_penalty: float = 5.0
    unresponsive_penalty: float = 2.0
    half_life_s: float = 600.0
    ban_threshold: float = -100.0
    ban_seconds: float = 900.0

    def penalty(self, offence: Reason | Fault) -> float:
        if isinstance(offence, Fault):
            return {
                Fault.BAD_FRAME: self.bad_frame_penalty,
                Fault.STALLED: self.stalled_penalty,
                Fault.UNRESPONSIVE: self.unresponsive_penalty,
            }[offence]
        return {
            "ignore": 0.0,
            "malformed": self.malformed_penalty,
            "authentication": self.forged_penalty,
            "rule": self.rule_penalty,
        }[offence.error_class]


class Action(Enum):
    NONE = "none"
    BAN = "ban"


@dataclass
class _Entry:
    score: float = 0.0
    updated: float = 0.0
    offences: int = 0
    banned_until: float = 0.0


@dataclass
class PeerScores:
    """Decaying per-peer scores keyed by peer id text; time is always passed in."""

    params: ScoreParams = field(default_factory=ScoreParams)
    max_peers: int = 8192
    _peers: dict[str, _Entry] = field(default_factory=dict)
    bans_total: int = 0

    def _decayed(self, entry: _Entry, now: float) -> float:
        if now <= entry.updated or entry.score == 0.0:
            return entry.score
        return entry.score * math.pow(0.5, (now - entry.updated) / self.params.half_life_s)

    def _entry(self, peer: str, now: float) -> _Entry:
        entry = self._peers.get(peer)
        if entry is None:
            if len(self._peers) >= self.max_peers:
                self._forget_one(now)
            entry = self._peers[peer] = _Entry(updated=now)
        entry.score = self._decayed(entry, now)
        entry.updated = now
        return entry

    def _forget_one(self, now: float) -> None:
        """Drop the entry closest to neutral that is not banned (bounded memory under churn)."""
        candidates = [
            (abs(self._decayed(e, now)), p) for p, e in self._peers.items() if e.banned_until <= now
        ]
        if candidates:
            del self._peers[min(candidates)[1]]

    def score(self, peer: str, now: float) -> float:
        entry = self._peers.get(peer)
        return 0.0 if entry is None else self._decayed(entry, now)

    def penalize(self, peer: str, offence: Reason | Fault, now: float) -> Action:
        """Charge `peer` for an offence; returns the new action it crossed into, if any."""
        amount = self.params.penalty(offence)
        if amount == 0.0:
            return Action.NONE
        entry = self._entry(peer, now)
        entry.score -= amount
        entry.offences += 1
        if entry.score <= self.params.ban_threshold and entry.banned_until <= now:
            entry.banned_until = now + self.params.ban_seconds
            self.bans_total += 1
            return Action.BAN
        return Action.NONE

    def is_banned(self, peer: str, now: float) -> bool:
        entry = self._peers.get(peer)
        return entry is not None and entry.banned_until > now

    def expire_bans(self, now: float) -> list[str]:
        """Peers whose ban ran out since the last call; they restart at half the ban threshold."""
        lifted = []
        for peer, entry in self._peers.items():
            if entry.banned_until and entry.banned_until <= now:
                entry.banned_until = 0.0
                entry.score = self.params.ban_threshold / 2
                entry.updated = now
                lifted.append(peer)
        return lifted

    def statistics(self, now: float) -> dict[str, float]:
        scores = [self._decayed(e, now) for e in self._peers.values()]
        return {
            "tracked_peers": len(self._peers),
            "banned_peers": sum(e.banned_until > now for e in self._peers.values()),
            "bans_total": self.bans_total,
            "lowest_score": min(scores, default=0.0),
        }

    def snapshot(self, now: float) -> dict[str, float]:
        return {peer: round(self._decayed(e, now), 2) for peer, e in self._peers.items() if e.offences}


BanHook = Callable[[ID], None]


class _BanNotifee(INotifee):
    """Closes connections from banned peers as soon as they are established (the swarm has no peer gate)."""

    def __init__(self, guard: PeerGuard) -> None:
        self.guard = guard

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        await trio.lowlevel.checkpoint()

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        await trio.lowlevel.checkpoint()

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        peer = conn.muxed_conn.peer_id
        if self.guard.is_banned(peer):
            self.guard.request_disconnect(peer)
        await trio.lowlevel.checkpoint()

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        await trio.lowlevel.checkpoint()

    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None:
        await trio.lowlevel.checkpoint()

    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None:
        await trio.lowlevel.checkpoint()


class PeerGuard:
    """Applies `PeerScores` verdicts to the live node: disconnect, refuse reconnects, unban.

    Components report offences with `report(peer, offence)` (synchronous, callable from validators);
    other components register what a ban means to them with `on_ban` / `on_unban` (the gossip layer
    blacklists the peer in pubsub, the DHT drops it from the routing table).
    """

    def __init__(
        self, host: IHost, params: ScoreParams | None = None, *, clock: Clock = trio.current_time
    ) -> None:
        self.host = host
        self.scores = PeerScores(params or ScoreParams())
        self.clock = clock
        self._ban_hooks: list[BanHook] = []
        self._unban_hooks: list[BanHook] = []
        self._send, self._receive = trio.open_memory_channel[ID](1024)
        self.disconnects = 0
        self.reports = 0
        host.get_network().register_notifee(_BanNotifee(self))

    def on_ban(self, hook: BanHook) -> None:
        self._ban_hooks.append(hook)

    def on_unban(self, hook: BanHook) -> None:
        self._unban_hooks.append(hook)

    def is_banned(self, peer: ID) -> bool:
        return self.scores.is_banned(str(peer), self.clock())

    def report(self, peer: ID, offence: Reason | Fault, detail: str = "") -> Action:
        """Charge a peer for an offence; bans take effect immediately and disconnect asynchronously."""
        if peer == self.host.get_id():
            return Action.NONE  # our own publications pass through our validators too
        self.reports += 1
        action = self.scores.penalize(str(peer), offence, self.clock())
        name = offence.name if isinstance(offence, Reason) else offence.value
        if action is not Action.NONE:
            log.warning(
                "peer %s",
                action.value,
                extra={
                    "peer": str(peer),
                    "offence": name,
                    "detail": detail,
                    "score": self.scores.score(str(peer), self.clock()),
                },
            )
        if action is Action.BAN:
            for hook in self._ban_hooks:
                hook(peer)
            self.request_disconnect(peer)
        return action

    def request_disconnect(self, peer: ID) -> None:
        try:
            self._send.send_nowait(peer)
        except trio.WouldBlock:
            log.error("disconnect queue full; peer %s stays connected until its next offence", peer)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Disconnect banned peers and lift expired bans; runs for the life of the node."""
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._expire_loop)
            async for peer in self._receive:
                await self._disconnect(peer)

    async def _disconnect(self, peer: ID) -> None:
        with trio.move_on_after(5):
            await self.host.disconnect(peer)
            self.disconnects += 1
            log.info("disconnected banned peer", extra={"peer": str(peer)})

    async def _expire_loop(self) -> None:
        while True:
            await trio.sleep(5)
            for text in self.scores.expire_bans(self.clock()):
                peer = ID.from_base58(text)
                for hook in self._unban_hooks:
                    hook(peer)
                log.info("ban lifted", extra={"peer": text})

    def statistics(self) -> dict[str, float]:
        return {
            **self.scores.statistics(self.clock()),
            "disconnects": self.disconnects,
            "reports": self.reports,
        }

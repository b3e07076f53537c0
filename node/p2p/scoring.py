"""Peer scores fed by typed rejections: who sent us bad input, how often, and what we do about it.

py-libp2p's gossipsub scorer ships with every weight at zero and every threshold at -inf, and it cannot
tell a `Reject` (peer at fault) from an `Ignore` (nobody at fault). So the score that matters is ours:
every `Reject` a component raises against a peer costs that peer points by its error class, scores decay
back toward zero with a half-life, and a peer at or below the ban threshold is disconnected, blacklisted
in pubsub, dropped from the routing table and refused on reconnect for `ban_seconds` (doubling for each
repeat ban, capped). (No graylist level: a peer whose messages we stopped reading could never sink to
the ban threshold.)

py-libp2p has no peer gate, and `host.disconnect` loses track of a connection redialed during the close.
So the guard gates the swarm itself: the one inbound stream handler (a banned peer's stream is reset
before negotiation, and a handler that raises costs its stream, never the host), `dial_peer` (we never
dial a banned peer), and a notifee that closes a banned peer's connection as soon as it is registered.

`PeerScores` is pure (time is an argument); `PeerGuard` applies its verdicts to the live host.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum

import trio
from google.protobuf.message import DecodeError
from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.network.exceptions import SwarmException
from libp2p.peer.id import ID
from multiaddr import Multiaddr  # type: ignore[import-untyped]

from swarmnode.node.p2p.clock import Clock
from swarmnode.node.p2p.host import TRANSPORT_ERRORS
from swarmnode.protocol.errors import Reason

log = logging.getLogger(__name__)


class Fault(Enum):
    """Faults below the message layer, which carry no protocol Reason."""

    BAD_FRAME = "bad_frame"  # length prefix over the cap, truncated frame
    STALLED = "stalled"  # opened a request stream and stopped sending mid-message
    UNRESPONSIVE = "unresponsive"  # failed liveness pings (not malice: small, decays)
    UNDECODABLE_RPC = "undecodable_rpc"  # a libp2p protocol's own framing failed (py-libp2p peers can
    # produce this by accident: unpatched pubsub interleaves large writes; so it is small)


@dataclass(frozen=True)
class ScoreParams:
    """Penalties per offence and the thresholds acted on (spec/gossip.md, Peer scoring)."""

    malformed_penalty: float = 10.0  # Reason 4xx
    forged_penalty: float = 25.0  # Reason 5xx: bad or mismatched signature
    unauthorised_penalty: float = 10.0  # Reason 502: authentic, but the signer has no authority there
    rule_penalty: float = 10.0  # Reason 6xx and 7xx (a ledger operation the state machine refuses)
    bad_frame_penalty: float = 20.0
    stalled_penalty: float = 5.0
    unresponsive_penalty: float = 2.0
    undecodable_rpc_penalty: float = 5.0
    half_life_s: float = 600.0
    ban_threshold: float = -100.0
    ban_seconds: float = 900.0  # the first ban; each further ban of the same peer lasts twice as long
    max_ban_seconds: float = 86_400.0

    def ban_duration(self, bans: int) -> float:
        """Length of a peer's `bans`-th ban (1-based): doubling from `ban_seconds`, capped."""
        return min(self.max_ban_seconds, self.ban_seconds * 2.0 ** min(bans - 1, 32))

    def penalty(self, offence: Reason | Fault) -> float:
        if isinstance(offence, Fault):
            return {
                Fault.BAD_FRAME: self.bad_frame_penalty,
                Fault.STALLED: self.stalled_penalty,
                Fault.UNRESPONSIVE: self.unresponsive_penalty,
                Fault.UNDECODABLE_RPC: self.undecodable_rpc_penalty,
            }[offence]
        if offence is Reason.UNAUTHORISED:
            return self.unauthorised_penalty
        return {
            "ignore": 0.0,
            "malformed": self.malformed_penalty,
            "authentication": self.forged_penalty,
            "rule": self.rule_penalty,
            "ledger": self.rule_penalty,
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
    bans: int = 0


MAX_SCORED_PEERS = 8192
"""Peers with a score kept at once. Identities are free, so the table is bounded: when full, the entry
closest to neutral that is not banned is dropped; when every entry is banned, the ban that ends first
(the peer is then unbanned early: one more free identity costs an attacker nothing anyway)."""


@dataclass
class PeerScores:
    """Decaying per-peer scores keyed by peer id text; time is always passed in."""

    params: ScoreParams = field(default_factory=ScoreParams)
    max_peers: int = MAX_SCORED_PEERS
    _peers: dict[str, _Entry] = field(default_factory=dict)
    _evicted_bans: list[str] = field(default_factory=list)
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
        """Drop one entry to stay within `max_peers` (MAX_SCORED_PEERS says which)."""
        candidates = [
            (abs(self._decayed(e, now)), p) for p, e in self._peers.items() if e.banned_until <= now
        ]
        if candidates:
            del self._peers[min(candidates)[1]]
            return
        peer = min(self._peers, key=lambda p: self._peers[p].banned_until)
        del self._peers[peer]
        self._evicted_bans.append(peer)  # its unban hooks run at the next expire_bans

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
            entry.bans += 1
            entry.banned_until = now + self.params.ban_duration(entry.bans)
            self.bans_total += 1
            return Action.BAN
        return Action.NONE

    def banned_until(self, peer: str) -> float:
        entry = self._peers.get(peer)
        return 0.0 if entry is None else entry.banned_until

    def is_banned(self, peer: str, now: float) -> bool:
        entry = self._peers.get(peer)
        return entry is not None and entry.banned_until > now

    def expire_bans(self, now: float) -> list[str]:
        """Peers whose ban ran out (or was evicted) since the last call; they restart at half the ban."""
        lifted, self._evicted_bans = self._evicted_bans, []
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
StreamHandler = Callable[[INetStream], Awaitable[None]]
Dial = Callable[[ID], Awaitable[list[INetConn]]]

CLOSE_TIMEOUT = 5.0  # seconds to close one banned peer's connection (a yamux GO_AWAY to a slow socket)


class PeerBanned(SwarmException):
    """We refused to dial a banned peer (a transport error to every caller: DHT, discovery, pubsub)."""


class _BanNotifee(INotifee):
    """Closes a banned peer's connection the moment it is registered (the swarm has no peer gate)."""

    def __init__(self, guard: PeerGuard) -> None:
        self.guard = guard

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        await trio.lowlevel.checkpoint()

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        await trio.lowlevel.checkpoint()

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        if self.guard.is_banned(conn.muxed_conn.peer_id):
            self.guard.connections_refused += 1
            await _close(conn)
        await trio.lowlevel.checkpoint()

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        await trio.lowlevel.checkpoint()

    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None:
        await trio.lowlevel.checkpoint()

    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None:
        await trio.lowlevel.checkpoint()


async def _close(conn: INetConn) -> None:
    """Close one connection object (never `close_peer`, which also forgets a redial racing the close)."""
    with trio.move_on_after(CLOSE_TIMEOUT):
        try:
            await conn.close()
        except TRANSPORT_ERRORS:
            pass


async def _reset(stream: INetStream) -> None:
    try:
        await stream.reset()
    except TRANSPORT_ERRORS:
        pass


async def close_connections(network: INetwork, peer: ID) -> int:
    """Close each connection to `peer` we hold now; returns how many.

    py-libp2p's `host.disconnect` (`Swarm.close_peer`) closes a snapshot of the peer's connections and
    then drops the peer's whole entry, so a connection the peer redialed meanwhile stays open, served
    and untracked. Closing connection objects one by one lets each remove only itself.
    """
    connections = list(network.get_connections(peer))
    for conn in connections:
        await _close(conn)
    return len(connections)


class PeerGuard:
    """Applies `PeerScores` verdicts to the live node: refuse, disconnect, unban.

    A ban holds below every protocol (spec/gossip.md, Bans): the guard wraps the swarm's one inbound
    stream handler, so a banned peer's stream is reset before multistream negotiation reads a byte and
    no protocol handler runs; it closes a banned peer's connection as soon as the swarm registers it;
    and it refuses to dial a banned peer, whoever asks (DHT, discovery, bootstrap, pubsub).

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
        self.connections_refused = 0
        self.streams_refused = 0
        self.dials_refused = 0
        self.handler_failures = 0
        self._install(host.get_network())

    def _install(self, network: INetwork) -> None:
        """Gate the swarm's inbound streams and outbound dials on the ban list (py-libp2p has no hook)."""
        inner: StreamHandler = network.common_stream_handler  # type: ignore[attr-defined]

        async def gated_stream(stream: INetStream) -> None:
            peer = stream.muxed_conn.peer_id
            if self.is_banned(peer):
                self.streams_refused += 1
                await _reset(stream)
                return
            try:
                await inner(stream)
            except DecodeError as exc:  # py-libp2p's pubsub parses a peer's RPC unguarded (pubsub.py:562)
                self.handler_failures += 1
                self.report(peer, Fault.UNDECODABLE_RPC, f"undecodable protobuf: {exc}")
                await _reset(stream)
            except Exception:  # a handler's bug costs its stream, never the connection or the node
                self.handler_failures += 1
                log.exception("stream handler failed", extra={"peer": str(peer)})
                await _reset(stream)

        network.set_stream_handler(gated_stream)
        dial: Dial = network.dial_peer

        async def gated_dial(peer: ID) -> list[INetConn]:
            if self.is_banned(peer):
                self.dials_refused += 1
                raise PeerBanned(f"peer {peer} is banned")
            return await dial(peer)

        network.dial_peer = gated_dial  # type: ignore[method-assign, assignment]
        network.register_notifee(_BanNotifee(self))

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
                    "until": self.scores.banned_until(str(peer)),
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
            # Its connections were live when banned; its streams are refused all the same, and the
            # connections close at the next reconnect or liveness round.
            log.error("disconnect queue full; banned peer %s keeps an unserved connection", peer)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Disconnect banned peers and lift expired bans; runs for the life of the node."""
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._expire_loop)
            async for peer in self._receive:
                nursery.start_soon(self._disconnect, peer)

    async def _disconnect(self, peer: ID) -> None:
        if await close_connections(self.host.get_network(), peer):
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
            "connections_refused": self.connections_refused,
            "streams_refused": self.streams_refused,
            "dials_refused": self.dials_refused,
            "handler_failures": self.handler_failures,
        }

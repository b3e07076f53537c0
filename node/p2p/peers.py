"""Who is who: the Hello exchange, the directory of verified peers, and idle-peer liveness pings.

A peer found through the DHT is only a claim (anyone can announce any role). A role talks to it after
a Hello exchange: both sides send their signed `Hello` (run, role, data-plane endpoint), so each learns
the other's address, role and HTTP endpoint from a signature, not from the DHT.

py-libp2p keeps idle connections forever and never notices a peer that vanished without closing its
socket. `Liveness` pings every connected peer that has been quiet for `idle_after` seconds and drops
one that misses `max_strikes` pings in a row. Not every peer is a swarmnode node (a crawler, a monitor,
any plain libp2p host): a peer is alive if it answers our signed ping or, failing that (or when its
identify record shows it does not speak ours), the standard `/ipfs/ping/1.0.0` that every libp2p host
serves. Only a peer that answers neither is charged.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import trio
from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.custom_types import TProtocol
from libp2p.host.ping import ID as IPFS_PING_ID
from libp2p.host.ping import perform_ping_roundtrip
from libp2p.peer.id import ID
from libp2p.peer.peerstore import PeerStoreError
from multiaddr import Multiaddr  # type: ignore[import-untyped]

from swarmnode.crypto.identity import address_of_peer_id
from swarmnode.node.p2p.clock import Clock
from swarmnode.node.p2p.endpoints import HELLO, PING
from swarmnode.node.p2p.host import TRANSPORT_ERRORS
from swarmnode.node.p2p.reqresp import (
    BadResponse,
    PeerUnreachable,
    RequestFailed,
    RequestResponse,
)
from swarmnode.node.p2p.scoring import Fault, PeerGuard, close_connections
from swarmnode.protocol import ids
from swarmnode.protocol.envelope import Opened
from swarmnode.protocol.errors import ProtocolError, Reason, Reject
from swarmnode.protocol.messages import Hello, Ping, Pong

log = logging.getLogger(__name__)

AGENT = "swarmnode/0.1"
IPFS_PING = TProtocol(IPFS_PING_ID)  # /ipfs/ping/1.0.0, served by every py-libp2p (and go/js/rust) host
IPFS_PING_TIMEOUT = 5.0
# ValueError: the pong differs from the ping
PING_ERRORS: tuple[type[BaseException], ...] = (*TRANSPORT_ERRORS, ValueError, EOFError)
MAX_DIRECTORY_RECORDS = 4096  # Hellos remembered; a Hello is free, so the oldest disconnected go first


@dataclass(frozen=True)
class PeerRecord:
    """A peer as it introduced itself in a signed Hello."""

    peer_id: str
    address: bytes
    role: str
    http_endpoint: str
    agent: str
    seen: float


class _DisconnectNotifee(INotifee):
    """Marks a peer's Hello stale when a connection to it closes: a restarted peer may have a new endpoint."""

    def __init__(self, directory: PeerDirectory) -> None:
        self.directory = directory

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        await trio.lowlevel.checkpoint()

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        await trio.lowlevel.checkpoint()

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        await trio.lowlevel.checkpoint()

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        peer = str(conn.muxed_conn.peer_id)
        if peer in self.directory.records:  # `stale` only marks known records: bounded with them
            self.directory.stale.add(peer)
        await trio.lowlevel.checkpoint()

    async def listen(self, network: INetwork, multiaddr: Multiaddr) -> None:
        await trio.lowlevel.checkpoint()

    async def listen_close(self, network: INetwork, multiaddr: Multiaddr) -> None:
        await trio.lowlevel.checkpoint()


class PeerDirectory:
    """Serves Hello and remembers the Hellos of peers we exchanged one with.

    A record goes stale when a connection to its peer closes; `is_current` is then False until the next
    Hello exchange, so a peer that restarted (same identity, maybe a new endpoint) is verified again.
    """

    def __init__(
        self,
        reqresp: RequestResponse,
        hello: Hello,
        *,
        clock: Clock = trio.current_time,
        max_records: int = MAX_DIRECTORY_RECORDS,
    ) -> None:
        self.reqresp = reqresp
        self.hello = hello
        self.clock = clock
        self.max_records = max_records
        self.evicted = 0
        self.records: dict[str, PeerRecord] = {}
        self.stale: set[str] = set()
        reqresp.serve(HELLO, self._on_hello)
        reqresp.host.get_network().register_notifee(_DisconnectNotifee(self))

    def is_current(self, peer: ID) -> bool:
        return str(peer) in self.records and str(peer) not in self.stale

    def _remember(self, peer: ID, opened: Opened) -> PeerRecord:
        message: Hello = opened.message
        if message.run != self.hello.run:
            raise Reject(Reason.WRONG_RUN, f"hello for run {message.run!r}")
        if address_of_peer_id(peer.to_bytes()) != opened.sender:
            # a relayed Hello: someone else's signed introduction presented over our own connection
            raise Reject(Reason.WRONG_SENDER, f"hello signed by {opened.sender.hex()}, not by peer {peer}")
        record = PeerRecord(
            str(peer), opened.sender, message.role, message.http_endpoint, message.agent, self.clock()
        )
        if str(peer) not in self.records and len(self.records) >= self.max_records:
            self._evict_one()
        self.records[str(peer)] = record
        self.stale.discard(str(peer))
        return record

    def _evict_one(self) -> None:
        """Forget the oldest record of a disconnected peer (else the oldest): the table stays bounded."""
        stale = [r for r in self.records.values() if r.peer_id in self.stale]
        victim = min(stale or self.records.values(), key=lambda r: r.seen)
        self.forget(ID.from_base58(victim.peer_id))
        self.evicted += 1

    async def _on_hello(self, peer: ID, opened: Opened) -> Hello:
        self._remember(peer, opened)
        return self.hello

    async def exchange(self, peer: ID) -> PeerRecord:
        """Hello both ways; raises RequestFailed if the peer does not answer with a valid Hello."""
        opened = await self.reqresp.request(peer, HELLO, self.hello)
        try:
            return self._remember(peer, opened)
        except ProtocolError as exc:
            raise BadResponse(peer, HELLO.protocol, exc) from None

    def with_role(self, role: str) -> list[PeerRecord]:
        return sorted((r for r in self.records.values() if r.role == role), key=lambda r: r.peer_id)

    def forget(self, peer: ID) -> None:
        self.records.pop(str(peer), None)
        self.stale.discard(str(peer))


class PeerActivity:
    """Last time each peer showed it was alive (a valid message, request or response)."""

    def __init__(self, clock: Clock = trio.current_time) -> None:
        self.clock = clock
        self.last_seen: dict[ID, float] = {}

    def touch(self, peer: ID) -> None:
        self.last_seen[peer] = self.clock()

    def idle_for(self, peer: ID) -> float:
        seen = self.last_seen.get(peer)
        return float("inf") if seen is None else self.clock() - seen

    def forget_missing(self, connected: set[ID]) -> None:
        for peer in [p for p in self.last_seen if p not in connected]:
            del self.last_seen[peer]


async def serve_ping(peer: ID, opened: Opened) -> Pong:
    return Pong(opened.message.nonce)


class Liveness:
    """Pings idle peers and disconnects the ones that stop answering."""

    def __init__(
        self,
        host: IHost,
        reqresp: RequestResponse,
        activity: PeerActivity,
        guard: PeerGuard,
        *,
        interval: float = 10.0,
        idle_after: float = 20.0,
        max_strikes: int = 3,
        on_drop: Callable[[ID], None] | None = None,
    ) -> None:
        self.host = host
        self.reqresp = reqresp
        self.activity = activity
        self.guard = guard
        self.interval = interval
        self.idle_after = idle_after
        self.max_strikes = max_strikes
        self.on_drop = on_drop or (lambda peer: None)
        self.strikes: dict[ID, int] = {}  # connected peers only: pruned every round
        self.pings_sent = 0
        self.pings_failed = 0
        self.ipfs_pings_sent = 0
        self.ipfs_pings_answered = 0
        self.dropped = 0
        reqresp.serve(PING, serve_ping)

    async def ping(self, peer: ID) -> float:
        """Round-trip seconds of one signed ping; raises RequestFailed."""
        nonce = secrets.token_bytes(8)
        start = trio.current_time()
        opened = await self.reqresp.request(peer, PING, Ping(nonce))
        if opened.message.nonce != nonce:
            self.guard.report(peer, Reason.RULE_VIOLATION, "pong echoes the wrong nonce")
            raise RequestFailed(peer, PING.protocol, "pong echoes the wrong nonce")
        return trio.current_time() - start

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            connected = set(self.host.get_connected_peers())
            self.activity.forget_missing(connected)
            for peer in [p for p in self.strikes if p not in connected]:
                del self.strikes[peer]
            idle = [p for p in connected if self.activity.idle_for(p) >= self.idle_after]
            async with trio.open_nursery() as nursery:
                for peer in idle:
                    nursery.start_soon(self._check, peer)

    async def ipfs_ping(self, peer: ID) -> float:
        """Round-trip seconds of one `/ipfs/ping/1.0.0` exchange; raises PeerUnreachable."""
        self.ipfs_pings_sent += 1
        start = trio.current_time()
        try:
            with trio.fail_after(IPFS_PING_TIMEOUT):
                stream = await self.host.new_stream(peer, [IPFS_PING])
                try:
                    await perform_ping_roundtrip(stream)
                finally:
                    with trio.move_on_after(1):
                        await stream.close()
        except trio.TooSlowError:
            raise PeerUnreachable(peer, IPFS_PING, f"no pong within {IPFS_PING_TIMEOUT}s") from None
        except PING_ERRORS as exc:
            raise PeerUnreachable(peer, IPFS_PING, f"{type(exc).__name__}: {exc}") from None
        self.ipfs_pings_answered += 1
        return trio.current_time() - start

    def _speaks_swarmnode(self, peer: ID) -> bool:
        """False only when identify told us the peer's protocols and ours is not among them."""
        try:
            protocols = self.host.get_peerstore().get_protocols(peer)
        except PeerStoreError:  # identify has not run (yet): try ours first
            return True
        return not protocols or ids.PING in protocols

    async def alive(self, peer: ID) -> None:
        """Our signed ping, then `/ipfs/ping` (plain libp2p peers); RequestFailed if neither answers."""
        if self._speaks_swarmnode(peer):
            self.pings_sent += 1
            try:
                await self.ping(peer)
                return
            except RequestFailed:
                pass  # a plain libp2p peer, or one whose swarmnode stack is stuck: try the base protocol
        await self.ipfs_ping(peer)

    async def _check(self, peer: ID) -> None:
        try:
            await self.alive(peer)
        except RequestFailed as exc:
            self.pings_failed += 1
            strikes = self.strikes[peer] = self.strikes.get(peer, 0) + 1
            if strikes < self.max_strikes:
                return
            log.info("dropping unresponsive peer", extra={"peer": str(peer), "detail": exc.detail})
            self.strikes.pop(peer, None)
            self.dropped += 1
            self.guard.report(peer, Fault.UNRESPONSIVE, exc.detail)
            self.on_drop(peer)
            await close_connections(self.host.get_network(), peer)
            return
        self.strikes.pop(peer, None)
        self.activity.touch(peer)  # answered: quiet again for `idle_after` before the next ping

    def statistics(self) -> dict[str, int]:
        return {
            "pings_sent": self.pings_sent,
            "pings_failed": self.pings_failed,
            "ipfs_pings_sent": self.ipfs_pings_sent,
            "ipfs_pings_answered": self.ipfs_pings_answered,
            "peers_dropped": self.dropped,
        }

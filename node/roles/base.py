"""What every role shares: the network handle it works through, and the loop that finds its peers.

A role is a small service: it announces itself as a DHT provider of `swarmnode/<run>/role/<ROLE>`,
finds the roles it `NEEDS` through the DHT (and verifies each candidate with a signed Hello), and hands
every gossip message of the topics it `SUBSCRIBES` to its work object. The work object is the seam later
issues fill in: it receives a `RoleNet` (publish, request, peers found, checkpoint announcements) and
runs its own loop. The networking here never depends on what the work does.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import trio
from libp2p.abc import IHost
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.dht import Discovery
from swarmnode.node.p2p.gossip import Delivery, Gossip
from swarmnode.node.p2p.host import TRANSPORT_ERRORS
from swarmnode.node.p2p.peers import PeerDirectory, PeerRecord
from swarmnode.node.p2p.records import RunRecord, checkpoint_key, checkpoint_name, role_key, role_name
from swarmnode.node.p2p.reqresp import ProtocolSpec, RequestFailed, RequestResponse
from swarmnode.node.p2p.scoring import PeerGuard
from swarmnode.protocol.envelope import Opened
from swarmnode.protocol.errors import Reason

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinderSettings:
    first_delay: float = 0.5
    max_backoff: float = 8.0
    connect_timeout: float = 5.0


@dataclass
class RoleNet:
    """Everything a role's work may use from the network, and nothing else."""

    identity: NodeIdentity
    run: str
    role: str
    host: IHost
    discovery: Discovery
    gossip: Gossip
    reqresp: RequestResponse
    directory: PeerDirectory | None
    guard: PeerGuard
    data_dir: Path
    finder: PeerFinder = field(init=False)
    run_record: RunRecord | None = None

    def __post_init__(self) -> None:
        self.finder = PeerFinder(self)
        self._run_record_event = trio.Event()

    def seal(self, message: Any) -> bytes:
        """Sign `message` into an envelope of this run with the node's next sequence number."""
        return self.reqresp.seal(message)

    async def wait_run_record(self) -> RunRecord:
        """The trainer's signed RunDescriptor, once found in the DHT."""
        await self._run_record_event.wait()
        assert self.run_record is not None
        return self.run_record

    def set_run_record(self, record: RunRecord) -> None:
        self.run_record = record
        self.gossip.set_trainer(record.descriptor.trainer)  # the run's only manifest signer
        self._run_record_event.set()

    async def fetch_run_record(self, *, first_delay: float = 0.5, max_backoff: float = 8.0) -> RunRecord:
        """Look the run descriptor up in the DHT until found (backing off)."""
        delay = first_delay
        while True:
            record = await self.discovery.get_run_record(self.run)
            if record is not None:
                self.set_run_record(record)
                return record
            await trio.sleep(delay)
            delay = min(delay * 2, max_backoff)

    async def publish(self, kind: str, message: Any) -> bytes:
        """Sign and gossip `message` on the run's `kind` topic; returns the envelope bytes."""
        return await self.gossip.publish(kind, message)

    async def request(
        self, peer: ID, spec: ProtocolSpec, message: Any, *, sealed: bytes | None = None
    ) -> Opened:
        """One request/response exchange; raises `RequestFailed` (`sealed`: see RequestResponse)."""
        return await self.reqresp.request(peer, spec, message, sealed=sealed)

    def report(self, peer: ID, reason: Reason, detail: str = "") -> None:
        """Charge `peer` for input our work rejected (a bad submission, a lying manifest)."""
        self.guard.report(peer, reason, detail)

    def serve(
        self,
        spec: ProtocolSpec,
        handler: Callable[[ID, Opened], Awaitable[Any]],
        *,
        admit: Callable[[ID], bool] | None = None,
    ) -> None:
        """Serve `spec`; `admit` refuses a peer (its role, its stake) before it takes any slot."""
        self.reqresp.serve(spec, handler, admit=admit)

    def peers(self, role: str) -> list[PeerRecord]:
        """Verified providers of `role` found so far (Hello-checked), sorted by peer id."""
        return self.finder.found(role)

    async def wait_for_role(self, role: str) -> list[PeerRecord]:
        """Wait until at least one verified provider of `role` is known."""
        return await self.finder.wait_for(role)

    async def provide_checkpoint(self, version: int) -> None:
        """Announce (and keep re-announcing) that we serve the shards of checkpoint `version`."""
        await self.discovery.provide(checkpoint_key(self.run, version), checkpoint_name(self.run, version))

    def stop_providing_checkpoint(self, version: int) -> None:
        self.discovery.stop_providing(checkpoint_key(self.run, version))

    async def find_checkpoint_providers(self, version: int) -> list[PeerInfo]:
        return await self.discovery.find_providers(checkpoint_key(self.run, version))


class PeerFinder:
    """Finds providers of the roles a node needs through the DHT and verifies them with Hello."""

    def __init__(self, net: RoleNet, settings: FinderSettings | None = None) -> None:
        self.net = net
        self.settings = settings or FinderSettings()
        self._found: dict[str, dict[str, PeerRecord]] = {}
        self._events: dict[str, trio.Event] = {}
        self.candidates_rejected = 0
        self.rounds = 0

    def found(self, role: str) -> list[PeerRecord]:
        return sorted(self._found.get(role, {}).values(), key=lambda r: r.peer_id)

    def summary(self) -> dict[str, list[str]]:
        return {role: sorted(records) for role, records in self._found.items()}

    async def wait_for(self, role: str) -> list[PeerRecord]:
        while not self._found.get(role):
            await self._events.setdefault(role, trio.Event()).wait()
        return self.found(role)

    async def run(self, needs: tuple[str, ...]) -> None:
        """Look up every needed role until each has a provider, then keep refreshing (churn)."""
        for role in needs:
            self._found.setdefault(role, {})
        delay = self.settings.first_delay
        while True:
            self.rounds += 1
            async with trio.open_nursery() as nursery:
                for role in needs:
                    nursery.start_soon(self._lookup, role)
            if needs and all(self._found[role] for role in needs):
                delay = self.net.discovery.settings.lookup_interval
            else:
                delay = min(delay * 2, self.settings.max_backoff)
            await trio.sleep(delay)

    async def _lookup(self, role: str) -> None:
        providers = await self.net.discovery.find_providers(role_key(self.net.run, role))
        current = self._found[role]
        directory = self.net.directory
        for info in providers:
            if str(info.peer_id) in current and directory is not None and directory.is_current(info.peer_id):
                continue  # verified over a connection that is still open
            record = await self._verify(info, role)
            if record is None:
                current.pop(str(info.peer_id), None)
                continue
            what = "re-verified provider" if str(info.peer_id) in current else "found provider"
            log.info(
                what, extra={"role": role, "peer": str(info.peer_id), "key": role_name(self.net.run, role)}
            )
            current[str(info.peer_id)] = record
        if current:
            event = self._events.pop(role, None)
            if event is not None:
                event.set()

    async def _verify(self, info: PeerInfo, role: str) -> PeerRecord | None:
        """Connect and exchange Hello; the peer must say, signed, that it has this role in this run."""
        directory = self.net.directory
        if directory is None:
            return None
        if self.net.guard.is_banned(info.peer_id):
            return None
        with trio.move_on_after(self.settings.connect_timeout):
            try:
                await self.net.host.connect(info)
            except TRANSPORT_ERRORS:
                return None
        try:
            record = await directory.exchange(info.peer_id)
        except RequestFailed:
            return None
        if record.role != role:
            self.candidates_rejected += 1
            return None
        return record


class RoleWork(Protocol):
    """The seam every role's work implements (later issues provide real ones)."""

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """The role's main loop; call `task_status.started()` once ready."""
        ...

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        """One validated message from a subscribed topic."""
        ...


class IdleWork:
    """Work that only listens: counts what arrives by topic and message type. The default seam filler."""

    def __init__(self) -> None:
        self.received: dict[str, int] = {}

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        await trio.sleep_forever()

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        key = f"{delivery.kind}/{delivery.opened.envelope.type}"
        self.received[key] = self.received.get(key, 0) + 1


class RoleService:
    """Base of the role classes: announce, find needed peers, pump gossip into the work."""

    ROLE: ClassVar[str]
    SUBSCRIBES: ClassVar[tuple[str, ...]]
    NEEDS: ClassVar[tuple[str, ...]]
    ANNOUNCE: ClassVar[bool] = True
    FETCH_RUN_RECORD: ClassVar[bool] = True

    def __init__(self, work: RoleWork | None = None) -> None:
        self.work: RoleWork = work if work is not None else IdleWork()

    def register(self, net: RoleNet) -> None:
        """Serve the role's own request/response protocols (override)."""

    async def start(self, net: RoleNet) -> None:
        """Role-specific start-up after the network is up, before work runs (override)."""

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.register(net)
        if self.ANNOUNCE and not net.discovery.client:  # behind NAT nobody could dial the provider
            await net.discovery.provide(role_key(net.run, self.ROLE), role_name(net.run, self.ROLE))
        await self.start(net)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(net.finder.run, self.NEEDS)
            if self.FETCH_RUN_RECORD or (net.run_record is None and "checkpoints" in self.SUBSCRIBES):
                # a node that relays `checkpoints` (a bootstrap too) needs the lead to judge manifests by
                nursery.start_soon(net.fetch_run_record)
            for kind in self.SUBSCRIBES:
                nursery.start_soon(self._pump, net, kind)
            await nursery.start(self.work.run, net)
            task_status.started()

    async def _pump(self, net: RoleNet, kind: str) -> None:
        async for delivery in net.gossip.messages(kind):
            await self.work.on_gossip(net, delivery)

"""Kademlia discovery: bootstrap, strict record validation, deduplicated provider lookups, re-announce.

What py-libp2p's `KadDHT` does by default (file:line in site-packages/libp2p/kad_dht), and what we do:

- Unvalidated keys: with `strict_validation=False` (its default, kad_dht.py:201) a PUT_VALUE for any key
  that is not namespaced is stored unvalidated, and `pk`/`ipns` validators are added behind our back
  (kad_dht.py:455). We pass a strict `NamespacedValidator` holding only the `swarmnode` namespace, with
  `validator_changed=True`.
- Provider keys are never validated (any 1..80 bytes, kad_dht.py:787) and the provider store bounds
  nothing but providers per key, so any peer can fill our memory with ADD_PROVIDER records (48 h expiry,
  provider_store.py:55). We install `BoundedProviderStore`: sha2-256 multihash keys only, at most
  `max_provider_keys` keys.
- `find_providers` answers from the local store alone whenever it holds any record for the key
  (provider_store.py:370: a relay providing `role/relay` never finds the other relays), and concatenates
  every answering peer's providers (provider_store.py:433: duplicates). Ours merges local and network
  answers by peer id, unioning addresses.
- Re-provide every 22 h (provider_store.py:54), routing-table refresh every 10 min (kad_dht.py:95). We
  announce at start, re-announce every `reprovide_interval`, retry failed announcements every
  `retry_interval`, refresh and re-announce on an early schedule (later joiners become visible fast),
  then refresh every `refresh_interval`, and re-dial the bootstrap peers whenever we have no connection.
- ADD_PROVIDER is limited to 10 per 10 s per sender (kad_dht.py:313); over the limit the stream is reset
  while the sender, which never reads the echo, counts a success (provider_store.py:326). We space our
  announcements `provide_spacing` apart.
- `value_store._store_at_peer(key, value)` sends the locally stored record instead of `value` when one
  exists (value_store.py:319); we only put through `put_value`, which stores locally first.
- Nothing stops a banned peer from re-entering the routing table (any inbound query adds its sender,
  kad_dht.py:632). We wrap the table's `add_peer` to refuse banned peers, drop a peer when its ban lands,
  and leave banned peers out of lookups and their results (spec/discovery.md, Banned peers).
- Any inbound query also adds its sender unchecked (`skip_server_mode_check=True`, kad_dht.py:632), so a
  DHT client (a NATed worker) enters our table and we then send it queries it refuses. Our wrapper always
  checks: the sender of a query is admitted only once identify lists `/ipfs/kad/1.0.0` for it; a peer
  found by a lookup only if identify, where it has run, lists it (routing_table.py:531).
- While its routing table holds fewer than 5 peers, a lookup starts from every connected peer and every
  peer in the peerstore (peer_routing.py:194), DHT clients included, queries them, and returns them among
  the closest (then ADD_PROVIDER and GET_PROVIDERS go to them too). We never query a peer whose identify
  lists no KAD (for a connected peer identify has not finished with, we wait for it, `identify_wait`),
  and drop such peers from lookup results.
- The Kademlia protocol id is always `/ipfs/kad/1.0.0` whatever `protocol_prefix` says (kad_dht.py:340).
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from dataclasses import dataclass

import trio
from libp2p.abc import IHost
from libp2p.kad_dht.common import PROTOCOL_ID as KAD_PROTOCOL
from libp2p.kad_dht.kad_dht import DHTMode, KadDHT
from libp2p.kad_dht.provider_store import ProviderStore
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.peer.peerstore import PeerStoreError
from libp2p.records.validator import NamespacedValidator
from libp2p.tools.anyio_service import background_trio_service
from multiaddr import Multiaddr  # type: ignore[import-untyped]

from swarmnode.node.p2p.bootstrap import BootstrapReport
from swarmnode.node.p2p.bootstrap import explain as explain_dial_failure
from swarmnode.node.p2p.clock import Clock
from swarmnode.node.p2p.host import TRANSPORT_ERRORS, parse_peer_addr
from swarmnode.node.p2p.records import (
    NAMESPACE,
    InvalidRecord,
    RunRecord,
    RunRecordValidator,
    is_provider_key,
    open_run_record,
    run_record_key,
)
from swarmnode.node.p2p.scoring import PeerGuard

log = logging.getLogger(__name__)

PROVIDER_ADDR_TTL = 3600
IDENTIFY_POLL = 0.05  # py-libp2p signals no event when identify completes, so its result is polled


@dataclass(frozen=True)
class DiscoverySettings:
    """Bootstrap peers and the DHT schedule (seconds); spec/discovery.md has the table."""

    bootstrap: tuple[str, ...] = ()
    reprovide_interval: float = 300.0
    retry_interval: float = 2.0
    refresh_interval: float = 60.0
    lookup_interval: float = 30.0  # roles re-look-up needed providers this often once all are found
    early_refresh: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
    lookup_timeout: float = 10.0
    query_timeout: float = 5.0
    dial_timeout: float = 5.0
    provide_spacing: float = 1.05
    max_lookup_fanout: int = 20
    lookup_batch: int = 4  # GET_PROVIDERS sent in parallel per batch, closest peers first
    min_answers: int = 4  # stop after this many answers once a batch finds no new provider
    max_provider_keys: int = 10_000
    identify_wait: float = 3.0  # a lookup waits this long for identify of a connected peer (~2 RTTs)
    trainer: bytes | None = None  # pin the run to this trainer address


class BoundedProviderStore(ProviderStore):
    """py-libp2p's provider store, refusing keys that are not sha2-256 multihashes and bounding key count."""

    def __init__(self, host: IHost, peer_routing: object, *, max_keys: int) -> None:
        super().__init__(host=host, peer_routing=peer_routing)
        self.max_keys = max_keys
        self.refused: Counter[str] = Counter()

    def add_provider(self, key: bytes, provider: PeerInfo) -> None:
        if not is_provider_key(key):
            self.refused["bad_key"] += 1
            return
        if key not in self.providers and len(self.providers) >= self.max_keys:
            self.refused["store_full"] += 1
            return
        super().add_provider(key, provider)


class Discovery:
    """The node's Kademlia DHT and everything we do with it.

    `client`: the node cannot be dialed (behind NAT, spec/discovery.md "Reachable addresses"): the DHT runs
    in client mode (it queries, serves no KAD streams, so identify does not list the protocol and peers
    keep it out of their routing tables) and `provide` announces nothing, since nobody could dial the
    provider it names.
    """

    def __init__(
        self,
        host: IHost,
        guard: PeerGuard,
        settings: DiscoverySettings,
        *,
        client: bool = False,
        clock: Clock = trio.current_time,
    ) -> None:
        self.host = host
        self.settings = settings
        self.client = client
        self.clock = clock
        self.record_validator = RunRecordValidator(settings.trainer)
        validator = NamespacedValidator({NAMESPACE: self.record_validator}, strict_validation=True)
        mode = DHTMode.CLIENT if client else DHTMode.SERVER
        self.dht = KadDHT(host, mode, validator=validator, validator_changed=True, strict_validation=True)
        # KadDHT takes no provider store argument; its handlers use this attribute, so we set it here.
        self.providers = BoundedProviderStore(
            host, self.dht.peer_routing, max_keys=settings.max_provider_keys
        )
        self.dht.provider_store = self.providers
        self.bootstrap_peers = [parse_peer_addr(a) for a in settings.bootstrap]
        self.bootstrap_report = BootstrapReport()
        self.provided: dict[bytes, str] = {}  # key -> human-readable name
        self.announced: dict[bytes, float] = {}  # key -> last successful announcement
        self.values: dict[str, bytes] = {}  # value records we publish and re-publish
        self.value_put_at: dict[str, float] = {}
        self.lookup_seconds: deque[float] = deque(maxlen=512)
        self.stats: Counter[str] = Counter()
        self._provide_lock = trio.Lock()
        self._last_provide = -float("inf")
        self._wake = trio.Event()
        self.guard = guard
        self._gate_routing_table()
        self._skip_dht_clients()
        guard.on_ban(self._forget_peer)

    def _gate_routing_table(self) -> None:
        """Only DHT servers that are not banned enter the routing table, by whichever path.

        The table object is shared by the DHT, its peer routing and its refresh task, so its own
        `add_peer` is wrapped (py-libp2p offers no admission hook). `skip_server_mode_check=True` marks
        the inbound-query path (kad_dht.py:632): a query proves only that its sender is a DHT client, so
        we admit it only once identify has listed `/ipfs/kad/1.0.0` (a server that queries us before
        identify finishes gets in on its next query, or through our own lookups). Every other path
        keeps py-libp2p's check: refused when identify lists protocols without KAD.
        """
        table = self.dht.routing_table
        add_peer = table.add_peer

        async def gated_add_peer(peer_obj: PeerInfo | ID, *, skip_server_mode_check: bool = False) -> bool:
            peer = peer_obj.peer_id if isinstance(peer_obj, PeerInfo) else peer_obj
            if self.guard.is_banned(peer):
                self.stats["routing_banned_refused"] += 1
                return False
            if skip_server_mode_check and not self._serves_kad(peer):
                self.stats["routing_client_refused"] += 1
                return False
            return await add_peer(peer_obj, skip_server_mode_check=False)

        table.add_peer = gated_add_peer  # type: ignore[method-assign]

    def _skip_dht_clients(self) -> None:
        """Lookups neither query nor return peers known to be DHT clients (the small-table fallback).

        Both are instance attributes the lookup reaches through `self.`, so wrapping them here covers
        every caller (refresh, provide, find_providers, get/put_value).
        """
        routing = self.dht.peer_routing
        query_peer = routing._query_peer_for_closest
        find_closest = routing.find_closest_peers_network

        async def query_servers_only(peer: ID, target_key: bytes) -> list[ID]:
            await self._await_identify(peer)
            if self._is_dht_client(peer):
                self.stats["dht_client_queries_skipped"] += 1
                return []
            return await query_peer(peer, target_key)

        async def closest_servers(target_key: bytes, count: int = 20) -> list[ID]:
            return [p for p in await find_closest(target_key, count) if not self._is_dht_client(p)]

        routing._query_peer_for_closest = query_servers_only  # type: ignore[method-assign]
        routing.find_closest_peers_network = closest_servers  # type: ignore[method-assign]

    def _protocols(self, peer: ID) -> list[str]:
        """The protocols identify recorded for `peer` (only identify writes them); [] before it ran."""
        try:
            return self.host.get_peerstore().get_protocols(peer)
        except PeerStoreError:
            return []

    async def _await_identify(self, peer: ID) -> None:
        """Give identify of a connected peer time to finish (it starts on every new connection).

        The small-table fallback picks connected peers the moment they connect, before we know whether
        they serve KAD; a peer we are not connected to came from a server's answer or our peerstore.
        """
        with trio.move_on_after(self.settings.identify_wait):
            while not self._protocols(peer) and peer in self.host.get_connected_peers():  # noqa: ASYNC110
                await trio.sleep(IDENTIFY_POLL)

    def _serves_kad(self, peer: ID) -> bool:
        return str(KAD_PROTOCOL) in self._protocols(peer)

    def _is_dht_client(self, peer: ID) -> bool:
        """Identify ran and did not list KAD: the peer serves no DHT queries."""
        protocols = self._protocols(peer)
        return bool(protocols) and str(KAD_PROTOCOL) not in protocols

    def _forget_peer(self, peer: ID) -> None:
        """A ban drops the peer from the routing table (and the gate keeps it out while banned)."""
        if self.dht.routing_table.remove_peer(peer):
            self.stats["routing_banned_removed"] += 1

    @property
    def my_id(self) -> ID:
        return self.host.get_id()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the DHT service; ready after the first bootstrap attempt (which may reach nobody)."""
        async with background_trio_service(self.dht):
            await self.bootstrap()
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._maintain_routing)
                nursery.start_soon(self._maintain_announcements)

    async def bootstrap(self) -> int:
        """Dial every bootstrap peer (concurrently, bounded) and seed the routing table; returns #reached."""
        reached = 0

        async def dial(address: str, info: PeerInfo) -> None:
            nonlocal reached
            if info.peer_id == self.my_id or self.guard.is_banned(info.peer_id):
                return
            failure: BaseException | None = None
            connected = False
            with trio.move_on_after(self.settings.dial_timeout) as scope:
                try:
                    await self.host.connect(info)
                except TRANSPORT_ERRORS as exc:
                    failure = exc
                else:
                    connected = True
                    self.bootstrap_report.reached(address)
                    await self.dht.add_peer(info.peer_id)
                    reached += 1
            if connected or (failure is None and not scope.cancelled_caught):
                return  # reached (a timeout while adding it to the table is not a failure to reach it)
            self.stats["bootstrap_failures"] += 1
            reason = explain_dial_failure(address, failure, self.settings.dial_timeout)
            if reason is not None:
                self.bootstrap_report.failed(address, reason, self.clock())

        async with trio.open_nursery() as nursery:
            for address, info in zip(self.settings.bootstrap, self.bootstrap_peers, strict=True):
                nursery.start_soon(dial, address, info)
        self.stats["bootstrap_rounds"] += 1
        if reached:
            await self.refresh()
        return reached

    async def refresh(self) -> None:
        with trio.move_on_after(self.settings.lookup_timeout * 3):
            await self.dht.refresh_routing_table()
            self.stats["refreshes"] += 1

    async def _maintain_routing(self) -> None:
        delays = list(self.settings.early_refresh)
        previous = 0.0
        while True:
            early = bool(delays)
            target = delays.pop(0) if delays else previous + self.settings.refresh_interval
            await trio.sleep(max(0.0, target - previous))
            previous = target
            if not self.host.get_connected_peers() and self.bootstrap_peers:
                await self.bootstrap()
            else:
                await self.refresh()
            if early:
                # The routing table is still growing, so the peers closest to our keys keep changing: an
                # announcement made when we knew only the bootstrap node sits where lookups may not ask.
                self.announced.clear()
                self.value_put_at.clear()
            self._wake.set()

    async def _maintain_announcements(self) -> None:
        while True:
            now = self.clock()
            due = [
                k
                for k in self.provided
                if now - self.announced.get(k, -float("inf")) >= self._interval_for(k)
            ]
            for key in due:
                await self._announce(key)
            for record_key, value in list(self.values.items()):
                if now - self.value_put_at.get(record_key, -float("inf")) >= self.settings.reprovide_interval:
                    await self._put(record_key, value)
            self._wake = trio.Event()
            with trio.move_on_after(self.settings.retry_interval):
                await self._wake.wait()

    def _interval_for(self, key: bytes) -> float:
        return self.settings.reprovide_interval if key in self.announced else self.settings.retry_interval

    async def provide(self, key: bytes, name: str) -> None:
        """Announce that we provide `key` now, and keep re-announcing it for the life of the node.

        A DHT client announces nothing: its provider record would name a peer nobody can dial.
        """
        if self.client:
            self.stats["provides_skipped_client"] += 1
            return
        self.provided[key] = name
        await self._announce(key)

    def stop_providing(self, key: bytes) -> None:
        self.provided.pop(key, None)
        self.announced.pop(key, None)

    async def _announce(self, key: bytes) -> bool:
        async with self._provide_lock:
            wait = self._last_provide + self.settings.provide_spacing - self.clock()
            if wait > 0:
                await trio.sleep(wait)
            ok = False
            with trio.move_on_after(self.settings.lookup_timeout * 2):
                ok = await self.providers.provide(key)
            self._last_provide = self.clock()
        if ok:
            self.announced[key] = self.clock()
            self.stats["announcements"] += 1
        else:
            self.stats["announcements_failed"] += 1
        return ok

    async def find_providers(
        self, key: bytes, *, include_self: bool = False, limit: int = 20
    ) -> list[PeerInfo]:
        """Providers of `key` from the local store and the k closest peers, one entry per peer id."""
        started = self.clock()
        found: dict[ID, dict[str, Multiaddr]] = {}

        def merge(info: PeerInfo) -> None:
            if info.peer_id == self.my_id and not include_self:
                return
            if self.guard.is_banned(info.peer_id):
                self.stats["providers_banned_dropped"] += 1
                return
            addrs = found.get(info.peer_id)
            if addrs is None:
                addrs = found[info.peer_id] = {}
            else:
                self.stats["provider_duplicates_merged"] += 1
            for addr in info.addrs:
                addrs.setdefault(str(addr), addr)

        for info in self.providers.get_providers(key):
            merge(info)

        async def ask(peer: ID, answered: list[ID]) -> None:
            with trio.move_on_after(self.settings.query_timeout):
                # The public find_providers short-circuits on local records (see module doc), so we
                # query the closest peers ourselves through the store's per-peer GET_PROVIDERS call.
                providers, _closer = await self.providers._get_providers_from_peer_with_closers(peer, key)
                answered.append(peer)
                for info in providers:
                    merge(info)

        with trio.move_on_after(self.settings.lookup_timeout):
            closest = await self.dht.peer_routing.find_closest_peers_network(key)
            candidates = [
                p
                for p in closest[: self.settings.max_lookup_fanout]
                if p != self.my_id and not self.guard.is_banned(p)
            ]
            answered: list[ID] = []
            # Closest first, a batch at a time: provider records live on the k closest peers, so once
            # `min_answers` peers answered and a batch taught us nothing new, asking further is waste.
            while candidates:
                batch, candidates = (
                    candidates[: self.settings.lookup_batch],
                    candidates[self.settings.lookup_batch :],
                )
                known = len(found)
                async with trio.open_nursery() as nursery:
                    for peer in batch:
                        nursery.start_soon(ask, peer, answered)
                if len(answered) >= self.settings.min_answers and len(found) == known:
                    break
        result = []
        for peer, addrs in sorted(found.items(), key=lambda item: str(item[0])):
            if addrs:
                self.host.get_peerstore().add_addrs(peer, list(addrs.values()), PROVIDER_ADDR_TTL)
            result.append(PeerInfo(peer, list(addrs.values())))
        self.lookup_seconds.append(self.clock() - started)
        self.stats["lookups"] += 1
        return result[:limit]

    async def put_run_record(self, run: str, envelope: bytes) -> None:
        """Store the signed RunDescriptor under `/swarmnode/run/<run>` and keep re-publishing it."""
        key = run_record_key(run)
        open_run_record(key, envelope, trainer=self.settings.trainer)  # refuse to publish what peers refuse
        self.values[key] = envelope
        await self._put(key, envelope)

    async def _put(self, key: str, value: bytes) -> None:
        """Put a value record; counts as done only if some peer was there to receive it (else retried)."""
        with trio.move_on_after(self.settings.lookup_timeout * 2):
            await self.dht.put_value(key, value)
            self.stats["value_puts"] += 1
            if self.dht.get_routing_table_size():
                self.value_put_at[key] = self.clock()

    async def get_run_record(self, run: str) -> RunRecord | None:
        """The run's descriptor from the DHT, verified; None if nobody we can reach holds a valid one."""
        key = run_record_key(run)
        value = None
        with trio.move_on_after(self.settings.lookup_timeout):
            value = await self.dht.get_value(key)
        if value is None:
            return None
        try:
            return open_run_record(key, value, trainer=self.settings.trainer)
        except InvalidRecord:
            self.stats["run_records_invalid"] += 1
            return None

    def statistics(self) -> dict[str, float]:
        lookups = sorted(self.lookup_seconds)
        return {
            "routing_table_size": self.dht.get_routing_table_size(),
            "provider_records": self.providers.size(),
            "provided_keys": len(self.provided),
            "announced_keys": len(self.announced),
            "records_refused": self.record_validator.rejected,
            "provider_keys_refused": sum(self.providers.refused.values()),
            "lookup_p50_s": lookups[len(lookups) // 2] if lookups else 0.0,
            **self.stats,
        }

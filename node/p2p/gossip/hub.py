"""The node's pubsub service: validated publish/subscribe on `swarm/<run>/<kind>` (`Gossip`).

What py-libp2p's pubsub does by default (file:line in site-packages/libp2p/pubsub), and what `Gossip` does:

- Each subscription is a 32-message channel (pubsub.py:124), emptied by a task that may not be
  scheduled before a burst overflows it. Our `GossipPubsub` hands each accepted message straight to
  `Gossip._deliver`, which puts it in our own queue (`TopicPolicy.queue_size`) and counts `queue_drops`
  when that is full; `upstream_drops` counts a message our validator accepted that py-libp2p then never
  delivered.
- The validator hook returns a bool, so `Reject` and `Ignore` look the same to the router. Ours keeps the
  distinction: a `Reject` charges the forwarding peer through the `PeerGuard` (an honest peer never
  forwards what its own validator refused), an `Ignore` is only counted.
- Message ids default to (origin peer, libp2p seqno), seqno starting at the wall clock in *seconds*
  (pubsub.py:478): a node restarted within its previous message count reuses ids, and peers drop its new
  messages as seen or as equivocation (gossipsub.py:2908). We use content ids (`content_id`: sha256 of
  the envelope, unique per (sender, seq)) and start the libp2p counter at the wall clock in microseconds.
- The validation cache (5 min, pubsub.py:385) outlives the seen cache (2 min, pubsub.py:379): a replay of
  a valid message after the seen TTL is delivered without running validators. A message reaches our
  queue only if our validator accepted it moments before (`pending`), so such replays are counted as
  `duplicates` and dropped.
- Heartbeat every 120 s (gossipsub.py:179) and "adaptive" degrees: we use a 1 s heartbeat, fixed degrees.
  With adaptive gossip off the router still appends a timestamp per forwarded message to
  `recent_message_deliveries` (gossipsub.py:1089), which only the adaptive path prunes
  (gossipsub.py:2661): an unbounded leak. We clear it every `pending_ttl / 3` s; nothing else reads it.
- Publication rates and outbound back-pressure: `node.p2p.gossip.policy` and `node.p2p.gossip.outbound`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import trio
from libp2p.abc import IHost
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11
from libp2p.pubsub.pb import rpc_pb2
from libp2p.tools.anyio_service import background_trio_service

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.clock import Clock, SeqCounter, wall_ms, wall_us
from swarmnode.node.p2p.gossip.authority import AuthorityView, LedgerView
from swarmnode.node.p2p.gossip.checks import check_gossip_message, content_id
from swarmnode.node.p2p.gossip.outbound import CountingGossipSub
from swarmnode.node.p2p.gossip.policy import GossipSettings
from swarmnode.node.p2p.gossip.pubsub import GossipPubsub
from swarmnode.node.p2p.peers import PeerActivity
from swarmnode.node.p2p.ratelimit import KeyedBuckets, TokenBucket
from swarmnode.node.p2p.scoring import PeerGuard
from swarmnode.protocol import ids
from swarmnode.protocol.envelope import Opened, ReplayWindow, seal
from swarmnode.protocol.errors import Ignore, Reject


@dataclass(frozen=True)
class Delivery:
    """A validated gossip message handed to the role."""

    kind: str
    opened: Opened
    forwarder: str
    received: float  # trio clock
    received_wall_ns: int
    size: int


@dataclass
class TopicStats:
    published: int = 0
    publish_waits: int = 0
    backpressure_waits: int = 0
    backpressure_timeouts: int = 0
    accepted: int = 0
    delivered: int = 0
    own: int = 0
    throttled: int = 0
    from_banned: int = 0
    duplicates: int = 0
    queue_drops: int = 0
    upstream_drops: int = 0
    pending_full: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    ignored: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "publish_waits": self.publish_waits,
            "backpressure_waits": self.backpressure_waits,
            "backpressure_timeouts": self.backpressure_timeouts,
            "accepted": self.accepted,
            "delivered": self.delivered,
            "own": self.own,
            "throttled": self.throttled,
            "from_banned": self.from_banned,
            "duplicates": self.duplicates,
            "queue_drops": self.queue_drops,
            "upstream_drops": self.upstream_drops,
            "pending_full": self.pending_full,
            "rejected": dict(self.rejected),
            "ignored": dict(self.ignored),
        }


@dataclass
class _Pending:
    kind: str
    opened: Opened
    forwarder: ID
    accepted_at: float


Observer = Callable[[Delivery], None]


class Gossip:
    """The node's pubsub: validated publish/subscribe on `swarm/<run>/<kind>`."""

    def __init__(
        self,
        host: IHost,
        identity: NodeIdentity,
        run: str,
        seq: SeqCounter,
        guard: PeerGuard,
        activity: PeerActivity,
        *,
        subscribe: tuple[str, ...],
        settings: GossipSettings | None = None,
        now_ms: Callable[[], int] = wall_ms,
        clock: Clock = trio.current_time,
    ) -> None:
        self.host = host
        self.identity = identity
        self.run_id = run
        self.seq = seq
        self.guard = guard
        self.activity = activity
        self.settings = settings or GossipSettings()
        self.now_ms = now_ms
        self.clock = clock
        unknown = set(subscribe) - set(self.settings.policies)
        if unknown:
            raise ValueError(f"no policy for topic kind(s) {sorted(unknown)}")
        self.subscribed = tuple(subscribe)
        self.topics = {kind: ids.topic(run, kind) for kind in self.settings.policies}
        self.router = CountingGossipSub(
            protocols=[TProtocol(PROTOCOL_ID_V11), TProtocol(PROTOCOL_ID)],
            degree=self.settings.degree,
            degree_low=self.settings.degree_low,
            degree_high=self.settings.degree_high,
            heartbeat_interval=self.settings.heartbeat_interval,
            heartbeat_initial_delay=0.1,
            adaptive_gossip_enabled=False,
            max_messages_per_topic_per_second=self.settings.forward_cap_per_topic,
        )
        self._kinds = {topic: kind for kind, topic in self.topics.items()}
        self.pubsub = GossipPubsub(
            host,
            self.router,
            seen_ttl=self.settings.seen_ttl,
            msg_id_constructor=content_id,
            allowed_topics=frozenset(self.topics.values()),
            deliver=self._deliver,
        )
        self.pubsub.counter = wall_us()  # libp2p seqnos must not repeat across restarts either
        self.replay = ReplayWindow()
        self.authority = AuthorityView()
        self.stats = {kind: TopicStats() for kind in self.settings.policies}
        self._sender_buckets = {
            kind: KeyedBuckets(p.sender_rate, p.sender_burst) for kind, p in self.settings.policies.items()
        }
        self._publish_buckets = {
            kind: TokenBucket(p.publish_rate, max(1.0, p.publish_rate))
            for kind, p in self.settings.policies.items()
        }
        self._publish_locks = {kind: trio.Lock() for kind in self.settings.policies}
        self._pending: dict[bytes, _Pending] = {}
        self._queues = {
            kind: trio.open_memory_channel[Delivery](self.settings.policies[kind].queue_size)
            for kind in subscribe
        }
        self._observers: list[Observer] = []
        for kind, topic in self.topics.items():
            self.pubsub.set_topic_validator(topic, self._validator_for(kind), is_async_validator=False)
        self._running = False
        guard.on_ban(self._on_ban)
        guard.on_unban(self.pubsub.remove_from_blacklist)

    def _on_ban(self, peer: ID) -> None:
        """Blacklist in pubsub: its messages are dropped and its pubsub stream is reset."""
        if self._running:
            self.pubsub.add_to_blacklist(peer)  # also tears the stream down (needs the running service)
        else:
            self.pubsub.blacklisted_peers.add(peer)

    # --- authority -------------------------------------------------------------------------------

    def set_trainer(self, trainer: bytes) -> None:
        """The run's lead, from its signed RunDescriptor (or the operator's pin): the manifest signer."""
        self.authority = replace(self.authority, trainer=trainer)

    def set_ledger_view(self, view: LedgerView) -> None:
        """The latest read of the node's ledger (eligible validators, registered nodes)."""
        self.authority = replace(self.authority, ledger=view)

    # --- validation ------------------------------------------------------------------------------

    def _validator_for(self, kind: str) -> Callable[[ID, rpc_pb2.Message], bool]:
        def validate(forwarder: ID, message: rpc_pb2.Message) -> bool:
            return self._validate(kind, forwarder, message)

        return validate

    def _validate(self, kind: str, forwarder: ID, message: rpc_pb2.Message) -> bool:
        """The pubsub validator hook: True delivers and forwards, False drops (counted by reason)."""
        policy = self.settings.policies[kind]
        stats = self.stats[kind]
        own = forwarder == self.host.get_id()
        if not own:
            self.activity.touch(forwarder)
            if self.guard.is_banned(forwarder):  # in flight when the ban landed
                stats.from_banned += 1
                return False
        try:
            opened = check_gossip_message(
                policy,
                message.data,
                run=self.run_id,
                now_ms=self.now_ms(),
                replay=self.replay,
                authority=None if own else self.authority,  # our own publications are our peers' to judge
            )
        except Reject as exc:
            stats.rejected[exc.reason.name] += 1
            self.guard.report(forwarder, exc.reason, f"{kind}: {exc.detail}")
            return False
        except Ignore as exc:
            stats.ignored[exc.reason.name] += 1
            return False
        if not own and not self._sender_buckets[kind].try_take(opened.sender, self.clock()):
            stats.throttled += 1
            return False
        if kind in self._queues:  # only subscribed topics are delivered; our fanout publications are not
            if len(self._pending) >= self.settings.max_pending:
                stats.pending_full += 1  # delivery is stuck: refuse rather than grow (not forwarded)
                return False
            self._pending[content_id(message)] = _Pending(kind, opened, forwarder, self.clock())
        stats.accepted += 1
        return True

    # --- delivery --------------------------------------------------------------------------------

    def messages(self, kind: str) -> trio.MemoryReceiveChannel[Delivery]:
        """The receive side of a subscribed topic's queue (one consumer: the role)."""
        return self._queues[kind][1]

    def add_observer(self, observer: Observer) -> None:
        """Called synchronously for every delivery (delivery logs, metrics)."""
        self._observers.append(observer)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with background_trio_service(self.pubsub), background_trio_service(self.router):
            await self.pubsub.wait_until_ready()
            self._running = True
            for kind in self.subscribed:
                await self.pubsub.subscribe(self.topics[kind])  # deliveries arrive through `_deliver`
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._sweep_pending)
                task_status.started()

    def _deliver(self, message: rpc_pb2.Message) -> None:
        """Called by the pubsub, synchronously, for each message it accepted on a subscribed topic."""
        kind = next((self._kinds[t] for t in message.topicIDs if t in self._kinds), None)
        if kind is None or kind not in self._queues:
            return
        stats = self.stats[kind]
        pending = self._pending.pop(content_id(message), None)
        if pending is None:
            stats.duplicates += 1
            return
        if pending.opened.sender == self.identity.address and not self.settings.deliver_own:
            stats.own += 1
            return
        delivery = Delivery(
            kind, pending.opened, str(pending.forwarder), self.clock(), _wall_ns(), len(message.data)
        )
        for observer in self._observers:
            observer(delivery)
        try:
            self._queues[kind][0].send_nowait(delivery)
        except trio.WouldBlock:
            stats.queue_drops += 1
            return
        stats.delivered += 1

    async def _sweep_pending(self) -> None:
        while True:
            await trio.sleep(self.settings.pending_ttl / 3)
            cutoff = self.clock() - self.settings.pending_ttl
            for key in [k for k, p in self._pending.items() if p.accepted_at < cutoff]:
                self.stats[self._pending.pop(key).kind].upstream_drops += 1
            self.router.recent_message_deliveries.clear()  # py-libp2p leak workaround (module doc)

    # --- publishing ------------------------------------------------------------------------------

    async def publish(self, kind: str, message: Any) -> bytes:
        """Seal `message` and publish it on the run's `kind` topic; waits if we are over our own rate."""
        policy = self.settings.policies[kind]
        if type(message) not in policy.types:
            raise TypeError(f"{type(message).__name__} is not carried on {kind}")
        async with self._publish_locks[kind]:
            bucket = self._publish_buckets[kind]
            wait = bucket.wait_time(self.clock())
            if wait > 0:
                self.stats[kind].publish_waits += 1
                await trio.sleep(wait)
            bucket.try_take(self.clock())
            await self._wait_for_outbound_room(kind)
            envelope = seal(self.identity, message, run=self.run_id, seq=self.seq.next(), ts=self.now_ms())
            if len(envelope) > policy.max_bytes:
                raise ValueError(
                    f"{kind} envelope of {len(envelope)} bytes exceeds the cap of {policy.max_bytes}"
                )
            await self.pubsub.publish(self.topics[kind], envelope)
        self.stats[kind].published += 1
        return envelope

    async def _wait_for_outbound_room(self, kind: str) -> None:
        """Back-pressure: wait while any peer we would send to has a nearly full outbound queue."""
        topic = self.topics[kind]
        deadline = self.clock() + self.settings.backpressure_timeout
        waited = False
        while True:
            peers = (
                self.router.mesh.get(topic)
                or self.router.fanout.get(topic)
                or self.pubsub.peer_topics.get(topic)
                or set()
            )
            queues = self.pubsub.peer_queues
            if all(len(queues[p]) < self.settings.outbound_high_water for p in peers if p in queues):
                return
            if not waited:
                self.stats[kind].backpressure_waits += 1
                waited = True
            if self.clock() >= deadline:
                self.stats[kind].backpressure_timeouts += 1
                return
            await trio.sleep(0.002)

    # --- introspection ---------------------------------------------------------------------------

    def mesh_peers(self, kind: str) -> int:
        return len(self.router.mesh.get(self.topics[kind], ()))

    def topic_peers(self, kind: str) -> int:
        return len(self.pubsub.peer_topics.get(self.topics[kind], ()))

    def outbound_drops(self, kind: str) -> int:
        topic = self.topics[kind]
        return sum(n for (t, _reason), n in self.router.outbound_drops.items() if t == topic)

    def statistics(self) -> dict[str, Any]:
        return {
            kind: {
                **s.as_dict(),
                "outbound_drops": self.outbound_drops(kind),
                "mesh_peers": self.mesh_peers(kind),
                "topic_peers": self.topic_peers(kind),
            }
            for kind, s in self.stats.items()
        } | {
            "pending": len(self._pending),
            "blacklisted": len(self.pubsub.blacklisted_peers),
            "rpc_copies": self.pubsub.copies,
            "rpc_duplicate_copies": self.pubsub.duplicate_copies,
            "records_verified": self.pubsub.records_verified,
            "outbound_merged": self.pubsub.outbound_merged,
        }


def _wall_ns() -> int:
    return time.time_ns()

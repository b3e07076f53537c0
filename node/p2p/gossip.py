"""GossipSub on the run's topics, with our validation in the pubsub hook and our own bounded queues.

What py-libp2p's pubsub does by default (file:line in site-packages/libp2p/pubsub), and what we do:

- A 10 msg/s cap per (forwarding peer, topic) (gossipsub.py:190, checked at gossipsub.py:975) silently
  stops *forwarding* (local delivery already happened), and it applies to our own publications too. We
  raise it to `forward_cap_per_topic` and enforce the rates that matter ourselves: per envelope sender
  and topic in the validator (`TopicPolicy.sender_rate`), and per topic on our own publications, where
  `publish` waits for a token instead of letting the router drop the message.
- Each subscription is a 32-message channel (pubsub.py:124), dropping with a log line when full
  (pubsub.py:1375), emptied by a task that may not be scheduled before a burst overflows it. Our
  `GossipPubsub` hands each accepted message straight to `Gossip._deliver`, which puts it in our own
  queue (`TopicPolicy.queue_size`) and counts `queue_drops` when that is full; `upstream_drops` counts a
  message our validator accepted that py-libp2p then never delivered.
- Each peer's outbound queue holds 32 RPCs (rpc_queue.py:39) and drops the rest, logged at DEBUG only
  (rpc_queue.py:446); every forwarded message is its own RPC, so a burst overflows it while a few KiB
  wait. Ours is a `BatchingRpcQueue`: message RPCs merge up to `OUTBOUND_BATCH_BYTES`. `CountingGossipSub`
  counts what is still dropped (`outbound_drops`), and `publish` waits while any peer it would send to has
  `outbound_high_water` RPCs queued: our own publications meet back-pressure instead of a drop.
- Per message copy, py-libp2p verifies the sender's signed peer record (attached to every RPC), spawns a
  task, and reads the frame's length prefix one byte per stream read. `GossipPubsub` verifies a record
  once per peer and change, handles messages in the read loop, and splits frames from whole reads
  (`take_frames`): 4.2x less CPU for a burst that outruns one core (tests/p2p/test_gossip_load.py).
- The validator hook returns a bool, so `Reject` and `Ignore` look the same to the router. Ours keeps the
  distinction: a `Reject` charges the forwarding peer through the `PeerGuard` (an honest peer never
  forwards what its own validator refused), an `Ignore` is only counted.
- Message ids default to (origin peer, libp2p seqno), seqno starting at the wall clock in *seconds*
  (pubsub.py:478): a node restarted within its previous message count reuses ids, and peers drop its new
  messages as seen or as equivocation (gossipsub.py:2908). We use content ids (sha256 of the envelope,
  unique per (sender, seq)) and start the libp2p counter at the wall clock in microseconds.
- The validation cache (5 min, pubsub.py:385) outlives the seen cache (2 min, pubsub.py:379): a replay of
  a valid message after the seen TTL is delivered without running validators. A message reaches our
  queue only if our validator accepted it moments before (`pending`), so such replays are counted as
  `duplicates` and dropped.
- The validator hook sees only bytes: authority is ours. Before forwarding, the claimed signer must have
  authority for the topic (`authorise`: checkpoint heads from the run's trainer, verdicts from eligible
  validators, shard announcements and ledger entries from registered nodes), judged from the envelope
  header before the signature is checked, against an `AuthorityView` the runtime fills.
- Three tasks write to a peer's pubsub stream concurrently and yamux locks per frame, so large RPCs
  interleave into garbage (`SerialPubsub` serialises writes per stream).
- Heartbeat every 120 s (gossipsub.py:179) and "adaptive" degrees: we use a 1 s heartbeat, fixed degrees.
  With adaptive gossip off the router still appends a timestamp per forwarded message to
  `recent_message_deliveries` (gossipsub.py:1089), which only the adaptive path prunes
  (gossipsub.py:2661): an unbounded leak. We clear it every `pending_ttl / 3` s; nothing else reads it.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.custom_types import TProtocol
from libp2p.exceptions import ParseError
from libp2p.io.exceptions import IOException, MessageTooLarge
from libp2p.network.connection.exceptions import RawConnError
from libp2p.network.stream.exceptions import StreamEOF, StreamError
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import GossipsubEvent, Pubsub
from libp2p.pubsub.rpc_queue import RpcQueue
from libp2p.pubsub.utils import maybe_consume_signed_record
from libp2p.tools.anyio_service import background_trio_service

from crypto.hashing import sha256
from crypto.identity import NodeIdentity
from ledger.errors import LedgerError
from ledger.log import authenticate
from node.p2p.clock import Clock, SeqCounter, wall_ms, wall_us
from node.p2p.peers import PeerActivity
from node.p2p.ratelimit import KeyedBuckets, TokenBucket
from node.p2p.scoring import PeerGuard
from protocol import ids
from protocol.codec import decode
from protocol.envelope import (
    ENVELOPE_OVERHEAD,
    ENVELOPE_VERSION,
    Envelope,
    Opened,
    ReplayWindow,
    open_envelope,
    seal,
)
from protocol.errors import Ignore, Reason, Reject
from protocol.ledger_messages import LedgerEntry
from protocol.messages import CheckpointHead, ShardHave, Verdict
from protocol.types import KIB

log = logging.getLogger(__name__)

MAX_GOSSIP_ENVELOPE = 960 * KIB  # py-libp2p splits outbound RPCs at 1 MiB and cannot split one message


@dataclass(frozen=True)
class TopicPolicy:
    """What a topic carries and how fast (spec/gossip.md, Topics)."""

    kind: str
    types: tuple[type, ...]
    max_bytes: int  # whole envelope
    sender_rate: float  # accepted messages per second per envelope sender
    sender_burst: int
    publish_rate: float  # our own publications per second on this topic
    queue_size: int  # delivered messages waiting for the role

    @property
    def type_map(self) -> Mapping[str, type]:
        return MappingProxyType({cls.TYPE: cls for cls in self.types})  # type: ignore[attr-defined]


def _cap(cls: type) -> int:
    return min(int(cls.MAX_SIZE) + ENVELOPE_OVERHEAD, MAX_GOSSIP_ENVELOPE)  # type: ignore[attr-defined]


DEFAULT_POLICIES: Mapping[str, TopicPolicy] = MappingProxyType(
    {
        "checkpoints": TopicPolicy("checkpoints", (CheckpointHead,), _cap(CheckpointHead), 2.0, 10, 2.0, 64),
        "shards": TopicPolicy("shards", (ShardHave,), _cap(ShardHave), 100.0, 200, 100.0, 1024),
        "verdicts": TopicPolicy("verdicts", (Verdict,), _cap(Verdict), 100.0, 200, 100.0, 1024),
        "ledger": TopicPolicy("ledger", (LedgerEntry,), _cap(LedgerEntry), 50.0, 100, 50.0, 1024),
    }
)


@dataclass(frozen=True)
class GossipSettings:
    degree: int = 6
    degree_low: int = 4
    degree_high: int = 12
    heartbeat_interval: int = 1  # seconds (GossipSub takes an int)
    seen_ttl: int = 600
    forward_cap_per_topic: float = 2000.0
    pending_ttl: float = 30.0
    max_pending: int = 8192  # accepted messages awaiting delivery; beyond it a message is not accepted
    outbound_high_water: int = 16  # publish waits while a topic peer has this many RPCs queued (of 32)
    backpressure_timeout: float = 5.0  # then publishes anyway (the router may drop; counted)
    deliver_own: bool = False
    policies: Mapping[str, TopicPolicy] = field(default_factory=lambda: DEFAULT_POLICIES)


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


class CountingGossipSub(GossipSub):
    """GossipSub that counts the RPCs its per-peer outbound queues drop.

    py-libp2p gives every peer a 32-RPC outbound queue (pubsub/rpc_queue.py:39, `OutBoundQueueSize`) and
    drops an RPC that does not fit, logging at DEBUG only (rpc_queue.py:446 `drop_rpc`, called from
    gossipsub.py:2066 `_handle_dropped_rpc`). We override that hook to count published messages lost
    this way, per topic and reason, then defer to the original behaviour.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outbound_drops: Counter[tuple[str, str]] = Counter()

    def send_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC, priority: bool = False) -> None:
        """gossipsub.py:2029, without its per-peer copy and split of a message RPC bound for a batching queue.

        The router builds one RPC per forwarded message and py-libp2p copies and splits it for every peer
        (6% of a node's CPU at 100 msg/s, py-spy). A `BatchingRpcQueue` copies an RPC only when it merges
        another into it, and an RPC within the size limit needs no split. Anything else, or a peer with
        control waiting to piggyback, takes py-libp2p's path.
        """
        queue = self.pubsub.peer_queues.get(peer_id) if self.pubsub is not None else None
        if (
            isinstance(queue, BatchingRpcQueue)
            and not priority
            and peer_id not in self._pending_control
            and _publish_only(rpc)
            and rpc.ByteSize() <= queue.max_message_size
        ):
            if not queue.push(rpc):
                self._handle_dropped_rpc(peer_id, rpc, "queue_full")
            return
        super().send_rpc(peer_id, rpc, priority)

    def _handle_dropped_rpc(self, peer_id: ID, rpc: rpc_pb2.RPC, reason: str) -> None:
        for message in rpc.publish:
            for topic in message.topicIDs:
                self.outbound_drops[(topic, reason)] += 1
        super()._handle_dropped_rpc(peer_id, rpc, reason)


# --- authority: who may sign what on each topic (spec/gossip.md, Authority) ----------------------------

VIEW_LAG_MS = 30_000
"""How long a registration may take to show in a fresh ledger read (EVM block time and RPC lag included).
A signer outside our view is charged only for a message it signed at least this long before the view
was read: had it been registered when it signed, the view would hold it."""

FORMER_GRACE_MS = 6 * 60_000
"""How long a signer dropped from a ledger set is Ignored rather than Rejected: peers whose views are
older still forward what it signed while it stood (the 5 min clock-skew window, plus a margin)."""


@dataclass(frozen=True)
class LedgerView:
    """What the node last read from its ledger, as sets of addresses (filled by the runtime)."""

    validators: frozenset[bytes]  # registered as validator, not ejected, fully staked
    registered: frozenset[bytes]  # registered in any role, not ejected
    former: Mapping[bytes, int]  # address -> wall ms it left a set, kept for FORMER_GRACE_MS
    as_of_ms: int  # wall clock of the read
    ledger_id: str | None = None  # the signed log's id (None on an EVM ledger: no entries to gossip)


@dataclass(frozen=True)
class AuthorityView:
    """The facts topic authority is judged on. Empty until the runtime learns them."""

    trainer: bytes | None = None  # the run's lead (RunDescriptor.trainer): signs its heads and manifests
    ledger: LedgerView | None = None  # None: the node has no ledger (open mode, spec/gossip.md)


def advance_ledger_view(
    previous: LedgerView | None,
    *,
    validators: frozenset[bytes],
    registered: frozenset[bytes],
    now_ms: int,
    ledger_id: str | None = None,
) -> LedgerView:
    """A new read of the ledger; members that left either set since `previous` enter `former`."""
    former = {} if previous is None else dict(previous.former)
    if previous is not None:
        for address in (previous.validators - validators) | (previous.registered - registered):
            former.setdefault(address, now_ms)
    for address in [a for a, left in former.items() if now_ms - left >= FORMER_GRACE_MS]:
        del former[address]
    for address in validators | registered:
        former.pop(address, None)
    return LedgerView(validators, registered, MappingProxyType(former), now_ms, ledger_id)


def _member(members: frozenset[bytes], ledger: LedgerView, kind: str, sender: bytes, ts_ms: int) -> None:
    if sender in members:
        return
    who = "0x" + sender.hex()
    if sender in ledger.former:
        raise Ignore(Reason.NOT_FOR_US, f"{kind}: {who} left the ledger set moments ago")
    if ts_ms > ledger.as_of_ms - VIEW_LAG_MS:
        raise Ignore(Reason.NOT_FOR_US, f"{kind}: {who} is not in a ledger view older than its message")
    raise Reject(Reason.UNAUTHORISED, f"{kind}: {who} has no authority on this topic")


def authorise(kind: str, sender: bytes, ts_ms: int, view: AuthorityView) -> None:
    """Whether `sender` may sign messages on topic `kind` (spec/gossip.md, Authority); raises Reject/Ignore.

    `ts_ms` is the envelope's timestamp: it decides whether a signer missing from the ledger view is
    provably unauthorised (Reject 502) or may have registered after the view was read (Ignore 205).
    """
    if kind == "checkpoints":
        if view.trainer is None:
            raise Ignore(Reason.NOT_FOR_US, "checkpoints: the run descriptor is not known yet")
        if sender != view.trainer:
            raise Reject(Reason.UNAUTHORISED, f"checkpoints: 0x{sender.hex()} is not the run's trainer")
        return
    ledger = view.ledger
    if kind == "verdicts":
        if ledger is not None:
            _member(ledger.validators, ledger, kind, sender, ts_ms)
        return
    if kind == "shards":
        if ledger is not None:
            _member(ledger.registered, ledger, kind, sender, ts_ms)
        return
    if kind == "ledger":
        if ledger is None or ledger.ledger_id is None:
            raise Ignore(Reason.NOT_FOR_US, "ledger: this node holds no signed log to judge entries by")
        _member(ledger.registered, ledger, kind, sender, ts_ms)
        return
    raise Ignore(Reason.NOT_FOR_US, f"no authority rule for topic kind {kind!r}")


def check_ledger_entry(entry: LedgerEntry, view: AuthorityView) -> None:
    """A gossiped entry is well-formed: its op is an operation of our ledger, signed by its author."""
    ledger_id = view.ledger.ledger_id if view.ledger is not None else None
    if ledger_id is None:
        raise Ignore(Reason.NOT_FOR_US, "ledger: this node holds no signed log to judge entries by")
    try:
        authenticate(entry.op, ledger_id)
    except LedgerError as exc:
        raise Reject(_ledger_reason(exc), f"ledger entry {entry.index}: {exc.detail}") from None


def _ledger_reason(exc: LedgerError) -> Reason:
    try:
        return Reason(exc.code)
    except ValueError:
        return Reason.MALFORMED_OPERATION


OUTBOUND_QUEUE_RPCS = 32
"""RPCs a peer's outbound queue holds (py-libp2p's `OutBoundQueueSize`, kept); beyond it an RPC is dropped."""

OUTBOUND_BATCH_BYTES = 64 * KIB
"""Publish RPCs waiting for the same peer merge into one RPC up to this wire size (a larger message
travels alone): 32 queued RPCs are then at least 32 × 64 KiB of backlog, not 32 messages."""

RECORD_RECHECK_S = 600.0
"""A peer's signed peer record, once verified, is verified again only when it changes or after this
long (it refreshes the record's 2 h TTL in the peerstore)."""


def _publish_only(rpc: rpc_pb2.RPC) -> bool:
    """An RPC that only carries messages (no control, subscriptions): safe to merge with another."""
    return bool(rpc.publish) and not rpc.subscriptions and not rpc.HasField("control")


def publish_size(rpc: rpc_pb2.RPC) -> int:
    """Wire bytes `rpc`'s messages add to an RPC they are merged into (protobuf field 2, repeated)."""
    return sum(RpcQueue.size_of_embedded_msg(m) for m in rpc.publish)


READ_CHUNK = 64 * KIB
"""Bytes asked of a pubsub stream per read; frames are split from what arrives (`take_frames`)."""

MAX_VARINT_BYTES = 10  # a uvarint of 64 bits


def take_frames(buffer: bytearray, max_size: int) -> list[bytes]:
    """Remove every complete varint-length-prefixed frame from the front of `buffer` and return them.

    A partial frame stays in `buffer` for the next read. A prefix claiming more than `max_size` raises
    `MessageTooLarge` before its body is awaited (so `buffer` never holds more than one frame's cap plus
    a read); a prefix longer than 10 bytes raises `ParseError`, as py-libp2p's own reader does.
    """
    frames: list[bytes] = []
    start, end = 0, len(buffer)
    while start < end:
        length, shift, cursor = 0, 0, start
        while True:
            if cursor == end:
                del buffer[:start]
                return frames  # the prefix is incomplete
            if cursor - start == MAX_VARINT_BYTES:
                raise ParseError("varint length prefix longer than 10 bytes")
            byte = buffer[cursor]
            cursor += 1
            length |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
        if length > max_size:
            raise MessageTooLarge(f"pubsub RPC of {length} bytes, limit {max_size}")
        if cursor + length > end:
            break
        frames.append(bytes(buffer[cursor : cursor + length]))
        start = cursor + length
    del buffer[:start]
    return frames


class BatchingRpcQueue(RpcQueue):
    """A peer's outbound queue whose waiting publish RPCs merge into one, up to `batch_bytes`.

    py-libp2p queues one RPC per forwarded message, and the per-peer send loop writes one per scheduling
    turn. Under load every validated message is pushed to every mesh peer in one turn, so the 32-RPC
    queue (rpc_queue.py:39) overflows while the bytes waiting are tiny: measured 6,239 outbound drops
    and 19% loss at 100 msg/s across 9 processes. Merging at push bounds the queue by bytes instead;
    the merged RPC is what go-libp2p's send loop writes too (it drains its queue into one write).
    Control RPCs (priority) are never merged and go first, as in `PriorityQueue`.
    """

    def __init__(
        self,
        max_size: int = OUTBOUND_QUEUE_RPCS,
        batch_bytes: int = OUTBOUND_BATCH_BYTES,
        on_merge: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(max_size)
        self.on_merge = on_merge  # told how many messages joined a queued RPC (a node-wide counter)
        self.max_size = max_size
        self.batch_bytes = batch_bytes
        self._priority: deque[rpc_pb2.RPC] = deque()
        self._bulk: deque[rpc_pb2.RPC] = deque()
        self._tail_size = -1  # wire size of _bulk[-1] if more messages may merge into it, else -1
        self._tail_owned = False  # _bulk[-1] is a copy we made, not the RPC a caller pushed
        self._wake = trio.Event()
        self._shut = False
        self.merged = 0  # messages that joined an RPC already queued

    @property
    def closed(self) -> bool:
        return self._shut

    def __len__(self) -> int:
        return len(self._priority) + len(self._bulk)

    def push(self, rpc: rpc_pb2.RPC, priority: bool = False) -> bool:
        if self._shut:
            return False
        mergeable = not priority and _publish_only(rpc)
        if mergeable and self._tail_size >= 0:
            extra = publish_size(rpc)
            if self._tail_size + extra <= self.batch_bytes:
                if not self._tail_owned:  # the caller's object: merge into our own copy
                    tail = rpc_pb2.RPC()
                    tail.CopyFrom(self._bulk[-1])
                    self._bulk[-1] = tail
                    self._tail_owned = True
                self._bulk[-1].publish.extend(rpc.publish)
                self._tail_size += extra
                self.merged += len(rpc.publish)
                if self.on_merge is not None:
                    self.on_merge(len(rpc.publish))
                return True
        if len(self) >= self.max_size:
            return False
        if priority:
            self._priority.append(rpc)
        else:
            self._bulk.append(rpc)
            size = rpc.ByteSize()
            self._tail_size = size if mergeable and size < self.batch_bytes else -1
            self._tail_owned = False
        self._wake.set()
        return True

    async def pop(self) -> rpc_pb2.RPC | None:
        while True:
            if self._priority:
                return self._priority.popleft()
            if self._bulk:
                if len(self._bulk) == 1:
                    self._tail_size = -1  # the writer owns it now: nothing may merge into it
                return self._bulk.popleft()
            if self._shut:
                return None
            self._wake = trio.Event()
            await self._wake.wait()

    def close(self) -> None:
        self._shut = True
        self._wake.set()


class SerialPubsub(Pubsub):
    """py-libp2p's Pubsub with one writer at a time per stream.

    Three paths write RPCs to a peer's pubsub stream concurrently: the per-peer send loop
    (pubsub.py:1266) and gossipsub's pending-flush and recent-message paths (gossipsub.py:704, :788).
    Yamux takes its write lock per frame, not per write (yamux.py:239), so two large RPCs interleave
    their frames and the receiver reads garbage protobuf: measured here with two 590 KB manifests.
    Serialising `write_msg` per stream keeps every RPC contiguous.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._write_locks: weakref.WeakKeyDictionary[INetStream, trio.Lock] = weakref.WeakKeyDictionary()

    async def write_msg(self, stream: INetStream, rpc_msg: rpc_pb2.RPC) -> bool:
        lock = self._write_locks.get(stream)
        if lock is None:
            lock = self._write_locks[stream] = trio.Lock()
        async with lock:
            return await super().write_msg(stream, rpc_msg)


class GossipPubsub(SerialPubsub):
    """The pubsub our `Gossip` runs: py-libp2p's, with the per-message costs and queues fixed for load.

    Measured at 20 msg/s across 10 in-process nodes (cProfile), each copy of a message that reached a
    node cost, before validation: a signed-peer-record verification (every RPC carries the sender's
    record, pubsub.py:563 and again gossipsub.py:932 for control; ~0.45 ms, secp256k1), and a task
    spawned per message copy (pubsub.py:584) whose `run_task` walks every task of the service to find
    its parent (trio_manager.py:277). Here:

    - a peer's record is verified when it changes, or after `RECORD_RECHECK_S` (the verdict for the
      same bytes cannot differ), and removed from the RPC before the router sees it;
    - each message is handled inline in the peer's read loop (our validators are synchronous, so
      `push_msg` never waits), duplicates cost one hash and a set lookup, and delivery order per
      peer is kept;
    - validated messages go straight to `deliver` (our `Gossip`), not through the 32-slot subscription
      channel (pubsub.py:124) that dropped a burst the drain task had not yet been scheduled for;
    - each peer's outbound queue is a `BatchingRpcQueue`.
    """

    def __init__(self, *args: Any, deliver: Callable[[rpc_pb2.Message], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deliver = deliver
        self._records: dict[ID, tuple[bytes, float]] = {}  # peer -> (verified record, when); live peers
        self.copies = 0  # message copies received on subscribed topics
        self.duplicate_copies = 0  # of those, already seen
        self.records_verified = 0
        self.outbound_merged = 0  # messages that joined an RPC already queued for a peer

    # --- inbound -----------------------------------------------------------------------------------

    def _accept_record(self, rpc: rpc_pb2.RPC, peer_id: ID) -> bool:
        """py-libp2p's `maybe_consume_signed_record`, once per distinct record (see the class doc)."""
        now = time.monotonic()
        known = self._records.get(peer_id)
        if known is not None and known[0] == rpc.senderRecord and now - known[1] < RECORD_RECHECK_S:
            return True
        if not maybe_consume_signed_record(rpc, self.host, peer_id):
            return False
        self.records_verified += 1
        self._records[peer_id] = (rpc.senderRecord, now)
        return True

    async def continuously_read_stream(self, stream: INetStream) -> None:
        """pubsub.py:547 with the changes of the class doc; the same exits and error handling.

        It reads whatever the stream holds and splits frames itself (`take_frames`): py-libp2p reads a
        frame's varint prefix one byte per `stream.read(1)`, each a pass through the stream's lock,
        yamux's buffer lock and its window accounting.
        """
        peer_id = stream.muxed_conn.peer_id
        buffer = bytearray()
        try:
            while self.manager.is_running:
                chunk = await stream.read(READ_CHUNK)
                if not chunk:
                    return
                buffer += chunk
                for frame in take_frames(buffer, self.max_inbound_rpc_size):
                    await self._handle_rpc(stream, peer_id, frame)
                    await trio.lowlevel.checkpoint()  # one read may hold many RPCs: let the senders run
        except MessageTooLarge as error:
            log.warning(
                "inbound pubsub RPC over the size limit", extra={"peer": str(peer_id), "error": str(error)}
            )
            with contextlib.suppress(Exception):
                await stream.reset()
            self._handle_dead_peer(peer_id)
        except (StreamEOF, StreamError, IOException, RawConnError):
            pass  # the stream or connection closed: pubsub's dead-peer path cleans up
        finally:
            self._records.pop(peer_id, None)

    async def _handle_rpc(self, stream: INetStream, peer_id: ID, incoming: bytes) -> None:
        rpc = rpc_pb2.RPC()
        rpc.ParseFromString(incoming)
        if rpc.HasField("senderRecord"):
            if not self._accept_record(rpc, peer_id):
                log.warning("invalid signed peer record in a pubsub RPC", extra={"peer": str(peer_id)})
                return
            rpc.ClearField("senderRecord")  # consumed: the router need not verify it again
        for message in rpc.publish:
            if not self._is_subscribed_to_msg(message):
                continue
            self.copies += 1
            if self._is_msg_seen(message):
                self.duplicate_copies += 1
                continue
            await self.push_msg(peer_id, message)
        if rpc.subscriptions:
            if len(rpc.subscriptions) > self.max_subscriptions_per_rpc:
                log.warning(
                    "pubsub RPC over the subscription limit ignored",
                    extra={"peer": str(peer_id), "subscriptions": len(rpc.subscriptions)},
                )
            else:
                for subscription in rpc.subscriptions:
                    self.handle_subscription(peer_id, subscription)
        if rpc.HasField("control"):
            await self.router.handle_rpc(rpc, peer_id)
        if stream.metric_send_channel is not None:
            event = GossipsubEvent()
            event.peer_id = peer_id.pretty()
            event.message_size = len(incoming)
            event.publish = bool(rpc.publish)
            event.subopts = bool(rpc.subscriptions)
            event.control = rpc.HasField("control")
            await stream.metric_send_channel.send(event)

    def notify_subscriptions(self, publish_message: rpc_pb2.Message) -> None:
        if any(topic in self.topic_ids for topic in publish_message.topicIDs):
            self.deliver(publish_message)

    # --- outbound ----------------------------------------------------------------------------------

    def _count_merged(self, messages: int) -> None:
        self.outbound_merged += messages

    async def handle_sending_messages(self, peer_id: ID, stream: INetStream, queue: RpcQueue) -> None:
        """pubsub.py:1250 on a `BatchingRpcQueue` that replaces the queue `_handle_new_peer` made."""
        if self.peer_queues.get(peer_id) is queue and not isinstance(queue, BatchingRpcQueue):
            batching = BatchingRpcQueue(on_merge=self._count_merged)
            self.peer_queues[peer_id] = batching
            while len(queue):  # pushed before this task started; pop() returns at once while non-empty
                rpc = await queue.pop()
                if rpc is not None:
                    batching.push(rpc, priority=not rpc.publish)
            queue = batching
        await super().handle_sending_messages(peer_id, stream, queue)


def _header_passes(header: Envelope, policy: TopicPolicy, run: str) -> bool:
    """The header checks open_envelope makes before the signature (spec/gossip.md, Validation 4-7)."""
    cls = policy.type_map.get(header.type)
    return (
        header.v == ENVELOPE_VERSION
        and cls is not None
        and len(header.body) <= int(cls.MAX_SIZE)  # type: ignore[attr-defined]
        and header.run == run
    )


def check_gossip_message(
    policy: TopicPolicy,
    data: bytes,
    *,
    run: str,
    now_ms: int,
    replay: ReplayWindow | None,
    authority: AuthorityView | None = None,
) -> Opened:
    """The message rule of a topic (spec/gossip.md, Validation), cheapest check first; raises Reject/Ignore.

    Size cap of the topic; then, given `authority`, the claimed signer's authority for the topic, read
    from the envelope header before any signature is verified or body decoded (a forged claim fails the
    signature next); then the signed envelope (version, type carried by the topic, body cap, run,
    signature, canonical body, clock skew, replay); then, on `ledger`, the entry's own operation.
    `authority=None` skips both authority checks (the message-rule vectors). Per-sender rates are applied
    after this, by the caller.
    """
    if len(data) > policy.max_bytes:
        raise Reject(Reason.OVERSIZED, f"{len(data)} bytes on {policy.kind}, cap {policy.max_bytes}")
    if authority is not None:
        header = decode(Envelope, data)
        if _header_passes(header, policy, run):  # else open_envelope says why not, as it always did
            authorise(policy.kind, header.sender, header.ts, authority)
    opened = open_envelope(data, run=run, now_ms=now_ms, replay=replay, types=policy.type_map)
    if authority is not None and isinstance(opened.message, LedgerEntry):
        check_ledger_entry(opened.message, authority)
    return opened


def content_id(message: rpc_pb2.Message) -> bytes:
    """Gossip message id: sha256 of the envelope bytes (unique per sender and seq)."""
    return sha256(message.data)


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

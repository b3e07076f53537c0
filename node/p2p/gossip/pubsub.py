"""py-libp2p's Pubsub with its per-message costs and queues fixed for load (`GossipPubsub`).

- Per message copy, py-libp2p verifies the sender's signed peer record (attached to every RPC), spawns a
  task, and reads the frame's length prefix one byte per stream read. `GossipPubsub` verifies a record
  once per peer and change, handles messages in the read loop, and splits frames from whole reads
  (`take_frames`): 4.2x less CPU for a burst that outruns one core (tests/p2p/test_gossip_load.py).
- Each subscription is a 32-message channel (pubsub.py:124), dropping with a log line when full
  (pubsub.py:1375): `GossipPubsub` hands each accepted message straight to its `deliver` callback (the
  service's queues) instead.
- The validation cache keeps its LRU order in a list, scanned and shifted on every put (pubsub.py:294):
  `OrderedValidationCache` keeps the same entries, TTL and evictions in O(1).
- Three tasks write to a peer's pubsub stream concurrently and yamux locks per frame, so large RPCs
  interleave into garbage (`SerialPubsub` serialises writes per stream).
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import trio
from libp2p.abc import INetStream
from libp2p.exceptions import ParseError
from libp2p.io.exceptions import IOException, MessageTooLarge
from libp2p.network.connection.exceptions import RawConnError
from libp2p.network.stream.exceptions import StreamEOF, StreamError
from libp2p.peer.id import ID
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import GossipsubEvent, Pubsub, ValidationCache, ValidationResult
from libp2p.pubsub.rpc_queue import RpcQueue
from libp2p.pubsub.utils import maybe_consume_signed_record

from swarmnode.node.p2p.gossip.outbound import BatchingRpcQueue
from swarmnode.protocol.types import KIB

log = logging.getLogger(__name__)

RECORD_RECHECK_S = 600.0
"""A peer's signed peer record, once verified, is verified again only when it changes or after this
long (it refreshes the record's 2 h TTL in the peerstore)."""


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


class OrderedValidationCache(ValidationCache):
    """py-libp2p's validation cache (same TTL, size and least-recently-used eviction) in O(1) per call.

    The original keeps its LRU order in a list: each `put` scans it for the id and evicts with
    `pop(0)`, each `get` removes the id from it, so every validated message cost a walk over up to
    `max_size` (1,000) ids: 2% of a node's CPU at 100 msg/s (py-spy).
    """

    def __init__(self, ttl: int, max_size: int, clock: Callable[[], float] = time.time) -> None:
        super().__init__(ttl, max_size)
        self.clock = clock  # py-libp2p stamps ValidationResult with time.time()
        self.cache: OrderedDict[bytes, ValidationResult] = OrderedDict()

    def get(self, msg_id: bytes) -> ValidationResult | None:
        result = self.cache.get(msg_id)
        if result is None:
            return None
        if self.clock() - result.timestamp > self.ttl:
            del self.cache[msg_id]
            return None
        self.cache.move_to_end(msg_id)
        return result

    def put(self, msg_id: bytes, result: ValidationResult) -> None:
        while self.cache and len(self.cache) >= self.max_size:  # as py-libp2p: even when refreshing
            self.cache.popitem(last=False)
        self.cache[msg_id] = result
        self.cache.move_to_end(msg_id)

    def _remove(self, msg_id: bytes) -> None:
        self.cache.pop(msg_id, None)

    def clear_expired(self) -> None:
        now = self.clock()
        for msg_id in [m for m, r in self.cache.items() if now - r.timestamp > self.ttl]:
            del self.cache[msg_id]


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
    - each peer's outbound queue is a `BatchingRpcQueue`;
    - the validation cache is an `OrderedValidationCache`.
    """

    def __init__(self, *args: Any, deliver: Callable[[rpc_pb2.Message], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        original = self.validation_cache
        self.validation_cache = OrderedValidationCache(original.ttl, original.max_size)
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

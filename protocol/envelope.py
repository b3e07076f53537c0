"""The signed envelope every protocol message travels in.

`{v, type, run, sender, seq, ts, body, sig}`. The signature is over keccak256 of a length-prefixed
domain string `swarmnode/<type>/v1`, the run id, the sender, seq, ts and the keccak256 of the canonical
body (so a contract can check it from the header and the body's hash): a signature
for one message type, run or position in the sender's sequence can never be passed off as another.
Replays are caught by (sender, seq) in a sliding window, so gossip reordering is tolerated.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from swarmnode.crypto.hashing import keccak256, sha256
from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.signing import InvalidSignature, recover_address
from swarmnode.protocol.codec import MaxLen, Size, decode, encode
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.protocol.messages import MESSAGE_TYPES
from swarmnode.protocol.types import MIB, Address

ENVELOPE_VERSION = 1
ENVELOPE_OVERHEAD = 512  # bytes an envelope adds around its body, generously
MAX_ENVELOPE_SIZE = 18 * MIB + ENVELOPE_OVERHEAD
MAX_CLOCK_SKEW_MS = 5 * 60 * 1000
REPLAY_WINDOW = 1024
MAX_REPLAY_SENDERS = 65_536  # senders a ReplayWindow tracks at once (~27 MiB at most, measured)
REPLAY_FLOOR_BUCKETS = 4096  # timestamp floors kept for evicted, still-fresh senders


@dataclass(frozen=True)
class Envelope:
    TYPE: ClassVar[str] = "envelope"
    MAX_SIZE: ClassVar[int] = MAX_ENVELOPE_SIZE

    v: int
    type: Annotated[str, MaxLen(32)]
    run: Annotated[str, MaxLen(64)]
    sender: Address
    seq: int
    ts: int
    body: Annotated[bytes, MaxLen(18 * MIB)]
    sig: Annotated[bytes, Size(65)]


def domain(message_type: str) -> bytes:
    return f"swarmnode/{message_type}/v1".encode()


def _lp(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def signing_digest(message_type: str, run: str, sender: bytes, seq: int, ts: int, body: bytes) -> bytes:
    """keccak256(lp(domain) || lp(run) || sender || u64 seq || u64 ts || keccak256(body)).

    The body enters by its hash, so a contract can recompute the digest of an envelope from its header
    fields and a 32-byte body hash, and check the signature with ecrecover (spec/ledger.md, Slash).
    """
    return signing_digest_of_body_hash(message_type, run, sender, seq, ts, keccak256(body))


def signing_digest_of_body_hash(
    message_type: str, run: str, sender: bytes, seq: int, ts: int, body_hash: bytes
) -> bytes:
    head = _lp(domain(message_type)) + _lp(run.encode()) + sender + struct.pack(">QQ", seq, ts)
    return keccak256(head + body_hash)


def seal(identity: NodeIdentity, message: Any, *, run: str, seq: int, ts: int) -> bytes:
    """Encode, sign and wrap a message; returns the envelope's canonical bytes."""
    body = encode(message)
    message_type = type(message).TYPE
    sender = identity.address
    sig = identity.sign(signing_digest(message_type, run, sender, seq, ts, body))
    return encode(Envelope(ENVELOPE_VERSION, message_type, run, sender, seq, ts, body, sig))


def envelope_digest(envelope_bytes: bytes) -> bytes:
    """The name of a signed message: sha256 of its envelope bytes (the submission digest, the evidence id)."""
    return sha256(envelope_bytes)


@dataclass(slots=True)
class SenderWindow:
    """One sender's replay state: the highest accepted seq, a bitmap of accepted seqs below it
    (bit k set: seq `highest - k` was accepted), the newest accepted timestamp, and the floor of its
    bucket when it was (re)admitted: messages at or below it may have been forgotten with an earlier state."""

    highest: int
    bits: int
    newest_ts: int
    floor_ts: int


@dataclass
class ReplayWindow:
    """Per-sender sliding window of accepted sequence numbers, bounded in senders and in time.

    A seq at or below `highest - window` is stale; one already seen within the window is a replay.
    Pure state: time arrives as arguments (`ts` of the message, `now_ms` of the receiver).

    Bounds (spec/wire.md, "Replay protection"):
    - Expiry. A sender whose newest accepted `ts` is older than `now_ms - expiry_ms` is forgotten.
      Nothing replayable is lost: every message it had accepted has `ts <= newest_ts < now - expiry`,
      so from then on the clock check (|now - ts| <= MAX_CLOCK_SKEW_MS = expiry_ms) refuses a replay.
      The window keeps the highest `now_ms` it was given (`clock_ms`) and refuses any
      `ts < clock_ms - expiry_ms`, so the argument holds even if the caller's clock steps back.
    - Size. At most `max_senders` are tracked; past that the least recently accepted is evicted.
      If it was still fresh, its newest `ts` becomes the floor of its bucket (a keyed hash of the
      sender): a sender of that bucket admitted afterwards is refused for `ts <= floor` (the floor is
      captured when it is admitted, so a later sybil eviction never touches a tracked sender). Safety is
      kept; under an identity flood an honest newcomer may be refused until its bucket's floor is in the past
      (at most 2 x MAX_CLOCK_SKEW_MS), never a replay accepted.
    Memory: about 420 bytes per tracked sender (measured; the seen set is one window-bit integer)
    plus 8 bytes per bucket.
    """

    window: int = REPLAY_WINDOW
    max_senders: int = MAX_REPLAY_SENDERS
    expiry_ms: int = MAX_CLOCK_SKEW_MS
    buckets: int = REPLAY_FLOOR_BUCKETS
    salt: bytes = field(default_factory=lambda: os.urandom(16))
    senders: OrderedDict[bytes, SenderWindow] = field(default_factory=OrderedDict)
    floors: list[int] = field(default_factory=list)
    clock_ms: int = 0
    expired: int = 0
    evicted_fresh: int = 0

    def __post_init__(self) -> None:
        if self.window < 1 or self.max_senders < 1 or self.buckets < 1:
            raise ValueError("a replay window needs window, max_senders and buckets >= 1")
        if not self.floors:
            self.floors = [-1] * self.buckets

    def _bucket(self, sender: bytes) -> int:
        digest = hashlib.blake2b(sender, key=self.salt, digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.buckets

    def check(self, sender: bytes, seq: int, *, ts: int, now_ms: int) -> None:
        """Raise Ignore if (sender, seq) is a replay, too old, or may be a replay of forgotten state;
        changes nothing."""
        horizon = max(self.clock_ms, now_ms) - self.expiry_ms
        if ts < horizon:
            raise Ignore(Reason.REPLAYED_SEQ, f"ts {ts} is older than the replay horizon {horizon}")
        state = self.senders.get(sender)
        floor = self.floors[self._bucket(sender)] if state is None else state.floor_ts
        if ts <= floor:
            raise Ignore(
                Reason.REPLAYED_SEQ, f"ts {ts} is at or below a forgotten sender's newest ts {floor}"
            )
        if state is None:
            return
        if seq <= state.highest - self.window:
            raise Ignore(
                Reason.REPLAYED_SEQ, f"seq {seq} is older than the replay window (highest {state.highest})"
            )
        if seq <= state.highest and state.bits >> (state.highest - seq) & 1:
            raise Ignore(Reason.REPLAYED_SEQ, f"seq {seq} from {sender.hex()} was already accepted")

    def record(self, sender: bytes, seq: int, *, ts: int, now_ms: int) -> None:
        """Remember an accepted (sender, seq, ts); expires and evicts to stay within the bounds."""
        self.clock_ms = max(self.clock_ms, now_ms)
        self._expire()
        state = self.senders.pop(sender, None)
        if state is None:
            while len(self.senders) >= self.max_senders:
                self._evict_oldest()
            state = SenderWindow(seq, 1, ts, self.floors[self._bucket(sender)])
        elif seq > state.highest:
            shift = seq - state.highest
            state.bits = ((state.bits << shift) | 1) & ((1 << self.window) - 1) if shift < self.window else 1
            state.highest = seq
        else:
            state.bits |= 1 << (state.highest - seq)
        state.newest_ts = max(state.newest_ts, ts)
        self.senders[sender] = state  # most recently accepted last

    def _expire(self) -> None:
        horizon = self.clock_ms - self.expiry_ms
        while self.senders:
            oldest = next(iter(self.senders.values()))
            if oldest.newest_ts >= horizon:
                break
            self.senders.popitem(last=False)
            self.expired += 1

    def _evict_oldest(self) -> None:
        sender, state = self.senders.popitem(last=False)
        if state.newest_ts >= self.clock_ms - self.expiry_ms:
            bucket = self._bucket(sender)
            self.floors[bucket] = max(self.floors[bucket], state.newest_ts)
            self.evicted_fresh += 1
        else:
            self.expired += 1

    def statistics(self) -> dict[str, int]:
        return {
            "senders": len(self.senders),
            "tracked_seqs": sum(s.bits.bit_count() for s in self.senders.values()),
            "expired": self.expired,
            "evicted_fresh": self.evicted_fresh,
        }


@dataclass(frozen=True)
class Opened:
    """A verified envelope and its decoded body."""

    envelope: Envelope
    message: Any

    @property
    def sender(self) -> bytes:
        return self.envelope.sender


def open_envelope(
    data: bytes,
    *,
    run: str | None,
    now_ms: int,
    replay: ReplayWindow | None,
    types: Mapping[str, type] = MESSAGE_TYPES,
    expect: type | None = None,
) -> Opened:
    """Decode and verify an envelope, cheapest checks first; raise Reject or Ignore with the reason.

    Order (spec/wire.md): size cap, envelope header, body cap, run, signature, clock, replay, and
    only then the body is decoded. A stale or replayed message is ignored before its body costs
    anything and before a malformed body could be blamed on a signer who may not have sent it now.

    `run=None` accepts any run (the run descriptor bootstrap); `replay=None` skips replay tracking
    (for re-verifying stored evidence). The replay window is updated only when every check passed.
    """
    envelope = decode(Envelope, data)
    if envelope.v != ENVELOPE_VERSION:
        raise Reject(
            Reason.UNSUPPORTED_VERSION, f"envelope version {envelope.v}, this node speaks {ENVELOPE_VERSION}"
        )
    cls = types.get(envelope.type)
    if cls is None:
        raise Reject(Reason.UNKNOWN_TYPE, f"unknown message type {envelope.type!r}")
    if expect is not None and cls is not expect:
        raise Reject(Reason.TYPE_MISMATCH, f"expected {expect.TYPE}, got {envelope.type}")  # type: ignore[attr-defined]
    if len(envelope.body) > cls.MAX_SIZE:  # type: ignore[attr-defined]
        raise Reject(Reason.OVERSIZED, f"{envelope.type} body of {len(envelope.body)} bytes exceeds its cap")
    if run is not None and envelope.run != run:
        raise Ignore(Reason.WRONG_RUN, f"message for run {envelope.run!r}, not {run!r}")
    digest = signing_digest(
        envelope.type, envelope.run, envelope.sender, envelope.seq, envelope.ts, envelope.body
    )
    try:
        signer = recover_address(digest, envelope.sig)
    except InvalidSignature as exc:
        raise Reject(Reason.BAD_SIGNATURE, str(exc)) from None
    if signer != envelope.sender:
        raise Reject(Reason.BAD_SIGNATURE, "signature does not match the sender")
    if abs(now_ms - envelope.ts) > MAX_CLOCK_SKEW_MS:
        raise Ignore(Reason.CLOCK_SKEW, f"timestamp {envelope.ts} is {now_ms - envelope.ts} ms from now")
    if replay is not None:
        replay.check(envelope.sender, envelope.seq, ts=envelope.ts, now_ms=now_ms)
    message: object = decode(cls, envelope.body)
    if replay is not None:
        replay.record(envelope.sender, envelope.seq, ts=envelope.ts, now_ms=now_ms)
    return Opened(envelope, message)

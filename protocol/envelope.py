"""The signed envelope every protocol message travels in.

`{v, type, run, sender, seq, ts, body, sig}`. The signature is over keccak256 of a length-prefixed
domain string `swarmnode/<type>/v1`, the run id, the sender, seq, ts and the canonical body: a signature
for one message type, run or position in the sender's sequence can never be passed off as another.
Replays are caught by (sender, seq) in a sliding window, so gossip reordering is tolerated.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from crypto.identity import NodeIdentity
from crypto.signing import InvalidSignature, recover_address
from crypto.hashing import keccak256, sha256
from protocol.codec import MaxLen, Size, decode, encode
from protocol.errors import Ignore, Reason, Reject
from protocol.messages import MESSAGE_TYPES
from protocol.types import MIB, Address

ENVELOPE_VERSION = 1
ENVELOPE_OVERHEAD = 512  # bytes an envelope adds around its body, generously
MAX_ENVELOPE_SIZE = 18 * MIB + ENVELOPE_OVERHEAD
MAX_CLOCK_SKEW_MS = 5 * 60 * 1000
REPLAY_WINDOW = 1024


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
    """keccak256(lp(domain) || lp(run) || sender || u64 seq || u64 ts || lp(body))."""
    payload = _lp(domain(message_type)) + _lp(run.encode()) + sender + struct.pack(">QQ", seq, ts) + _lp(body)
    return keccak256(payload)


def seal(identity: NodeIdentity, message: Any, *, run: str, seq: int, ts: int) -> bytes:
    """Encode, sign and wrap a message; returns the envelope's canonical bytes."""
    body = encode(message)
    message_type = type(message).TYPE
    sender = identity.address
    sig = identity.sign(signing_digest(message_type, run, sender, seq, ts, body))
    return encode(Envelope(ENVELOPE_VERSION, message_type, run, sender, seq, ts, body, sig))


def envelope_digest(envelope_bytes: bytes) -> bytes:
    """The name of a signed message: sha256 of its envelope bytes (used as submission digests, evidence ids)."""
    return sha256(envelope_bytes)


@dataclass
class ReplayWindow:
    """Per-sender sliding window of accepted sequence numbers.

    A seq at or below `highest - window` is stale; one already seen within the window is a replay.
    State is explicit so callers can persist it and tests can construct it.
    """

    window: int = REPLAY_WINDOW
    highest: dict[bytes, int] = field(default_factory=dict)
    seen: dict[bytes, set[int]] = field(default_factory=dict)

    def check(self, sender: bytes, seq: int) -> None:
        """Raise Ignore if (sender, seq) is a replay or too old; changes nothing."""
        top = self.highest.get(sender)
        if top is None:
            return
        if seq <= top - self.window:
            raise Ignore(Reason.REPLAYED_SEQ, f"seq {seq} is older than the replay window (highest {top})")
        if seq in self.seen.get(sender, ()):
            raise Ignore(Reason.REPLAYED_SEQ, f"seq {seq} from {sender.hex()} was already accepted")

    def record(self, sender: bytes, seq: int) -> None:
        top = max(seq, self.highest.get(sender, seq))
        self.highest[sender] = top
        seen = self.seen.setdefault(sender, set())
        seen.add(seq)
        if len(seen) > self.window:
            seen.difference_update({s for s in seen if s <= top - self.window})

    def statistics(self) -> dict[str, int]:
        return {"senders": len(self.highest), "tracked_seqs": sum(len(s) for s in self.seen.values())}


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

    `run=None` accepts any run (the run descriptor bootstrap); `replay=None` skips replay tracking
    (for re-verifying stored evidence). The replay window is updated only when every check passed.
    """
    envelope = decode(Envelope, data)
    if envelope.v != ENVELOPE_VERSION:
        raise Reject(Reason.UNSUPPORTED_VERSION, f"envelope version {envelope.v}, this node speaks {ENVELOPE_VERSION}")
    cls = types.get(envelope.type)
    if cls is None:
        raise Reject(Reason.UNKNOWN_TYPE, f"unknown message type {envelope.type!r}")
    if expect is not None and cls is not expect:
        raise Reject(Reason.TYPE_MISMATCH, f"expected {expect.TYPE}, got {envelope.type}")  # type: ignore[attr-defined]
    if len(envelope.body) > cls.MAX_SIZE:  # type: ignore[attr-defined]
        raise Reject(Reason.OVERSIZED, f"{envelope.type} body of {len(envelope.body)} bytes exceeds its cap")
    if run is not None and envelope.run != run:
        raise Ignore(Reason.WRONG_RUN, f"message for run {envelope.run!r}, not {run!r}")
    digest = signing_digest(envelope.type, envelope.run, envelope.sender, envelope.seq, envelope.ts, envelope.body)
    try:
        signer = recover_address(digest, envelope.sig)
    except InvalidSignature as exc:
        raise Reject(Reason.BAD_SIGNATURE, str(exc)) from None
    if signer != envelope.sender:
        raise Reject(Reason.BAD_SIGNATURE, "signature does not match the sender")
    message = decode(cls, envelope.body)
    if abs(now_ms - envelope.ts) > MAX_CLOCK_SKEW_MS:
        raise Ignore(Reason.CLOCK_SKEW, f"timestamp {envelope.ts} is {now_ms - envelope.ts} ms from now")
    if replay is not None:
        replay.check(envelope.sender, envelope.seq)
        replay.record(envelope.sender, envelope.seq)
    return Opened(envelope, message)

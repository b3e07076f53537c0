"""Verdict batches: how a validator's verdicts travel on gossip (spec/gossip.md, Verdict batches).

Pure: the batcher is told when to flush, the check gets the signer and the run as arguments. A validator
gossips its verdicts of one run as `VerdictBatch`es, signed once: a receiver verifies one signature per
batch. The rules a receiver applies are the single verdict's (its codec bounds) plus the batch's own;
a batch that breaks one of them for one verdict is refused whole, so nothing of it is applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarmnode.protocol.codec import encode
from swarmnode.protocol.envelope import Opened
from swarmnode.protocol.errors import Reason, Reject
from swarmnode.protocol.messages import VERDICT_BATCH_MAX_ITEMS, VERDICT_BATCH_MAX_SIZE, Verdict, VerdictBatch

ARRAY16_EXTRA = 2  # a msgpack array of 16..65535 items has a 3-byte header, not the 1-byte fixarray's


def batch_header_size(run: str, validator: bytes) -> int:
    """Bytes a batch's body adds around its verdicts' bodies (at most: the array header at its widest)."""
    return len(encode(VerdictBatch(run, validator, ()))) + ARRAY16_EXTRA


def check_verdict_batch(batch: VerdictBatch, *, signer: bytes, run: str) -> tuple[Verdict, ...]:
    """The batch rule; returns its verdicts, or raises Reject naming the first broken rule.

    `run` is the envelope's run (gossip checks it is this node's run before the body is decoded) and
    `signer` the envelope's verified sender. Each verdict's own bounds were checked by the decoder.
    """
    if batch.run != run:
        raise Reject(Reason.RULE_VIOLATION, f"batch names run {batch.run!r}, envelope {run!r}")
    if batch.validator != signer:
        named, signed = batch.validator.hex(), signer.hex()
        raise Reject(Reason.WRONG_SENDER, f"batch names validator {named}, signed by {signed}")
    if not batch.verdicts:
        raise Reject(Reason.RULE_VIOLATION, "a verdict batch carries at least one verdict")
    seen: set[bytes] = set()
    for i, verdict in enumerate(batch.verdicts):
        if verdict.run != batch.run:
            raise Reject(Reason.RULE_VIOLATION, f"verdict {i} names run {verdict.run!r}, batch {batch.run!r}")
        if verdict.submission_digest in seen:
            digest = verdict.submission_digest.hex()[:16]
            raise Reject(Reason.RULE_VIOLATION, f"verdict {i} repeats submission {digest}")
        seen.add(verdict.submission_digest)
    return batch.verdicts


def check_opened_verdicts(opened: Opened) -> tuple[Verdict, ...]:
    """The batch rule on a verified envelope (gossip validation, check 11b on `verdicts`)."""
    batch = opened.message
    if not isinstance(batch, VerdictBatch):
        raise Reject(Reason.TYPE_MISMATCH, f"expected {VerdictBatch.TYPE}, got {opened.envelope.type}")
    return check_verdict_batch(batch, signer=opened.sender, run=opened.envelope.run)


@dataclass
class VerdictBatcher:
    """One validator's verdicts of one run, collected into batches that are full by count or by bytes.

    `add` hands back the batches a verdict completes; `take` empties what is pending (the caller calls it
    every flush interval, on its own clock). Any single verdict fits a batch: a Verdict body is at most
    `Verdict.MAX_SIZE`, and `max_bytes` must leave room for one.
    """

    run: str
    validator: bytes
    max_items: int = VERDICT_BATCH_MAX_ITEMS
    max_bytes: int = VERDICT_BATCH_MAX_SIZE
    _items: list[Verdict] = field(default_factory=list, init=False, repr=False)
    _size: int = field(default=0, init=False, repr=False)
    _header: int = field(default=0, init=False, repr=False)
    _digests: set[bytes] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self._header = self._size = batch_header_size(self.run, self.validator)
        if not 1 <= self.max_items <= VERDICT_BATCH_MAX_ITEMS:
            raise ValueError(f"max_items must be in [1, {VERDICT_BATCH_MAX_ITEMS}], not {self.max_items}")
        if not self._header + Verdict.MAX_SIZE <= self.max_bytes <= VERDICT_BATCH_MAX_SIZE:
            raise ValueError(
                f"max_bytes must be in [{self._header + Verdict.MAX_SIZE}, {VERDICT_BATCH_MAX_SIZE}],"
                f" not {self.max_bytes}"
            )

    def __len__(self) -> int:
        return len(self._items)

    @property
    def pending_bytes(self) -> int:
        """The encoded size the pending batch would have, at most."""
        return self._size

    def add(self, verdict: Verdict) -> tuple[VerdictBatch, ...]:
        """Queue `verdict`; return the batches it completed: the pending one if `verdict` does not fit its
        bytes or repeats one of its submissions (it starts the next), and the next if that is full."""
        if verdict.run != self.run:
            raise ValueError(f"verdict names run {verdict.run!r}, batcher {self.run!r}")
        size = len(encode(verdict))
        done: list[VerdictBatch] = []
        if self._items and (self._size + size > self.max_bytes or verdict.submission_digest in self._digests):
            done.append(self._take())
        self._items.append(verdict)
        self._digests.add(verdict.submission_digest)
        self._size += size
        if len(self._items) >= self.max_items:
            done.append(self._take())
        return tuple(done)

    def take(self) -> VerdictBatch | None:
        """The pending batch (None when nothing is pending), and start an empty one."""
        return self._take() if self._items else None

    def _take(self) -> VerdictBatch:
        batch = VerdictBatch(self.run, self.validator, tuple(self._items))
        self._items, self._digests, self._size = [], set(), self._header
        return batch

"""Batched credits: the Merkle tree over a CommitCredits' leaves, its inclusion proofs, and the contract's
key for "this assignment was credited" (spec/ledger.md, Batched credits). Pure functions.

Everything is keccak256 over ABI words so the contract computes the same bytes: a leaf is
`keccak256(abi.encode(address worker, uint64 step, uint64 tokens, uint64 flops, bytes32 rollout_digest))`
(160 bytes hashed); an inner node is `keccak256(left || right)` (64 bytes: a node can never be read as a
leaf); the last node of an odd level moves up unchanged. The root of one leaf is the leaf.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from swarmnode.crypto.hashing import keccak256
from swarmnode.ledger.types import BatchRecord, ContributionRecord
from swarmnode.protocol.ledger_messages import Credit

MAX_PROOF_DEPTH = 16  # 2^16 leaves, far above MAX_CREDITS_PER_BATCH; the contract's loop bound
LOW_COUNTERS = 32  # counters below this share a slot across 8 versions (workers rarely go higher)
VERSIONS_PER_SLOT = 8


def word(value: int) -> bytes:
    return value.to_bytes(32, "big")


def address_word(address: bytes) -> bytes:
    return b"\0" * 12 + address


def credit_leaf(credit: Credit) -> bytes:
    return keccak256(
        address_word(credit.worker)
        + word(credit.step)
        + word(credit.tokens)
        + word(credit.flops)
        + credit.rollout_digest
    )


def _parent(left: bytes, right: bytes) -> bytes:
    return keccak256(left + right)


def _next_level(level: Sequence[bytes]) -> list[bytes]:
    return [
        _parent(level[i], level[i + 1]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)
    ]


def credits_root(leaves: Sequence[bytes]) -> bytes:
    if not leaves:
        raise ValueError("a batch has at least one credit")
    level = list(leaves)
    while len(level) > 1:
        level = _next_level(level)
    return level[0]


def credit_path(leaves: Sequence[bytes], index: int) -> tuple[bytes, ...]:
    """The siblings from leaf `index` up to the root (levels where it has none are skipped)."""
    if not 0 <= index < len(leaves):
        raise IndexError(f"leaf {index} is outside a batch of {len(leaves)}")
    path: list[bytes] = []
    level = list(leaves)
    while len(level) > 1:
        sibling = index ^ 1
        if sibling < len(level):
            path.append(level[sibling])
        level = _next_level(level)
        index //= 2
    return tuple(path)


def root_from_path(leaf: bytes, index: int, count: int, path: Sequence[bytes]) -> bytes | None:
    """The root a path leads to, or None when the path's length does not fit (index, count)."""
    if not 0 <= index < count or len(path) > MAX_PROOF_DEPTH:
        return None
    node, used, size = leaf, 0, count
    while size > 1:
        if index % 2 == 1 or index + 1 < size:
            if used >= len(path):
                return None
            sibling = path[used]
            used += 1
            node = _parent(sibling, node) if index % 2 == 1 else _parent(node, sibling)
        index //= 2
        size = (size + 1) // 2
    return node if used == len(path) else None


@dataclass(frozen=True)
class CreditProof:
    """Contribution `contribution` is leaf `leaf_index` of batch `batch` (`count` leaves, root `root`)."""

    contribution: int
    batch: int
    run: str
    validator: bytes
    leaf_index: int
    count: int
    credit: Credit
    path: tuple[bytes, ...]
    root: bytes

    def verify(self) -> bool:
        return root_from_path(credit_leaf(self.credit), self.leaf_index, self.count, self.path) == self.root


def batch_contributions(batch: BatchRecord, credits: Sequence[Credit]) -> list[ContributionRecord]:
    """The contribution records a batch's credits become, numbered from its first contribution."""
    return [
        ContributionRecord(
            index=batch.first_contribution + offset,
            run=batch.run,
            step=c.step,
            worker=c.worker,
            validator=batch.validator,
            tokens=c.tokens,
            flops=c.flops,
            rollout_digest=c.rollout_digest,
            batch=batch.index,
            epoch=batch.epoch,
        )
        for offset, c in enumerate(credits)
    ]


def credits_of(records: Sequence[ContributionRecord]) -> list[Credit]:
    """The credits (the batch's leaves) that contribution records were made from."""
    return [Credit(r.worker, r.step, r.tokens, r.flops, r.rollout_digest) for r in records]


def credit_proof(contribution: int, batch: BatchRecord, credits: Sequence[Credit]) -> CreditProof:
    """The proof that contribution `contribution` is in `batch`, whose leaves are `credits` (in order)."""
    leaf_index = contribution - batch.first_contribution
    if not 0 <= leaf_index < len(credits):
        raise IndexError(f"contribution {contribution} is not in batch {batch.index}")
    return CreditProof(
        contribution=contribution,
        batch=batch.index,
        run=batch.run,
        validator=batch.validator,
        leaf_index=leaf_index,
        count=batch.count,
        credit=credits[leaf_index],
        path=credit_path([credit_leaf(c) for c in credits], leaf_index),
        root=batch.root,
    )


def run_key(run: str) -> bytes:
    """How the contract names a run: keccak256 of its id's UTF-8 bytes."""
    return keccak256(run.encode())


def credit_slot(run: str, worker: bytes, step: int) -> tuple[bytes, int]:
    """The contract's storage key and bit recording that assignment (run, worker, step) was credited.

    One 256-bit slot holds counters 0..31 of eight consecutive versions, so a worker's usual credits cost
    one fresh slot (22,100 gas) per eight versions; a counter of 32 or more gets a slot per 256 counters of
    its version (bucket 1 + counter // 256).
    """
    version, counter = step >> 32, step & 0xFFFFFFFF
    if counter < LOW_COUNTERS:
        group, bucket = version // VERSIONS_PER_SLOT, 0
        bit = (version % VERSIONS_PER_SLOT) * LOW_COUNTERS + counter
    else:
        group, bucket, bit = version, 1 + (counter >> 8), counter & 0xFF
    return keccak256(run_key(run) + address_word(worker) + word(group) + word(bucket)), bit

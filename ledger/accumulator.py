"""Incremental RFC 6962 tree head: O(log n) per append instead of rehashing the whole log.

An RFC 6962 tree of n leaves is the perfect subtrees of n's binary decomposition, largest on the left,
folded from the right. Keeping one root per set bit (like a binary counter) gives the same head as
`crypto.merkle.merkle_root` over all leaves; the tests hold the two equal for every size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from swarmnode.crypto.hashing import sha256
from swarmnode.crypto.merkle import leaf_hash, node_hash


@dataclass
class MerkleAccumulator:
    size: int = 0
    peaks: list[tuple[int, bytes]] = field(default_factory=list)  # (subtree size, root), largest first

    def append(self, leaf: bytes) -> None:
        self.peaks.append((1, leaf_hash(leaf)))
        while len(self.peaks) >= 2 and self.peaks[-1][0] == self.peaks[-2][0]:
            (n, right), (_, left) = self.peaks.pop(), self.peaks.pop()
            self.peaks.append((2 * n, node_hash(left, right)))
        self.size += 1

    def root(self) -> bytes:
        if not self.peaks:
            return sha256(b"")
        current = self.peaks[-1][1]
        for _, peak in reversed(self.peaks[:-1]):
            current = node_hash(peak, current)
        return current

    def copy(self) -> MerkleAccumulator:
        return MerkleAccumulator(self.size, list(self.peaks))

"""RFC 6962 Merkle trees (Certificate Transparency): leaf and node hashes are domain-separated.

Used for the shard list of a checkpoint manifest and for ledger epoch checkpoints. The 0x00 / 0x01
prefixes stop an attacker from passing an inner node off as a leaf (second-preimage attack).
"""

from __future__ import annotations

from collections.abc import Sequence

from swarmnode.crypto.hashing import sha256

LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"


def leaf_hash(data: bytes) -> bytes:
    return sha256(LEAF_PREFIX + data)


def node_hash(left: bytes, right: bytes) -> bytes:
    return sha256(NODE_PREFIX + left + right)


def _split(n: int) -> int:
    """Largest power of two strictly less than n (n >= 2)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def _root_of_hashes(hashes: Sequence[bytes]) -> bytes:
    if len(hashes) == 1:
        return hashes[0]
    k = _split(len(hashes))
    return node_hash(_root_of_hashes(hashes[:k]), _root_of_hashes(hashes[k:]))


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """Merkle Tree Hash of the leaves; the empty tree hashes to sha256(b"")."""
    if not leaves:
        return sha256(b"")
    return _root_of_hashes([leaf_hash(leaf) for leaf in leaves])


def _path(index: int, hashes: Sequence[bytes]) -> list[bytes]:
    if len(hashes) == 1:
        return []
    k = _split(len(hashes))
    if index < k:
        return _path(index, hashes[:k]) + [_root_of_hashes(hashes[k:])]
    return _path(index - k, hashes[k:]) + [_root_of_hashes(hashes[:k])]


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """Audit path for leaf `index`, bottom-up, as in RFC 6962 section 2.1.1."""
    if not 0 <= index < len(leaves):
        raise IndexError(f"leaf index {index} outside a tree of {len(leaves)} leaves")
    return _path(index, [leaf_hash(leaf) for leaf in leaves])


def root_from_inclusion_proof(leaf: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes:
    """Recompute the root an audit path implies (RFC 9162 section 2.1.3.2); raise if the path is malformed."""
    if not 0 <= index < size:
        raise ValueError(f"leaf index {index} outside a tree of {size} leaves")
    fn, sn = index, size - 1
    current = leaf_hash(leaf)
    for sibling in proof:
        if sn == 0:
            raise ValueError("audit path is longer than the tree is deep")
        if fn & 1 or fn == sn:
            current = node_hash(sibling, current)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            current = node_hash(current, sibling)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ValueError("audit path is shorter than the tree is deep")
    return current


def is_included(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """True when `proof` shows `leaf` at `index` in the tree of `size` leaves with this `root`."""
    try:
        return root_from_inclusion_proof(leaf, index, size, proof) == root
    except ValueError:
        return False

"""Hash functions used by the protocol.

sha256 names content (shards, tasks, rollouts) because every tool has it; keccak256 is used only
where a digest is signed, so the same signature can be checked by an EVM contract with `ecrecover`.
"""

from __future__ import annotations

import hashlib

from eth_hash.auto import keccak as _keccak

DIGEST_SIZE = 32


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def keccak256(data: bytes) -> bytes:
    return _keccak(data)

"""Hash functions used by the protocol.

sha256 names content (shards, tasks, rollouts) because every tool has it; keccak256 is used only
where a digest is signed, so the same signature can be checked by an EVM contract with `ecrecover`.

keccak256 runs on every seal and open, so it calls the fastest installed backend directly rather than
through eth_hash's dispatch: pysha3's C Keccak when it is installed (0.7 µs on 32 bytes, 53 µs on 26 KB),
else pycryptodome's, which libp2p already depends on (4.5 µs / 69 µs). Both are the original
(pre-SHA-3 padding) Keccak-256 that Ethereum uses; tests/test_crypto_fast.py holds them to each other.
"""

from __future__ import annotations

import hashlib

from Crypto.Hash import keccak as _cryptodome_keccak

DIGEST_SIZE = 32


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def keccak256_pycryptodome(data: bytes) -> bytes:
    """Keccak-256 through pycryptodome: the fallback, always installed."""
    return _cryptodome_keccak.new(data=data, digest_bits=256).digest()


try:
    from sha3 import keccak_256 as _pysha3_keccak_256  # safe-pysha3, optional
except ImportError:
    KECCAK_BACKEND = "pycryptodome"
    keccak256 = keccak256_pycryptodome
else:
    KECCAK_BACKEND = "pysha3"

    def keccak256(data: bytes) -> bytes:
        """Keccak-256 as Ethereum uses it (not NIST SHA3-256)."""
        digest: bytes = _pysha3_keccak_256(data).digest()
        return digest

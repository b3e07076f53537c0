"""Recoverable secp256k1 signatures over 32-byte digests, in Ethereum's layout.

A signature is 65 bytes `r || s || v` with `v` in {27, 28}, low-s only. Verification recovers the
signer's 20-byte address, so a message names its sender by address and an EVM contract can check the
same signature with `ecrecover`. High-s signatures are refused: they are the malleable twin of a
valid one and would let a third party mint a second "distinct" signature.
"""

from __future__ import annotations

import coincurve

from swarmnode.crypto.hashing import keccak256

SIGNATURE_SIZE = 65
_SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141


class InvalidSignature(ValueError):
    """The signature is malformed or does not recover to a valid public key."""


def address_of_point(public_key: coincurve.PublicKey) -> bytes:
    """Ethereum address: the last 20 bytes of keccak256 of the uncompressed key without its 0x04 prefix."""
    return keccak256(public_key.format(compressed=False)[1:])[-20:]


def address_of_public_key(public_key: bytes) -> bytes:
    """`address_of_point` of a serialised (33- or 65-byte) key; ValueError if it is not on the curve."""
    return address_of_point(coincurve.PublicKey(public_key))


def sign_digest_with(key: coincurve.PrivateKey, digest: bytes) -> bytes:
    """Sign a 32-byte digest with a parsed key; returns `r || s || v` (v = 27 + recovery id).

    Takes the parsed key so a long-lived signer pays for parsing it (and deriving its public key) once.
    libsecp256k1 signs deterministically (RFC 6979) and always low-s.
    """
    if len(digest) != 32:
        raise ValueError("digest must be 32 bytes")
    rsv = key.sign_recoverable(digest, hasher=None)
    return rsv[:64] + bytes([27 + rsv[64]])


def sign_digest(private_key: bytes, digest: bytes) -> bytes:
    """`sign_digest_with` from the raw 32-byte private key."""
    return sign_digest_with(coincurve.PrivateKey(private_key), digest)


def recover_address(digest: bytes, signature: bytes) -> bytes:
    """Return the address that produced `signature` over `digest`, or raise InvalidSignature."""
    if len(digest) != 32:
        raise InvalidSignature("digest must be 32 bytes")
    if len(signature) != SIGNATURE_SIZE:
        raise InvalidSignature(f"signature must be {SIGNATURE_SIZE} bytes, got {len(signature)}")
    r = int.from_bytes(signature[:32], "big")
    s = int.from_bytes(signature[32:64], "big")
    v = signature[64]
    if v not in (27, 28):
        raise InvalidSignature(f"v must be 27 or 28, got {v}")
    if not (0 < r < _SECP256K1_N and 0 < s <= _SECP256K1_N // 2):
        raise InvalidSignature("r or s out of range (high-s signatures are refused)")
    try:
        public_key = coincurve.PublicKey.from_signature_and_message(
            signature[:64] + bytes([v - 27]), digest, hasher=None
        )
    except Exception as exc:  # coincurve raises a bare Exception on unrecoverable input
        raise InvalidSignature("signature does not recover to a public key") from exc
    return address_of_point(public_key)

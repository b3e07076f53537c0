"""The fast crypto paths give the bytes of independent references.

keccak256 is held to published vectors and to pycryptodome and eth_hash; signing and recovery to
eth_keys' pure-Python secp256k1 backend, which shares no code with libsecp256k1.
"""

from __future__ import annotations

import copy
import pickle

import pytest
from eth_hash.backends import pycryptodome as eth_hash_pycryptodome
from eth_keys import KeyAPI
from eth_keys.backends import NativeECCBackend
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.crypto.hashing import KECCAK_BACKEND, keccak256, keccak256_pycryptodome
from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.signing import InvalidSignature, address_of_public_key, recover_address, sign_digest

_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
_REFERENCE = KeyAPI(NativeECCBackend)
_eth_hash_keccak = eth_hash_pycryptodome.CryptodomeBackend().keccak256

private_keys = st.integers(1, _N - 1).map(lambda n: n.to_bytes(32, "big"))
digests = st.binary(min_size=32, max_size=32)
long_inputs = st.integers(0, 5000).map(lambda n: bytes(i % 251 for i in range(n)))

KNOWN = {
    b"": "c5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470",
    b"abc": "4e03657aea45a94fc7d47ba826c8d667c0d1e6e33a64a036ec44f58fa12d6c45",
    b"The quick brown fox jumps over the lazy dog":
        "4d741b6f1eb29cb2a9b9911c82f56fa8d73b04959d3d9d222895df6c0b28aa15",
}


def test_the_installed_fast_backend_is_the_one_chosen():
    try:
        import sha3  # noqa: F401
    except ImportError:
        assert KECCAK_BACKEND == "pycryptodome"
    else:
        assert KECCAK_BACKEND == "pysha3"


@pytest.mark.parametrize("data", list(KNOWN))
def test_keccak256_known_vectors(data):
    assert keccak256(data).hex() == KNOWN[data]
    assert keccak256_pycryptodome(data).hex() == KNOWN[data]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600) | long_inputs)
def test_keccak256_backends_agree(data):
    """Sizes around the 136-byte rate and its multiples are where padding bugs live."""
    assert keccak256(data) == keccak256_pycryptodome(data) == _eth_hash_keccak(data)
    assert keccak256(bytearray(data)) == keccak256(data)


@pytest.mark.parametrize("bad", ["abc", None, 7])
def test_keccak256_refuses_non_bytes(bad):
    with pytest.raises(TypeError):
        keccak256(bad)


@settings(max_examples=25, deadline=None)
@given(private_keys, digests)
def test_identity_signature_is_byte_identical_to_the_reference(key, digest):
    identity = NodeIdentity(key)
    expected = _REFERENCE.PrivateKey(key).sign_msg_hash(digest).to_bytes()
    signature = identity.sign(digest)
    assert signature == expected[:64] + bytes([27 + expected[64]])
    assert signature == sign_digest(key, digest)
    assert identity.sign(digest) == signature  # the cached key object is not consumed by signing


@settings(max_examples=25, deadline=None)
@given(private_keys, digests)
def test_identity_names_and_recovery_match_the_reference(key, digest):
    identity = NodeIdentity(key)
    reference = _REFERENCE.PrivateKey(key).public_key
    assert identity.public_key == reference.to_compressed_bytes()
    assert identity.address == reference.to_canonical_address()
    assert address_of_public_key(b"\x04" + reference.to_bytes()) == identity.address
    assert recover_address(digest, identity.sign(digest)) == identity.address


@settings(max_examples=25, deadline=None)
@given(private_keys, digests, st.integers(0, 64 * 8 - 1))
def test_a_flipped_bit_never_recovers_the_signer(key, digest, bit):
    identity = NodeIdentity(key)
    signature = bytearray(identity.sign(digest))
    signature[bit // 8] ^= 1 << (bit % 8)
    try:
        assert recover_address(digest, bytes(signature)) != identity.address
    except InvalidSignature:
        pass


@settings(max_examples=25, deadline=None)
@given(private_keys, digests)
def test_the_high_s_twin_is_refused(key, digest):
    signature = NodeIdentity(key).sign(digest)
    s = int.from_bytes(signature[32:64], "big")
    assert 0 < s <= _N // 2
    twin = signature[:32] + (_N - s).to_bytes(32, "big") + bytes([55 - signature[64]])
    with pytest.raises(InvalidSignature, match="high-s"):
        recover_address(digest, twin)


@pytest.mark.parametrize("digest", [b"", b"\x01" * 31, b"\x01" * 33])
def test_signing_refuses_a_digest_that_is_not_32_bytes(digest):
    with pytest.raises(ValueError, match="32 bytes"):
        NodeIdentity(b"\x01" * 32).sign(digest)
    with pytest.raises(InvalidSignature, match="32 bytes"):
        recover_address(digest, b"\x00" * 65)


def test_identity_copies_and_pickles_by_its_private_key():
    identity = NodeIdentity(bytes(range(1, 33)))
    digest = keccak256(b"copy")
    for twin in (copy.copy(identity), copy.deepcopy(identity), pickle.loads(pickle.dumps(identity))):
        assert twin == identity and hash(twin) == hash(identity)
        assert twin.address == identity.address and twin.sign(digest) == identity.sign(digest)
    assert identity != NodeIdentity(bytes(range(2, 34)))
    assert "private_key" not in repr(identity) and identity.private_key.hex() not in repr(identity)

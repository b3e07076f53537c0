"""Node identity: one secp256k1 key that is at once a libp2p peer id and an Ethereum address.

One key means one name for a node everywhere: its gossip messages, its ledger entries and its chain
transactions are all attributable to the same address, and slashing evidence needs no key mapping.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import coincurve

from swarmnode.crypto.hashing import keccak256
from swarmnode.crypto.signing import address_of_point, address_of_public_key, sign_digest_with

_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_LIBP2P_KEYTYPE_SECP256K1 = 2


def base58btc(data: bytes) -> str:
    """Bitcoin base58, the text form libp2p uses for peer ids."""
    number = int.from_bytes(data, "big")
    digits = ""
    while number:
        number, rem = divmod(number, 58)
        digits = _B58_ALPHABET[rem] + digits
    leading_zeros = len(data) - len(data.lstrip(b"\0"))
    return "1" * leading_zeros + digits


def base58btc_decode(text: str) -> bytes | None:
    """The bytes of a base58btc string; None for a character outside the alphabet."""
    number = 0
    for char in text:
        digit = _B58_ALPHABET.find(char)
        if digit < 0:
            return None
        number = number * 58 + digit
    leading_ones = len(text) - len(text.lstrip("1"))
    body = number.to_bytes((number.bit_length() + 7) // 8, "big") if number else b""
    return b"\0" * leading_ones + body


def peer_id_bytes(public_key: bytes) -> bytes:
    """libp2p peer id of a compressed secp256k1 key.

    The key is wrapped in libp2p's protobuf `PublicKey{Type=Secp256k1, Data=key}`; serialised keys of
    at most 42 bytes are embedded whole with the identity multihash (code 0x00) instead of hashed.
    """
    protobuf = bytes([0x08, _LIBP2P_KEYTYPE_SECP256K1, 0x12, len(public_key)]) + public_key
    return bytes([0x00, len(protobuf)]) + protobuf


def address_of_peer_id(peer_id: bytes) -> bytes | None:
    """The Ethereum address of the secp256k1 key a raw libp2p peer id embeds; None for any other id.

    A peer proves its address by signing, its peer id by the Noise handshake; checking that both name the
    same key stops one node from presenting another node's signed messages as its own.
    """
    header = bytes([0x00, 37, 0x08, _LIBP2P_KEYTYPE_SECP256K1, 0x12, 33])
    if len(peer_id) != len(header) + 33 or not peer_id.startswith(header):
        return None
    try:
        return address_of_public_key(peer_id[len(header) :])
    except ValueError:
        return None


def address_of_peer_id_text(peer_id: str) -> bytes | None:
    """`address_of_peer_id` of a peer id in its base58 text form (None for anything else).
    Bounded: a libp2p secp256k1 peer id is 53 characters; longer text is refused before decoding."""
    if len(peer_id) > 64:
        return None
    raw = base58btc_decode(peer_id)
    return None if raw is None else address_of_peer_id(raw)


@dataclass(frozen=True)
class NodeIdentity:
    """A node's private key and the names derived from it.

    The parsed key, its public key and its address are computed once here: parsing a key derives its
    public key (a point multiplication), which would otherwise be paid again on every signature.
    """

    private_key: bytes = field(repr=False)
    _signing_key: coincurve.PrivateKey = field(init=False, repr=False, compare=False)
    public_key: bytes = field(init=False, repr=False, compare=False)  # 33-byte compressed
    address: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.private_key) != 32:
            raise ValueError("a secp256k1 private key is 32 bytes")
        key = coincurve.PrivateKey(self.private_key)  # raises on zero or >= curve order
        object.__setattr__(self, "_signing_key", key)
        object.__setattr__(self, "public_key", key.public_key.format(compressed=True))
        object.__setattr__(self, "address", address_of_point(key.public_key))

    def __reduce__(self) -> tuple[type[NodeIdentity], tuple[bytes]]:
        """Copy and pickle by the private key alone: the parsed key object holds a lock."""
        return (NodeIdentity, (self.private_key,))

    @property
    def checksum_address(self) -> str:
        return format_address(self.address)

    @property
    def peer_id(self) -> str:
        return base58btc(peer_id_bytes(self.public_key))

    def sign(self, digest: bytes) -> bytes:
        """`r || s || v` over a 32-byte digest (see crypto.signing)."""
        return sign_digest_with(self._signing_key, digest)


def format_address(address: bytes) -> str:
    """EIP-55 checksummed text form of a 20-byte address: a hex digit is upper case where the same nibble
    of keccak256(lower-case hex) is 8 or more. Here rather than eth_utils' (the same function;
    tests/test_crypto.py holds them to each other), whose import costs `keys show` a quarter of a second."""
    if len(address) != 20:
        raise ValueError(f"an address is 20 bytes, not {len(address)}")
    text = address.hex()
    digest = keccak256(text.encode()).hex()
    return "0x" + "".join(c.upper() if int(h, 16) >= 8 else c for c, h in zip(text, digest, strict=False))


def parse_address(text: str) -> bytes:
    """Parse `0x…` hex (checksummed or all one case) into 20 bytes; mixed case must checksum."""
    from eth_utils.address import is_checksum_address, is_hex_address

    if not is_hex_address(text):
        raise ValueError(f"not a 20-byte hex address: {text!r}")
    body = text[2:] if text.lower().startswith("0x") else text
    if body != body.lower() and body != body.upper() and not is_checksum_address(text):
        raise ValueError(f"address checksum is wrong: {text!r}")
    return bytes.fromhex(body)

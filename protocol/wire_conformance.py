"""Replays the core vectors (spec/vectors/{identity,merkle,codec,envelope}.json) through the real code.

Keys, Merkle trees (crypto/), the canonical codec and the signed envelope (protocol/) are pure, so their
replay sits here and needs nothing of the node; node/conformance.py lists it in the `core` suite. A handler
turns a vector's `input` into what this implementation produces; `expect.verdict` is "accept" or
"reject"/"ignore" with the reason code an implementation must produce (spec/wire.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarmnode.crypto.identity import NodeIdentity, base58btc, peer_id_bytes
from swarmnode.crypto.merkle import inclusion_proof, merkle_root, root_from_inclusion_proof
from swarmnode.protocol.codec import decode, encode, to_json
from swarmnode.protocol.envelope import ReplayWindow, open_envelope, signing_digest
from swarmnode.protocol.errors import ProtocolError
from swarmnode.protocol.messages import MESSAGE_TYPES


def _hex(text: str) -> bytes:
    return bytes.fromhex(text[2:] if text.startswith("0x") else text)


def _verdict_of(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a decode/verify step and describe its outcome the way vectors do."""
    try:
        return {"verdict": "accept", **run()}
    except ProtocolError as exc:
        return {"verdict": exc.verdict, "reason": int(exc.reason)}


def check_identity(inp: dict[str, Any]) -> dict[str, Any]:
    identity = NodeIdentity(_hex(inp["private_key"]))
    return {
        "public_key": "0x" + identity.public_key.hex(),
        "address": identity.checksum_address,
        "peer_id": base58btc(peer_id_bytes(identity.public_key)),
    }


def check_merkle(inp: dict[str, Any]) -> dict[str, Any]:
    leaves = [_hex(x) for x in inp["leaves"]]
    root = merkle_root(leaves)
    proofs = [[("0x" + p.hex()) for p in inclusion_proof(leaves, i)] for i in range(len(leaves))]
    for i, leaf in enumerate(leaves):  # the proofs must verify through the verifier, not only match
        if root_from_inclusion_proof(leaf, i, len(leaves), [_hex(p) for p in proofs[i]]) != root:
            raise AssertionError("inclusion proof does not verify")
    return {"root": "0x" + root.hex(), "proofs": proofs}


def check_codec(inp: dict[str, Any]) -> dict[str, Any]:
    cls = MESSAGE_TYPES[inp["type"]]

    def run() -> dict[str, Any]:
        message: Any = decode(cls, _hex(inp["bytes"]))
        return {"fields": to_json(message), "reencoded": "0x" + encode(message).hex()}

    return _verdict_of(run)


def check_envelope(inp: dict[str, Any]) -> dict[str, Any]:
    replay = ReplayWindow()
    for earlier in inp.get("accepted_before", []):
        open_envelope(_hex(earlier), run=inp["run"], now_ms=inp["now_ms"], replay=replay)

    def run() -> dict[str, Any]:
        opened = open_envelope(_hex(inp["envelope"]), run=inp["run"], now_ms=inp["now_ms"], replay=replay)
        env = opened.envelope
        digest = signing_digest(env.type, env.run, env.sender, env.seq, env.ts, env.body)
        return {
            "type": env.type,
            "sender": "0x" + env.sender.hex(),
            "seq": env.seq,
            "signing_digest": "0x" + digest.hex(),
            "fields": to_json(opened.message),
        }

    return _verdict_of(run)


WIRE_HANDLERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "identity": check_identity,
    "merkle": check_merkle,
    "codec": check_codec,
    "envelope": check_envelope,
}

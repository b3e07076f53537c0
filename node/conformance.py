"""Replays conformance vectors (spec/vectors/*.json) through the real decoder and verifiers.

A vector file holds `{"suite": str, "cases": [ {name, kind, input, expect}, ... ]}`. Each kind has
one handler that runs the real code path and compares with `expect`; `expect.verdict` is "accept" or
"reject"/"ignore" with the reason code the implementation must produce. Another implementation can
run the same files, and `swarmnode conformance --vectors DIR` runs ours against anyone's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crypto.identity import NodeIdentity, base58btc, peer_id_bytes
from crypto.merkle import inclusion_proof, merkle_root, root_from_inclusion_proof
from protocol.codec import decode, encode, to_json
from protocol.envelope import ReplayWindow, open_envelope, signing_digest
from protocol.errors import ProtocolError
from protocol.messages import MESSAGE_TYPES


@dataclass(frozen=True)
class CaseResult:
    suite: str
    name: str
    passed: bool
    detail: str


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
        message = decode(cls, _hex(inp["bytes"]))
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


def _rows(inp: dict[str, Any]) -> Any:
    import torch

    return torch.tensor(inp["rows"], dtype=torch.float32)


def check_toploc_build(inp: dict[str, Any]) -> dict[str, Any]:
    from crypto.toploc import build_proofs

    proofs = build_proofs(_rows(inp), k=inp["k"], chunk=inp["chunk"])
    return {"proofs": ["0x" + p.hex() for p in proofs]}


def check_toploc_verify(inp: dict[str, Any]) -> dict[str, Any]:
    from crypto.toploc import ToplocError, verify_proofs

    try:
        checks = verify_proofs(_rows(inp), [_hex(p) for p in inp["proofs"]], k=inp["k"], chunk=inp["chunk"])
    except ToplocError as exc:
        return {"verdict": "reject", "reason": 605, "error": type(exc).__name__}
    return {"verdict": "accept", "chunks": [
        {"exp_mismatches": c.exp_mismatches, "mant_err_mean": c.mant_err_mean,
         "mant_err_median": c.mant_err_median, "passed": c.passed} for c in checks]}


HANDLERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "identity": check_identity,
    "merkle": check_merkle,
    "codec": check_codec,
    "envelope": check_envelope,
    "toploc_build": check_toploc_build,
    "toploc_verify": check_toploc_verify,
}


def run_case(suite: str, case: dict[str, Any]) -> CaseResult:
    handler = HANDLERS.get(case["kind"])
    if handler is None:
        return CaseResult(suite, case["name"], False, f"no handler for kind {case['kind']!r}")
    try:
        got = handler(case["input"])
    except (ValueError, KeyError, AssertionError, ProtocolError) as exc:
        return CaseResult(suite, case["name"], False, f"{type(exc).__name__}: {exc}")
    if got != case["expect"]:
        diff = {k: (case["expect"].get(k), got.get(k)) for k in set(got) | set(case["expect"])
                if got.get(k) != case["expect"].get(k)}
        return CaseResult(suite, case["name"], False, f"mismatch (expected, got): {diff}"[:500])
    return CaseResult(suite, case["name"], True, "ok")


def load_suites(directory: Path) -> list[tuple[str, list[dict[str, Any]]]]:
    suites = []
    for path in sorted(directory.glob("*.json")):
        document = json.loads(path.read_text())
        suites.append((document["suite"], document["cases"]))
    return suites


def run_suites(suites: Iterable[tuple[str, list[dict[str, Any]]]]) -> list[CaseResult]:
    return [run_case(suite, case) for suite, cases in suites for case in cases]

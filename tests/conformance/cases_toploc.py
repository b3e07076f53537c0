"""TOPLOC conformance cases: proofs of explicit small inputs, their checks, and tampered proofs.

Rows are exact in bf16 (small multiples of 1/8), so the vectors do not depend on float rounding.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

from swarmnode.crypto.toploc_conformance import check_toploc_build, check_toploc_verify


def rows(tokens: int, hidden: int, salt: int = 0) -> list[list[float]]:
    """Pseudo-random values in [-6, 6) in steps of 1/16 (exact in bf16), from sha256 so they are portable."""

    def value(i: int, j: int) -> float:
        digest = hashlib.sha256(f"{salt}/{i}/{j}".encode()).digest()
        return (int.from_bytes(digest[:2], "big") % 192 - 96) / 16

    return [[value(i, j) for j in range(hidden)] for i in range(tokens)]


def _h(data: bytes) -> str:
    return "0x" + data.hex()


def _case(name: str, kind: str, inp: dict[str, Any], expect: dict[str, Any]) -> dict[str, Any]:
    return {"name": f"toploc/{name}", "kind": kind, "input": inp, "expect": expect}


def _build(name: str, r: list[list[float]], k: int, chunk: int) -> tuple[dict[str, Any], list[str]]:
    inp = {"rows": r, "k": k, "chunk": chunk}
    expect = check_toploc_build(inp)
    return _case(f"build/{name}", "toploc_build", inp, expect), expect["proofs"]


def _verify(name: str, r: list[list[float]], proofs: list[str], k: int, chunk: int) -> dict[str, Any]:
    inp = {"rows": r, "proofs": proofs, "k": k, "chunk": chunk}
    return _case(f"verify/{name}", "toploc_verify", inp, check_toploc_verify(inp))


def _flip(proof_hex: str, byte: int) -> str:
    data = bytearray(bytes.fromhex(proof_hex[2:]))
    data[byte] ^= 0x01
    return _h(bytes(data))


def toploc_cases() -> Iterator[dict[str, Any]]:
    small = rows(5, 8)
    case, small_proofs = _build("k4-chunk2-short-last", small, 4, 2)
    yield case
    full = rows(33, 16, salt=1)
    case, full_proofs = _build("k128-chunk32-33-rows", full, 128, 32)
    yield case
    yield _verify("honest-small", small, small_proofs, 4, 2)
    yield _verify("honest-full", full, full_proofs, 128, 32)
    yield _verify("other-rows", rows(5, 8, salt=3), small_proofs, 4, 2)
    yield _verify("other-rows-full", rows(33, 16, salt=2), full_proofs, 128, 32)
    yield _verify("reordered", small, [small_proofs[1], small_proofs[0], small_proofs[2]], 4, 2)
    yield _verify("coefficient-changed", full, [_flip(full_proofs[0], 10), full_proofs[1]], 128, 32)
    yield _verify("dropped-chunk", small, small_proofs[:2], 4, 2)
    yield _verify("extra-chunk", small, small_proofs + small_proofs[:1], 4, 2)
    yield _verify("modulus-zero", small, ["0x0000" + small_proofs[0][6:]] + small_proofs[1:], 4, 2)
    yield _verify("short-proof", small, [small_proofs[0][:-4]] + small_proofs[1:], 4, 2)
    yield _verify("coefficient-above-prime", small, [small_proofs[0][:6] + "ffff" + small_proofs[0][10:]]
                  + small_proofs[1:], 4, 2)


SUITES = {"toploc": toploc_cases}

"""Replays spec/vectors/toploc.json through the real TOPLOC proofs (crypto/toploc.py, spec/toploc.md).

The proofs are pure, so their replay sits beside them; node/conformance.py lists it in the `core` suite.
A proof that does not parse is a `reject` with reason 605 (bad proof) and the typed error's name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from swarmnode.crypto.toploc import ToplocError, build_proofs, verify_proofs


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.removeprefix("0x"))


def _rows(inp: dict[str, Any]) -> torch.Tensor:
    return torch.tensor(inp["rows"], dtype=torch.float32)


def check_toploc_build(inp: dict[str, Any]) -> dict[str, Any]:
    proofs = build_proofs(_rows(inp), k=inp["k"], chunk=inp["chunk"])
    return {"proofs": ["0x" + p.hex() for p in proofs]}


def check_toploc_verify(inp: dict[str, Any]) -> dict[str, Any]:
    try:
        checks = verify_proofs(_rows(inp), [_hex(p) for p in inp["proofs"]], k=inp["k"], chunk=inp["chunk"])
    except ToplocError as exc:
        # 605 is protocol.errors.Reason.BAD_PROOF, written out: crypto sits below protocol
        return {"verdict": "reject", "reason": 605, "error": type(exc).__name__}
    return {
        "verdict": "accept",
        "chunks": [
            {
                "exp_mismatches": c.exp_mismatches,
                "mant_err_mean": c.mant_err_mean,
                "mant_err_median": c.mant_err_median,
                "passed": c.passed,
            }
            for c in checks
        ],
    }


TOPLOC_HANDLERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "toploc_build": check_toploc_build,
    "toploc_verify": check_toploc_verify,
}

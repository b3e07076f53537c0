"""A credit's inclusion proof as a JSON document a worker keeps and shows anyone (`swarmnode ledger prove`).

Pure functions. The document is strict: a format tag, every field present and no other, integers as JSON
integers within their ranges, addresses as 0x hex (checksummed or one case), digests as 0x hex of 32 bytes.
A file either parses to exactly the proof it was written from or is refused naming the wrong field; whether
the proof holds is then `CreditProof.verify` (its path) and `Ledger.check_credit_proof` (the ledger's batch).
"""

from __future__ import annotations

import json
import re
import typing
from typing import Any

from swarmnode.crypto.identity import format_address, parse_address
from swarmnode.ledger.batches import MAX_PROOF_DEPTH, CreditProof
from swarmnode.protocol.codec import Pattern
from swarmnode.protocol.ledger_messages import MAX_CREDITS_PER_BATCH, U64_MAX, Credit
from swarmnode.protocol.types import RunId

PROOF_FORMAT = "swarmnode/credit_proof/v1"
_RUN_ID = re.compile(next(m.regex for m in typing.get_args(RunId)[1:] if isinstance(m, Pattern)))
_PROOF_FIELDS = frozenset(
    {"format", "contribution", "batch", "run", "validator", "leaf_index", "count", "credit", "path", "root"}
)
_CREDIT_FIELDS = frozenset({"worker", "step", "tokens", "flops", "rollout_digest"})


class ProofFormatError(ValueError):
    """A document that is not a well-formed credit proof; the message names the field."""


def _hex32(data: bytes) -> str:
    return "0x" + data.hex()


def proof_to_json(proof: CreditProof) -> dict[str, Any]:
    c = proof.credit
    return {
        "format": PROOF_FORMAT,
        "contribution": proof.contribution,
        "batch": proof.batch,
        "run": proof.run,
        "validator": format_address(proof.validator),
        "leaf_index": proof.leaf_index,
        "count": proof.count,
        "credit": {
            "worker": format_address(c.worker),
            "step": c.step,
            "tokens": c.tokens,
            "flops": c.flops,
            "rollout_digest": _hex32(c.rollout_digest),
        },
        "path": [_hex32(node) for node in proof.path],
        "root": _hex32(proof.root),
    }


def dump_proof(proof: CreditProof) -> str:
    return json.dumps(proof_to_json(proof), indent=2, sort_keys=True) + "\n"


def _fields(value: Any, expected: frozenset[str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProofFormatError(f"{where} must be a JSON object")
    missing, unknown = expected - value.keys(), value.keys() - expected
    if missing:
        raise ProofFormatError(f"{where} lacks {', '.join(sorted(missing))}")
    if unknown:
        raise ProofFormatError(f"{where} has unknown fields {', '.join(sorted(unknown))}")
    return value


def _integer(value: Any, field: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProofFormatError(f"{field} must be an integer")
    if not low <= value <= high:
        raise ProofFormatError(f"{field} = {value} is outside {low}..{high}")
    return value


def _digest(value: Any, field: str) -> bytes:
    if not isinstance(value, str) or not re.fullmatch(r"0x[0-9a-fA-F]{64}", value):
        raise ProofFormatError(f"{field} must be 0x and 64 hex digits")
    return bytes.fromhex(value[2:])


def _address(value: Any, field: str) -> bytes:
    if not isinstance(value, str) or not value.startswith("0x"):
        raise ProofFormatError(f"{field} must be a 0x address")
    try:
        return parse_address(value)
    except ValueError as exc:
        raise ProofFormatError(f"{field}: {exc}") from None


def proof_from_json(document: Any) -> CreditProof:
    """The proof a document describes; ProofFormatError naming the first wrong field otherwise."""
    doc = _fields(document, _PROOF_FIELDS, "the proof")
    if doc["format"] != PROOF_FORMAT:
        raise ProofFormatError(f"format must be {PROOF_FORMAT!r}, got {doc['format']!r}")
    if not isinstance(doc["run"], str) or not _RUN_ID.fullmatch(doc["run"]):
        raise ProofFormatError("run must be a run id (lower-case letters, digits, '.', '_', '-'; 1..64)")
    count = _integer(doc["count"], "count", 1, MAX_CREDITS_PER_BATCH)
    path = doc["path"]
    if not isinstance(path, list) or len(path) > MAX_PROOF_DEPTH:
        raise ProofFormatError(f"path must be a list of at most {MAX_PROOF_DEPTH} digests")
    credit = _fields(doc["credit"], _CREDIT_FIELDS, "credit")
    return CreditProof(
        contribution=_integer(doc["contribution"], "contribution", 0, U64_MAX),
        batch=_integer(doc["batch"], "batch", 0, U64_MAX),
        run=doc["run"],
        validator=_address(doc["validator"], "validator"),
        leaf_index=_integer(doc["leaf_index"], "leaf_index", 0, count - 1),
        count=count,
        credit=Credit(
            worker=_address(credit["worker"], "credit.worker"),
            step=_integer(credit["step"], "credit.step", 0, U64_MAX),
            tokens=_integer(credit["tokens"], "credit.tokens", 1, U64_MAX),
            flops=_integer(credit["flops"], "credit.flops", 0, U64_MAX),
            rollout_digest=_digest(credit["rollout_digest"], "credit.rollout_digest"),
        ),
        path=tuple(_digest(node, f"path[{i}]") for i, node in enumerate(path)),
        root=_digest(doc["root"], "root"),
    )


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ProofFormatError(f"a field appears twice among {', '.join(keys)}")
    return dict(pairs)


def load_proof(text: str) -> CreditProof:
    try:
        document = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise ProofFormatError(f"not JSON: {exc}") from None
    return proof_from_json(document)

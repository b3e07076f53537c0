"""Ledger operations and the log entry that carries them (spec/ledger.md is the normative twin).

Amounts are integers in gwei. Each operation is signed by its author inside the envelope; a
`LedgerEntry` carries one operation's signed envelope bytes, chained to its parent by hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from protocol.codec import MaxLen, Pattern, Range
from protocol.types import KIB, MIB, Address, Digest, Role, RunId


# --- ledger --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ComputeSpec:
    accelerator: Annotated[str, Pattern(r"[a-z0-9_-]{1,32}")]
    count: Annotated[int, Range(1, 1 << 16)]
    memory_gb: Annotated[int, Range(1, 1 << 20)]
    benchmark_tflops: float


@dataclass(frozen=True)
class RegisterNode:
    TYPE: ClassVar[str] = "register_node"
    MAX_SIZE: ClassVar[int] = 1 * KIB

    role: Role
    compute: ComputeSpec
    peer_id: Annotated[str, MaxLen(128)]


@dataclass(frozen=True)
class StakeDeposit:
    TYPE: ClassVar[str] = "stake_deposit"
    MAX_SIZE: ClassVar[int] = 256

    amount_gwei: Annotated[int, Range(1, 2**64 - 1)]


@dataclass(frozen=True)
class StakeUnbond:
    TYPE: ClassVar[str] = "stake_unbond"
    MAX_SIZE: ClassVar[int] = 256

    amount_gwei: Annotated[int, Range(1, 2**64 - 1)]


@dataclass(frozen=True)
class StakeWithdraw:
    TYPE: ClassVar[str] = "stake_withdraw"
    MAX_SIZE: ClassVar[int] = 256

    epoch: int


@dataclass(frozen=True)
class RecordContribution:
    """Validator-authored: an accepted submission's tokens credited to its worker; cites the signed verdict."""

    TYPE: ClassVar[str] = "record_contribution"
    MAX_SIZE: ClassVar[int] = 128 * KIB

    run: RunId
    step: int
    worker: Address
    tokens: int
    flops: int
    rollout_digest: Digest
    verdict: Annotated[bytes, MaxLen(96 * KIB)]  # the validator's signed Verdict envelope


@dataclass(frozen=True)
class Slash:
    """Validator-authored: takes stake from a worker; the evidence is the worker's own signed submission."""

    TYPE: ClassVar[str] = "slash"
    MAX_SIZE: ClassVar[int] = 17 * MIB

    run: RunId
    worker: Address
    amount_gwei: int
    submission_digest: Digest
    failing_chunks: Annotated[tuple[int, ...], MaxLen(4096)]
    reason_code: Annotated[int, Range(0, 999)]
    evidence: Annotated[bytes, MaxLen(16 * MIB + 4 * KIB)]  # the worker's signed RolloutSubmission envelope


@dataclass(frozen=True)
class LedgerEntry:
    """One append-only log entry: an operation (canonical bytes of one ledger message) chained to its parent."""

    TYPE: ClassVar[str] = "ledger_entry"
    MAX_SIZE: ClassVar[int] = 18 * MIB

    index: int
    prev_hash: Digest
    epoch: int
    op_type: Annotated[str, MaxLen(32)]
    op: Annotated[bytes, MaxLen(17 * MIB)]

"""Ledger operations and the log entry that carries them (spec/ledger.md is the normative twin).

Amounts are integers in gwei, so one figure means the same on the signed log (declared stake) and on an
EVM chain (native currency, 1 gwei = 1e9 wei). Every field fits the contract's storage types: no floats
(the EVM has none), ints within u64, at most `MAX_FAILING_CHUNKS` chunk indices in a slash.

An operation travels as the canonical body of a signed envelope (`protocol.envelope.seal`) whose `run`
is the ledger id and whose `seq` is the author's operation nonce; a `LedgerEntry` carries those envelope
bytes, chained to its parent entry by hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from protocol.codec import MaxLen, Pattern, Range
from protocol.types import KIB, MIB, Address, Digest, Role, RunId

U32_MAX = 2**32 - 1
U64_MAX = 2**64 - 1
MAX_FAILING_CHUNKS = 64  # one failing chunk already proves fraud; the contract stores each index
LedgerId = Annotated[str, Pattern(r"[a-z0-9][a-z0-9._-]{0,63}"), MaxLen(64)]


@dataclass(frozen=True)
class ComputeSpec:
    """What a node declares it brings; `count` is its number of compute units for the stake rule."""

    accelerator: Annotated[str, Pattern(r"[a-z0-9_-]{1,32}")]
    count: Annotated[int, Range(1, 1 << 16)]
    memory_gb: Annotated[int, Range(1, 1 << 20)]
    benchmark_gflops: Annotated[int, Range(0, U64_MAX)]


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

    amount_gwei: Annotated[int, Range(1, U64_MAX)]


@dataclass(frozen=True)
class StakeUnbond:
    TYPE: ClassVar[str] = "stake_unbond"
    MAX_SIZE: ClassVar[int] = 256

    amount_gwei: Annotated[int, Range(1, U64_MAX)]


@dataclass(frozen=True)
class StakeWithdraw:
    """Withdraw the whole unbonded amount once its release epoch has come (no fields: the state decides)."""

    TYPE: ClassVar[str] = "stake_withdraw"
    MAX_SIZE: ClassVar[int] = 64


@dataclass(frozen=True)
class RecordContribution:
    """Validator-authored: an accepted submission's tokens credited to its worker; cites the signed verdict."""  # noqa: E501

    TYPE: ClassVar[str] = "record_contribution"
    MAX_SIZE: ClassVar[int] = 128 * KIB

    run: RunId
    step: int
    worker: Address
    tokens: int
    flops: int
    rollout_digest: Digest  # the submission's envelope digest, as named by the verdict
    verdict: Annotated[bytes, MaxLen(96 * KIB)]  # the validator's signed Verdict envelope


@dataclass(frozen=True)
class Slash:
    """Validator-authored: takes stake from a worker; the evidence is the worker's own signed submission."""

    TYPE: ClassVar[str] = "slash"
    MAX_SIZE: ClassVar[int] = 17 * MIB

    run: RunId
    worker: Address
    amount_gwei: Annotated[int, Range(1, U64_MAX)]
    submission_digest: Digest
    failing_chunks: Annotated[tuple[Annotated[int, Range(0, U32_MAX)], ...], MaxLen(MAX_FAILING_CHUNKS)]
    reason_code: Annotated[int, Range(0, 999)]
    evidence: Annotated[bytes, MaxLen(16 * MIB + 4 * KIB)]  # the worker's signed RolloutSubmission envelope


@dataclass(frozen=True)
class LedgerGenesis:
    """The first record of a signed log: its id and parameters; entry 0 chains to sha256 of these bytes."""

    TYPE: ClassVar[str] = "ledger_genesis"
    MAX_SIZE: ClassVar[int] = 1 * KIB

    ledger_id: LedgerId
    genesis_time_s: int
    epoch_seconds: Annotated[int, Range(1, U32_MAX)]
    min_stake_per_unit_gwei: int
    unbonding_delay_epochs: Annotated[int, Range(0, U32_MAX)]
    slash_gwei: Annotated[int, Range(1, U64_MAX)]
    ejection_threshold: Annotated[int, Range(1, U32_MAX)]


@dataclass(frozen=True)
class LedgerEntry:
    """One append-only log entry: an operation's signed envelope, its epoch, chained to its parent by hash."""

    TYPE: ClassVar[str] = "ledger_entry"
    MAX_SIZE: ClassVar[int] = 18 * MIB

    index: int
    prev_hash: Digest
    epoch: int
    op: Annotated[bytes, MaxLen(17 * MIB + 4 * KIB)]


LEDGER_OPERATIONS = (RegisterNode, StakeDeposit, StakeUnbond, StakeWithdraw, RecordContribution, Slash)

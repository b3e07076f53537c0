"""Parameters and query results shared by the state machine and both backends.

Both backends return exactly these frozen dataclasses, so the conformance suite can compare them with `==`.
"""

from __future__ import annotations

from dataclasses import dataclass

from swarmnode.protocol.ledger_messages import ComputeSpec

ROLES = ("trainer", "relay", "worker", "validator")
GWEI_PER_NATIVE = 10**9  # gwei per unit of the chain's native currency
WEI_PER_GWEI = 10**9


@dataclass(frozen=True)
class Params:
    """The ledger's parameters (spec/ledger.md, Parameters); fixed at genesis or contract deployment."""

    min_stake_per_unit_gwei: int = 100_000_000  # 0.1 native per compute unit
    unbonding_delay_epochs: int = 24
    slash_gwei: int = 50_000_000
    ejection_threshold: int = 3
    epoch_seconds: int = 3600

    def __post_init__(self) -> None:
        if self.epoch_seconds < 1:
            raise ValueError("epoch_seconds must be at least 1")
        if self.slash_gwei < 1 or self.ejection_threshold < 1:
            raise ValueError("slash_gwei and ejection_threshold must be at least 1")
        if self.min_stake_per_unit_gwei < 0 or self.unbonding_delay_epochs < 0:
            raise ValueError("min_stake_per_unit_gwei and unbonding_delay_epochs must not be negative")


@dataclass(frozen=True)
class NodeInfo:
    address: bytes
    role: str
    compute: ComputeSpec
    peer_id: str
    registered_epoch: int
    ejected: bool
    slash_count: int


@dataclass(frozen=True)
class StakeInfo:
    address: bytes
    bonded_gwei: int
    unbonding_gwei: int
    release_epoch: int
    required_gwei: int
    eligible: bool


@dataclass(frozen=True)
class RunInfo:
    """A run on the ledger: its owner (the trainer that signs its RunDescriptor), the validators it trusts,
    the challenge window of its slashes and the bounds of its credits."""

    run: str
    owner: bytes
    validators: tuple[bytes, ...]
    challenge_window_epochs: int
    max_tokens_per_credit: int
    max_flops_per_token: int
    registered_epoch: int
    max_submissions_per_version: int = 64  # protocol.ledger_messages.DEFAULT_MAX_SUBMISSIONS_PER_VERSION


@dataclass(frozen=True)
class BatchRecord:
    """One validator's CommitCredits: the Merkle root over its credits' leaves (ledger.batches)."""

    index: int
    run: str
    validator: bytes
    root: bytes
    count: int
    first_contribution: int  # index of its first ContributionRecord; the rest follow in leaf order
    epoch: int


@dataclass(frozen=True)
class ContributionRecord:
    index: int
    run: str
    step: int
    worker: bytes
    validator: bytes
    tokens: int
    flops: int
    rollout_digest: bytes
    batch: int
    epoch: int


@dataclass(frozen=True)
class WorkerTotal:
    """What a reward split reads: a worker's credited work in one run."""

    run: str
    worker: bytes
    credits: int
    tokens: int
    flops: int


SLASH_PENDING = "pending"  # in its challenge window: nothing taken yet
SLASH_FINAL = "final"  # the window passed and FinalizeSlash took the stake
SLASH_VOIDED = "voided"  # the run owner or a quorum voided it; the validator paid `penalty_gwei`


@dataclass(frozen=True)
class SlashRecord:
    index: int
    run: str
    worker: bytes
    validator: bytes
    requested_gwei: int
    taken_gwei: int  # 0 until final
    submission_digest: bytes  # the envelope signing digest the worker signed (protocol.envelope)
    failing_chunks: tuple[int, ...]
    reason_code: int
    epoch: int
    final_epoch: int  # epoch + the run's challenge window: finalizable from here, voidable before
    status: str
    votes: int  # void votes of the run's other validators so far
    penalty_gwei: int  # taken from the validator when the slash was voided
    ejected: bool  # this slash (final) ejected the worker, or (voided) ejected the validator


@dataclass(frozen=True)
class Receipt:
    """Where an accepted operation landed: a log entry (index, entry hash) or a transaction (block, tx)."""

    position: int
    ref: bytes
    epoch: int


@dataclass(frozen=True)
class Snapshot:
    """Everything a query can see; two backends agree when their snapshots are equal."""

    epoch: int
    nodes: tuple[NodeInfo, ...]
    stakes: tuple[StakeInfo, ...]
    runs: tuple[RunInfo, ...]
    batches: tuple[BatchRecord, ...]
    contributions: tuple[ContributionRecord, ...]
    totals: tuple[WorkerTotal, ...]
    slashes: tuple[SlashRecord, ...]

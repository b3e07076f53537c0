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

from swarmnode.protocol.codec import MaxLen, Pattern, Range
from swarmnode.protocol.types import KIB, MIB, Address, Digest, Role, RunId

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


MAX_RUN_VALIDATORS = 16  # a run's validator set; the contract loops over it when the set changes
MAX_CREDITS_PER_BATCH = 512  # one CommitCredits: about 2.5 MB of gas budget on chain, 9 Merkle levels
RUN_LIMIT_MAX = U32_MAX  # max tokens per credit: a credit's tokens fit 32 bits
# max flops per token: 2 x parameters for inference, so up to ~550B-parameter models. A credit's flops are a
# u64 whatever the limits, so a worker's totals (at most 2^32 credits) fit the contract's 128-bit field.
FLOPS_PER_TOKEN_MAX = (1 << 40) - 1
# The longest challenge window a run may set. A pending slash freezes the accused's stake (no withdrawal, no
# finalization) until its window passes, so the window bounds how long one accusation can hold anyone's
# stake: 720 epochs, 30 days at the default 1-hour epoch.
MAX_CHALLENGE_WINDOW_EPOCHS = 720
DEFAULT_MAX_SUBMISSIONS_PER_VERSION = 64  # counters a worker may use per checkpoint version, by default
MAX_SUBMISSIONS_PER_VERSION_LIMIT = 1 << 16  # the most any run may allow (the counter field has 32 bits)
# A credit's version may not run ahead of the run's age: at most this many versions per epoch since the run
# was registered (one a second at the default 1-hour epoch, far above any real run's step rate), so a run
# validator cannot credit versions that cannot exist yet (issue: version 10^9 was credited).
MAX_VERSIONS_PER_EPOCH = 3600


@dataclass(frozen=True)
class RegisterRun:
    """Owner-authored: puts a run on the ledger with the validators it trusts and the bounds of its credits.

    The author becomes the run's owner; followers accept the run only if that is the `trainer` who signed
    its RunDescriptor. `validators` are strictly ascending addresses (one canonical form)."""

    TYPE: ClassVar[str] = "register_run"
    MAX_SIZE: ClassVar[int] = 2 * KIB

    run: RunId
    validators: Annotated[tuple[Address, ...], MaxLen(MAX_RUN_VALIDATORS)]
    challenge_window_epochs: Annotated[int, Range(0, MAX_CHALLENGE_WINDOW_EPOCHS)]
    max_tokens_per_credit: Annotated[int, Range(1, RUN_LIMIT_MAX)]
    max_flops_per_token: Annotated[int, Range(0, FLOPS_PER_TOKEN_MAX)]
    # the RunDescriptor's: a credit's counter (its step's low 32 bits) must be below it
    max_submissions_per_version: Annotated[
        int, Range(1, MAX_SUBMISSIONS_PER_VERSION_LIMIT)
    ] = DEFAULT_MAX_SUBMISSIONS_PER_VERSION


@dataclass(frozen=True)
class SetRunValidators:
    """Owner-authored: replaces the run's validator set (strictly ascending, 1..16 addresses)."""

    TYPE: ClassVar[str] = "set_run_validators"
    MAX_SIZE: ClassVar[int] = 1 * KIB

    run: RunId
    validators: Annotated[tuple[Address, ...], MaxLen(MAX_RUN_VALIDATORS)]


@dataclass(frozen=True)
class Credit:
    """One accepted submission, credited to its worker: what a batch's Merkle leaf commits to."""

    worker: Address
    step: Annotated[int, Range(0, U64_MAX)]  # version << 32 | counter: the assignment it paid for
    tokens: Annotated[int, Range(1, U64_MAX)]
    flops: Annotated[int, Range(0, U64_MAX)]
    rollout_digest: Digest  # the submission's envelope digest, as named by the validator's verdict


@dataclass(frozen=True)
class CommitCredits:
    """Validator-authored: the accepted submissions of one run since its last commit, as one entry (one
    transaction on chain). Credits are strictly ascending by (worker, step)."""

    TYPE: ClassVar[str] = "commit_credits"
    MAX_SIZE: ClassVar[int] = 96 * KIB

    run: RunId
    credits: Annotated[tuple[Credit, ...], MaxLen(MAX_CREDITS_PER_BATCH)]


@dataclass(frozen=True)
class Slash:
    """Validator-authored: asks to take stake from a worker. The evidence is the worker's own signed
    submission; the slash names it by its signing digest, which the contract recomputes and checks with
    ecrecover. It takes effect only after the run's challenge window (`FinalizeSlash`)."""

    TYPE: ClassVar[str] = "slash"
    MAX_SIZE: ClassVar[int] = 17 * MIB

    run: RunId
    worker: Address
    amount_gwei: Annotated[int, Range(1, U64_MAX)]
    failing_chunks: Annotated[tuple[Annotated[int, Range(0, U32_MAX)], ...], MaxLen(MAX_FAILING_CHUNKS)]
    reason_code: Annotated[int, Range(0, 999)]
    evidence: Annotated[bytes, MaxLen(16 * MIB + 4 * KIB)]  # the worker's signed RolloutSubmission envelope


@dataclass(frozen=True)
class VoidSlash:
    """Run owner: voids a pending slash. Another validator of the run: one vote; a quorum voids it."""

    TYPE: ClassVar[str] = "void_slash"
    MAX_SIZE: ClassVar[int] = 64

    slash_index: Annotated[int, Range(0, U64_MAX)]


@dataclass(frozen=True)
class FinalizeSlash:
    """Anyone: applies a pending slash once its challenge window has passed."""

    TYPE: ClassVar[str] = "finalize_slash"
    MAX_SIZE: ClassVar[int] = 64

    slash_index: Annotated[int, Range(0, U64_MAX)]


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


LEDGER_OPERATIONS = (
    RegisterNode,
    StakeDeposit,
    StakeUnbond,
    StakeWithdraw,
    RegisterRun,
    SetRunValidators,
    CommitCredits,
    Slash,
    VoidSlash,
    FinalizeSlash,
)

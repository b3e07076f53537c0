"""Every wire message of the protocol, as frozen dataclasses (spec/messages.md is the normative twin).

Field order is wire order. Amounts of stake are integers in gwei (1e-9 of the chain's native unit),
which fits any realistic stake in a u64; times are milliseconds since the Unix epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from swarmnode.protocol.codec import MaxLen, OmitWhenDefault, Pattern, Range, Size, registry  # noqa: F401
from swarmnode.protocol.ledger_messages import (  # noqa: F401 - the run's counter bounds are re-exported
    DEFAULT_MAX_SUBMISSIONS_PER_VERSION,
    MAX_SUBMISSIONS_PER_VERSION_LIMIT,
    CommitCredits,
    FinalizeSlash,
    LedgerEntry,
    LedgerGenesis,
    RegisterNode,
    RegisterRun,
    SetRunValidators,
    Slash,
    StakeDeposit,
    StakeUnbond,
    StakeWithdraw,
    VoidSlash,
)
from swarmnode.protocol.types import KIB, MIB, Address, Digest, Role, RunId, Url  # noqa: F401

# --- run ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GrpoParams:
    """Hyper-parameters of the GRPO step (spec/rollouts.md): fixed for the whole run."""

    group_size: Annotated[int, Range(2, 1024)]
    prompts_per_step: Annotated[int, Range(1, 65536)]
    max_new_tokens: Annotated[int, Range(1, 1 << 20)]
    temperature: float
    learning_rate: float
    clip_epsilon: float
    clip_delta: float
    max_grad_norm: float
    token_budget: Annotated[int, Range(1, 1 << 40)]
    length_target: int  # 0 disables the length-target reward
    length_penalty: float


@dataclass(frozen=True)
class ValidatorPolicy:
    """How validators judge submissions of this run; signed into the run so any verdict is recomputable."""

    toploc_k: Annotated[int, Range(1, 4096)]
    toploc_chunk: Annotated[int, Range(1, 4096)]
    max_mean_exp_mismatches: float
    max_mean_mant_err: float
    sampling_tolerance: float
    eos_min_prob: float
    sample_fraction: float
    min_stake_gwei: int
    slash_gwei: int


# Protocol maxima of an environment's episode bounds (spec/environments.md, Bounds): what a validator may
# have to replay for one completion, whatever a run sets.
MAX_ENV_TURNS = 64  # model turns per episode
MAX_ENV_TURN_BYTES = 16 * KIB  # UTF-8 bytes of one environment turn
MAX_TRANSCRIPT_BYTES = 256 * KIB  # UTF-8 bytes of all turns of an episode
MAX_COMPLETION_TOKENS = 1 << 16  # tokens of a completion, model and environment spans together


@dataclass(frozen=True)
class EnvironmentTerms:
    """The environment a multi-turn run plays its episodes in, and its bounds (spec/environments.md).

    `name` and `version` pick the environment's code; a node without that version refuses the run, naming
    it. Each model turn gets at most `GrpoParams.max_new_tokens` tokens and a whole completion (model and
    environment spans) at most `max_completion_tokens`.
    """

    name: Annotated[str, Pattern(r"[a-z0-9_.-]{1,64}")]
    version: Annotated[str, Pattern(r"[A-Za-z0-9_.+-]{1,32}")]
    max_turns: Annotated[int, Range(1, MAX_ENV_TURNS)]
    max_env_bytes: Annotated[int, Range(1, MAX_ENV_TURN_BYTES)]
    max_total_bytes: Annotated[int, Range(1, MAX_TRANSCRIPT_BYTES)]
    max_completion_tokens: Annotated[int, Range(1, MAX_COMPLETION_TOKENS)]


@dataclass(frozen=True)
class FileDigest:
    """A named file of a run's model folder and the sha256 of its bytes."""

    name: Annotated[str, Pattern(r"[A-Za-z0-9._-]{1,128}")]
    sha256: Digest


@dataclass(frozen=True)
class RunDescriptor:
    """The run a trainer owns; workers and validators follow only runs whose descriptor the trainer signed.
    `trainer` is the lead: it signs the descriptor and is the sole signer of the run's checkpoint manifests.
    `co_trainers` are the other trainers of a multi-trainer (DiLoCo) run: they may pull accepted rollouts
    (ACCEPTED) but never sign a manifest. A descriptor whose `co_trainers` repeat an address or name the lead
    is rejected 600 `RULE_VIOLATION` (`protocol.runs.check_descriptor`).
    `max_submissions_per_version` bounds a worker's counters on one checkpoint version (counters
    0 .. max - 1): a validator rejects a larger one 602 `BAD_ASSIGNMENT`, so one worker's credits and a
    validator's per-assignment records per version are bounded (spec/rollouts.md, Task assignment).
    The model is a Hugging Face folder: `model_config_hash` is the sha256 of its `config.json`,
    `tokenizer_files` names and hashes each tokenizer file, `base_checkpoint_hash` is the Merkle root over
    the sha256 of its weights files in name order; `dataset_hash` is the Merkle root over the task ids in
    dataset order (spec/rollouts.md, The run's model and tasks). Every role refuses a folder or task file
    that differs, naming the file.
    """

    TYPE: ClassVar[str] = "run_descriptor"
    MAX_SIZE: ClassVar[int] = 16 * KIB

    run: RunId
    trainer: Address
    model_config_hash: Digest
    tokenizer_files: Annotated[tuple[FileDigest, ...], MaxLen(16)]
    base_checkpoint_hash: Digest
    dataset_hash: Digest
    task_kind: Annotated[str, MaxLen(64)]
    grpo: GrpoParams
    async_level: Annotated[int, Range(0, 64)]
    policy: ValidatorPolicy
    created_ms: int
    co_trainers: Annotated[tuple[Address, ...], MaxLen(15)] = ()
    max_submissions_per_version: Annotated[
        int, Range(1, MAX_SUBMISSIONS_PER_VERSION_LIMIT)
    ] = DEFAULT_MAX_SUBMISSIONS_PER_VERSION
    # Empty: single-turn (the task kind's grader); written only when set, so single-turn runs' bytes stand.
    environment: Annotated[tuple[EnvironmentTerms, ...], MaxLen(1), OmitWhenDefault()] = ()


# --- weights -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShardInfo:
    name: Annotated[str, Pattern(r"[A-Za-z0-9._-]{1,128}")]
    size: int
    sha256: Digest


MANIFEST_MAX_SHARDS = 8192
# The largest manifest body (8192 shards with 128-character names, every field at its widest) encodes to
# 1,564,932 bytes: above the 960 KiB gossip cap, hence `CheckpointHead` (spec/shards.md, Checkpoint heads).
MANIFEST_MAX_SIZE = 1536 * KIB


@dataclass(frozen=True)
class CheckpointManifest:
    """A policy version: its shards, their hashes and the Merkle root over the shard hashes."""

    TYPE: ClassVar[str] = "checkpoint_manifest"
    MAX_SIZE: ClassVar[int] = MANIFEST_MAX_SIZE

    run: RunId
    version: int
    parent_version: int
    model_config_hash: Digest
    total_size: int
    shards: Annotated[tuple[ShardInfo, ...], MaxLen(MANIFEST_MAX_SHARDS)]
    merkle_root: Digest
    created_ms: int


@dataclass(frozen=True)
class CheckpointHead:
    """What the `checkpoints` topic carries: a manifest's header, its shard count and the sha256 of its body.

    A manifest of a large model does not fit one gossip message; its head always does. Followers fetch the
    full trainer-signed manifest over HTTP and keep it only when it matches the head (spec/shards.md).
    """

    TYPE: ClassVar[str] = "checkpoint_head"
    MAX_SIZE: ClassVar[int] = 1 * KIB

    run: RunId
    version: int
    parent_version: int
    model_config_hash: Digest
    total_size: int
    shard_count: int
    merkle_root: Digest
    manifest_digest: Digest  # sha256 of the canonical CheckpointManifest body
    created_ms: int


@dataclass(frozen=True)
class ShardHave:
    """Which shards of a version a peer holds and where to fetch them (bit i set = shard i held)."""

    TYPE: ClassVar[str] = "shard_have"
    MAX_SIZE: ClassVar[int] = 4 * KIB

    run: RunId
    version: int
    merkle_root: Digest
    bitfield: Annotated[bytes, MaxLen(1024)]
    endpoint: Url


# --- rollouts ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EnvSpan:
    """Where an environment turn sits in a completion's tokens: `length` tokens from index `start`."""

    start: Annotated[int, Range(1, MAX_COMPLETION_TOKENS)]
    length: Annotated[int, Range(1, MAX_COMPLETION_TOKENS)]


@dataclass(frozen=True)
class Completion:
    """One sampled completion with what a validator needs to re-check it.

    In a multi-turn run `token_ids` is the whole episode after the prompt and `env_spans` (in order) mark
    the environment's turns; every other token is the model's. The environment's tokens are not sampled:
    their logprobs are 0.0, TOPLOC proofs cover the model's tokens only (spec/environments.md).
    """

    token_ids: Annotated[tuple[int, ...], MaxLen(MAX_COMPLETION_TOKENS)]
    logprobs: Annotated[bytes, MaxLen(4 * MAX_COMPLETION_TOKENS)]  # float32 little-endian, one per token
    reward: float
    advantage: float
    seed: int
    ended_with_eos: bool
    proofs: Annotated[tuple[Annotated[bytes, MaxLen(2 + 2 * 4096)], ...], MaxLen(1 << 11)]
    env_spans: Annotated[tuple[EnvSpan, ...], MaxLen(MAX_ENV_TURNS - 1), OmitWhenDefault()] = ()


@dataclass(frozen=True)
class RolloutGroup:
    """G completions of one assigned task."""

    task_id: Digest
    prompt_ids: Annotated[tuple[int, ...], MaxLen(1 << 16)]
    completions: Annotated[tuple[Completion, ...], MaxLen(1024)]


@dataclass(frozen=True)
class RolloutSubmission:
    """A worker's signed batch of groups for one assignment step, generated with a named checkpoint."""

    TYPE: ClassVar[str] = "rollout_submission"
    MAX_SIZE: ClassVar[int] = 16 * MIB

    run: RunId
    step: int
    checkpoint_version: int
    checkpoint_root: Digest
    groups: Annotated[tuple[RolloutGroup, ...], MaxLen(4096)]


@dataclass(frozen=True)
class Verdict:
    """A validator's signed judgement of one submission; a rejection names its reason and failing chunks."""

    TYPE: ClassVar[str] = "verdict"
    MAX_SIZE: ClassVar[int] = 64 * KIB

    run: RunId
    submission_digest: Digest
    worker: Address
    step: int
    checkpoint_version: int
    accepted: bool
    reason_code: Annotated[int, Range(0, 999)]
    detail: Annotated[str, MaxLen(512)]
    failing_chunks: Annotated[tuple[int, ...], MaxLen(4096)]
    tokens: int
    mean_exp_mismatches: float
    mean_mant_err: float


VERDICT_BATCH_MAX_ITEMS = 256  # verdicts in one VerdictBatch (spec/gossip.md, Verdict batches)
# A batch's envelope must fit the 960 KiB gossip cap with the envelope's 512 bytes around the body; the
# largest Verdict body is about 21 KiB (4096 failing chunks), so any single verdict fits a batch.
VERDICT_BATCH_MAX_SIZE = 960 * KIB - 512


@dataclass(frozen=True)
class VerdictBatch:
    """What the `verdicts` topic carries: one validator's verdicts of one run, gossiped at once.

    Signed once: a receiver verifies one signature per batch instead of one per verdict. `validator` is the
    signer and every verdict names `run` (`protocol.verdicts.check_verdict_batch`); a batch with one bad
    verdict is refused whole. Not evidence: the accepted log and the ledger cite single sealed `Verdict`s.
    """

    TYPE: ClassVar[str] = "verdict_batch"
    MAX_SIZE: ClassVar[int] = VERDICT_BATCH_MAX_SIZE

    run: RunId
    validator: Address
    verdicts: Annotated[tuple[Verdict, ...], MaxLen(VERDICT_BATCH_MAX_ITEMS)]


# --- request / response --------------------------------------------------------------------------

@dataclass(frozen=True)
class Hello:
    """First message on a control stream: who I am in this run and where my data plane listens."""

    TYPE: ClassVar[str] = "hello"
    MAX_SIZE: ClassVar[int] = 4 * KIB

    run: RunId
    role: Role
    http_endpoint: Url
    agent: Annotated[str, MaxLen(64)]


@dataclass(frozen=True)
class Ping:
    TYPE: ClassVar[str] = "ping"
    MAX_SIZE: ClassVar[int] = 128

    nonce: Annotated[bytes, Size(8)]


@dataclass(frozen=True)
class Pong:
    TYPE: ClassVar[str] = "pong"
    MAX_SIZE: ClassVar[int] = 128

    nonce: Annotated[bytes, Size(8)]


@dataclass(frozen=True)
class ManifestRequest:
    TYPE: ClassVar[str] = "manifest_request"
    MAX_SIZE: ClassVar[int] = 256

    run: RunId
    version: int  # 2**64 - 1 asks for the newest


@dataclass(frozen=True)
class ManifestResponse:
    TYPE: ClassVar[str] = "manifest_response"
    MAX_SIZE: ClassVar[int] = MANIFEST_MAX_SIZE + 4 * KIB

    status: Annotated[int, Range(100, 999)]
    manifest: Annotated[bytes, MaxLen(MANIFEST_MAX_SIZE + 2 * KIB)]  # the trainer's signed manifest envelope


@dataclass(frozen=True)
class SubmitAck:
    """A validator's receipt for a submission: 100 queued, 2xx ignored, 4xx-6xx rejected (protocol.errors)."""

    TYPE: ClassVar[str] = "submit_ack"
    MAX_SIZE: ClassVar[int] = 1 * KIB

    submission_digest: Digest
    status: Annotated[int, Range(100, 999)]
    detail: Annotated[str, MaxLen(512)]



@dataclass(frozen=True)
class AcceptedRequest:
    """The trainer pulls a validator's accepted submissions in the validator's order, after a cursor.

    A pull with a cursor, not a push: the trainer stores what it received with the cursor in one
    transaction, so a crash on either side loses nothing and re-sends nothing twice.
    """

    TYPE: ClassVar[str] = "accepted_request"
    MAX_SIZE: ClassVar[int] = 256

    run: RunId
    after: int  # the last index received from this validator; 0 asks from the start (indices begin at 1)
    limit: Annotated[int, Range(1, 256)]
    wait_ms: Annotated[int, Range(0, 30_000)]  # long poll: answer early when something new is accepted


@dataclass(frozen=True)
class AcceptedRollout:
    """One accepted submission: the worker's signed envelope and the validator's signed accepting Verdict."""

    TYPE: ClassVar[str] = "accepted_rollout"
    MAX_SIZE: ClassVar[int] = 16 * MIB + 128 * KIB

    index: Annotated[int, Range(1, 2**63 - 1)]  # an SQLite INTEGER
    verdict: Annotated[bytes, MaxLen(96 * KIB)]
    submission: Annotated[bytes, MaxLen(16 * MIB + 4 * KIB)]


@dataclass(frozen=True)
class AcceptedBatch:
    """Accepted submissions with index > the request's cursor, oldest first (at least one if any exist)."""

    TYPE: ClassVar[str] = "accepted_batch"
    MAX_SIZE: ClassVar[int] = 24 * MIB

    items: Annotated[tuple[AcceptedRollout, ...], MaxLen(256)]
    newest: int  # the validator's newest index, so the puller knows whether to ask again at once

# --- DiLoCo (spec/diloco.md) ---------------------------------------------------------------------

Compression = Annotated[str, Pattern(r"none|fp16|int8")]


@dataclass(frozen=True)
class DilocoRun:
    """A DiLoCo run, signed by its owner: the trainers (ascending addresses) and the outer loop's settings."""

    TYPE: ClassVar[str] = "diloco_run"
    MAX_SIZE: ClassVar[int] = 16 * KIB

    run: RunId
    trainers: Annotated[tuple[Address, ...], MaxLen(256)]
    model_config_hash: Digest
    initial_digest: Digest  # content digest of θ_0, the trainable weights every trainer starts from
    rounds: Annotated[int, Range(1, 1 << 32)]
    inner_steps: Annotated[int, Range(1, 1 << 20)]
    inner_lr: float
    outer_lr: float
    outer_momentum: float
    nesterov: bool
    compression: Compression
    collect_timeout_ms: Annotated[int, Range(1, 86_400_000)]
    vote_timeout_ms: Annotated[int, Range(1, 86_400_000)]
    created_ms: int


@dataclass(frozen=True)
class DilocoEntry:
    """One contribution named in a vote or an outer state: its author and the sha256 of its envelope."""

    trainer: Address
    digest: Digest


@dataclass(frozen=True)
class DilocoContribution:
    """A trainer's compressed pseudo-gradient for one round; the embedded manifest lists its shards."""

    TYPE: ClassVar[str] = "diloco_contribution"
    MAX_SIZE: ClassVar[int] = 1 * MIB + 4 * KIB

    run: RunId
    round: int
    trainer: Address
    plan: Digest  # sha256 of the canonical DilocoRun body
    base: Digest  # content digest of θ_round, the outer weights the inner steps started from
    compression: Compression
    merkle_root: Digest
    manifest: Annotated[bytes, MaxLen(1 * MIB)]  # the author's signed CheckpointManifest


@dataclass(frozen=True)
class DilocoVote:
    """The contributions a trainer holds for a round when its collection ends, ascending by author."""

    TYPE: ClassVar[str] = "diloco_vote"
    MAX_SIZE: ClassVar[int] = 32 * KIB

    run: RunId
    round: int
    plan: Digest
    base: Digest
    entries: Annotated[tuple[DilocoEntry, ...], MaxLen(256)]


@dataclass(frozen=True)
class DilocoOuterState:
    """A trainer's outer state at the start of a round (θ and momentum), for trainers that (re)join."""

    TYPE: ClassVar[str] = "diloco_outer_state"
    MAX_SIZE: ClassVar[int] = 1 * MIB + 32 * KIB

    run: RunId
    round: int  # the round that starts from this θ
    plan: Digest
    theta: Digest  # content digest of θ_round (the `base` of that round's contributions)
    parent: Digest  # θ_(round-1)'s digest; 32 zero bytes for round 0
    contributors: Annotated[tuple[DilocoEntry, ...], MaxLen(256)]  # averaged in round-1; none for round 0
    merkle_root: Digest
    manifest: Annotated[bytes, MaxLen(1 * MIB)]  # the author's signed CheckpointManifest


LATEST_VERSION = 2**64 - 1

MESSAGE_TYPES = registry(
    RunDescriptor,
    CheckpointManifest,
    ShardHave,
    RolloutSubmission,
    Verdict,
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
    LedgerEntry,
    LedgerGenesis,
    Hello,
    Ping,
    Pong,
    ManifestRequest,
    ManifestResponse,
    SubmitAck,
    AcceptedRequest,
    AcceptedRollout,
    AcceptedBatch,
    DilocoRun,
    DilocoContribution,
    DilocoVote,
    DilocoOuterState,
    CheckpointHead,
    VerdictBatch,
)

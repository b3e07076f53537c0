"""The validator's judgement of one signed RolloutSubmission, checks in order of cost (DESIGN.md step 5).

1. envelope and signature (done by `open_envelope` before this module sees it);
2. stake and registration of the worker;
3. staleness: the claimed checkpoint is known, its root matches, and it is within the async level;
4. assignment: the task ids, prompts, group size and seeds are exactly the ones the run prescribes;
5. rewards and advantages recomputed from the completions' text;
6. one batched teacher-forced prefill on the claimed checkpoint, then: TOPLOC per chunk under the
   reference thresholds and the submission aggregate under the run's calibrated bounds, termination
   (EOS only where P(EOS) is not negligible), logprobs (what the trainer will use as the old policy's),
   and the sampling check (every token re-derived from the validator's own logits).

The first failing check decides. A failure of the worker's making is a `Reject` naming the reason and,
for proofs, the failing chunk indices (numbered across the submission: groups, then completions, then
chunks), which is what a slash cites. TOPLOC runs first among the model checks: generating with other
weights or on another prompt then shows as a slashable `BadProof` naming its chunks, not as logprobs the
worker could not reproduce. Nothing here does I/O; the engine is passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from crypto.toploc import (
    CalibratedPolicy,
    ChunkCheck,
    MalformedProof,
    ToplocAggregate,
    ToplocError,
    aggregate,
    judge,
    verify_proofs,
)
from node.rl.engine import InferenceEngine, Prefill
from node.rl.grpo import group_advantages
from node.rl.rollouts import assigned_tasks, completion_rewards, unpack_logprobs
from node.rl.sampling import (
    SamplingCheck,
    check_sampling,
    check_termination,
    derive_seed,
    eos_probabilities,
    token_logprobs,
)
from node.rl.tasks import Task
from node.rl.tokenizer import EOS_ID, encode_prompt
from protocol.errors import Ignore, Reason, Reject
from protocol.messages import Completion, RolloutSubmission, RunDescriptor, ValidatorPolicy

ADVANTAGE_TOLERANCE = 1e-4
LOGPROB_TOLERANCE = 1e-3


@dataclass(frozen=True)
class ValidationContext:
    """What the validator knows when it judges: the run, its dataset, the checkpoints it holds, the ledger."""

    descriptor: RunDescriptor
    dataset: Mapping[bytes, Task]
    dataset_ids: Sequence[bytes]
    newest_version: int
    checkpoint_roots: Mapping[int, bytes]
    is_eligible: Callable[[bytes], bool]


@dataclass(frozen=True)
class Accepted:
    tokens: int
    mean_exp_mismatches: float
    mean_mant_err: float


@dataclass(frozen=True)
class ProofFailure:
    """Details a slash needs beyond the reason: which chunks failed and the submission's statistics."""

    failing_chunks: tuple[int, ...]
    mean_exp_mismatches: float
    mean_mant_err: float


class BadProof(Reject):
    def __init__(self, detail: str, failure: ProofFailure) -> None:
        super().__init__(Reason.BAD_PROOF, detail)
        self.failure = failure


def check_eligibility(worker: bytes, ctx: ValidationContext) -> None:
    if not ctx.is_eligible(worker):
        raise Reject(Reason.NOT_STAKED, f"worker {worker.hex()} is not registered with enough stake")


def check_staleness(sub: RolloutSubmission, ctx: ValidationContext) -> None:
    version = sub.checkpoint_version
    if version > ctx.newest_version:
        raise Ignore(
            Reason.UNKNOWN_CHECKPOINT, f"checkpoint v{version} is newer than v{ctx.newest_version} held here"
        )
    if ctx.newest_version - version > ctx.descriptor.async_level:
        raise Ignore(
            Reason.STALE, f"checkpoint v{version} is more than {ctx.descriptor.async_level} versions old"
        )
    root = ctx.checkpoint_roots.get(version)
    if root is None:
        raise Ignore(Reason.UNKNOWN_CHECKPOINT, f"checkpoint v{version} is not held here")
    if root != sub.checkpoint_root:
        raise Reject(Reason.BAD_HASH, f"checkpoint v{version} root differs from the trainer's manifest")


def check_assignment(sub: RolloutSubmission, worker: bytes, ctx: ValidationContext) -> None:
    descriptor = ctx.descriptor
    if sub.step >> 32 != sub.checkpoint_version:
        raise Reject(Reason.BAD_ASSIGNMENT, "assignment step is not bound to the claimed checkpoint version")
    expected = assigned_tasks(descriptor, ctx.dataset_ids, worker, sub.step)
    claimed = [g.task_id for g in sub.groups]
    if claimed != expected:
        raise Reject(Reason.BAD_ASSIGNMENT, "task ids differ from the deterministic assignment")
    for gi, group in enumerate(sub.groups):
        task = ctx.dataset[group.task_id]
        if list(group.prompt_ids) != encode_prompt(task.prompt):
            raise Reject(Reason.BAD_ASSIGNMENT, f"group {gi}: prompt tokens differ from the task's prompt")
        if len(group.completions) != descriptor.grpo.group_size:
            raise Reject(
                Reason.BAD_ASSIGNMENT,
                f"group {gi}: {len(group.completions)} completions, "
                f"the run asks for {descriptor.grpo.group_size}",
            )
        for ci, completion in enumerate(group.completions):
            if completion.seed != derive_seed(descriptor.run, worker, group.task_id, ci):
                raise Reject(
                    Reason.BAD_SAMPLING, f"group {gi} completion {ci}: seed is not the prescribed one"
                )
            if not completion.token_ids or len(completion.token_ids) > descriptor.grpo.max_new_tokens:
                raise Reject(Reason.BAD_TERMINATION, f"group {gi} completion {ci}: length out of bounds")


def check_rewards(sub: RolloutSubmission, ctx: ValidationContext) -> None:
    for gi, group in enumerate(sub.groups):
        rewards = completion_rewards(
            ctx.dataset[group.task_id], [c.token_ids for c in group.completions], ctx.descriptor
        )
        claimed = [c.reward for c in group.completions]
        if claimed != rewards:
            raise Reject(Reason.BAD_REWARD, f"group {gi}: claimed rewards {claimed} != recomputed {rewards}")
        advantages = group_advantages(torch.tensor(rewards))
        if not torch.allclose(
            torch.tensor([c.advantage for c in group.completions]), advantages, atol=ADVANTAGE_TOLERANCE
        ):
            raise Reject(Reason.BAD_REWARD, f"group {gi}: advantages do not follow from the rewards")


def failing_chunks(checks: Sequence[ChunkCheck], bounds: CalibratedPolicy) -> tuple[int, ...]:
    """Chunks that fail the reference thresholds or, on their own, exceed a calibrated bound.

    When the submission's mean exceeds a bound, at least one chunk does too, so a failed verdict always
    names a chunk a slash can cite (the 1%-noise cheat passes every reference threshold).
    """
    return tuple(
        i
        for i, c in enumerate(checks)
        if not c.passed
        or not c.exp_mismatches <= bounds.max_mean_exp_mismatches
        or not c.mant_err_mean <= bounds.max_mean_mant_err
    )


def check_proofs(
    completions: Sequence[Completion], prefills: Sequence[Prefill], policy: ValidatorPolicy
) -> ToplocAggregate:
    """TOPLOC on every completion, chunks numbered across the submission; `BadProof` names failing ones."""
    checks: list[ChunkCheck] = []
    for i, (completion, prefill) in enumerate(zip(completions, prefills, strict=True)):
        offset = len(checks)
        try:
            checks.extend(
                verify_proofs(
                    prefill.hidden_rows, list(completion.proofs), k=policy.toploc_k, chunk=policy.toploc_chunk
                )
            )
        except MalformedProof as exc:
            raise BadProof(f"completion {i}: {exc}", ProofFailure((offset + exc.index,), 0.0, 0.0)) from None
        except ToplocError as exc:  # a proof count that does not match the tokens: all its claimed chunks
            claimed = tuple(range(offset, offset + len(completion.proofs)))
            raise BadProof(f"completion {i}: {exc}", ProofFailure(claimed, 0.0, 0.0)) from None
    summary = aggregate(checks)
    bounds = CalibratedPolicy(policy.max_mean_exp_mismatches, policy.max_mean_mant_err)
    verdict = judge(summary, bounds)
    if not verdict.passed:
        broken = "; ".join(f"{b.bound.value} {b.observed:.3f} > {b.limit}" for b in verdict.exceeded)
        failure = ProofFailure(
            failing_chunks(checks, bounds), summary.mean_exp_mismatches, summary.mean_mant_err
        )
        raise BadProof(f"TOPLOC over {len(checks)} chunks: {broken}", failure)
    return summary


def check_model_outputs(sub: RolloutSubmission, ctx: ValidationContext, engine: InferenceEngine) -> Accepted:
    """One batched prefill on the claimed checkpoint, then TOPLOC, termination, logprobs and sampling.

    TOPLOC comes first: a worker that generated with other weights or another prompt is caught by the
    check that names failing chunks (slashable evidence), not by the logprobs it could not reproduce.
    """
    descriptor, policy = ctx.descriptor, ctx.descriptor.policy
    temperature = descriptor.grpo.temperature
    flat = [(g.prompt_ids, c) for g in sub.groups for c in g.completions]
    completions = [c for _, c in flat]
    prefills = engine.prefill_batch([(list(p), list(c.token_ids)) for p, c in flat])
    summary = check_proofs(completions, prefills, policy)
    samplings = [
        check_sampling(prefill.logits, c.token_ids, c.seed, temperature, policy.sampling_tolerance)
        for c, prefill in zip(completions, prefills, strict=True)
    ]
    tokens = 0
    for i, (completion, prefill) in enumerate(zip(completions, prefills, strict=True)):
        where = f"completion {i}"
        termination = check_termination(
            eos_probabilities(prefill.logits, EOS_ID, temperature),
            completion.token_ids,
            EOS_ID,
            descriptor.grpo.max_new_tokens,
            eos_threshold(completion.token_ids, samplings[i], policy.eos_min_prob),
        )
        if not termination.passed or completion.ended_with_eos != (completion.token_ids[-1] == EOS_ID):
            raise Reject(Reason.BAD_TERMINATION, f"{where}: {termination.failures}")
        claimed = unpack_logprobs(completion.logprobs)
        recomputed = token_logprobs(prefill.logits, torch.tensor(completion.token_ids), temperature)
        if claimed.shape != recomputed.shape or not torch.allclose(
            claimed, recomputed, atol=LOGPROB_TOLERANCE
        ):
            raise Reject(Reason.RULE_VIOLATION, f"{where}: claimed logprobs differ from the checkpoint's")
        tokens += len(completion.token_ids)
    for i, sampling in enumerate(samplings):
        if not sampling.passed:
            raise Reject(
                Reason.BAD_SAMPLING,
                f"completion {i}: tokens at {list(sampling.mismatches)[:8]} are not "
                "the seeded sampler's choice",
            )
    return Accepted(tokens, summary.mean_exp_mismatches, summary.mean_mant_err)


def eos_threshold(tokens: Sequence[int], sampling: SamplingCheck, eos_min_prob: float) -> float:
    """The P(EOS) a final EOS needs (check 6b): none when the seeded sampler itself chose it.

    An honest sampler picks EOS at P(EOS) = p with probability p, so over the thousands of positions
    of a submission an honest EOS below any fixed threshold is bound to happen (the devnet slashed an
    honest worker for it); the seeded choice is exact evidence, the threshold only guards an EOS the
    sampler did not choose.
    """
    last = len(tokens) - 1
    if last >= 0 and tokens[last] == EOS_ID and last not in sampling.mismatches:
        return 0.0
    return eos_min_prob


def submission_tokens(sub: RolloutSubmission) -> int:
    return sum(len(c.token_ids) for g in sub.groups for c in g.completions)


def validate_submission(
    sub: RolloutSubmission,
    worker: bytes,
    ctx: ValidationContext,
    engine_for: Callable[[int], InferenceEngine],
    *,
    prefill: bool = True,
) -> Accepted:
    """Run every check in order of cost; return the accepted statistics or raise Reject / Ignore.

    `prefill=False` stops after the cheap checks (1-5): what a validator that samples a fraction of the
    submissions does with the others (spec/validation.md); the statistics are then zero.
    """
    check_eligibility(worker, ctx)
    check_staleness(sub, ctx)
    check_assignment(sub, worker, ctx)
    check_rewards(sub, ctx)
    if not prefill:
        return Accepted(submission_tokens(sub), 0.0, 0.0)
    return check_model_outputs(sub, ctx, engine_for(sub.checkpoint_version))

"""The validator's judgement of one signed RolloutSubmission (spec/validation.md).

1. envelope and signature (done by `open_envelope` before this module sees it);
2. stake and registration of the worker;
2b. fields: every field within what the run and its model allow (`check_fields`: vocabulary, counts,
   lengths, byte sizes, finite floats), before any tokenizer, grader or engine sees it;
3. staleness: the claimed checkpoint is known, its root matches, and it is within the async level;
4. assignment: the step's version and counter, the task ids, prompts and seeds are exactly the ones the
   run prescribes (seeds bind the whole assignment: run, worker, step, task, index);
6. one batched teacher-forced prefill on the claimed checkpoint, then: TOPLOC per chunk under the
   reference thresholds and the submission aggregate under the run's calibrated bounds, termination
   (EOS only where P(EOS) is not negligible), logprobs (what the trainer will use as the old policy's),
   and the sampling check (every token re-derived from the validator's own logits);
5. rewards and advantages recomputed from the completions' text, last; in a multi-turn run (one that
   names an environment) by replaying the environment on the model's turns (`replayed_rewards`), and the
   model checks (6) read the model's positions only (spec/environments.md, On the wire).

Checks run in that order: cheap ones first, but grading (5) after the model checks (6), because a grader may
execute the completion's text (a code task runs it as a program) and the worker chose those tokens. Only
text shown to be the model's own output (the seeded sampler's choice on the claimed checkpoint) is ever
graded; a forged reward costs a prefill before its rejection. The numbers are the checks' names (reason
codes and vectors cite them), not their order. Without the prefill (`prefill=False`, a validator sampling a
fraction of the submissions) only kinds whose graders parse the text are graded (`executes_completion`);
a submission with an executing kind is always drawn for the full check.

The first failing check decides. A failure of the worker's making is a `Reject` naming the reason and,
for proofs, the failing chunk indices (numbered across the submission: groups, then completions, then
chunks), which is what a slash cites. TOPLOC runs first among the model checks: generating with other
weights or on another prompt then shows as a slashable `BadProof` naming its chunks, not as logprobs the
worker could not reproduce. A detail names where a check failed, never what a grader computed: verdicts
are public. Nothing here does I/O; the engine is passed in.

The judge is total (`judge_total`): whatever a submission holds, judging it ends in an outcome. A field
outside the run's bounds is a signed, slashable `Reject(MALFORMED_ROLLOUT)` found before any code that
could trip on it runs; any other exception while judging (a bug, an engine failure, a grader's safety
net, MemoryError included) is `Ignore(JUDGE_FAULT)`: the item is quarantined, nobody is proven at fault,
nothing is credited or slashed, and the validator's loop goes on. MemoryError is not let through:
everything a submission holds is bounded by the run before any allocation that scales with it, so running
out of memory is the node's condition, and letting it escape would kill the validator on the same durable
item at every restart.
Only BaseExceptions that are not Exceptions (cancellation, KeyboardInterrupt, SystemExit) propagate.
"""

from __future__ import annotations

import bisect
import math
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from swarmnode.crypto.toploc import (
    CalibratedPolicy,
    ChunkCheck,
    MalformedProof,
    ProofCountMismatch,
    ToplocAggregate,
    aggregate,
    chunk_count,
    judge,
    proof_size,
    verify_proofs_batch,
)
from swarmnode.node.rl.engine import InferenceEngine, Prefill
from swarmnode.node.rl.environments import prefetch
from swarmnode.node.rl.environments.episodes import (
    EpisodeRules,
    episode_rules,
    model_mask,
    model_ranges,
    replay_calls,
    replay_tokens,
    span_layout_fault,
)
from swarmnode.node.rl.environments.replay import FabricatedTurn, MalformedTranscript
from swarmnode.node.rl.grpo import group_advantages
from swarmnode.node.rl.model import ModelInfo
from swarmnode.node.rl.rollouts import assigned_tasks, submission_rewards, task_prompt_ids, unpack_logprobs
from swarmnode.node.rl.sampling import (
    SEED_BITS,
    SamplingCheck,
    check_termination_at_end,
    derive_seed,
    eos_probabilities,
    keyed_scores,
    position_key,
    token_logprobs,
)
from swarmnode.node.rl.tasks import GraderFault, Task, executes_completion
from swarmnode.node.rl.tokenizer import ChatTokenizer
from swarmnode.protocol.errors import Ignore, ProtocolError, Reason, Reject
from swarmnode.protocol.messages import (
    Completion,
    EnvironmentTerms,
    GrpoParams,
    RolloutSubmission,
    RunDescriptor,
    ValidatorPolicy,
)
from swarmnode.protocol.runs import run_environment, step_counter, step_version

ADVANTAGE_TOLERANCE = 1e-4
LOGPROB_TOLERANCE = 1e-3
LOGPROB_BYTES = 4  # one float32 per token
MAX_FAULT_DETAIL = 256  # characters of an unexpected exception's message kept in a JUDGE_FAULT detail
REWARD_DIFFERS = "claimed reward differs from the recomputed one"  # 603 details: no value, only where
ADVANTAGE_DIFFERS = "advantage does not follow from the rewards"


def grades_by_execution(sub: RolloutSubmission, dataset: Mapping[bytes, Task]) -> bool:
    """Whether grading `sub` would execute a completion: some group's claimed task has an executing kind.

    Read from the claimed task ids before any check: check 4 makes them the assignment's before anything is
    graded, and an id outside the dataset fails there.
    """
    tasks = (dataset.get(g.task_id) for g in sub.groups)
    multi_turn = any(c.env_spans for g in sub.groups for c in g.completions)  # the replay runs environments
    return multi_turn or any(task is not None and executes_completion(task.kind) for task in tasks)


@dataclass(frozen=True)
class ValidationContext:
    """What the validator knows when it judges: the run, its dataset, the checkpoints it holds, the ledger,
    and the run's model (the folder the descriptor names: its sizes and special tokens, its tokenizer)."""

    descriptor: RunDescriptor
    dataset: Mapping[bytes, Task]
    dataset_ids: Sequence[bytes]
    newest_version: int
    checkpoint_roots: Mapping[int, bytes]
    is_eligible: Callable[[bytes], bool]
    model: ModelInfo
    tokenizer: ChatTokenizer


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


def _malformed(where: str, detail: str) -> Reject:
    return Reject(Reason.MALFORMED_ROLLOUT, f"{where}: {detail}")


def _first_outside(ids: Sequence[object], vocab_size: int) -> int | None:
    """Index of the first id that is not an int in [0, vocab_size), or None."""
    for i, t in enumerate(ids):
        if type(t) is not int or not 0 <= t < vocab_size:
            return i
    return None


def _finite(value: object) -> bool:
    return type(value) is float and math.isfinite(value)


def check_completion_shape(completion: Completion, where: str, grpo: GrpoParams, model: ModelInfo,
                           terms: EnvironmentTerms | None = None) -> None:
    """What anything that reads a completion needs: a token count the run allows, ids in the vocabulary,
    one finite float32 logprob per token, a finite reward and advantage (the trainer checks these too);
    in a multi-turn run (`terms`), environment spans placed between model turns with logprobs 0.0."""
    tokens = completion.token_ids
    most = terms.max_completion_tokens if terms is not None else grpo.max_new_tokens
    if not 1 <= len(tokens) <= most:
        raise _malformed(where, f"{len(tokens)} tokens, the run allows 1 to {most}")
    bad = _first_outside(tokens, model.vocab_size)
    if bad is not None:
        raise _malformed(where, f"token {bad} ({tokens[bad]!r}) outside the vocabulary of {model.vocab_size}")
    logprobs = completion.logprobs
    if type(logprobs) is not bytes or len(logprobs) != LOGPROB_BYTES * len(tokens):
        raise _malformed(where, f"logprobs must be {LOGPROB_BYTES} x {len(tokens)} bytes")
    values = struct.unpack(f"<{len(tokens)}f", logprobs)
    if not all(math.isfinite(x) for x in values):
        raise _malformed(where, "a logprob is not finite")
    if not _finite(completion.reward) or not _finite(completion.advantage):
        raise _malformed(where, "reward and advantage must be finite floats")
    check_env_spans(completion, values, where, terms)


def check_env_spans(completion: Completion, logprobs: Sequence[float], where: str,
                    terms: EnvironmentTerms | None) -> None:
    """Environment spans only in a multi-turn run, each between model turns, within the run's turns, over
    tokens whose logprobs are 0.0 (nobody sampled them)."""
    spans = completion.env_spans
    if not spans:
        return
    if terms is None:
        raise _malformed(where, "environment spans in a single-turn run")
    fault = span_layout_fault(len(completion.token_ids), spans, terms.max_turns)
    if fault is not None:
        raise _malformed(where, fault)
    if any(logprobs[i] != 0.0 for span in spans for i in range(span.start, span.start + span.length)):
        raise _malformed(where, "an environment token's logprob is not 0.0")


def check_groups_shape(sub: RolloutSubmission, grpo: GrpoParams, model: ModelInfo,
                       terms: EnvironmentTerms | None = None) -> None:
    """Every group's prompt and completions readable by the GRPO step: prompts non-empty and in the
    vocabulary, `group_size` completions of sound shape, each fitting the model's context after its prompt."""
    for gi, group in enumerate(sub.groups):
        prompt = group.prompt_ids
        if not prompt:
            raise _malformed(f"group {gi}", "empty prompt")
        bad = _first_outside(prompt, model.vocab_size)
        if bad is not None:
            raise _malformed(f"group {gi}", f"prompt token {bad} ({prompt[bad]!r}) outside the vocabulary")
        if len(group.completions) != grpo.group_size:
            raise _malformed(
                f"group {gi}", f"{len(group.completions)} completions, the run asks for {grpo.group_size}"
            )
        for ci, completion in enumerate(group.completions):
            where = f"group {gi} completion {ci}"
            check_completion_shape(completion, where, grpo, model, terms)
            if len(prompt) + len(completion.token_ids) > model.max_positions:
                raise _malformed(where, f"prompt and completion exceed {model.max_positions} positions")


def check_completion_provenance(completion: Completion, where: str, ctx: ValidationContext) -> None:
    """What only the worker's generation explains: EOS placement, the seed's range, one proof per chunk."""
    policy, tokens = ctx.descriptor.policy, completion.token_ids
    eos = ctx.model.eos_token_ids
    ranges = model_ranges(len(tokens), completion.env_spans)
    turn_ends = {end - 1 for _, end in ranges}
    early = next((i for a, b in ranges for i in range(a, b) if tokens[i] in eos and i not in turn_ends), None)
    if early is not None:
        raise _malformed(where, f"EOS at position {early} before the end of the model's turn")
    if type(completion.ended_with_eos) is not bool or completion.ended_with_eos != (tokens[-1] in eos):
        raise _malformed(where, "ended_with_eos disagrees with the last token")
    if type(completion.seed) is not int or not 0 <= completion.seed < 2**SEED_BITS:
        raise _malformed(where, f"seed outside [0, 2^{SEED_BITS})")
    sampled = sum(b - a for a, b in ranges)  # proofs cover the model's tokens only
    owed = chunk_count(sampled, policy.toploc_chunk)
    if len(completion.proofs) != owed:
        raise _malformed(where, f"{len(completion.proofs)} proofs, {sampled} model tokens owe {owed}")
    size = proof_size(policy.toploc_k)
    for pi, proof in enumerate(completion.proofs):
        if type(proof) is not bytes or len(proof) != size:
            raise _malformed(where, f"proof {pi} is not {size} bytes")


def check_fields(sub: RolloutSubmission, ctx: ValidationContext) -> None:
    """Every field within what the run allows, before anything that could trip on it sees the submission.

    The counts are the run's (`prompts_per_step` groups of `group_size`), ids lie in the model's
    vocabulary, every completion fits the model's context after its prompt, and the byte fields have
    exactly the sizes the run prescribes. A violation is `Reject(MALFORMED_ROLLOUT)` naming the group,
    completion and field: the worker signed it, so it is slashable. A submission of another run is
    ignored 204: it is not this run's to judge.
    """
    grpo = ctx.descriptor.grpo
    if sub.run != ctx.descriptor.run:
        raise Ignore(Reason.WRONG_RUN, f"submission of run {sub.run!r}, not {ctx.descriptor.run!r}")
    if len(sub.groups) != grpo.prompts_per_step:
        raise _malformed("groups", f"{len(sub.groups)} groups, the run asks for {grpo.prompts_per_step}")
    check_groups_shape(sub, grpo, ctx.model, run_environment(ctx.descriptor))
    for gi, group in enumerate(sub.groups):
        for ci, completion in enumerate(group.completions):
            check_completion_provenance(completion, f"group {gi} completion {ci}", ctx)


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


def check_step(sub: RolloutSubmission, descriptor: RunDescriptor) -> None:
    """The step names the claimed version and a counter below the run's `max_submissions_per_version`
    (cheap: a validator also runs it at SUBMIT, before storing anything)."""
    if step_version(sub.step) != sub.checkpoint_version:
        raise Reject(Reason.BAD_ASSIGNMENT, "assignment step is not bound to the claimed checkpoint version")
    counter, allowed = step_counter(sub.step), descriptor.max_submissions_per_version
    if counter >= allowed:
        raise Reject(Reason.BAD_ASSIGNMENT, f"counter {counter}: the run allows {allowed} per version")


def check_assignment(sub: RolloutSubmission, worker: bytes, ctx: ValidationContext) -> None:
    """The step names the claimed version and an allowed counter; tasks, prompts and seeds are the
    assignment's. The seeds hash the step in, so completions made for another assignment fail here."""
    descriptor = ctx.descriptor
    check_step(sub, descriptor)
    rules = episode_rules(descriptor)
    expected = assigned_tasks(descriptor, ctx.dataset_ids, worker, sub.step)
    claimed = [g.task_id for g in sub.groups]
    if claimed != expected:
        raise Reject(Reason.BAD_ASSIGNMENT, "task ids differ from the deterministic assignment")
    for gi, group in enumerate(sub.groups):
        task = ctx.dataset[group.task_id]
        if tuple(group.prompt_ids) != task_prompt_ids(task, ctx.tokenizer, rules):
            raise Reject(Reason.BAD_ASSIGNMENT, f"group {gi}: prompt tokens differ from the task's prompt")
        for ci, completion in enumerate(group.completions):
            if completion.seed != derive_seed(descriptor.run, worker, sub.step, group.task_id, ci):
                raise Reject(
                    Reason.BAD_SAMPLING, f"group {gi} completion {ci}: seed is not the prescribed one"
                )


def check_rewards(sub: RolloutSubmission, ctx: ValidationContext) -> None:
    """Check 5: every reward recomputed exactly, every advantage within ADVANTAGE_TOLERANCE of the group's.

    Grading may execute a completion (`executes_completion`), so this runs only on text the model checks
    passed (or, unsampled, on parsing kinds only). The 603 detail names the group and the first differing
    completion, never a value: a verdict is public, and what a grader computed stays in this node.
    """
    rules = episode_rules(ctx.descriptor)
    if rules is not None:
        recomputed = replayed_rewards(sub, ctx, rules)
    else:
        recomputed = submission_rewards(
            [(ctx.dataset[group.task_id], [c.token_ids for c in group.completions]) for group in sub.groups],
            ctx.descriptor,
            ctx.tokenizer,
        )
    for gi, (group, rewards) in enumerate(zip(sub.groups, recomputed, strict=True)):
        claimed = [c.reward for c in group.completions]
        ci = next((i for i, (c, r) in enumerate(zip(claimed, rewards, strict=True)) if c != r), None)
        if ci is not None:
            raise Reject(Reason.BAD_REWARD, f"group {gi} completion {ci}: {REWARD_DIFFERS}")
        advantages = group_advantages(torch.tensor(rewards))
        close = torch.isclose(
            torch.tensor([c.advantage for c in group.completions]), advantages, atol=ADVANTAGE_TOLERANCE
        )
        if not bool(close.all()):
            ci = int(torch.nonzero(~close)[0])
            raise Reject(Reason.BAD_REWARD, f"group {gi} completion {ci}: {ADVANTAGE_DIFFERS}")


def replayed_rewards(sub: RolloutSubmission, ctx: ValidationContext,
                     rules: EpisodeRules) -> list[list[float]]:
    """Each completion's reward by replaying the environment on its model turns (spec/environments.md,
    Replay): an environment span the environment does not say is 611 FABRICATED_ENV_TURN, a transcript in
    another shape than the episode's 609. The detail names the span, not what the environment said."""
    prefetch(rules.env, [call for group in sub.groups for c in group.completions
                         for call in replay_calls(ctx.dataset[group.task_id], c.seed, ctx.tokenizer,
                                                  c.token_ids, c.env_spans)])
    rewards = []
    for gi, group in enumerate(sub.groups):
        task = ctx.dataset[group.task_id]
        row = []
        for ci, c in enumerate(group.completions):
            where = f"group {gi} completion {ci}"
            try:
                replayed = replay_tokens(rules, task, c.seed, ctx.tokenizer, c.token_ids, c.env_spans,
                                         ctx.model.eos_token_ids)
            except FabricatedTurn as exc:
                raise Reject(Reason.FABRICATED_ENV_TURN,
                             f"{where}: span {exc.index} is not what the environment says") from None
            except MalformedTranscript as exc:
                raise _malformed(where, f"span {exc.index}: {exc.problem}") from None
            row.append(replayed.reward)
        rewards.append(row)
    return rewards


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
    """TOPLOC on every completion in one vectorised pass, chunks numbered across the submission;
    `BadProof` names failing ones. Every proof is checked for its form before any is evaluated."""
    offsets = [0]
    for completion in completions:
        offsets.append(offsets[-1] + len(completion.proofs))
    try:
        per_completion = verify_proofs_batch(
            [p.hidden_rows for p in prefills],
            [list(c.proofs) for c in completions],
            k=policy.toploc_k,
            chunk=policy.toploc_chunk,
        )
    except MalformedProof as exc:
        i = exc.completion
        raise BadProof(f"completion {i}: {exc}", ProofFailure((offsets[i] + exc.index,), 0.0, 0.0)) from None
    except ProofCountMismatch as exc:  # a proof count that does not match the tokens: all its claimed chunks
        i = exc.completion
        claimed = tuple(range(offsets[i], offsets[i + 1]))
        raise BadProof(f"completion {i}: {exc}", ProofFailure(claimed, 0.0, 0.0)) from None
    checks = [check for chunk_checks in per_completion for check in chunk_checks]
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


@dataclass(frozen=True)
class _Sampled:
    """What the model checks read of one completion: the tokens the model sampled (all of them in a
    single-turn run, the model spans' in a multi-turn one), their positions in the completion (the
    sampler's noise index), their claimed logprobs (packed float32), and the last model turn with its token
    budget (what termination reads)."""

    tokens: list[int]
    positions: list[int]
    seed: int
    claimed_logprobs: bytes
    last_turn: Sequence[int]
    last_budget: int


def sampled_tokens(completion: Completion, rules: EpisodeRules | None, max_new_tokens: int) -> _Sampled:
    """The model's part of a completion (`_Sampled`): every token of a single-turn one; in a multi-turn run
    (`rules`) the tokens outside its environment spans, and its last turn's budget."""
    tokens = list(completion.token_ids)
    if rules is None or not completion.env_spans:
        budget = max_new_tokens if rules is None else rules.turn_budget(0)
        everything = list(range(len(tokens)))
        return _Sampled(tokens, everything, completion.seed, completion.logprobs, tokens, budget)
    ranges = model_ranges(len(tokens), completion.env_spans)
    positions = [i for a, b in ranges for i in range(a, b)]
    claimed = b"".join(completion.logprobs[LOGPROB_BYTES * i : LOGPROB_BYTES * (i + 1)] for i in positions)
    last_start, last_end = ranges[-1]
    return _Sampled([tokens[i] for i in positions], positions, completion.seed, claimed,
                    tokens[last_start:last_end], rules.turn_budget(last_start))


def model_rows(prefill: Prefill, completion: Completion) -> Prefill:
    """The prefill at the model's positions only (a multi-turn completion's environment rows dropped)."""
    if not completion.env_spans:
        return prefill
    mask = model_mask(len(completion.token_ids), completion.env_spans)
    at_logits = mask.to(prefill.logits.device)
    return Prefill(hidden_rows=prefill.hidden_rows[mask], logits=prefill.logits[at_logits])


SCORE_ENTRIES = 1 << 25
"""Logit entries (rows x vocabulary) scored in one pass: 221 rows of a 150k vocabulary. The pass's seeded
noise and scores are a few temporaries of that size (128 MB each in fp32, twice that in the int64 hash on a
GPU), so a submission of any length is scored in bounded memory beside its logits."""


def score_rows(vocab_size: int) -> int:
    """Rows per scoring pass at this vocabulary (`SCORE_ENTRIES`), at least one."""
    return max(1, SCORE_ENTRIES // max(1, vocab_size))


@dataclass(frozen=True)
class _TokenScores:
    """What checks 6b-6d read from the validator's logits, for every sampled token of a submission at
    once (packed: completion after completion), from one pass over the stacked logits."""

    logprobs: torch.Tensor  # (N,) under softmax(logits / temperature), as `token_logprobs`
    last_eos_probs: list[float]  # one per completion: `eos_probabilities` at its last position (0 if none)
    sampling: list[SamplingCheck]  # one per completion, as `check_sampling`


def _blocks(prefills: Sequence[Prefill], rows: int) -> Iterator[torch.Tensor]:
    """The submission's logits, completion after completion, `rows` rows at a time (the last block shorter),
    where they lie: no copy of the whole submission's logits is made."""
    pending: list[torch.Tensor] = []
    held = 0
    for logits in (p.logits for p in prefills):
        at = 0
        while at < len(logits):
            take = min(rows - held, len(logits) - at)
            pending.append(logits[at : at + take])
            held, at = held + take, at + take
            if held == rows:
                yield torch.cat(pending)
                pending, held = [], 0
    if pending:
        yield torch.cat(pending)


def _token_scores(
    sampled: Sequence[_Sampled], prefills: Sequence[Prefill], temperature: float, tolerance: float,
    eos_token_ids: Sequence[int], rows: int | None = None,
) -> _TokenScores:
    """`token_logprobs`, the P(EOS) `check_termination` reads and `check_sampling` of every completion,
    batched.

    Each is row-wise over the logits, so stacking the completions changes no value; the sampling check
    is `check_sampling`'s: the seeded Gumbel noise of each (seed, position), the gap between the best
    perturbed score and the claimed token's, a mismatch where it exceeds the tolerance. P(EOS) is taken
    only at each completion's last position, the one value termination reads. Mismatches are indices into
    each completion's sampled tokens. The work runs `rows` rows at a time (`score_rows` by default) on the
    logits' device (a GPU validator hashes the noise there: on its CPU that took 30x the worker's
    generation); only per-token values come back.
    """
    lengths = [len(s.tokens) for s in sampled]
    tokens = torch.tensor([t for s in sampled for t in s.tokens], dtype=torch.int64)
    held = sum(len(p.logits) for p in prefills)
    if any(p.logits.ndim != 2 for p in prefills) or held != tokens.shape[0]:
        shapes = [tuple(p.logits.shape) for p in prefills]
        raise ValueError(f"logits {shapes} do not match {tokens.shape[0]} tokens")
    keys = [position_key(s.seed, p) for s in sampled for p in s.positions] if temperature > 0 else []
    if rows is None:
        rows = score_rows(prefills[0].logits.shape[-1] if prefills else 1)
    ends = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    present = [i for i, n in enumerate(lengths) if n]
    last_rows = (ends[present] - 1).tolist()
    logprobs, gap_parts, last_logits = [], [], []
    at = 0
    for block in _blocks(prefills, rows):
        n, device = len(block), block.device
        claimed = tokens[at : at + n].to(device)
        logprobs.append(token_logprobs(block, claimed, temperature).cpu())
        scores = keyed_scores(block, keys[at : at + n], temperature)
        gap = scores.max(dim=-1).values - scores.gather(-1, claimed.unsqueeze(-1)).squeeze(-1)
        gap_parts.append(gap.cpu())
        last_logits += [block[r - at] for r in last_rows if at <= r < at + n]
        at += n
    gaps = torch.cat(gap_parts) if gap_parts else torch.zeros(0)
    owner = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch.int64))
    largest = torch.zeros(len(lengths), dtype=gaps.dtype).scatter_reduce(
        0, owner, gaps, "amax", include_self=False
    )
    mismatches: list[list[int]] = [[] for _ in lengths]
    stops = ends.tolist()
    for flat in torch.nonzero(gaps > tolerance).flatten().tolist():
        i = bisect.bisect_right(stops, flat)
        mismatches[i].append(flat - (stops[i] - lengths[i]))
    sampling = [
        SamplingCheck(mismatches=tuple(m), max_gap=float(g) if n else 0.0)
        for m, g, n in zip(mismatches, largest.tolist(), lengths, strict=True)
    ]
    last_eos_probs = [0.0] * len(lengths)
    if last_logits:
        last_eos = eos_probabilities(torch.stack(last_logits), eos_token_ids, temperature).tolist()
        for i, p in zip(present, last_eos, strict=True):
            last_eos_probs[i] = p
    packed = torch.cat(logprobs) if logprobs else torch.zeros(0)
    return _TokenScores(packed, last_eos_probs, sampling)


def _logprobs_differ(sampled: Sequence[_Sampled], recomputed: torch.Tensor) -> set[int]:
    """Check 6c for every completion at once: those whose claimed logprobs are not `torch.allclose` to the
    prefill's (`recomputed`, packed) within LOGPROB_TOLERANCE."""
    lengths = [len(s.tokens) for s in sampled]
    if all(len(s.claimed_logprobs) == LOGPROB_BYTES * n for s, n in zip(sampled, lengths, strict=True)):
        claimed = unpack_logprobs(b"".join(s.claimed_logprobs for s in sampled))
        close = torch.isclose(claimed, recomputed, atol=LOGPROB_TOLERANCE)
        owner = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths, dtype=torch.int64))
        return set(owner[~close].tolist())
    return {  # not from a submission that passed check 2b: completion by completion
        i
        for i, (s, r) in enumerate(zip(sampled, recomputed.split(lengths), strict=True))
        if (claimed := unpack_logprobs(s.claimed_logprobs)).shape != r.shape
        or not torch.allclose(claimed, r, atol=LOGPROB_TOLERANCE)
    }


def check_model_outputs(sub: RolloutSubmission, ctx: ValidationContext, engine: InferenceEngine) -> Accepted:
    """One batched prefill on the claimed checkpoint, then TOPLOC, termination, logprobs and sampling.

    The prefill's rows and logits are all the model checks read (no second forward); each check runs
    once over the whole submission. TOPLOC comes first: a worker that generated with other weights or
    another prompt is caught by the check that names failing chunks (slashable evidence), not by the
    logprobs it could not reproduce. In a multi-turn run the prefill runs over the whole transcript and the
    checks read the model's positions only: the environment's tokens were not sampled.
    """
    descriptor, policy = ctx.descriptor, ctx.descriptor.policy
    temperature = descriptor.grpo.temperature
    rules = episode_rules(descriptor)
    flat = [(g.prompt_ids, c) for g in sub.groups for c in g.completions]
    completions = [c for _, c in flat]
    prefills = [model_rows(p, c) for p, c in zip(
        engine.prefill_batch([(list(p), list(c.token_ids)) for p, c in flat]), completions, strict=True)]
    summary = check_proofs(completions, prefills, policy)
    eos_ids = ctx.model.eos_token_ids
    sampled = [sampled_tokens(c, rules, descriptor.grpo.max_new_tokens) for c in completions]
    scores = _token_scores(sampled, prefills, temperature, policy.sampling_tolerance, eos_ids)
    logprobs_differ = _logprobs_differ(sampled, scores.logprobs)
    for i, (s, sampling) in enumerate(zip(sampled, scores.sampling, strict=True)):
        termination = check_termination_at_end(
            scores.last_eos_probs[i],
            s.last_turn,
            eos_ids,
            s.last_budget,
            eos_threshold(s.tokens, sampling, policy.eos_min_prob, eos_ids),
        )
        if not termination.passed:
            raise Reject(Reason.BAD_TERMINATION, f"completion {i}: {termination.failures}")
        if i in logprobs_differ:
            raise Reject(Reason.RULE_VIOLATION,
                         f"completion {i}: claimed logprobs differ from the checkpoint's")
    for i, sampling in enumerate(scores.sampling):
        if not sampling.passed:
            raise Reject(
                Reason.BAD_SAMPLING,
                f"completion {i}: tokens at {list(sampling.mismatches)[:8]} are not "
                "the seeded sampler's choice",
            )
    return Accepted(sum(len(s.tokens) for s in sampled), summary.mean_exp_mismatches, summary.mean_mant_err)


def eos_threshold(tokens: Sequence[int], sampling: SamplingCheck, eos_min_prob: float,
                  eos_token_ids: Sequence[int]) -> float:
    """The P(EOS) a final EOS needs (check 6b): none when the seeded sampler itself chose it.

    An honest sampler picks EOS at P(EOS) = p with probability p, so over the thousands of positions
    of a submission an honest EOS below any fixed threshold is bound to happen (the devnet slashed an
    honest worker for it); the seeded choice is exact evidence, the threshold only guards an EOS the
    sampler did not choose.
    """
    last = len(tokens) - 1
    if last >= 0 and tokens[last] in eos_token_ids and last not in sampling.mismatches:
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
    """Checks 1, 2, 2b, 3, 4, 6, 5 (module docstring); the accepted statistics, or Reject / Ignore.

    Rewards are recomputed last, on text the model checks showed to be the model's own. `prefill=False`
    skips check 6: what a validator that samples a fraction of the submissions does with the others
    (spec/validation.md); the statistics are then zero. It is refused (ValueError, the caller's error) for a
    submission whose grading executes a completion: such a submission is always drawn. A grader's safety
    net (GraderFault: a wall clock, memory) gives no reward and is a JUDGE_FAULT; a forged submission never
    gets that far, the model checks already slashed it. Raises only ProtocolError for what the submission
    holds; `judge_total` is the form that never raises.
    """
    check_eligibility(worker, ctx)
    check_fields(sub, ctx)
    check_staleness(sub, ctx)
    check_assignment(sub, worker, ctx)
    if prefill:
        accepted = check_model_outputs(sub, ctx, engine_for(sub.checkpoint_version))
    elif grades_by_execution(sub, ctx.dataset):
        raise ValueError("a submission whose grader executes its completions is graded only after check 6")
    else:
        accepted = Accepted(submission_tokens(sub), 0.0, 0.0)
    try:
        check_rewards(sub, ctx)
    except GraderFault as fault:
        raise judge_fault(fault) from fault
    return accepted


def judge_fault(exc: BaseException) -> Ignore:
    """The quarantine verdict for an unexpected exception: its type and the start of its message.

    The exception is kept as `__cause__`, so a caller can log the original traceback.
    """
    fault = Ignore(Reason.JUDGE_FAULT, f"{type(exc).__name__}: {str(exc)[:MAX_FAULT_DETAIL]}")
    fault.__cause__ = exc
    return fault


def judge_total(
    sub: RolloutSubmission,
    worker: bytes,
    ctx: ValidationContext,
    engine_for: Callable[[int], InferenceEngine],
    *,
    prefill: bool = True,
) -> Accepted | ProtocolError:
    """`validate_submission` that never raises: the outcome is Accepted or the ProtocolError it found.

    Any other exception (a bug, an engine failure, MemoryError) is `Ignore(JUDGE_FAULT)`: that item is
    quarantined, never credited or slashed, and the caller's loop goes on (module docstring).
    """
    try:
        return validate_submission(sub, worker, ctx, engine_for, prefill=prefill)
    except ProtocolError as exc:
        return exc
    except Exception as exc:  # a crash while judging one item is a verdict about that item
        return judge_fault(exc)

"""The judge is total: whatever a signed submission holds, `judge_total` ends in an outcome.

Honest submissions are built on a tiny model folder (EOS-prone, so completions end both ways) and judged
by the real engine; hypothesis then mutates every field (tokens, prompt ids, logprob bytes, proofs, rewards,
advantages, seeds, EOS flags, counters, versions, roots, group and completion shapes), alone and combined,
and each mutant is judged both as constructed and, when the codec can encode it, sealed by the worker and
opened again as a validator receives it. Properties:
- no exception escapes, and the outcome is `Accepted` or a `ProtocolError`;
- no mutant makes the judge fault (JUDGE_FAULT): every field is checked before anything can trip on it;
- a mutant is accepted with the prefill only if its tokens, seeds, prompts and step are the honest ones;
- the signed and the constructed mutant get the same outcome.
A fault (an engine that raises, a validator whose model config is wrong) is quarantined as JUDGE_FAULT.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.rl.engine import InferenceEngine, TransformersEngine
from swarmnode.node.rl.model import ModelInfo
from swarmnode.node.rl.rollouts import assigned_tasks, build_submission
from swarmnode.node.rl.run import devnet_dataset, devnet_grpo, devnet_run
from swarmnode.node.rl.validation import Accepted, ValidationContext, judge_total, validate_submission
from swarmnode.protocol.envelope import ReplayWindow, open_envelope, seal
from swarmnode.protocol.errors import Ignore, ProtocolError, Reason, Reject
from swarmnode.protocol.messages import RolloutSubmission
from swarmnode.protocol.runs import assignment_step
from tests.tinymodel import eos_prone, tiny_engine, tiny_folder

RUN = "judge-total"
WORKER = NodeIdentity(b"\x11" * 32)
NOW_MS = 1_767_225_600_000
DATASET_SIZE = 16
VERSION = 1  # the validator holds v0 and v1 (both the base weights), newest v1
ARCH = "qwen2"


@dataclasses.dataclass(frozen=True)
class Judge:
    """One engine, one run, one honest submission, and the context of a validator holding v0 and v1."""

    engine: TransformersEngine
    ctx: ValidationContext
    honest: RolloutSubmission
    root: bytes

    @property
    def info(self) -> ModelInfo:
        return self.engine.info

    def __call__(self, sub: RolloutSubmission, *, prefill: bool = True) -> Accepted | ProtocolError:
        return judge_total(sub, WORKER.address, self.ctx, self.engine_for, prefill=prefill)

    def engine_for(self, version: int) -> InferenceEngine:
        return self.engine


@pytest.fixture(scope="module")
def judge() -> Judge:
    engine = eos_prone(tiny_engine(ARCH), scale=1.0)  # the honest submission below ends both ways
    tasks = devnet_dataset()[:DATASET_SIZE]
    base = devnet_grpo(engine.info)
    grpo = dataclasses.replace(base, prompts_per_step=2, group_size=2, token_budget=4 * base.max_new_tokens)
    run = devnet_run(b"\x01" * 20, tiny_folder(ARCH), NOW_MS, grpo=grpo, tasks=tasks, info=engine.info)
    descriptor = dataclasses.replace(run.descriptor, run=RUN, max_submissions_per_version=8)
    root = descriptor.base_checkpoint_hash
    ctx = ValidationContext(
        descriptor, run.dataset, run.dataset_ids, VERSION, {0: root, VERSION: root}, lambda _: True,
        engine.info, engine.tokenizer,
    )  # fmt: skip
    honest = build_submission(
        engine, descriptor, run.dataset, run.dataset_ids, WORKER.address, VERSION, root, 2
    )
    return Judge(engine, ctx, honest, root)


def test_the_honest_submission_is_accepted(judge):
    ends = {c.ended_with_eos for g in judge.honest.groups for c in g.completions}
    assert ends == {True, False}  # mutants meet EOS-ended and full-length completions
    for prefill in (True, False):
        outcome = judge(judge.honest, prefill=prefill)
        assert isinstance(outcome, Accepted), outcome
        assert outcome.tokens == sum(len(c.token_ids) for g in judge.honest.groups for c in g.completions)


# --- mutations -------------------------------------------------------------------------------------

U64 = st.integers(0, 2**64 - 1)


def tokens_of(info: ModelInfo) -> st.SearchStrategy[int]:
    """Token ids at and around the model's bounds (its EOS ids, the vocabulary's end, the wire's)."""
    edges = [0, *info.eos_token_ids, info.pad_token_id, info.vocab_size - 1, info.vocab_size]
    return st.one_of(st.sampled_from([*edges, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1]), U64)

FLOAT = st.floats(allow_nan=True, allow_infinity=True, width=64)
FLOAT32_BYTES = st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=8).map(
    lambda xs: struct.pack(f"<{len(xs)}f", *xs)
)


def _completion_at(data: st.DataObject, sub: RolloutSubmission) -> tuple[int, int] | None:
    groups = [gi for gi, g in enumerate(sub.groups) if g.completions]
    if not groups:
        return None
    gi = data.draw(st.sampled_from(groups))
    return gi, data.draw(st.integers(0, len(sub.groups[gi].completions) - 1))


def _replace_completion(sub: RolloutSubmission, gi: int, ci: int, **changes: Any) -> RolloutSubmission:
    group = sub.groups[gi]
    completions = list(group.completions)
    completions[ci] = dataclasses.replace(completions[ci], **changes)
    return _replace_group(sub, gi, completions=tuple(completions))


def _replace_group(sub: RolloutSubmission, gi: int, **changes: Any) -> RolloutSubmission:
    groups = list(sub.groups)
    groups[gi] = dataclasses.replace(groups[gi], **changes)
    return dataclasses.replace(sub, groups=tuple(groups))


def _edit_list(data: st.DataObject, items: tuple[Any, ...], item: st.SearchStrategy[Any]) -> tuple[Any, ...]:
    """Set, insert, delete or append one item, or replace the whole list."""
    out = list(items)
    kind = data.draw(st.sampled_from(["set", "insert", "delete", "append", "replace"]))
    if kind == "replace" or not out and kind in ("set", "delete"):
        return tuple(data.draw(st.lists(item, max_size=10)))
    if kind == "append":
        return (*out, data.draw(item))
    at = data.draw(st.integers(0, len(out) - 1)) if out else 0
    if kind == "set":
        out[at] = data.draw(item)
    elif kind == "insert":
        out.insert(at, data.draw(item))
    else:
        del out[at]
    return tuple(out)


def _proofs(data: st.DataObject, proofs: tuple[bytes, ...]) -> tuple[bytes, ...]:
    kind = data.draw(st.sampled_from(["flip", "truncate", "list"]))
    if kind == "list" or not proofs:
        return _edit_list(data, proofs, st.binary(max_size=300) | st.sampled_from(proofs or (b"",)))
    at = data.draw(st.integers(0, len(proofs) - 1))
    proof = bytearray(proofs[at])
    if kind == "flip" and proof:
        i = data.draw(st.integers(0, len(proof) - 1))
        proof[i] ^= data.draw(st.integers(1, 255))
    else:
        del proof[data.draw(st.integers(0, len(proof))) :]
    return proofs[:at] + (bytes(proof),) + proofs[at + 1 :]


def mutate(data: st.DataObject, sub: RolloutSubmission, info: ModelInfo) -> RolloutSubmission:
    """One field of `sub` changed to a hostile value (the kinds cover every field of the submission)."""
    token = tokens_of(info)
    kind = data.draw(
        st.sampled_from(
            [
                "tokens", "logprobs", "logprob-values", "proofs", "reward", "advantage", "seed", "eos-flag",
                "prompt", "step", "counter", "version", "root", "run", "groups", "completions",
            ]
        )
    )  # fmt: skip
    if kind in ("step", "counter", "version", "root", "run", "groups"):
        if kind == "step":
            return dataclasses.replace(sub, step=data.draw(U64))
        if kind == "counter":
            counter = data.draw(st.integers(0, 2**32 - 1) | st.integers(0, 12))
            return dataclasses.replace(sub, step=assignment_step(sub.checkpoint_version, counter))
        if kind == "version":
            version = data.draw(st.integers(0, 4) | st.integers(0, 2**32 - 1) | U64)
            counter = sub.step & 0xFFFFFFFF
            step = assignment_step(version, counter) if version < 2**32 else sub.step
            return dataclasses.replace(sub, checkpoint_version=version, step=step)
        if kind == "root":
            return dataclasses.replace(sub, checkpoint_root=data.draw(st.binary(min_size=32, max_size=32)))
        if kind == "run":
            return dataclasses.replace(sub, run=data.draw(st.sampled_from(["other", "", RUN + "x"])))
        if not sub.groups:  # an earlier edit emptied them: nothing to copy from
            return sub
        return dataclasses.replace(sub, groups=_edit_list(data, sub.groups, st.sampled_from(sub.groups)))
    gi = data.draw(st.integers(0, len(sub.groups) - 1)) if sub.groups else None
    if gi is None:
        return sub
    if kind == "prompt":
        return _replace_group(sub, gi, prompt_ids=_edit_list(data, sub.groups[gi].prompt_ids, token))
    if kind == "completions":
        group = sub.groups[gi]
        pool = st.sampled_from([c for g in sub.groups for c in g.completions] or [None]).filter(bool)
        return _replace_group(sub, gi, completions=_edit_list(data, group.completions, pool))
    where = _completion_at(data, sub)
    if where is None:
        return sub
    gi, ci = where
    c = sub.groups[gi].completions[ci]
    changes: dict[str, Any]
    if kind == "tokens":
        changes = {"token_ids": _edit_list(data, c.token_ids, token)}
    elif kind == "logprobs":
        changes = {"logprobs": data.draw(st.binary(max_size=40) | FLOAT32_BYTES)}
    elif kind == "logprob-values":
        changes = {"logprobs": data.draw(st.binary(min_size=len(c.logprobs), max_size=len(c.logprobs)))}
    elif kind == "proofs":
        changes = {"proofs": _proofs(data, c.proofs)}
    elif kind == "reward":
        changes = {"reward": data.draw(FLOAT | st.sampled_from([0.0, 1.0, c.reward + 1e-9]))}
    elif kind == "advantage":
        changes = {"advantage": data.draw(FLOAT | st.just(c.advantage + 5e-5))}
    elif kind == "seed":
        changes = {"seed": data.draw(U64 | st.sampled_from([c.seed ^ 1, c.seed + 2**63]))}
    else:
        changes = {"ended_with_eos": not c.ended_with_eos}
    return _replace_completion(sub, gi, ci, **changes)


def _shape(sub: RolloutSubmission) -> tuple[Any, ...]:
    """What acceptance must leave as the honest worker made it."""
    return (
        sub.run,
        sub.step,
        sub.checkpoint_version,
        sub.checkpoint_root,
        tuple(
            (g.task_id, g.prompt_ids, tuple((c.token_ids, c.seed) for c in g.completions)) for g in sub.groups
        ),
    )


def _signed(sub: RolloutSubmission, seq: int) -> RolloutSubmission | None:
    """The mutant as a validator receives it: sealed by the worker, opened; None when it cannot be encoded."""
    try:
        envelope = seal(WORKER, sub, run=RUN, seq=seq, ts=NOW_MS)
    except Reject:
        return None  # outside the wire's types (a NaN float, say): no peer can send it
    opened = open_envelope(envelope, run=RUN, now_ms=NOW_MS, replay=ReplayWindow(), expect=RolloutSubmission)
    return opened.message


def _summary(outcome: Accepted | ProtocolError) -> tuple[str, int]:
    return ("accept", 0) if isinstance(outcome, Accepted) else (outcome.verdict, int(outcome.reason))


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_every_mutant_ends_in_an_outcome(judge, data):
    sub = judge.honest
    for _ in range(data.draw(st.integers(1, 3))):
        sub = mutate(data, sub, judge.info)
    prefill = data.draw(st.booleans())
    outcome = judge(sub, prefill=prefill)
    assert isinstance(outcome, Accepted | ProtocolError)
    assert not (isinstance(outcome, Ignore) and outcome.reason == Reason.JUDGE_FAULT), outcome.detail
    if isinstance(outcome, Accepted) and prefill:  # unsampled work is not checked against the model
        assert _shape(sub) == _shape(judge.honest)
    if isinstance(outcome, Accepted):
        assert all(
            math.isfinite(c.reward) and math.isfinite(c.advantage) for g in sub.groups for c in g.completions
        )
    signed = _signed(sub, seq=1)
    if signed is not None:
        assert _summary(judge(signed, prefill=prefill)) == _summary(outcome)


# --- named hostile inputs (the issue's cases) ------------------------------------------------------


def _first(judge: Judge, **changes: Any) -> RolloutSubmission:
    return _replace_completion(judge.honest, 0, 0, **changes)


@pytest.mark.parametrize(
    "name",
    ["vocab-before-eos", "vocab-after-eos", "token-2^63", "logprobs-short", "logprobs-long", "no-proof",
     "proof-short", "nan-reward", "inf-advantage", "prompt-vocab"],
)  # fmt: skip
def test_the_issues_poison_is_a_slashable_malformed_rollout(judge, name):
    """Each of these made the validator raise ValueError/IndexError before; now each is 609 naming the field,
    whether the submission is drawn for the prefill or not."""
    c = judge.honest.groups[0].completions[0]
    tokens, vocab, eos = c.token_ids, judge.info.vocab_size, judge.info.eos_token_ids[0]
    subs = {
        "vocab-before-eos": _first(judge, token_ids=(vocab + 7, *tokens[1:])),
        "vocab-after-eos": _first(
            judge, token_ids=(tokens[0], eos, vocab + 39), logprobs=c.logprobs[:4] * 3, ended_with_eos=False
        ),
        "token-2^63": _first(judge, token_ids=(2**63, *tokens[1:])),
        "logprobs-short": _first(judge, logprobs=c.logprobs[:-1]),
        "logprobs-long": _first(judge, logprobs=c.logprobs + b"\0\0\0\0"),
        "no-proof": _first(judge, proofs=()),
        "proof-short": _first(judge, proofs=(c.proofs[0][:-2],)),
        "nan-reward": _first(judge, reward=float("nan")),
        "inf-advantage": _first(judge, advantage=float("-inf")),
        "prompt-vocab": _replace_group(judge.honest, 0, prompt_ids=(1, 2**64 - 1)),
    }
    for prefill in (True, False):
        outcome = judge(subs[name], prefill=prefill)
        assert isinstance(outcome, Reject) and outcome.reason == Reason.MALFORMED_ROLLOUT, outcome
        assert "group 0" in outcome.detail


def test_a_counter_beyond_the_runs_bound_is_a_bad_assignment(judge):
    descriptor = judge.ctx.descriptor
    allowed = descriptor.max_submissions_per_version
    with pytest.raises(ValueError, match="allows"):  # an honest worker never builds one
        build_submission(
            judge.engine, descriptor, judge.ctx.dataset, judge.ctx.dataset_ids, WORKER.address, VERSION,
            judge.root, allowed,
        )  # fmt: skip
    wide = dataclasses.replace(descriptor, max_submissions_per_version=allowed + 1)
    ctx = judge.ctx
    beyond = build_submission(
        judge.engine, wide, ctx.dataset, ctx.dataset_ids, WORKER.address, VERSION, judge.root, allowed
    )
    outcome = judge(beyond)
    assert isinstance(outcome, Reject) and outcome.reason == Reason.BAD_ASSIGNMENT
    assert "allows" in outcome.detail
    counter = allowed - 1
    last = build_submission(
        judge.engine, descriptor, ctx.dataset, ctx.dataset_ids, WORKER.address, VERSION, judge.root, counter
    )
    assert isinstance(judge(last), Accepted)


def test_cached_completions_cannot_be_sold_under_another_step(judge):
    """A worker that generated a task once claims the same completions for another assignment of that task:
    the seeds bind the step, so the replay fails check 4 while honest work for that step passes."""
    descriptor, ids = judge.ctx.descriptor, judge.ctx.dataset_ids
    one = dataclasses.replace(descriptor, grpo=dataclasses.replace(descriptor.grpo, prompts_per_step=1))
    ctx = dataclasses.replace(judge.ctx, descriptor=one)
    steps = [assignment_step(v, c) for v in (0, VERSION) for c in range(one.max_submissions_per_version)]
    by_task: dict[bytes, list[int]] = {}
    for step in steps:
        by_task.setdefault(assigned_tasks(one, ids, WORKER.address, step)[0], []).append(step)
    first, again = next(s for s in by_task.values() if len(s) >= 2)[:2]
    cached = build_submission(
        judge.engine, one, judge.ctx.dataset, ids, WORKER.address, first >> 32, judge.root, first & 0xFFFFFFFF
    )
    replay = dataclasses.replace(cached, step=again, checkpoint_version=again >> 32)
    outcome = judge_total(replay, WORKER.address, ctx, judge.engine_for)
    assert isinstance(outcome, Reject) and outcome.reason == Reason.BAD_SAMPLING, outcome
    fresh = build_submission(
        judge.engine, one, judge.ctx.dataset, ids, WORKER.address, again >> 32, judge.root, again & 0xFFFFFFFF
    )
    assert isinstance(judge_total(fresh, WORKER.address, ctx, judge.engine_for), Accepted)


# --- faults are quarantined --------------------------------------------------------------------------


def test_an_engine_failure_is_a_judge_fault_not_a_crash(judge):
    def broken(version: int) -> InferenceEngine:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    outcome = judge_total(judge.honest, WORKER.address, judge.ctx, broken)
    assert isinstance(outcome, Ignore) and outcome.reason == Reason.JUDGE_FAULT
    assert outcome.detail.startswith("RuntimeError: CUDA error")
    assert isinstance(outcome.__cause__, RuntimeError)  # the caller can log the original traceback
    with pytest.raises(RuntimeError):  # validate_submission stays the raising form
        validate_submission(judge.honest, WORKER.address, judge.ctx, broken)
    assert isinstance(judge_total(judge.honest, WORKER.address, judge.ctx, broken, prefill=False), Accepted)


def test_a_validator_with_the_wrong_model_config_quarantines_what_its_engine_cannot_take(judge):
    """Should a field check ever miss (here: the validator believes the vocabulary is larger than its
    engine's), the real engine's IndexError is a JUDGE_FAULT verdict, and the next item is judged."""
    vocab = judge.info.vocab_size
    wrong = dataclasses.replace(judge.ctx, model=dataclasses.replace(judge.info, vocab_size=4 * vocab))
    c = judge.honest.groups[0].completions[0]
    poison = _first(judge, token_ids=(vocab + 1, *c.token_ids[1:]))
    outcome = judge_total(poison, WORKER.address, wrong, judge.engine_for)
    assert isinstance(outcome, Ignore) and outcome.reason == Reason.JUDGE_FAULT, outcome
    assert outcome.detail.split(":")[0] in ("IndexError", "RuntimeError", "ValueError")
    assert len(outcome.detail) < 300
    assert isinstance(judge_total(judge.honest, WORKER.address, wrong, judge.engine_for), Accepted)


def test_memory_errors_are_quarantined_too(judge):
    """Everything a submission holds is bounded before allocation, so MemoryError is the node's state: the
    item is quarantined rather than killing the validator on the same durable item at every restart."""

    def exhausted(version: int) -> InferenceEngine:
        raise MemoryError()

    outcome = judge_total(judge.honest, WORKER.address, judge.ctx, exhausted)
    assert isinstance(outcome, Ignore) and outcome.reason == Reason.JUDGE_FAULT
    assert outcome.detail == "MemoryError: "


def test_cancellation_and_exit_propagate(judge):
    """Only Exceptions become verdicts: KeyboardInterrupt, SystemExit (and trio's Cancelled) are not."""

    def interrupted(version: int) -> InferenceEngine:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        judge_total(judge.honest, WORKER.address, judge.ctx, interrupted)

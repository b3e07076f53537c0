"""The validator's pipeline on a real tiny model: honest work passes, every cheat gets its reason."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from swarmnode.crypto.hashing import sha256
from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.rl import validation
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.model import ModelRecipe, build_model, hf_config, model_commitment, save_model_folder
from swarmnode.node.rl.rollouts import (
    assigned_tasks,
    assignment_step,
    build_submission,
    generate_group,
    task_prompt_ids,
    to_wire_group,
)
from swarmnode.node.rl.run import describe_run, devnet_dataset, devnet_grpo, devnet_policy
from swarmnode.node.rl.tasks import GRADERS, executes_completion
from swarmnode.node.rl.validation import BadProof, ValidationContext, judge_total, validate_submission
from swarmnode.node.validator.judgement import make_verdict
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.protocol.messages import RolloutSubmission
from tests.forged import CODE_TASKS, PROGRAM, code_grpo, program_submission
from tests.tinymodel import eos_prone, tiny_engine, tiny_folder

WORKER = NodeIdentity(sha256(b"validation-test-worker")).address
ROOT = sha256(b"checkpoint-3")


def run_engine() -> TransformersEngine:
    """The run's model: the tiny folder's weights, EOS-prone so that honest groups hold EOS endings."""
    return eos_prone(tiny_engine())


@pytest.fixture(scope="module")
def engine():
    return run_engine()


@pytest.fixture(scope="module")
def setup(engine):
    tasks = devnet_dataset()
    grpo = dataclasses.replace(devnet_grpo(engine.info), prompts_per_step=2, group_size=4)
    descriptor = describe_run(
        run="test-run",
        trainer=b"\x01" * 20,
        model=model_commitment(tiny_folder()),
        tasks=tasks,
        grpo=grpo,
        policy=devnet_policy(),
        created_ms=0,
    )
    return descriptor, tasks


def context(setup, engine, newest=3, eligible=True):
    descriptor, tasks = setup
    return ValidationContext(
        descriptor,
        {t.task_id: t for t in tasks},
        [t.task_id for t in tasks],
        newest,
        {3: ROOT, 2: sha256(b"checkpoint-2")},
        lambda _: eligible,
        engine.info,
        engine.tokenizer,
    )


@pytest.fixture(scope="module")
def honest(engine, setup):
    descriptor, tasks = setup
    return build_submission(
        engine, descriptor, {t.task_id: t for t in tasks}, [t.task_id for t in tasks], WORKER, 3, ROOT, 0
    )


def judge(sub, ctx, engine, worker=WORKER):
    return validate_submission(sub, worker, ctx, lambda version: engine)


def test_honest_submission_is_accepted(honest, setup, engine):
    accepted = judge(honest, context(setup, engine), engine)
    assert accepted.tokens == sum(len(c.token_ids) for g in honest.groups for c in g.completions)
    assert accepted.mean_exp_mismatches <= 1.0


def test_unstaked_worker_is_rejected(honest, setup, engine):
    with pytest.raises(Reject) as err:
        judge(honest, context(setup, engine, eligible=False), engine)
    assert err.value.reason == Reason.NOT_STAKED


def test_stale_and_unknown_checkpoints_are_ignored(honest, setup, engine):
    with pytest.raises(Ignore) as err:
        judge(honest, context(setup, engine, newest=6), engine)
    assert err.value.reason == Reason.STALE
    with pytest.raises(Ignore):
        judge(
            dataclasses.replace(honest, checkpoint_version=4, step=assignment_step(4, 0)),
            context(setup, engine),
            engine,
        )


def test_wrong_checkpoint_root_is_rejected(honest, setup, engine):
    with pytest.raises(Reject) as err:
        judge(dataclasses.replace(honest, checkpoint_root=b"\x09" * 32), context(setup, engine), engine)
    assert err.value.reason == Reason.BAD_HASH


def test_cherry_picked_tasks_are_rejected(honest, setup, engine):
    with pytest.raises(Reject) as err:
        judge(dataclasses.replace(honest, groups=honest.groups[::-1]), context(setup, engine), engine)
    assert err.value.reason == Reason.BAD_ASSIGNMENT
    with pytest.raises(Reject) as err:  # someone else's assignment
        judge(honest, context(setup, engine), engine, worker=b"\x07" * 20)
    assert err.value.reason == Reason.BAD_ASSIGNMENT


def test_forged_reward_is_rejected(honest, setup, engine):
    """Full marks claimed for a group: 603 naming the group and its first completion that did not earn
    them, and no reward value: the detail is in the public verdict, a grader's result is not."""
    group = honest.groups[0]
    forged = tuple(dataclasses.replace(c, reward=1.0) for c in group.completions)
    sub = dataclasses.replace(
        honest, groups=(dataclasses.replace(group, completions=forged),) + honest.groups[1:]
    )
    with pytest.raises(Reject) as err:
        judge(sub, context(setup, engine), engine)
    assert err.value.reason == Reason.BAD_REWARD
    first = next(i for i, c in enumerate(group.completions) if c.reward != 1.0)
    detail = f"group 0 completion {first}: claimed reward differs from the recomputed one"
    assert err.value.detail == detail
    verdict = make_verdict(sub, b"\x00" * 32, WORKER, err.value)
    assert verdict.detail == detail and verdict.reason_code == Reason.BAD_REWARD


def test_the_603_details_name_a_completion_never_a_value(honest, setup, engine):
    """Rewards and advantages off in group 1 completion 2: the details are exactly the place, no number
    the grader or the advantages produced."""
    c = honest.groups[1].completions[2]
    for changes, what in (
        ({"reward": c.reward + 0.25}, "claimed reward differs from the recomputed one"),
        ({"advantage": c.advantage + 0.25}, "advantage does not follow from the rewards"),
    ):
        with pytest.raises(Reject) as err:
            judge(_replace_completion(honest, 1, 2, **changes), context(setup, engine), engine)
        assert err.value.reason == Reason.BAD_REWARD
        assert err.value.detail == f"group 1 completion 2: {what}"
        assert not re.search(r"\d", err.value.detail.split(":", 1)[1])


def test_tampered_prompt_is_caught_by_toploc(honest, setup, engine):
    """Generated on another prompt, claimed for the assigned one: the hidden rows betray it."""
    descriptor, tasks = setup
    dataset = {t.task_id: t for t in tasks}
    ids = assigned_tasks(descriptor, [t.task_id for t in tasks], WORKER, honest.step)
    groups = []
    for i, task_id in enumerate(ids):
        task = dataset[task_id]
        generated = generate_group(engine, task, descriptor, WORKER, honest.step)
        if i == 0:
            prompt = list(generated.prompt_ids)
            text = [engine.tokenizer.tokenizer.decode([t]) for t in prompt]
            at = next(i for i, piece in enumerate(text) if piece.isdigit())  # change one digit
            prompt[at] = engine.tokenizer.encode(str((int(text[at]) + 1) % 10))[0]
            generated = dataclasses.replace(
                generate_group(engine, task, descriptor, WORKER, honest.step, prompt),
                prompt_ids=generated.prompt_ids,
            )
        groups.append(to_wire_group(generated, descriptor, engine.tokenizer))
    with pytest.raises(BadProof) as err:
        judge(dataclasses.replace(honest, groups=tuple(groups)), context(setup, engine), engine)
    group_size = setup[0].grpo.group_size
    assert err.value.failure.failing_chunks  # the first group's completions (one chunk each here)
    assert all(c < group_size for c in err.value.failure.failing_chunks)


def test_perturbed_model_is_caught_by_toploc(setup, engine):
    descriptor, tasks = setup
    cheat = run_engine()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in cheat.model.parameters():
            p.mul_(1 + 0.01 * torch.randn(p.shape, generator=gen))
    sub = build_submission(
        cheat, descriptor, {t.task_id: t for t in tasks}, [t.task_id for t in tasks], WORKER, 3, ROOT, 1
    )
    with pytest.raises(BadProof) as err:
        judge(sub, context(setup, engine), engine)
    assert err.value.reason == Reason.BAD_PROOF
    chunks = sum(len(c.proofs) for g in sub.groups for c in g.completions)
    assert err.value.failure.failing_chunks and err.value.failure.failing_chunks[-1] < chunks
    assert err.value.failure.mean_mant_err > setup[0].policy.max_mean_mant_err


def _chunk_of(sub, gi, ci):
    """The submission-wide index of the first proof chunk of group gi, completion ci."""
    flat = [(g, c) for g, group in enumerate(sub.groups) for c in range(len(group.completions))]
    return sum(len(sub.groups[g].completions[c].proofs) for g, c in flat[: flat.index((gi, ci))])


def test_swapped_token_is_rejected(honest, setup, engine):
    """The row behind a swapped token is not the one proved (a completion of two or more tokens, so the
    swapped token feeds a proved row)."""
    gi, ci = next(
        (gi, ci)
        for gi, g in enumerate(honest.groups)
        for ci, c in enumerate(g.completions)
        if len(c.token_ids) >= 2
    )
    tokens = list(honest.groups[gi].completions[ci].token_ids)
    tokens[0] = next(t for t in (5, 6, 7) if t != tokens[0] and t not in engine.info.eos_token_ids)
    sub = _replace_completion(honest, gi, ci, token_ids=tuple(tokens))
    with pytest.raises(BadProof) as err:
        judge(sub, context(setup, engine), engine)
    assert err.value.failure.failing_chunks == (_chunk_of(sub, gi, ci),)


def _replace_completion(sub, gi, ci, **changes):
    group = sub.groups[gi]
    completions = list(group.completions)
    completions[ci] = dataclasses.replace(completions[ci], **changes)
    groups = list(sub.groups)
    groups[gi] = dataclasses.replace(group, completions=tuple(completions))
    return dataclasses.replace(sub, groups=tuple(groups))


def test_a_malformed_proof_names_its_chunk(honest, setup, engine):
    """Chunks are numbered across the submission: group 1, completion 2 is chunk G + 2 here."""
    group_size = setup[0].grpo.group_size
    proof = honest.groups[1].completions[2].proofs[0]
    bad = _replace_completion(honest, 1, 2, proofs=(b"\x00\x00" + proof[2:],))  # modulus 0
    with pytest.raises(BadProof) as err:
        judge(bad, context(setup, engine), engine)
    assert err.value.failure.failing_chunks == (group_size + 2,)


def test_a_wrong_proof_count_is_malformed_before_any_prefill(honest, setup, engine):
    """The count the chunking prescribes is a field rule: checked with the other fields, no engine needed."""
    proof = honest.groups[0].completions[1].proofs[0]
    for proofs in ((proof, proof), ()):
        bad = _replace_completion(honest, 0, 1, proofs=proofs)
        with pytest.raises(Reject) as err:
            validate_submission(bad, WORKER, context(setup, engine), _no_engine, prefill=True)
        assert err.value.reason == Reason.MALFORMED_ROLLOUT
        assert "group 0 completion 1" in err.value.detail


def _no_engine(version):
    raise AssertionError("the engine must not be used")


def test_logprobs_are_checked_after_the_proofs(honest, setup, engine):
    """Right tokens and proofs, wrong logprobs (what the trainer would use): a rule violation, not a slash."""
    from swarmnode.node.rl.rollouts import pack_logprobs, unpack_logprobs

    c = honest.groups[0].completions[0]
    bad = _replace_completion(honest, 0, 0, logprobs=pack_logprobs(unpack_logprobs(c.logprobs) + 0.5))
    with pytest.raises(Reject) as err:
        judge(bad, context(setup, engine), engine)
    assert err.value.reason == Reason.RULE_VIOLATION


def _recorded(monkeypatch, events: list[str]) -> None:
    """Record, in `events`, each model-checks pass and each group graded by the validator (both still run:
    these are spies on the real functions, not stand-ins)."""
    check_model_outputs, submission_rewards = validation.check_model_outputs, validation.submission_rewards

    def model_checks(*args, **kwargs):
        events.append("model checks")
        return check_model_outputs(*args, **kwargs)

    def graded(groups, *args, **kwargs):
        events.extend(f"graded {task.kind}" for task, _ in groups)
        return submission_rewards(groups, *args, **kwargs)

    monkeypatch.setattr(validation, "check_model_outputs", model_checks)
    monkeypatch.setattr(validation, "submission_rewards", graded)


def test_rewards_are_recomputed_only_after_the_model_checks(honest, setup, engine, monkeypatch):
    """Check 6 before check 5: a grader reads only text shown to be the model's own output."""
    events: list[str] = []
    _recorded(monkeypatch, events)
    assert judge(honest, context(setup, engine), engine).tokens > 0
    assert events == ["model checks"] + ["graded arithmetic"] * len(honest.groups)


def test_a_grader_fault_after_the_model_checks_is_a_judge_fault(honest, setup, engine, monkeypatch):
    """A grader's safety net (GraderFault: wall clock, memory) gives no reward: with the model checks
    passed, nobody is proven at fault, so the submission is quarantined (207), never slashed."""
    from swarmnode.node.rl.tasks import GraderFault

    events: list[str] = []
    _recorded(monkeypatch, events)

    def fault(groups, *args, **kwargs):
        events.append("grader fault")
        raise GraderFault("the code sandbox stopped on a machine-dependent limit (timeout)")

    monkeypatch.setattr(validation, "submission_rewards", fault)
    outcome = judge_total(honest, WORKER, context(setup, engine), lambda version: engine)
    assert isinstance(outcome, Ignore) and outcome.reason == Reason.JUDGE_FAULT
    assert outcome.detail.startswith("GraderFault: ") and isinstance(outcome.__cause__, GraderFault)
    assert events == ["model checks", "grader fault"]


@pytest.fixture(scope="module")
def code_setup(engine):
    """A run of code tasks only (tests.forged): every assignment's completions are executed when graded."""
    descriptor = describe_run(
        run="test-run",
        trainer=b"\x01" * 20,
        model=model_commitment(tiny_folder()),
        tasks=list(CODE_TASKS),
        grpo=code_grpo(devnet_grpo(engine.info), engine.tokenizer),
        policy=devnet_policy(),
        created_ms=0,
    )
    return descriptor, list(CODE_TASKS)


@pytest.fixture(scope="module")
def program(code_setup, engine):
    """The worker's own program claimed as completion 0 of its code task, with full marks (tests.forged)."""
    descriptor, tasks = code_setup
    ids = [t.task_id for t in tasks]
    return program_submission(engine, descriptor, {t.task_id: t for t in tasks}, ids, WORKER, 3, ROOT)


def test_a_program_the_model_did_not_write_is_refused_before_any_grader_runs_it(
    program, code_setup, engine, monkeypatch
):
    """The worker's program, teacher-forced so that its proofs, termination and logprobs are the model's,
    claimed to pass the tests: the sampling check refuses it (606, slashable), and no grader saw its text.
    (Grading first, the validator executed the program in its sandbox to find the claim false: 603.)"""
    assert engine.tokenizer.completion_text(program.groups[0].completions[0].token_ids) == PROGRAM
    events: list[str] = []
    _recorded(monkeypatch, events)
    with pytest.raises(Reject) as err:
        judge(program, context(code_setup, engine), engine)
    assert err.value.reason == Reason.BAD_SAMPLING and err.value.detail.startswith("completion 0:")
    assert events == ["model checks"]


def test_without_the_prefill_code_is_never_graded(program, code_setup, engine, monkeypatch):
    """`prefill=False` on a submission whose grader executes completions is the caller's error (the judge
    always draws such a submission): a ValueError, a JUDGE_FAULT through the total judge, no grading."""
    events: list[str] = []
    _recorded(monkeypatch, events)
    ctx = context(code_setup, engine)
    with pytest.raises(ValueError, match="executes"):
        validate_submission(program, WORKER, ctx, _no_engine, prefill=False)
    outcome = judge_total(program, WORKER, ctx, _no_engine, prefill=False)
    assert isinstance(outcome, Ignore) and outcome.reason == Reason.JUDGE_FAULT
    assert events == []
    with pytest.raises(Reject) as err:  # checks 1-4 still come first: someone else's assignment
        validate_submission(program, b"\x07" * 20, ctx, _no_engine, prefill=False)
    assert err.value.reason == Reason.BAD_ASSIGNMENT


def test_code_and_families_execute_and_an_unknown_kind_counts_as_executing():
    """The validator's allowlist of parsing kinds agrees with the graders' own list of executing kinds
    (reasoning-gym scorers eval answers)."""
    assert {kind for kind in GRADERS if executes_completion(kind)} == {"code", "reasoning_gym"}
    assert executes_completion("lean") and not executes_completion("math")


def test_cheap_checks_only_when_not_sampled(honest, setup, engine):
    """prefill=False (the submission was not drawn for the full check): no model is touched."""

    no_engine = _no_engine
    accepted = validate_submission(honest, WORKER, context(setup, engine), no_engine, prefill=False)
    assert accepted.tokens == sum(len(c.token_ids) for g in honest.groups for c in g.completions)
    assert (accepted.mean_exp_mismatches, accepted.mean_mant_err) == (0.0, 0.0)
    forged = _replace_completion(honest, 0, 0, reward=honest.groups[0].completions[0].reward + 1.0)
    with pytest.raises(Reject) as err:
        validate_submission(forged, WORKER, context(setup, engine), no_engine, prefill=False)
    assert err.value.reason == Reason.BAD_REWARD


def test_tier_two_failures_name_the_chunks_over_the_bound():
    from swarmnode.crypto.toploc import CalibratedPolicy, ChunkCheck
    from swarmnode.node.rl.validation import failing_chunks

    checks = [
        ChunkCheck(0, 0.0, 0.0, True),
        ChunkCheck(3, 0.2, 0.0, True),
        ChunkCheck(0, 0.9, 0.0, True),
        ChunkCheck(40, 0.0, 0.0, False),
    ]
    assert failing_chunks(checks, CalibratedPolicy(1.0, 0.5)) == (1, 2, 3)


def _submission_from(engine, setup, seed_offset=0, edit=None, counter=2):
    """A consistent submission (rewards, advantages, proofs match its tokens), possibly off-policy."""
    from swarmnode.node.rl.rollouts import GeneratedGroup
    from swarmnode.node.rl.sampling import derive_seed

    descriptor, tasks = setup
    dataset = {t.task_id: t for t in tasks}
    step = assignment_step(3, counter)
    groups = []
    for task_id in assigned_tasks(descriptor, [t.task_id for t in tasks], WORKER, step):
        task = dataset[task_id]
        grpo = descriptor.grpo
        seeds = [derive_seed(descriptor.run, WORKER, step, task_id, i) for i in range(grpo.group_size)]
        prompt = list(task_prompt_ids(task, engine.tokenizer))
        completions = engine.generate_group(
            prompt, grpo.group_size, [s + seed_offset for s in seeds], grpo.max_new_tokens, grpo.temperature
        )
        completions = [dataclasses.replace(c, seed=s) for c, s in zip(completions, seeds, strict=True)]
        if edit is not None:
            completions = edit(engine, prompt, completions)
        groups.append(
            to_wire_group(GeneratedGroup(task, tuple(prompt), completions), descriptor, engine.tokenizer)
        )
    return RolloutSubmission(descriptor.run, step, 3, ROOT, tuple(groups))


def test_int8_quantised_weights_are_caught(setup, engine):
    cheat = run_engine()
    with torch.no_grad():
        for p in cheat.model.parameters():
            if p.ndim == 2:
                scale = p.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
                p.copy_(torch.round(p / scale).clamp(-127, 127) * scale)
    with pytest.raises(Reject) as err:
        judge(_submission_from(cheat, setup), context(setup, engine), engine)
    assert isinstance(err.value, BadProof) and err.value.failure.failing_chunks


def bigger_folder(out: Path, engine: TransformersEngine) -> Path:
    """A model folder with the run's tokenizer and a larger model (wider, one more layer)."""
    info = engine.info
    recipe = ModelRecipe(vocab_size=info.vocab_size, hidden_size=96, intermediate_size=256, num_layers=3)
    config = hf_config(recipe, eos_token_id=info.eos_token_ids[0], pad_token_id=info.pad_token_id)
    return save_model_folder(build_model(config, seed=7), tiny_folder(), out)


def test_a_different_model_size_is_caught(tmp_path, setup, engine):
    bigger = TransformersEngine.from_folder(bigger_folder(tmp_path / "bigger", engine))
    assert bigger.info.hidden_size == 96
    assert bigger.tokenizer.encode_prompt("1+1=") == engine.tokenizer.encode_prompt("1+1=")
    with pytest.raises(Reject) as err:
        judge(_submission_from(bigger, setup), context(setup, engine), engine)
    assert isinstance(err.value, BadProof) and err.value.failure.failing_chunks


def test_tokens_not_from_the_seeded_sampler_are_caught(setup, engine):
    """All else consistent (the claimed model, proofs, logprobs, rewards): only the sampling check sees it."""
    with pytest.raises(Reject) as err:
        judge(_submission_from(engine, setup, seed_offset=1000), context(setup, engine), engine)
    assert err.value.reason == Reason.BAD_SAMPLING


def _with_eos_min_prob(setup, eos_min_prob):
    descriptor, tasks = setup
    policy = dataclasses.replace(descriptor.policy, eos_min_prob=eos_min_prob)
    return dataclasses.replace(descriptor, policy=policy), tasks


def test_premature_eos_is_caught(setup, engine):
    """An EOS the seeded sampler did not choose, right after the first token, with the proofs, logprobs and
    rewards made consistent with it: the termination check rejects it where the model's P(EOS) is below
    the run's `eos_min_prob`, else the sampling check does."""
    from swarmnode.node.rl.engine import Completion as EngineCompletion
    from swarmnode.node.rl.sampling import token_logprobs

    eos = engine.info.eos_token_ids[0]
    p_eos: list[float] = []  # the model's P(EOS) where each cut puts its EOS

    def cut_after_first_token(eng, prompt, completions):
        i = next(i for i, c in enumerate(completions) if len(c.tokens) >= 2 and c.tokens[1] != eos)
        tokens = (completions[i].tokens[0], eos)
        pre = eng.prefill(prompt, list(tokens))
        p_eos.append(float(torch.softmax(pre.logits[1], -1)[eos]))
        logprobs = token_logprobs(pre.logits, torch.tensor(tokens), 1.0)
        completions = list(completions)
        completions[i] = EngineCompletion(tokens, logprobs, pre.hidden_rows, completions[i].seed, True)
        return completions

    cut = _submission_from(engine, setup, edit=cut_after_first_token)
    assert len(p_eos) == len(cut.groups) and 0.0 < min(p_eos) and max(p_eos) < 0.5
    # EOS more likely than the run's bound: only the sampling check can object ...
    with pytest.raises(Reject) as err:
        judge(cut, context(_with_eos_min_prob(setup, min(p_eos) / 2), engine), engine)
    assert err.value.reason == Reason.BAD_SAMPLING
    # ... below it (a trained model's P(EOS) after one digit of a two-digit answer): termination.
    with pytest.raises(Reject) as err:
        judge(cut, context(_with_eos_min_prob(setup, 2 * max(p_eos)), engine), engine)
    assert err.value.reason == Reason.BAD_TERMINATION


def test_an_eos_the_seeded_sampler_chose_is_never_unlikely(setup, engine):
    """Honest EOS tokens pass even when every EOS is 'unlikely' (threshold 1): the seeded choice is proof.

    (A devnet run slashed an honest worker whose sampler drew EOS at P(EOS) < eos_min_prob.)
    """
    strict, tasks = _with_eos_min_prob(setup, 1.0)
    sub = build_submission(
        engine, strict, {t.task_id: t for t in tasks}, [t.task_id for t in tasks], WORKER, 3, ROOT, 0
    )
    ended = [c for g in sub.groups for c in g.completions if c.ended_with_eos]
    assert ended, "the EOS-prone model ends some answers with EOS"
    assert judge(sub, context((strict, tasks), engine), engine).tokens > 0


def test_the_eos_threshold_guards_only_an_eos_the_sampler_did_not_choose():
    from swarmnode.node.rl.sampling import SamplingCheck
    from swarmnode.node.rl.validation import eos_threshold

    eos = (2,)
    chosen = SamplingCheck(mismatches=(), max_gap=0.0)
    not_chosen = SamplingCheck(mismatches=(2,), max_gap=3.0)
    assert eos_threshold((5, 6, 2), chosen, 1e-3, eos) == 0.0
    assert eos_threshold((5, 6, 2), not_chosen, 1e-3, eos) == 1e-3
    assert eos_threshold((5, 6, 7), chosen, 1e-3, eos) == 1e-3
    assert eos_threshold((), chosen, 1e-3, eos) == 1e-3


def test_the_eos_threshold_with_two_eos_ids():
    """Any of the model's EOS ids ends a completion; another token in last place is not an EOS."""
    from swarmnode.node.rl.sampling import SamplingCheck
    from swarmnode.node.rl.validation import eos_threshold

    eos = (2, 9)
    chosen = SamplingCheck(mismatches=(), max_gap=0.0)
    not_chosen = SamplingCheck(mismatches=(2,), max_gap=3.0)
    assert eos_threshold((5, 6, 9), chosen, 1e-3, eos) == 0.0
    assert eos_threshold((5, 6, 2), chosen, 1e-3, eos) == 0.0
    assert eos_threshold((5, 6, 9), not_chosen, 1e-3, eos) == 1e-3
    assert eos_threshold((5, 6, 9), chosen, 1e-3, (2,)) == 1e-3


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_batched_token_scores_equal_the_per_completion_checks(honest, engine, temperature):
    """Check 6's batched logprobs, P(EOS) and sampling are exactly the per-completion functions' values,
    including a completion whose tokens are off the sampler."""
    from swarmnode.node.rl.sampling import check_sampling, eos_probabilities, token_logprobs
    from swarmnode.node.rl.validation import _token_scores, sampled_tokens

    flat = [(g.prompt_ids, c) for g in honest.groups for c in g.completions]
    off = dataclasses.replace(flat[1][1], token_ids=tuple((t + 1) % 50 for t in flat[1][1].token_ids))
    completions = [flat[0][1], off, *(c for _, c in flat[2:])]
    pairs = [(list(p), list(c.token_ids)) for (p, _), c in zip(flat, completions, strict=True)]
    prefills = engine.prefill_batch(pairs)
    eos = engine.info.eos_token_ids
    sampled = [sampled_tokens(c, None, 1 << 16) for c in completions]
    scores = _token_scores(sampled, prefills, temperature, 1e-3, eos)
    lengths = [len(c.token_ids) for c in completions]
    for c, pre, logp, p_eos, sampling in zip(completions, prefills, scores.logprobs.split(lengths),
                                             scores.last_eos_probs, scores.sampling, strict=True):
        assert sampling == check_sampling(pre.logits, c.token_ids, c.seed, temperature, 1e-3)
        assert torch.equal(logp, token_logprobs(pre.logits, torch.tensor(c.token_ids), temperature))
        assert p_eos == float(eos_probabilities(pre.logits, eos, temperature)[-1])
    assert temperature == 0.0 or not scores.sampling[1].passed

"""The validator's pipeline on a real tiny model: honest work passes, every cheat gets its reason."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from crypto.hashing import sha256
from crypto.identity import NodeIdentity
from node.rl.engine import TransformersEngine
from node.rl.model import ModelConfig
from node.rl.rollouts import (
    assigned_tasks,
    assignment_step,
    build_submission,
    generate_group,
    to_wire_group,
)
from node.rl.run import devnet_grpo, devnet_policy, devnet_dataset, dataset_hash
from node.rl.validation import BadProof, ValidationContext, validate_submission
from protocol.errors import Ignore, Reason, Reject
from protocol.messages import RunDescriptor

CFG = ModelConfig()
WORKER = NodeIdentity(sha256(b"validation-test-worker")).address
ROOT = sha256(b"checkpoint-3")


@pytest.fixture(scope="module")
def engine():
    return TransformersEngine.from_seed(CFG, seed=7)


@pytest.fixture(scope="module")
def setup():
    tasks = devnet_dataset()
    grpo = dataclasses.replace(devnet_grpo(CFG), prompts_per_step=2, group_size=4)
    descriptor = RunDescriptor("test-run", b"\x01" * 20, b"\x02" * 32, b"\x03" * 32, dataset_hash(tasks),
                               "arithmetic", grpo, 2, devnet_policy(), 0)
    return descriptor, tasks


def context(setup, newest=3, eligible=True):
    descriptor, tasks = setup
    return ValidationContext(descriptor, {t.task_id: t for t in tasks}, [t.task_id for t in tasks], newest,
                             {3: ROOT, 2: sha256(b"checkpoint-2")}, lambda _: eligible)


@pytest.fixture(scope="module")
def honest(engine, setup):
    descriptor, tasks = setup
    return build_submission(engine, descriptor, {t.task_id: t for t in tasks}, [t.task_id for t in tasks],
                            WORKER, 3, ROOT, 0)


def judge(sub, ctx, engine, worker=WORKER):
    return validate_submission(sub, worker, ctx, lambda version: engine)


def test_honest_submission_is_accepted(honest, setup, engine):
    accepted = judge(honest, context(setup), engine)
    assert accepted.tokens == sum(len(c.token_ids) for g in honest.groups for c in g.completions)
    assert accepted.mean_exp_mismatches <= 1.0


def test_unstaked_worker_is_rejected(honest, setup, engine):
    with pytest.raises(Reject) as err:
        judge(honest, context(setup, eligible=False), engine)
    assert err.value.reason == Reason.NOT_STAKED


def test_stale_and_unknown_checkpoints_are_ignored(honest, setup, engine):
    with pytest.raises(Ignore) as err:
        judge(honest, context(setup, newest=6), engine)
    assert err.value.reason == Reason.STALE
    with pytest.raises(Ignore):
        judge(dataclasses.replace(honest, checkpoint_version=4, step=assignment_step(4, 0)), context(setup), engine)


def test_wrong_checkpoint_root_is_rejected(honest, setup, engine):
    with pytest.raises(Reject) as err:
        judge(dataclasses.replace(honest, checkpoint_root=b"\x09" * 32), context(setup), engine)
    assert err.value.reason == Reason.BAD_HASH


def test_cherry_picked_tasks_are_rejected(honest, setup, engine):
    with pytest.raises(Reject) as err:
        judge(dataclasses.replace(honest, groups=honest.groups[::-1]), context(setup), engine)
    assert err.value.reason == Reason.BAD_ASSIGNMENT
    with pytest.raises(Reject) as err:  # someone else's assignment
        judge(honest, context(setup), engine, worker=b"\x07" * 20)
    assert err.value.reason == Reason.BAD_ASSIGNMENT


def test_forged_reward_is_rejected(honest, setup, engine):
    group = honest.groups[0]
    forged = tuple(dataclasses.replace(c, reward=1.0) for c in group.completions)
    sub = dataclasses.replace(honest, groups=(dataclasses.replace(group, completions=forged),) + honest.groups[1:])
    with pytest.raises(Reject) as err:
        judge(sub, context(setup), engine)
    assert err.value.reason == Reason.BAD_REWARD


def test_tampered_prompt_is_caught_by_toploc(honest, setup, engine):
    """Generated on another prompt, claimed for the assigned one: the hidden rows betray it."""
    descriptor, tasks = setup
    dataset = {t.task_id: t for t in tasks}
    ids = assigned_tasks(descriptor, [t.task_id for t in tasks], WORKER, honest.step)
    groups = []
    for i, task_id in enumerate(ids):
        task = dataset[task_id]
        generated = generate_group(engine, task, descriptor, WORKER)
        if i == 0:
            prompt = list(generated.prompt_ids)
            prompt[1] = prompt[1] + 1 if prompt[1] < 20 else prompt[1] - 1  # change one digit
            generated = dataclasses.replace(generate_group(engine, task, descriptor, WORKER, prompt),
                                            prompt_ids=generated.prompt_ids)
        groups.append(to_wire_group(generated, descriptor))
    with pytest.raises(Reject) as err:
        judge(dataclasses.replace(honest, groups=tuple(groups)), context(setup), engine)
    assert err.value.reason in (Reason.BAD_PROOF, Reason.RULE_VIOLATION, Reason.BAD_REWARD)


def test_perturbed_model_is_caught_by_toploc(setup, engine):
    descriptor, tasks = setup
    cheat = TransformersEngine.from_seed(CFG, seed=7)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in cheat.model.parameters():
            p.mul_(1 + 0.01 * torch.randn(p.shape, generator=gen))
    sub = build_submission(cheat, descriptor, {t.task_id: t for t in tasks}, [t.task_id for t in tasks], WORKER, 3,
                           ROOT, 1)
    with pytest.raises(Reject) as err:
        judge(sub, context(setup), engine)
    assert err.value.reason in (Reason.BAD_PROOF, Reason.RULE_VIOLATION)
    if isinstance(err.value, BadProof):
        assert err.value.failure.mean_mant_err > 0


def test_swapped_token_is_rejected(honest, setup, engine):
    group = honest.groups[0]
    c = group.completions[0]
    tokens = list(c.token_ids)
    tokens[0] = 5 if tokens[0] != 5 else 6
    bad = dataclasses.replace(c, token_ids=tuple(tokens))
    sub = dataclasses.replace(honest, groups=(dataclasses.replace(group, completions=(bad,) + group.completions[1:]),)
                              + honest.groups[1:])
    with pytest.raises(Reject) as err:
        judge(sub, context(setup), engine)
    assert err.value.reason in (Reason.BAD_REWARD, Reason.BAD_TERMINATION, Reason.RULE_VIOLATION,
                                Reason.BAD_PROOF, Reason.BAD_SAMPLING)

"""The trainer's GRPO step on fixed batches, its warmup schedule and its save/resume round trip."""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from pathlib import Path

import pytest
import torch

from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.grpo import group_advantages
from swarmnode.node.rl.learner import GrpoTrainer, OptimizerParams, load_optimizer, optimizer_tensors
from swarmnode.node.rl.model import ModelMismatch, load_weights
from swarmnode.node.rl.rollouts import pack_logprobs
from swarmnode.node.rl.run import devnet_grpo, devnet_optimizer
from swarmnode.node.rl.tokenizer import load_tokenizer
from swarmnode.protocol.messages import Completion, RolloutGroup
from tests.tinymodel import copy_folder, tiny_engine, tiny_folder

PROMPTS = ["12+7=", "40+41=", "3+99="]
GROUP = 8
MAX_NEW = 5


@cache
def tiny_info():
    return load_tokenizer(tiny_folder())[1]


def grpo_params(lr: float = 1e-3):
    return dataclasses.replace(
        devnet_grpo(tiny_info()),
        group_size=GROUP,
        prompts_per_step=len(PROMPTS),
        max_new_tokens=MAX_NEW,
        learning_rate=lr,
        token_budget=GROUP * len(PROMPTS) * MAX_NEW,
    )


def fixed_groups(engine: TransformersEngine) -> list[RolloutGroup]:
    """Groups sampled from `engine`, rewarded 1 when a completion's first token is even (an arbitrary but
    learnable preference), with the sampler's logprobs as the old ones, exactly as a worker sends them."""
    groups = []
    for p, text in enumerate(PROMPTS):
        prompt = engine.tokenizer.encode_prompt(text)
        seeds = [1000 * p + i for i in range(GROUP)]
        sampled = engine.generate_group(prompt, GROUP, seeds, MAX_NEW, 1.0)
        rewards = [float(c.tokens[0] % 2 == 0) for c in sampled]
        if len(set(rewards)) == 1:  # make sure every group carries signal
            rewards[0] = 1.0 - rewards[0]
        advantages = group_advantages(torch.tensor(rewards)).tolist()
        completions = tuple(
            Completion(
                token_ids=c.tokens,
                logprobs=pack_logprobs(c.logprobs),
                reward=r,
                advantage=a,
                seed=c.seed,
                ended_with_eos=c.ended_with_eos,
                proofs=(),
            )
            for c, r, a in zip(sampled, rewards, advantages, strict=True)
        )
        groups.append(RolloutGroup(bytes([p]) * 32, tuple(prompt), completions))
    return groups


def mean_logprob_by_sign(engine: TransformersEngine, groups: list[RolloutGroup]) -> tuple[float, float]:
    """Mean per-completion summed logprob of the positive- and of the negative-advantage completions."""
    prompts = [list(g.prompt_ids) for g in groups for _ in g.completions]
    completions = [list(c.token_ids) for g in groups for c in g.completions]
    adv = torch.tensor([c.advantage for g in groups for c in g.completions])
    with torch.no_grad():
        total = engine.logprobs(prompts, completions).values.sum(1)
    return float(total[adv > 0].mean()), float(total[adv < 0].mean())


def test_grpo_steps_move_logprobs_with_the_advantage():
    engine = tiny_engine()
    groups = fixed_groups(engine)
    pos0, neg0 = mean_logprob_by_sign(engine, groups)
    trainer = GrpoTrainer(engine, grpo_params(lr=1e-3), optim=OptimizerParams())
    first = trainer.step(groups)
    # on-policy: the recomputed logprobs match the sampler's, so nothing is clipped and every group is used
    assert first.clipped_fraction == 0.0 and first.groups_used == len(PROMPTS) and first.grad_norm > 0
    for _ in range(4):
        trainer.step(groups)
    pos, neg = mean_logprob_by_sign(engine, groups)
    assert pos > pos0 + 0.05, (pos0, pos)
    assert neg < neg0 - 0.05, (neg0, neg)
    assert not engine.model.training  # the step leaves the model in eval mode for generation


def test_step_without_signal_changes_nothing():
    engine = tiny_engine()
    groups = fixed_groups(engine)
    flat = [
        dataclasses.replace(
            g, completions=tuple(dataclasses.replace(c, reward=0.0, advantage=0.0) for c in g.completions)
        )
        for g in groups
    ]
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    stats = GrpoTrainer(engine, grpo_params()).step(flat)
    assert stats.groups_used == 0 and stats.groups_dropped == len(PROMPTS) and stats.step == 1
    assert all(torch.equal(before[k], v) for k, v in engine.model.state_dict().items())


def test_warmup_schedule():
    optim = OptimizerParams(warmup_steps=4)
    assert [optim.lr_at(1e-3, s) for s in (1, 2, 4, 9)] == pytest.approx([2.5e-4, 5e-4, 1e-3, 1e-3])
    assert OptimizerParams(warmup_steps=0).lr_at(1e-3, 1) == 1e-3
    trainer = GrpoTrainer(tiny_engine(), grpo_params(lr=1e-3), optim=optim)
    trainer.step(fixed_groups(trainer.engine))
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(2.5e-4)
    assert trainer.optimizer.param_groups[0]["betas"] == optim.betas


def optimizer_state(trainer: GrpoTrainer) -> tuple[dict[str, torch.Tensor], dict]:
    return optimizer_tensors(trainer.optimizer)


def test_save_resume_round_trips_weights_and_adamw_state_exactly(tmp_path: Path):
    grpo = grpo_params(lr=1e-3)
    optim = OptimizerParams(betas=(0.8, 0.95), eps=1e-7, warmup_steps=5)
    trainer = GrpoTrainer(tiny_engine(), grpo, optim=optim)
    groups = fixed_groups(trainer.engine)
    trainer.step(groups)
    trainer.save(tmp_path)  # an older step on disk: resume must take the newest
    trainer.step(groups)
    weights = trainer.save(tmp_path)
    assert weights.name == "step-000002.safetensors"
    (tmp_path / "step-000003.json").write_text("{trunc")  # a torn record is skipped, not fatal

    resumed = GrpoTrainer.resume(tmp_path, tiny_folder(), grpo)
    assert resumed is not None and resumed.step_count == 2 and resumed.optim == optim
    for (name, a), b in zip(
        trainer.engine.model.state_dict().items(), resumed.engine.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    tensors_a, meta_a = optimizer_state(trainer)
    tensors_b, meta_b = optimizer_state(resumed)
    assert meta_a == meta_b and meta_a["param_groups"][0]["betas"] == (0.8, 0.95)
    assert tensors_a.keys() == tensors_b.keys() and len(tensors_a) == 3 * len(
        list(trainer.engine.model.parameters())
    )
    assert all(torch.equal(tensors_a[k], tensors_b[k]) for k in tensors_a)

    # the continuation is bit-identical: same moments, same step count, same point on the warmup schedule
    trainer.step(groups)
    resumed.step(groups)
    for a, b in zip(trainer.engine.model.parameters(), resumed.engine.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(grpo.learning_rate * 3 / 5)


def test_saved_weights_name_the_model_config_and_resume_refuses_another(tmp_path: Path):
    """The step's weights file carries the config hash: resuming on a folder with another config.json
    (here: another rms_norm_eps, same shapes) is refused instead of silently training another model."""
    trainer = GrpoTrainer(tiny_engine(), grpo_params())
    trainer.step(fixed_groups(trainer.engine))
    weights = trainer.save(tmp_path / "state")
    state = load_weights(weights, trainer.engine.info.config_hash)
    assert all(torch.equal(state[k], v) for k, v in trainer.engine.model.state_dict().items())
    other = copy_folder("qwen2", tmp_path / "other")
    config = json.loads((other / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelMismatch, match="weights for model config"):
        GrpoTrainer.resume(tmp_path / "state", other, grpo_params())


def test_resume_of_an_empty_directory_is_none(tmp_path: Path):
    assert GrpoTrainer.resume(tmp_path, tiny_folder(), grpo_params()) is None


def test_optimizer_file_alone_restores_into_a_fresh_optimizer(tmp_path: Path):
    """`load_optimizer` is the inverse of the file `save` writes (hyper-parameters included)."""
    trainer = GrpoTrainer(tiny_engine(), grpo_params(), optim=devnet_optimizer())
    trainer.step(fixed_groups(trainer.engine))
    trainer.save(tmp_path)
    record = json.loads((tmp_path / "step-000001.json").read_text())
    assert record["optimizer"]["warmup_steps"] == devnet_optimizer().warmup_steps
    fresh = torch.optim.AdamW(trainer.engine.model.parameters(), lr=1.0)
    load_optimizer(fresh, tmp_path / "step-000001.optim.safetensors")
    assert fresh.param_groups[0]["lr"] == trainer.optimizer.param_groups[0]["lr"]
    assert fresh.param_groups[0]["betas"] == trainer.optimizer.param_groups[0]["betas"]

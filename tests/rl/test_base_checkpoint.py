"""The committed base checkpoint: intact, described by its recipe, and at a non-zero improvable pass rate."""

from __future__ import annotations

import json

from node.rl.model import ModelConfig, file_sha256, load_checkpoint, model_config_hash
from node.rl.sampling import derive_seed
from node.rl.tasks import grade
from node.rl.tasks.arithmetic import DEVNET_PARAMS, generate_tasks
from node.rl.tokenizer import completion_text, encode_prompt

from .conftest import ASSETS


def test_recipe_describes_the_file():
    meta = json.loads((ASSETS / "base.json").read_text())
    path = ASSETS / meta["checkpoint"]
    assert file_sha256(path).hex() == meta["sha256"]
    assert path.stat().st_size == meta["size_bytes"] < 4 * 2**20
    cfg, _ = load_checkpoint(path)
    assert cfg == ModelConfig() and model_config_hash(cfg).hex() == meta["model_config_hash"]
    assert 0.2 <= meta["final_eval"]["pass_rate"] <= 0.5


def test_base_model_solves_some_but_not_all_devnet_tasks(base_engine):
    tasks = generate_tasks(DEVNET_PARAMS, seed=99, count=24)
    rewards = []
    for task in tasks:
        seeds = [derive_seed("test", b"w", 0, task.task_id, i) for i in range(4)]
        group = base_engine.generate_group(encode_prompt(task.prompt), 4, seeds, 8, 1.0)
        rewards += [grade(task, completion_text(c.tokens)).reward for c in group]
    rate = sum(rewards) / len(rewards)
    assert 0.05 <= rate <= 0.7, rate

"""Warm-start the tiny policy on synthetic arithmetic so GRPO starts from a non-zero, improvable reward.

Supervised next-token training on "BOS a+b= answer EOS" (loss on the answer and EOS only), from explicit
seeds and generators, stopped at the first evaluation whose pass rate at temperature 1 reaches the target
(default 30%): a clearly non-zero reward that GRPO can still raise. Writes the checkpoint and a recipe JSON
(config, seeds, data params, steps, sha256 of the file, measured pass rate) beside it.

    python scripts/make_base_checkpoint.py            # about two minutes on 2 CPU cores

Bit-exact reproduction needs the same torch version and thread count (float sums are order-dependent);
both are recorded in the recipe.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from node.rl.engine import TransformersEngine
from node.rl.model import (
    ModelConfig,
    build_model,
    config_json,
    model_config_hash,
    save_checkpoint,
    state_dict_of,
)
from node.rl.sampling import derive_seed
from node.rl.tasks import Task, grade
from node.rl.tasks.arithmetic import DEVNET_PARAMS, ArithmeticParams, generate_tasks, make_task
from node.rl.tokenizer import PAD_ID, completion_text, encode, encode_prompt

ASSETS = Path(__file__).resolve().parent.parent / "node" / "rl" / "assets"
IGNORE = -100


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the base checkpoint."""

    model_seed: int = 0
    data_seed: int = 1
    eval_seed: int = 2
    batch_size: int = 128
    lr: float = 3e-3
    max_steps: int = 3000
    eval_every: int = 50
    eval_tasks: int = 128
    eval_samples: int = 2
    target_pass_rate: float = 0.3
    final_eval_tasks: int = 256
    final_eval_samples: int = 8
    max_new_tokens: int = 8
    temperature: float = 1.0
    threads: int = 2


def make_batch(tasks: list[Task]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and labels; labels are the answer and EOS, shifted to the row that predicts them."""
    pairs = [(encode_prompt(t.prompt), encode(t.target, eos=True)) for t in tasks]
    width = max(len(p) + len(c) for p, c in pairs)
    ids = torch.full((len(pairs), width), PAD_ID, dtype=torch.int64)
    labels = torch.full((len(pairs), width), IGNORE, dtype=torch.int64)
    for i, (p, c) in enumerate(pairs):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        labels[i, len(p) - 1 : len(p) + len(c) - 1] = torch.tensor(c)
    return ids, labels


def pass_rate(
    engine: TransformersEngine,
    tasks: list[Task],
    samples: int,
    max_new_tokens: int,
    temperature: float,
    run_id: str,
) -> float:
    """Mean reward over `samples` completions per task, with seeds derived as the devnet derives them."""
    total = 0.0
    for task in tasks:
        seeds = [derive_seed(run_id, b"base-checkpoint-eval", 0, task.task_id, i) for i in range(samples)]
        group = engine.generate_group(encode_prompt(task.prompt), samples, seeds, max_new_tokens, temperature)
        total += sum(grade(task, completion_text(c.tokens)).reward for c in group)
    return total / (len(tasks) * samples)


def train(
    cfg: ModelConfig, params: ArithmeticParams, recipe: Recipe
) -> tuple[TransformersEngine, int, float]:
    """Train until the eval pass rate reaches the target; returns (engine, steps, last eval pass rate)."""
    model = build_model(cfg, recipe.model_seed).train()
    engine = TransformersEngine(cfg, model)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.98), weight_decay=0.0)
    rng = random.Random(recipe.data_seed)
    eval_tasks = generate_tasks(params, recipe.eval_seed, recipe.eval_tasks)
    rate, start = 0.0, time.perf_counter()
    for step in range(1, recipe.max_steps + 1):
        ids, labels = make_batch([make_task(params, rng) for _ in range(recipe.batch_size)])
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % recipe.eval_every == 0:
            model.eval()
            rate = pass_rate(
                engine,
                eval_tasks,
                recipe.eval_samples,
                recipe.max_new_tokens,
                recipe.temperature,
                "base-eval",
            )
            model.train()
            print(
                f"step {step:5d}  loss {loss.item():.3f}  pass@T={recipe.temperature} {rate:.3f}  "
                f"{time.perf_counter() - start:6.1f}s",
                flush=True,
            )
            if rate >= recipe.target_pass_rate:
                return engine, step, rate
    return engine, recipe.max_steps, rate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", type=Path, default=ASSETS)
    ap.add_argument("--target-pass-rate", type=float, default=Recipe.target_pass_rate)
    args = ap.parse_args(argv)
    recipe = Recipe(target_pass_rate=args.target_pass_rate)
    cfg, params = ModelConfig(), DEVNET_PARAMS
    torch.set_num_threads(recipe.threads)
    start = time.perf_counter()
    engine, steps, train_rate = train(cfg, params, recipe)
    train_s = time.perf_counter() - start
    engine.model.eval()
    final_tasks = generate_tasks(params, recipe.eval_seed + 1, recipe.final_eval_tasks)
    final_rate = pass_rate(
        engine,
        final_tasks,
        recipe.final_eval_samples,
        recipe.max_new_tokens,
        recipe.temperature,
        "base-final-eval",
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / "base.safetensors"
    digest = save_checkpoint(state_dict_of(engine.model), cfg, path)
    meta = {
        "checkpoint": path.name,
        "sha256": digest.hex(),
        "size_bytes": path.stat().st_size,
        "model_config": json.loads(config_json(cfg)),
        "model_config_hash": model_config_hash(cfg).hex(),
        "parameters": sum(p.numel() for p in engine.model.parameters()),
        "task": {"kind": "arithmetic", "params": asdict(params)},
        "recipe": asdict(recipe),
        "steps": steps,
        "train_eval_pass_rate": train_rate,
        "final_eval": {
            "tasks": recipe.final_eval_tasks,
            "samples_per_task": recipe.final_eval_samples,
            "task_seed": recipe.eval_seed + 1,
            "temperature": recipe.temperature,
            "max_new_tokens": recipe.max_new_tokens,
            "pass_rate": final_rate,
        },
        "train_seconds": round(train_s, 1),
        "torch": torch.__version__,
    }
    (args.out_dir / "base.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    print(
        f"wrote {path} ({meta['size_bytes']} bytes, sha256 {digest.hex()[:16]}...), {steps} steps, "
        f"{train_s:.0f}s, final pass rate {final_rate:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

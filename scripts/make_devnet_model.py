"""Build the devnet's model folder: a tiny Qwen2 model with a BPE tokenizer, warm-started on arithmetic.

With `--env calculator` it builds the calculator devnet's folder instead (node/rl/assets/calc-model/):
the tasks are two-digit products (`arithmetic.DEVNET_PRODUCTS`), the tokenizer is trained on their
calculator episodes (the environment's instructions, the call, the result, the boxed answer) and the
warm start trains on those episodes (`warmstart.episode_example`, the environment's turns without loss)
until their mean reward reaches the target: the base calls the tool and copies its result often enough
for GRPO to have a signal, and not always.

Steps, each from an explicit seed:
1. a byte-level BPE tokenizer trained on the devnet dataset's tasks rendered as chats (answers included);
2. a `tiny` Qwen2 model initialised from `model_seed` (`node.rl.modelinit.init_model_folder`);
3. `node.rl.warmstart.warm_start` on two-digit additions (the whole space, see `warm_start_tasks`),
   stopped at the first evaluation whose pass rate at temperature 1 reaches the target (0.3): a clearly
   non-zero reward that GRPO can still raise;
4. the devnet's measure of the result: `node.rl.sync.eval_reward` on `devnet_eval_tasks` (128 tasks x 8
   samples, temperature 1, the devnet's max_new_tokens), the figure benchmarks/bench_rl.py starts from.

Writes node/rl/assets/devnet-model/ (a Hugging Face folder) and node/rl/assets/devnet-model.json (recipe,
seeds, steps, the evaluations, file sha256s, the digests a RunDescriptor carries, parameter count,
versions, thread count, seconds).

    python scripts/make_devnet_model.py          # a few minutes on 2 CPU cores

Bit-exact reproduction needs the same torch, transformers and tokenizers versions and thread count (float
sums are order-dependent, BPE training ties too); all are recorded in the JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import tokenizers
import torch
import transformers

from swarmnode.node.devnet.rl import DEVNET_CALC_TURN_TOKENS
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.environments import Environment, EnvTurn, calculator
from swarmnode.node.rl.environments.episodes import EpisodeRules, rules_from_terms
from swarmnode.node.rl.environments.registry import ENVIRONMENTS
from swarmnode.node.rl.model import file_sha256, model_commitment
from swarmnode.node.rl.modelinit import DEFAULT_VOCAB_SIZE, chat_texts, init_model_folder
from swarmnode.node.rl.rollouts import task_prompt_ids
from swarmnode.node.rl.run import (
    DEVNET_CALC_MODEL,
    DEVNET_MODEL,
    devnet_dataset,
    devnet_eval_tasks,
    devnet_grpo,
    environment_for,
)
from swarmnode.node.rl.sync import eval_reward
from swarmnode.node.rl.tasks import Task
from swarmnode.node.rl.tasks.arithmetic import (
    DEVNET_PARAMS,
    DEVNET_PRODUCTS,
    ArithmeticParams,
    generate_tasks,
)
from swarmnode.node.rl.tokenizer import load_tokenizer
from swarmnode.node.rl.warmstart import EvalPoint, WarmStartRecipe, warm_start


@dataclass(frozen=True)
class DevnetModelRecipe:
    """Everything that determines the devnet's model folder."""

    arch: str = "qwen2"
    size: str = "tiny"
    vocab_size: int = DEFAULT_VOCAB_SIZE
    model_seed: int = 0
    task_seed: int = 1  # the warm-start task pool: generate_tasks(DEVNET_PARAMS, task_seed, pool_draws)
    pool_draws: int = 20_000
    stop_eval_tasks: int = 128  # the pool's first tasks judge when to stop (seen in training too)
    warm: WarmStartRecipe = field(default_factory=lambda: WarmStartRecipe(eval_every=25))
    final_eval_samples: int = 8
    threads: int = 2
    task_params: ArithmeticParams = DEVNET_PARAMS
    environment: str = ""  # "calculator": episodes with the tool (the run's turn budget: warm.max_new_tokens)


CALCULATOR_RECIPE = DevnetModelRecipe(
    task_params=DEVNET_PRODUCTS,
    environment=calculator.NAME,
    pool_draws=8000,
    warm=WarmStartRecipe(eval_every=25, max_new_tokens=DEVNET_CALC_TURN_TOKENS),
)
RECIPES = {"": DevnetModelRecipe(), calculator.NAME: CALCULATOR_RECIPE}
FOLDERS = {"": DEVNET_MODEL, calculator.NAME: DEVNET_CALC_MODEL}


def transcript_text(env: Environment, task: Task) -> str:
    """A demonstrated episode as text (model turns and the environment's replies): tokenizer training."""
    turns = calculator.demonstration(task)
    replies = [env.respond(task, 0, turns[: i + 1]) for i in range(len(turns) - 1)]
    return "".join(turn + (reply.text if isinstance(reply, EnvTurn) else "")
                   for turn, reply in zip(turns, [*replies, None], strict=True))


def warm_start_tasks(recipe: DevnetModelRecipe) -> tuple[list[Task], list[Task]]:
    """(training tasks, stop-eval tasks): the distinct additions of the pool, and the first of them.

    The warm start covers the whole two-digit space (as the char-level base did): `devnet_eval_tasks` is
    held out of GRPO's dataset, not of the warm start, so a rise on it measures GRPO sharpening what the
    base half-knows. Measured: a base that never saw those tasks (0.34 on them) stayed at 0.30-0.34 over
    40 GRPO steps at lr 2e-4 (and fell at 5e-4 and 1e-3) while its training groups' reward rose.
    """
    drawn = generate_tasks(recipe.task_params, recipe.task_seed, recipe.pool_draws)
    pool = list({t.task_id: t for t in drawn}.values())
    return pool, pool[: recipe.stop_eval_tasks]


def build(out: Path, recipe: DevnetModelRecipe) -> dict[str, object]:
    """Build the folder into `out` (must not exist); returns the JSON document describing it."""
    torch.set_num_threads(recipe.threads)
    start = time.perf_counter()
    dataset = devnet_dataset(recipe.task_params)
    train, stop_eval = warm_start_tasks(recipe)
    with tempfile.TemporaryDirectory() as scratch:
        if recipe.environment:
            env = ENVIRONMENTS[recipe.environment]
            texts = chat_texts((f"{env.instructions}\n\n{t.prompt}", transcript_text(env, t))
                               for t in dataset)
        else:
            texts = chat_texts((t.prompt, t.target) for t in dataset)
        init = init_model_folder(Path(scratch) / "init", texts, arch=recipe.arch, size=recipe.size,
                                 seed=recipe.model_seed, vocab_size=recipe.vocab_size)
        rules = run_rules(recipe, init, dataset)
        if rules is not None:
            prompt = len(task_prompt_ids(dataset[0], load_tokenizer(init)[0], rules))
            print(f"{recipe.environment}: prompts of {prompt} tokens, episodes of at most "
                  f"{rules.max_completion_tokens}", flush=True)

        def report(point: EvalPoint) -> None:
            print(f"step {point.step:5d}  loss {point.loss:.3f}  pass@T=1 {point.pass_rate:.3f}  "
                  f"{point.seconds:6.1f}s", flush=True)

        episodes = None if rules is None else (rules, calculator.demonstration)
        result = warm_start(init, out, train, stop_eval, recipe.warm, report, episodes=episodes)
    if not result.reached_target:
        raise SystemExit(f"pass rate {result.pass_rate:.3f} after {result.steps} steps: target not reached")
    engine = TransformersEngine.from_folder(out)
    grpo = devnet_grpo(engine.info, recipe.warm.max_new_tokens)
    eval_tasks = devnet_eval_tasks(params=recipe.task_params)
    final = eval_reward(engine, eval_tasks, samples=recipe.final_eval_samples,
                        max_new_tokens=grpo.max_new_tokens, temperature=grpo.temperature, rules=rules)
    commitment = model_commitment(out)
    files = sorted(p for p in out.iterdir() if p.is_file())
    return {
        "folder": out.name,
        "recipe": asdict(recipe),
        "task": {"kind": "arithmetic", "params": asdict(recipe.task_params),
                 "tokenizer_texts": "devnet_dataset(params)" + (" episodes" if recipe.environment else ""),
                 "train_tasks": len(train), "stop_eval_tasks": len(stop_eval)},
        "steps": result.steps,
        "evals": [asdict(p) | {"seconds": round(p.seconds, 1)} for p in result.evals],
        "stop_eval_pass_rate": result.pass_rate,
        "devnet_eval": {
            "tasks": len(eval_tasks),
            "samples_per_task": recipe.final_eval_samples,
            "temperature": grpo.temperature,
            "max_new_tokens": grpo.max_new_tokens,
            "pass_rate": final,
        },
        "files": {p.name: {"sha256": file_sha256(p).hex(), "size_bytes": p.stat().st_size} for p in files},
        "commitment": {
            "model_config_hash": commitment.config_hash.hex(),
            "tokenizer_files": {f.name: f.sha256.hex() for f in commitment.tokenizer_files},
            "base_checkpoint_hash": commitment.weights_root.hex(),
        },
        "model": asdict(engine.info) | {"config_hash": engine.info.config_hash.hex()},
        "parameters": sum(p.numel() for p in engine.model.parameters()),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
        "threads": result.threads,
        "warm_start_seconds": round(result.seconds, 1),
        "total_seconds": round(time.perf_counter() - start, 1),
    }


def run_rules(recipe: DevnetModelRecipe, folder: Path, dataset: list[Task]) -> EpisodeRules | None:
    """The episode rules the devnet's run will state for this folder (`environment_for`, as a trainer)."""
    if not recipe.environment:
        return None
    tokenizer, info = load_tokenizer(folder)
    terms = environment_for(recipe.environment, dataset, tokenizer, info, recipe.warm.max_new_tokens)
    return rules_from_terms(terms, recipe.warm.max_new_tokens)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--env", choices=sorted(RECIPES), default="",
                    help="build the calculator devnet's model instead of the single-turn one")
    ap.add_argument("--out", type=Path, default=None, help="the folder to (re)write [default: the asset's]")
    ap.add_argument("--target-pass-rate", type=float, default=WarmStartRecipe.target_pass_rate)
    args = ap.parse_args(argv)
    recipe = RECIPES[args.env]
    recipe = replace(recipe, warm=replace(recipe.warm, target_pass_rate=args.target_pass_rate))
    out: Path = (args.out or FOLDERS[args.env]).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        meta = build(partial, recipe)
        meta["folder"] = out.name
        shutil.rmtree(out, ignore_errors=True)
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    (out.parent / f"{out.name}.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    total = sum(f["size_bytes"] for f in meta["files"].values())  # type: ignore[attr-defined]
    print(f"wrote {out} ({total} bytes, {meta['parameters']} parameters), {meta['steps']} steps, "
          f"{meta['total_seconds']}s, devnet eval pass rate {meta['devnet_eval']['pass_rate']:.3f}")  # type: ignore[index]
    return 0


if __name__ == "__main__":
    sys.exit(main())

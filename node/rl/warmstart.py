"""Warm start: supervised training of a model folder on tasks until its sampled pass rate reaches a target.

A random-init model solves nothing, and GRPO cannot learn from groups whose rewards are all zero. A short
supervised run on (prompt, target) pairs gives a base that solves some tasks at the run's temperature and
not others, so the groups carry a signal and GRPO has room to raise the reward (the devnet's built-in
model is made this way by scripts/make_devnet_model.py; `swarmnode model init --warm-start-pass`).

Decisions:
- The prompt is the run's prompt (the task's chat through the model's template with its target length,
  `encode_prompt`), the target is a completion the task's grader accepts (`graders.reference_completion`:
  the target text, with a math answer boxed) plus the model's first EOS id; the loss is on the target
  tokens only.
  Batches are right-padded with the model's pad id, which causal attention never looks at.
- Stopping is on the pass rate at temperature 1 (what GRPO samples at), measured every `eval_every` steps
  on a fixed eval set with fixed seeds (`derive_seed` at step 0), so two evaluations differ only by the
  weights. Training stops at the first evaluation that reaches the target: the aim is a clearly non-zero,
  still improvable reward, not a trained model.
- Deterministic from (folder, tasks, recipe): batches come from an explicit `random.Random(data_seed)`,
  there is no dropout and no global RNG. Float sums depend on the torch version and thread count, so the
  result records both.
- The output is a model folder written by `save_model_folder`: the tokenizer files are copied byte for
  byte, so a run's tokenizer digests are the same before and after the warm start.
- A multi-turn run (`episodes`) trains on demonstrated episodes: model turns a caller writes for each task
  (a calculator call, then the boxed result), played through the environment's own rules
  (`episode_example`), so the model learns exactly the tokens a worker would send; the environment's
  turns are in the input and carry no loss. Its pass rate is the episodes' reward.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.environments.episodes import EpisodeRules, ModelTurn, model_mask, play
from swarmnode.node.rl.model import save_model_folder
from swarmnode.node.rl.recipes import WarmStartRecipe
from swarmnode.node.rl.rollouts import task_prompt_ids
from swarmnode.node.rl.sync import eval_reward
from swarmnode.node.rl.tasks import Task
from swarmnode.node.rl.tasks.graders import reference_completion
from swarmnode.node.rl.tokenizer import ChatTokenizer

IGNORE = -100  # label of a position that carries no loss (cross_entropy's ignore_index)
EVAL_RUN = "swarmnode-warm-start"
EVAL_WORKER = b"warm-start-eval"

# (prompt ids, completion ids, labels): labels[i] is completion[i], or IGNORE where it carries no loss
Example = tuple[Sequence[int], Sequence[int], Sequence[int]]
# a task -> the model turns (texts) of one correct episode, for a multi-turn warm start
Demonstration = Callable[[Task], Sequence[str]]


@dataclass(frozen=True)
class EvalPoint:
    """One evaluation during training: the step, the last batch's loss, the pass rate, seconds so far."""

    step: int
    loss: float
    pass_rate: float
    seconds: float


@dataclass(frozen=True)
class WarmStartResult:
    folder: Path
    steps: int
    pass_rate: float  # of the last evaluation (the one that reached the target, unless max_steps ran out)
    reached_target: bool
    best_step: int  # the evaluation with the highest pass rate (the first of equals)
    best_pass_rate: float
    kept_best: bool  # the folder holds the best evaluation's weights, not the last step's
    evals: tuple[EvalPoint, ...]
    seconds: float
    threads: int  # torch.get_num_threads() during training (bit-exact reproduction needs the same)
    torch_version: str


def training_pair(tokenizer: ChatTokenizer, task: Task) -> tuple[list[int], list[int]]:
    """(prompt ids, target ids + the first EOS id) of one task."""
    prompt = tokenizer.encode_prompt(task.prompt, task.target_length)
    return prompt, tokenizer.encode(reference_completion(task)) + [tokenizer.eos_token_ids[0]]


class BadDemonstration(ValueError):
    """Demonstrated model turns that are not one whole episode within the run's bounds."""


def episode_example(tokenizer: ChatTokenizer, rules: EpisodeRules, task: Task, model_texts: Sequence[str],
                    seed: int = 0) -> Example:
    """One demonstrated episode as the worker's transcript, played by `play` itself: each model turn's
    tokens and the model's first EOS (supervised), the environment's replies between them (not supervised).
    BadDemonstration when a turn overruns its budget or the turns do not end the episode exactly."""
    eos, name = tokenizer.eos_token_ids[0], repr(task.prompt[:40])
    turns = iter(model_texts)

    def demonstrated(so_far: Sequence[int], budget: int) -> ModelTurn:
        text = next(turns, None)
        if text is None:
            raise BadDemonstration(f"the episode of {name} is not over after {len(model_texts)} turns")
        tokens = (*tokenizer.encode(text), eos)
        if len(tokens) > budget:
            raise BadDemonstration(f"a turn of {name} takes {len(tokens)} tokens, more than its budget of "
                                   f"{budget}")
        return ModelTurn(tokens, torch.zeros(len(tokens)), torch.zeros(len(tokens), 0), True)

    played = play(rules, task, seed, tokenizer, demonstrated)
    if len(played.turns) != len(model_texts):
        raise BadDemonstration(f"the episode of {name} ended after turn {len(played.turns) - 1} "
                               f"({played.ended_by})")
    mask = model_mask(len(played.tokens), played.env_spans).tolist()
    labels = [token if model else IGNORE for token, model in zip(played.tokens, mask, strict=True)]
    return list(task_prompt_ids(task, tokenizer, rules)), list(played.tokens), labels


def make_batch(examples: Sequence[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and labels; the label of row i is the label of the token row i predicts (i + 1)."""
    width = max(len(p) + len(c) for p, c, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.int64)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.int64)
    for i, (p, c, target) in enumerate(examples):
        ids[i, : len(p) + len(c)] = torch.tensor([*p, *c], dtype=torch.int64)
        labels[i, len(p) - 1 : len(p) + len(c) - 1] = torch.tensor(list(target), dtype=torch.int64)
    return ids, labels


def pass_rate(engine: TransformersEngine, tasks: Sequence[Task], samples: int, max_new_tokens: int,
              temperature: float, run_id: str = EVAL_RUN, rules: EpisodeRules | None = None) -> float:
    """Mean reward at temperature on `tasks` (`node.rl.sync.eval_reward` with the warm start's own seeds)."""
    return eval_reward(engine, tasks, samples=samples, max_new_tokens=max_new_tokens, temperature=temperature,
                       run_id=run_id, worker=EVAL_WORKER, rules=rules)


def warm_start(
    folder_in: str | os.PathLike[str],
    out: str | os.PathLike[str],
    tasks: Sequence[Task],
    eval_tasks: Sequence[Task],
    recipe: WarmStartRecipe = WarmStartRecipe(),
    progress: Callable[[EvalPoint], None] | None = None,
    *,
    keep_best: bool = False,
    episodes: tuple[EpisodeRules, Demonstration] | None = None,
) -> WarmStartResult:
    """Train the model of `folder_in` on `tasks` until the pass rate on `eval_tasks` reaches the target;
    write the trained folder to `out` (config and tokenizer files as in `folder_in`).

    `keep_best`: when the target is missed, write the weights of the best evaluation instead of the last
    step's (training can overshoot: a loss near 0 with a falling sampled pass rate). They are kept as a
    copy in memory, which the model sizes a warm start is for afford.

    `episodes`: a multi-turn run's rules and a demonstration of each task (`episode_example`); the pass
    rate is then the episodes' mean reward.
    """
    recipe.check()
    if not tasks or not eval_tasks:
        raise ValueError("a warm start needs training tasks and eval tasks")
    engine = TransformersEngine.from_folder(folder_in)
    info, tokenizer, model = engine.info, engine.tokenizer, engine.model
    rules = None
    if episodes is None:
        examples: list[Example] = [(p, c, c) for p, c in (training_pair(tokenizer, t) for t in tasks)]
    else:
        rules, demonstrate = episodes
        examples = [episode_example(tokenizer, rules, t, demonstrate(t)) for t in tasks]
    longest = max(len(p) + len(c) for p, c, _ in examples)
    if longest > info.max_positions:
        raise ValueError(f"a training task has {longest} tokens, more than the model's {info.max_positions}")
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=recipe.betas, weight_decay=0.0)
    rng = random.Random(recipe.data_seed)
    evals: list[EvalPoint] = []
    start = time.perf_counter()
    step, rate = 0, 0.0
    best: tuple[float, int, dict[str, torch.Tensor] | None] = (-1.0, 0, None)
    for step in range(1, recipe.max_steps + 1):
        model.train()
        ids, labels = make_batch([examples[rng.randrange(len(examples))] for _ in range(recipe.batch_size)],
                                 info.pad_token_id)
        logits = model(input_ids=ids).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % recipe.eval_every == 0 or step == recipe.max_steps:
            model.eval()
            rate = pass_rate(engine, eval_tasks, recipe.eval_samples, recipe.max_new_tokens,
                             recipe.temperature, rules=rules)
            point = EvalPoint(step, float(loss.item()), rate, time.perf_counter() - start)
            evals.append(point)
            if progress is not None:
                progress(point)
            if rate > best[0]:
                state = model.state_dict()
                best = (rate, step, {k: v.detach().clone() for k, v in state.items()} if keep_best else None)
            if rate >= recipe.target_pass_rate:
                break
    model.eval()
    seconds = time.perf_counter() - start
    reached = rate >= recipe.target_pass_rate
    kept_best = keep_best and not reached and best[2] is not None and best[1] != step
    if kept_best:
        assert best[2] is not None
        model.load_state_dict(best[2])
    folder = save_model_folder(model, folder_in, out)
    return WarmStartResult(
        folder=folder,
        steps=step,
        pass_rate=rate,
        reached_target=reached,
        best_step=best[1],
        best_pass_rate=max(best[0], 0.0),
        kept_best=kept_best,
        evals=tuple(evals),
        seconds=seconds,
        threads=torch.get_num_threads(),
        torch_version=torch.__version__,
    )

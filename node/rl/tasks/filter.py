"""INTELLECT-2's offline data filter: measure the base model's pass rate per task, drop the uninformative.

A GRPO group whose completions all get the same reward has zero advantages and teaches nothing, so tasks the
base model always solves or never solves only cost generation. INTELLECT-2 measured pass rates with a base
model offline and kept the tasks in between; `swarmnode tasks filter` does that for a run's dataset.

Decisions:
- Completions are drawn with the engine's seeded sampler, seeds from (`FILTER_RUN`, `seed`, task id, index)
  alone (`derive_seed` with the filter's own run name), so a rerun measures the same rates and a task's rate
  does not depend on its neighbours. Prompts go through the chat template with the task's length target,
  exactly as a worker encodes them.
- A completion passes when its reward is above `PASS_REWARD` (rewards are 0 or 1; the length term of a run is
  not part of it). A completion the grader cannot judge (GraderFault) is not a pass.
- A task whose prompt leaves no room for `max_new_tokens` in the model's context gets rate 0: the run, with
  the same budget, could never solve it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from swarmnode.node.rl.engine import InferenceEngine
from swarmnode.node.rl.sampling import group_seeds
from swarmnode.node.rl.tasks.core import Task
from swarmnode.node.rl.tasks.graders import measured_rewards

FILTER_RUN = "swarmnode-filter"  # the run name seeds are derived under (no real run has it)
FILTER_WORKER = b"pass-rate"
PASS_REWARD = 0.5  # a completion whose reward is above this counts as solving the task

Progress = Callable[[int, int, float], None]  # (tasks done, tasks in all, the last task's pass rate)


def task_pass_rate(engine: InferenceEngine, task: Task, *, samples: int, max_new_tokens: int,
                   temperature: float, seed: int = 0) -> float:
    """Share of `samples` seeded completions of `task` that its grader passes (one batched group)."""
    prompt = engine.tokenizer.encode_prompt(task.prompt, task.target_length)
    if len(prompt) + max_new_tokens > engine.info.max_positions:
        return 0.0
    seeds = group_seeds(FILTER_RUN, FILTER_WORKER, seed, task.task_id, samples)
    group = engine.generate_group(prompt, samples, seeds, max_new_tokens, temperature)
    texts = [engine.tokenizer.completion_text(c.tokens) for c in group]
    return sum(r > PASS_REWARD for r in measured_rewards([(task, texts)])[0]) / samples


def pass_rates(engine: InferenceEngine, tasks: Sequence[Task], *, samples: int, max_new_tokens: int,
               temperature: float = 1.0, seed: int = 0, progress: Progress | None = None) -> list[float]:
    """The pass rate of every task, in order; `progress` is called after each task (long work)."""
    if samples < 1 or max_new_tokens < 1:
        raise ValueError(f"need samples >= 1 and max_new_tokens >= 1, got {samples} and {max_new_tokens}")
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed {seed} outside u64")
    rates: list[float] = []
    for task in tasks:
        rates.append(task_pass_rate(engine, task, samples=samples, max_new_tokens=max_new_tokens,
                                    temperature=temperature, seed=seed))
        if progress is not None:
            progress(len(rates), len(tasks), rates[-1])
    return rates


def filter_tasks(tasks: Sequence[Task], rates: Sequence[float], min_pass: float = 0.0,
                 max_pass: float = 1.0) -> tuple[list[Task], list[Task], list[Task]]:
    """(kept, too easy, too hard), each in dataset order: kept iff `min_pass < rate < max_pass`.

    The defaults are INTELLECT-2's: drop what the base model never solves (0.0) or always solves (1.0).
    """
    if len(rates) != len(tasks):
        raise ValueError(f"{len(rates)} pass rates for {len(tasks)} tasks")
    if not 0.0 <= min_pass < max_pass <= 1.0:
        raise ValueError(f"need 0 <= min_pass < max_pass <= 1, got {min_pass} and {max_pass}")
    kept: list[Task] = []
    easy: list[Task] = []
    hard: list[Task] = []
    for task, rate in zip(tasks, rates, strict=True):
        (hard if rate <= min_pass else easy if rate >= max_pass else kept).append(task)
    return kept, easy, hard

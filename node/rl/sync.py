"""The synchronous single-process baseline: same model, tasks, seeds and GRPO step, no network.

Each step one honest worker generates its assigned groups on the current policy (version = step), and
the trainer takes one GRPO step on them. The distributed devnet is compared against this loop at equal
numbers of trainer steps (benchmarks/bench_rl.py).

Progress is judged on a fixed held-out set (`node.rl.run.devnet_eval_tasks`) with `eval_reward`: the
same tasks and the same sampling seeds every time, so two measurements differ only by the weights. The
per-step reward of the trained groups is reported too, but it swings with which tasks a step drew.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from swarmnode.node.rl.engine import InferenceEngine, TransformersEngine
from swarmnode.node.rl.environments.episodes import EpisodeRules, episode_rules
from swarmnode.node.rl.learner import GrpoTrainer, OptimizerParams, StepStats
from swarmnode.node.rl.rollouts import build_submission, play_groups, task_prompt_ids
from swarmnode.node.rl.run import RunSetup, devnet_optimizer
from swarmnode.node.rl.sampling import group_seeds
from swarmnode.node.rl.tasks import Task
from swarmnode.node.rl.tasks.graders import measured_rewards

EVAL_RUN = "swarmnode-eval"
EVAL_WORKER = b"held-out"
EVAL_PLAYED_TASKS = 16  # tasks whose episodes are played together: a batch of 16 x samples episodes a round


@dataclass(frozen=True)
class SyncStep:
    stats: StepStats
    generate_s: float
    train_s: float
    eval_reward: float | None = None  # held-out mean reward after this step, when it was measured
    eval_s: float = 0.0


def eval_reward(
    engine: InferenceEngine,
    tasks: Sequence[Task],
    *,
    samples: int,
    max_new_tokens: int,
    temperature: float,
    run_id: str = EVAL_RUN,
    worker: bytes = EVAL_WORKER,
    rules: EpisodeRules | None = None,
) -> float:
    """Mean reward of `samples` completions per task, with seeds fixed by (run_id, worker, task, index)
    alone (step 0), so two measurements differ only by the weights. With `rules` (a multi-turn run) each
    completion is an episode of the run's environment, and its reward the episode's.

    A completion the grader faults on (a machine-dependent limit, GraderFault) counts as unsolved: this is
    a local measurement, not a verdict anyone recomputes.
    """
    if not tasks or samples < 1:
        raise ValueError("need at least one task and one sample")
    if rules is not None:
        return _played_reward(engine, tasks, rules, samples, temperature, run_id, worker)
    groups = []
    for task in tasks:
        seeds = group_seeds(run_id, worker, 0, task.task_id, samples)
        prompt = list(task_prompt_ids(task, engine.tokenizer))
        group = engine.generate_group(prompt, samples, seeds, max_new_tokens, temperature)
        groups.append((task, [engine.tokenizer.completion_text(completion.tokens) for completion in group]))
    total = sum(sum(rewards) for rewards in measured_rewards(groups))  # a faulting one counts 0
    return total / (len(tasks) * samples)


def _played_reward(engine: InferenceEngine, tasks: Sequence[Task], rules: EpisodeRules, samples: int,
                   temperature: float, run_id: str, worker: bytes) -> float:
    """`eval_reward` of a multi-turn run: the mean reward of the episodes, `EVAL_PLAYED_TASKS` tasks'
    episodes played together (in rounds: `play_groups`)."""
    total = 0.0
    for start in range(0, len(tasks), EVAL_PLAYED_TASKS):
        chunk = tasks[start : start + EVAL_PLAYED_TASKS]
        seeds = [group_seeds(run_id, worker, 0, task.task_id, samples) for task in chunk]
        prompts = [task_prompt_ids(task, engine.tokenizer, rules) for task in chunk]
        played = play_groups(engine, chunk, rules, prompts, seeds, temperature)
        total += sum(sum(group.rewards or ()) for group in played)
    return total / (len(tasks) * samples)


def run_sync(
    setup: RunSetup,
    model_dir: Path,
    steps: int,
    worker: bytes,
    *,
    optim: OptimizerParams | None = None,
    eval_tasks: Sequence[Task] = (),
    eval_samples: int = 8,
    eval_every: int = 0,
    out_dir: Path | None = None,
    on_step: Callable[[SyncStep], None] | None = None,
) -> list[SyncStep]:
    """Train for `steps` GRPO steps; checkpoints go to `out_dir` when given.

    `optim` defaults to the devnet's (`node.rl.run.devnet_optimizer`). With `eval_tasks`, the held-out
    reward is measured after every `eval_every`-th step and after the last one.
    """
    descriptor = setup.descriptor
    grpo = descriptor.grpo
    trainer = GrpoTrainer(
        TransformersEngine.from_folder(model_dir), grpo, optim=optim or devnet_optimizer()
    )
    dataset, ids = setup.dataset, setup.dataset_ids
    history = []
    for version in range(steps):
        started = time.perf_counter()
        submission = build_submission(
            trainer.engine, descriptor, dataset, ids, worker, version, b"\0" * 32, 0
        )
        generated = time.perf_counter()
        stats = trainer.step(submission.groups)
        trained = time.perf_counter()
        reward, eval_s = None, 0.0
        if eval_tasks and (version + 1 == steps or (eval_every > 0 and (version + 1) % eval_every == 0)):
            reward = eval_reward(
                trainer.engine,
                eval_tasks,
                samples=eval_samples,
                max_new_tokens=grpo.max_new_tokens,
                temperature=grpo.temperature,
                rules=episode_rules(descriptor),
            )
            eval_s = time.perf_counter() - trained
        record = SyncStep(stats, generated - started, trained - generated, reward, eval_s)
        history.append(record)
        if on_step is not None:
            on_step(record)
    if out_dir is not None:
        trainer.save(out_dir)
    return history

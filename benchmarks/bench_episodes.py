#!/usr/bin/env python3
"""Multi-turn groups (spec/environments.md) on the devnet's committed model: what a worker spends playing a
group of guess-the-number episodes, and what a validator spends checking them.

Measured in one run, alternating, medians of `--rounds`:
  worker      `build_submission`: every episode of the submission played round by round (each round of
              turns one batch: `rollouts.play_groups`), TOPLOC proofs, the signed-ready message
  rounds      `play_groups` alone, over the submission's groups
  first only  what play_group did before: a group's first turns sampled as one batch (they share the
              prompt), the later turns one episode at a time, each a new request on the episode so far
  one by one  every turn of every episode its own request
  validator   `validate_submission` of the worker's submission: one prefill of every whole transcript, the
              model checks on the model's positions, and the replay of every episode

`later_turn_batching_ratio` is rounds over first-only seconds, `first_turn_batching_ratio` first-only over
one-by-one seconds (below 1: the batch pays); `validator_to_worker_ratio` is validator over worker seconds
(what verification costs per unit of work). The ways sample the same tokens up to the last bits of a
batched matmul (same seeds, same positions); the run notes a game where they differ.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import torch

from swarmnode.crypto.hashing import sha256
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.environments.episodes import episode_rules, play
from swarmnode.node.rl.environments.game import generate_tasks
from swarmnode.node.rl.model import model_commitment
from swarmnode.node.rl.rollouts import build_submission, model_turn, play_groups, turn_sampler
from swarmnode.node.rl.run import DEVNET_MODEL, describe_run, devnet_grpo, devnet_policy, environment_for
from swarmnode.node.rl.validation import ValidationContext, validate_submission

WORKER = sha256(b"bench-episodes-worker")[:20]
ROOT = sha256(b"bench-episodes-checkpoint")


def one_by_one(engine: TransformersEngine, task, rules, prompt, seeds, temperature):
    """Every turn its own request, the first ones too."""
    return [play(rules, task, seed, engine.tokenizer, turn_sampler(engine, prompt, seed, temperature))
            for seed in seeds]


def first_only(engine: TransformersEngine, task, rules, prompt, seeds, temperature):
    """A group's first turns in one batch, every later turn its own request (play_group before rounds)."""
    firsts = engine.generate_group(list(prompt), len(seeds), seeds, rules.turn_budget(0), temperature)
    return [play(rules, task, seed, engine.tokenizer, turn_sampler(engine, prompt, seed, temperature),
                 model_turn(first)) for seed, first in zip(seeds, firsts, strict=True)]


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8, help="groups per submission")
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)

    engine = TransformersEngine.from_folder(DEVNET_MODEL)
    tasks = list({t.task_id: t for t in generate_tasks(256, seed=1, max_low=20, max_size=16)}.values())
    grpo = dataclasses.replace(devnet_grpo(engine.info), prompts_per_step=args.prompts,
                               group_size=args.group_size)
    terms = environment_for("guess", tasks, engine.tokenizer, engine.info, grpo.max_new_tokens)
    descriptor = describe_run(run="bench", trainer=b"\x01" * 20, model=model_commitment(DEVNET_MODEL),
                              tasks=tasks, grpo=grpo, policy=devnet_policy(), created_ms=0, environment=terms)
    rules = episode_rules(descriptor)
    assert rules is not None
    dataset = {t.task_id: t for t in tasks}
    ctx = ValidationContext(descriptor, dataset, list(dataset), 0, {0: ROOT}, lambda _: True, engine.info,
                            engine.tokenizer)

    worker_s, rounds_s, first_s, baseline_s, validator_s, turns = [], [], [], [], [], []
    for counter in range(args.rounds):
        started = time.perf_counter()
        sub = build_submission(engine, descriptor, dataset, list(dataset), WORKER, 0, ROOT, counter)
        worker_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        validate_submission(sub, WORKER, ctx, lambda _: engine)
        validator_s.append(time.perf_counter() - started)
        groups = [(dataset[g.task_id], g.prompt_ids, [c.seed for c in g.completions]) for g in sub.groups]
        started = time.perf_counter()
        play_groups(engine, [t for t, _, _ in groups], rules, [p for _, p, _ in groups],
                    [s for _, _, s in groups], grpo.temperature)
        rounds_s.append(time.perf_counter() - started)
        first = baseline = 0.0
        for (task, prompt, seeds), group in zip(groups, sub.groups, strict=True):
            started = time.perf_counter()
            first_only(engine, task, rules, prompt, seeds, grpo.temperature)
            first += time.perf_counter() - started
            started = time.perf_counter()
            again = one_by_one(engine, task, rules, prompt, seeds, grpo.temperature)
            baseline += time.perf_counter() - started
            if [p.tokens for p in again] != [c.token_ids for c in group.completions]:
                print(f"note: game {task.target}: one by one sampled other tokens than the rounds")
        first_s.append(first)
        baseline_s.append(baseline)
        turns.append(sum(len(c.env_spans) + 1 for g in sub.groups for c in g.completions))
        print(f"round {counter}: worker {worker_s[-1]:.2f} s (play in rounds {rounds_s[-1]:.2f} s, first "
              f"turns only batched {first:.2f} s, one by one {baseline:.2f} s), validator "
              f"{validator_s[-1]:.2f} s, {turns[-1]} model turns")

    worker, rounds, first, baseline, validator = (statistics.median(x) for x in
                                                  (worker_s, rounds_s, first_s, baseline_s, validator_s))
    print(json.dumps({
        "episodes_per_round": args.prompts * args.group_size,
        "model_turns_per_round_median": statistics.median(turns),
        "worker_s": round(worker, 3),
        "play_rounds_s": round(rounds, 3),
        "play_first_turns_only_s": round(first, 3),
        "play_one_by_one_s": round(baseline, 3),
        "validator_s": round(validator, 3),
        "later_turn_batching_ratio": round(rounds / first, 3),
        "first_turn_batching_ratio": round(first / baseline, 3),
        "validator_to_worker_ratio": round(validator / worker, 3),
    }))

if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Multi-turn groups (spec/environments.md) on the devnet's committed model: what a worker spends playing a
group of guess-the-number episodes, and what a validator spends checking them.

Measured in one run, alternating, medians of `--rounds`:
  worker      `build_submission`: every group played, TOPLOC proofs, the signed-ready message
  batched     `rollouts.play_group` alone: a group's first turns sampled as one batch (they share the
              prompt), the later turns one episode at a time, each a new request on the episode so far
  one by one  the baseline: every turn of every episode its own request (what play_group did before)
  validator   `validate_submission` of the worker's submission: one prefill of every whole transcript, the
              model checks on the model's positions, and the replay of every episode

`first_turn_batching_ratio` is batched over one-by-one seconds (below 1: the batch pays);
`validator_to_worker_ratio` is validator over worker seconds (what verification costs per unit of work).
The two ways sample the same tokens up to the last bits of a batched matmul (same seeds, same positions);
the run notes a game where they differ.
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
from swarmnode.node.rl.rollouts import build_submission, play_group, turn_sampler
from swarmnode.node.rl.run import DEVNET_MODEL, describe_run, devnet_grpo, devnet_policy, environment_for
from swarmnode.node.rl.validation import ValidationContext, validate_submission

WORKER = sha256(b"bench-episodes-worker")[:20]
ROOT = sha256(b"bench-episodes-checkpoint")


def one_by_one(engine: TransformersEngine, task, rules, prompt, seeds, temperature):
    """Every turn its own request, the first ones too: the baseline play_group is measured against."""
    return [play(rules, task, seed, engine.tokenizer, turn_sampler(engine, prompt, seed, temperature))
            for seed in seeds]


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

    worker_s, batched_s, baseline_s, validator_s, turns = [], [], [], [], []
    for counter in range(args.rounds):
        started = time.perf_counter()
        sub = build_submission(engine, descriptor, dataset, list(dataset), WORKER, 0, ROOT, counter)
        worker_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        validate_submission(sub, WORKER, ctx, lambda _: engine)
        validator_s.append(time.perf_counter() - started)
        batched = baseline = 0.0
        for group in sub.groups:
            task, seeds = dataset[group.task_id], [c.seed for c in group.completions]
            started = time.perf_counter()
            play_group(engine, task, rules, group.prompt_ids, seeds, grpo.temperature)
            batched += time.perf_counter() - started
            started = time.perf_counter()
            again = one_by_one(engine, task, rules, group.prompt_ids, seeds, grpo.temperature)
            baseline += time.perf_counter() - started
            if [p.tokens for p in again] != [c.token_ids for c in group.completions]:
                print(f"note: game {task.target}: one by one sampled other tokens than the batch")
        batched_s.append(batched)
        baseline_s.append(baseline)
        turns.append(sum(len(c.env_spans) + 1 for g in sub.groups for c in g.completions))
        print(f"round {counter}: worker {worker_s[-1]:.2f} s (play batched {batched:.2f} s, one by one "
              f"{baseline:.2f} s), validator {validator_s[-1]:.2f} s, {turns[-1]} model turns")

    worker, batched, baseline, validator = (statistics.median(x)
                                            for x in (worker_s, batched_s, baseline_s, validator_s))
    print(json.dumps({
        "episodes_per_round": args.prompts * args.group_size,
        "model_turns_per_round_median": statistics.median(turns),
        "worker_s": round(worker, 3),
        "play_batched_s": round(batched, 3),
        "play_one_by_one_s": round(baseline, 3),
        "validator_s": round(validator, 3),
        "first_turn_batching_ratio": round(batched / baseline, 3),
        "validator_to_worker_ratio": round(validator / worker, 3),
    }))

if __name__ == "__main__":
    main()

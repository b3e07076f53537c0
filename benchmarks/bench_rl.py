"""RL benchmark: does GRPO raise the devnet model's reward, and what does a step cost?

Usage: `python benchmarks/bench_rl.py [--steps 30] [--worker NAME ...] [--threads 2] [--quick] [--no-sync]`
(`--quick`: 12 steps, 32 held-out tasks measured at the end only, no DiLoCo section; `--no-sync`: the
devnet sections alone, e.g. to compare the async pipeline's supply before and after a change).

Sections (each a function returning its own keys; `SECTIONS` runs them in order):
- sync: the synchronous single-process baseline (`node.rl.sync.run_sync`) from the devnet's committed model
  folder (node/rl/assets/devnet-model) with the devnet recipe (`devnet_grpo`, `devnet_optimizer`).
  Reward is judged on the fixed
  held-out set `devnet_eval_tasks` (128 tasks x 8 samples at the run's temperature, the same seeds every
  time), measured on the base before training, every `--eval-every` steps and at the end; the per-step
  reward of the trained groups is printed as well but swings with the tasks a step drew. Wall time per
  step is split into generation (sampling + rewards + TOPLOC proofs, i.e. a worker's job) and training.
  With several `--worker` names the run is repeated per worker (the task assignment and the sampling
  seeds depend on the worker address) and the keys are means, plus the worst ratio.
- devnet: the same number of trainer steps through the distributed devnet (`swarmnode devnet --steps N
  --no-live`: bootstrap, trainer, 2 relays, 3 workers, 1 validator as processes sharing the same cores),
  on the same base, recipe and held-out set. Reported: held-out reward at equal trainer steps, wall time
  per trainer step, the fraction of it the trainer waited for rollouts, the share of honest submissions
  that arrived too stale to train on (`devnet_stale_ratio`: the validator's STALE verdicts plus the
  trainer's stale drops, over the validator's accepted and STALE verdicts), and validator CPU seconds per
  accepted rollout against worker CPU seconds to generate one (both measured inside the working thread).
  A devnet that wrote its summary but then exited non-zero (on a loaded machine: nodes slow to stop) is
  still reported, with `devnet_exit_code` saying so.
- diloco: the devnet again with `--diloco-trainers K` trainers of one run (DiLoCo, H =
  `--diloco-inner-steps`), each taking steps/K GRPO steps, so the run trains on as many rollout batches
  as the single-trainer devnet; reported: held-out reward of the outer weights and wall time, as ratios
  against the single-trainer devnet.

Progress goes to stderr; the last line on stdout is one JSON object (snake_case keys, ratios end in
`_ratio`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from swarmnode.crypto.hashing import sha256
from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.run import DEVNET_MODEL, devnet_eval_tasks, devnet_optimizer, devnet_run
from swarmnode.node.rl.sync import SyncStep, eval_reward, run_sync

Section = Callable[[argparse.Namespace], dict[str, float | int]]
TRAINER_KEY = sha256(b"swarmnode-sync-trainer")
ROOT = Path(__file__).resolve().parents[1]


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def sync_section(args: argparse.Namespace) -> dict[str, float | int]:
    if args.no_sync:
        return {}
    setup = devnet_run(NodeIdentity(TRAINER_KEY).address, DEVNET_MODEL, created_ms=0)
    grpo, optim = setup.descriptor.grpo, devnet_optimizer()
    tasks = devnet_eval_tasks(args.eval_tasks)
    _log(
        f"sync: {args.steps} steps x {grpo.prompts_per_step} prompts x {grpo.group_size} completions, "
        f"lr {grpo.learning_rate:g}, betas {optim.betas}, warmup {optim.warmup_steps}; "
        f"eval {len(tasks)} held-out tasks x {args.eval_samples} samples"
    )

    started = time.perf_counter()
    base = eval_reward(
        TransformersEngine.from_folder(DEVNET_MODEL),
        tasks,
        samples=args.eval_samples,
        max_new_tokens=grpo.max_new_tokens,
        temperature=grpo.temperature,
    )
    base_eval_s = time.perf_counter() - started
    _log(f"base held-out reward {base:.3f} ({base_eval_s:.1f}s)")

    finals, firsts, lasts, gen, train, evals, walls = [], [], [], [], [], [], []
    for name in args.worker:
        worker = NodeIdentity(sha256(name.encode())).address

        def report(record: SyncStep, name: str = name) -> None:
            s = record.stats
            held = f"  held-out {record.eval_reward:.3f}" if record.eval_reward is not None else ""
            _log(
                f"[{name}] step {s.step:3d}  reward {s.mean_reward:.3f}  groups {s.groups_used}/"
                f"{s.groups_used + s.groups_dropped}  grad {s.grad_norm:5.2f}  "
                f"gen {record.generate_s:5.2f}s  train {record.train_s:5.2f}s{held}"
            )

        run_started = time.perf_counter()
        history = run_sync(
            setup,
            DEVNET_MODEL,
            args.steps,
            worker,
            optim=optim,
            eval_tasks=tasks,
            eval_samples=args.eval_samples,
            eval_every=args.eval_every,
            on_step=report,
        )
        walls.append(time.perf_counter() - run_started)
        final = history[-1].eval_reward
        assert final is not None
        k = min(5, len(history))
        rewards = [h.stats.mean_reward for h in history]
        finals.append(final)
        firsts.append(_mean(rewards[:k]))
        lasts.append(_mean(rewards[-k:]))
        gen.append(_mean([h.generate_s for h in history]))
        train.append(_mean([h.train_s for h in history]))
        evals.append(sum(h.eval_s for h in history))
        _log(
            f"[{name}] held-out reward {base:.3f} -> {final:.3f} ({final / base:.2f}x); "
            f"step reward first {k} {firsts[-1]:.3f} -> last {k} {lasts[-1]:.3f}; "
            f"per step gen {gen[-1]:.2f}s train {train[-1]:.2f}s"
        )

    final = _mean(finals)
    return {
        "steps": args.steps,
        "workers": len(args.worker),
        "group_size": grpo.group_size,
        "prompts_per_step": grpo.prompts_per_step,
        "max_new_tokens": grpo.max_new_tokens,
        "learning_rate": grpo.learning_rate,
        "warmup_steps": optim.warmup_steps,
        "eval_tasks": len(tasks),
        "eval_samples": args.eval_samples,
        "base_eval_reward": round(base, 4),
        "final_eval_reward": round(final, 4),
        "final_eval_reward_min": round(min(finals), 4),
        "eval_reward_gain": round(final - base, 4),
        "final_vs_base_reward_ratio": round(final / base, 4),
        "worst_final_vs_base_reward_ratio": round(min(finals) / base, 4),
        "step_reward_first5": round(_mean(firsts), 4),
        "step_reward_last5": round(_mean(lasts), 4),
        "step_reward_last5_vs_first5_ratio": round(_mean(lasts) / max(_mean(firsts), 1e-9), 4),
        "generate_s_per_step": round(_mean(gen), 4),
        "train_s_per_step": round(_mean(train), 4),
        "step_s": round(_mean(gen) + _mean(train), 4),
        "train_vs_generate_time_ratio": round(_mean(train) / _mean(gen), 4),
        "eval_s_per_run": round(_mean(evals), 3),
        "base_eval_s": round(base_eval_s, 3),
        "sync_wall_s_per_run": round(_mean(walls), 3),
        "sync_reward_spread": round(statistics.pstdev(finals), 4) if len(finals) > 1 else 0.0,
    }


def run_devnet(steps: int, *extra: str) -> tuple[dict[str, Any], float]:
    """One `swarmnode devnet --steps N` run in a temporary folder: its summary JSON and wall seconds."""
    with tempfile.TemporaryDirectory(prefix="bench-rl-devnet-") as tmp:
        summary_path = Path(tmp) / "summary.json"
        command = [
            sys.executable, "-m", "swarmnode.node.cli.run", "devnet", "--steps", str(steps), "--no-live",
            "--out", str(Path(tmp) / "run"), "--summary", str(summary_path), *extra,
        ]  # fmt: skip
        _log(f"devnet: {' '.join(command[2:])}")
        started = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if result.returncode != 0 and not summary_path.exists():
            raise SystemExit(
                f"devnet failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
            )
        summary = json.loads(summary_path.read_text())
        if result.returncode != 0:  # measured, but it ended badly (on a loaded machine: nodes slow to stop)
            _log(f"devnet exited {result.returncode} after its summary:\n{result.stderr[-600:]}")
        return summary | {"exit_code": result.returncode}, wall


def stale_counts(summary: dict[str, Any]) -> dict[str, int]:
    """Honest submissions that reached a validator in time to be judged (accepted, or ignored as STALE),
    those too stale to train on (STALE at the validator, or dropped stale by the trainer), those used."""
    validators, trainer = summary["validators"], summary["trainer"]
    stale_verdicts = int(validators["by_reason"].get("STALE", 0))
    return {
        "arrived": int(validators["accepted"]) + stale_verdicts,
        "stale_at_validator": stale_verdicts,
        "stale_dropped": int(trainer["stale_dropped"]),
        "too_stale": stale_verdicts + int(trainer["stale_dropped"]),
        "used": int(trainer["submissions_used"]),
    }


def devnet_section(args: argparse.Namespace) -> dict[str, float | int]:
    if args.no_devnet:
        return {}
    summary, wall = run_devnet(args.steps)
    rewards = summary["rewards_per_step"]
    k = min(5, len(rewards))
    step_s = summary["step_s_mean"]
    stale = stale_counts(summary)
    _log(
        f"devnet: held-out reward {summary['base_reward']:.3f} -> {summary['final_reward']:.3f}; "
        f"{step_s:.2f}s per step, trainer waited {summary['trainer_wait_fraction']:.0%}; "
        f"{stale['too_stale']} of {stale['arrived']} honest submissions arrived too stale "
        f"({stale['stale_at_validator']} at the validator, {stale['stale_dropped']} dropped by the trainer), "
        f"{stale['used']} trained on; validator "
        f"{summary['validator_cpu_s_per_accepted']:.3f} CPU s per accepted rollout vs worker "
        f"{summary['worker_cpu_s_per_accepted']:.3f}"
    )
    return {
        "devnet_base_eval_reward": round(summary["base_reward"], 4),
        "devnet_final_eval_reward": round(summary["final_reward"], 4),
        "devnet_final_vs_base_reward_ratio": round(summary["final_reward"] / summary["base_reward"], 4),
        "devnet_step_reward_first5": round(_mean(rewards[:k]), 4),
        "devnet_step_reward_last5": round(_mean(rewards[-k:]), 4),
        "devnet_step_s": round(step_s, 4),
        "devnet_trainer_wait_fraction": round(summary["trainer_wait_fraction"], 4),
        "devnet_submissions_arrived": stale["arrived"],
        "devnet_submissions_too_stale": stale["too_stale"],
        "devnet_submissions_stale_at_validator": stale["stale_at_validator"],
        "devnet_submissions_stale_dropped": stale["stale_dropped"],
        "devnet_submissions_used": stale["used"],
        "devnet_stale_ratio": round(stale["too_stale"] / max(stale["arrived"], 1), 4),
        "devnet_validator_cpu_s_per_accepted": summary["validator_cpu_s_per_accepted"],
        "devnet_worker_cpu_s_per_accepted": summary["worker_cpu_s_per_accepted"],
        "devnet_validator_vs_worker_cpu_ratio": round(summary["verification_cost_ratio"], 4),
        "devnet_wall_s": round(wall, 2),
        "devnet_exit_code": summary["exit_code"],
    }


def diloco_section(args: argparse.Namespace) -> dict[str, float | int]:
    """K trainers of one run (DiLoCo), each taking steps/K GRPO steps: the same total of GRPO steps, so
    the same number of rollout batches trained on, as the single-trainer devnet above."""
    if args.no_devnet or args.diloco_trainers < 2:
        return {}
    k, h = args.diloco_trainers, args.diloco_inner_steps
    per_trainer = max(h, args.steps // k)
    summary, wall = run_devnet(
        per_trainer, "--trainers", str(k), "--inner-steps", str(h),
        "--outer-lr", str(args.diloco_outer_lr), "--outer-momentum", str(args.diloco_outer_momentum),
    )  # fmt: skip
    _log(
        f"diloco devnet ({k} trainers x {per_trainer} steps, H={h}): held-out reward "
        f"{summary['base_reward']:.3f} -> {summary['final_reward']:.3f} in {wall:.0f}s"
    )
    return {
        "diloco_trainers": k,
        "diloco_inner_steps": h,
        "diloco_steps_per_trainer": per_trainer,
        "diloco_final_eval_reward": round(summary["final_reward"], 4),
        "diloco_final_vs_base_reward_ratio": round(summary["final_reward"] / summary["base_reward"], 4),
        "diloco_wall_s": round(wall, 2),
    }


def comparison_section(args: argparse.Namespace, result: dict[str, float | int]) -> dict[str, float | int]:
    """Devnet against the synchronous baseline at equal trainer steps (both measured above)."""
    if "devnet_final_eval_reward" not in result or "final_eval_reward" not in result:
        return {}
    return {
        "devnet_vs_sync_final_reward_ratio": round(
            float(result["devnet_final_eval_reward"]) / float(result["final_eval_reward"]), 4
        ),
        "devnet_vs_sync_step_time_ratio": round(float(result["devnet_step_s"]) / float(result["step_s"]), 4),
    } | (
        {
            "diloco_vs_devnet_final_reward_ratio": round(
                float(result["diloco_final_eval_reward"]) / float(result["devnet_final_eval_reward"]), 4
            ),
            "diloco_vs_devnet_wall_ratio": round(
                float(result["diloco_wall_s"]) / float(result["devnet_wall_s"]), 4
            ),
        }
        if "diloco_final_eval_reward" in result
        else {}
    )


SECTIONS: list[Section] = [sync_section, devnet_section, diloco_section]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps per run")
    parser.add_argument(
        "--worker",
        action="append",
        default=None,
        help="worker key name (repeat for several runs; default: the CLI's sync worker)",
    )
    parser.add_argument("--eval-tasks", type=int, default=128, help="held-out tasks for the reward")
    parser.add_argument("--eval-samples", type=int, default=8, help="samples per held-out task")
    parser.add_argument(
        "--eval-every", type=int, default=10, help="held-out reward every N steps (0: end only)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (sync section)")
    parser.add_argument("--no-devnet", action="store_true", help="skip the distributed devnet sections")
    parser.add_argument("--no-sync", action="store_true", help="skip the synchronous baseline section")
    parser.add_argument(
        "--diloco-trainers", type=int, default=2, help="trainers of the DiLoCo devnet (< 2: skip it)"
    )
    parser.add_argument("--diloco-inner-steps", type=int, default=3, help="H of the DiLoCo devnet")
    parser.add_argument("--diloco-outer-lr", type=float, default=0.7)
    parser.add_argument("--diloco-outer-momentum", type=float, default=0.9)
    parser.add_argument(
        "--quick", action="store_true", help="12 steps, 32 held-out tasks at the end only, no DiLoCo"
    )
    args = parser.parse_args()
    if args.quick:
        args.steps, args.eval_tasks, args.eval_every, args.diloco_trainers = 12, 32, 0, 0
    args.worker = args.worker or ["swarmnode-sync-worker"]
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    result: dict[str, float | int] = {"torch_threads": torch.get_num_threads()}
    for section in SECTIONS:
        result.update(section(args))
    result.update(comparison_section(args, result))
    result["wall_s"] = round(time.perf_counter() - started, 3)
    print(json.dumps(result, sort_keys=False))


if __name__ == "__main__":
    main()

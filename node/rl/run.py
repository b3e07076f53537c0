"""A run's fixed facts: the devnet's defaults, its dataset and the signed RunDescriptor.

Everything a validator needs to recompute a verdict is derivable from the descriptor: the dataset
hash names the task list, the model config hash the architecture, the policy the TOPLOC bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from crypto.merkle import merkle_root
from node.rl.model import ModelConfig, file_sha256, model_config_hash
from node.rl.tasks import Task
from node.rl.tasks.arithmetic import DEVNET_PARAMS, generate_tasks
from node.rl.trainer import OptimizerParams
from protocol.messages import GrpoParams, RunDescriptor, ValidatorPolicy

ASSETS = Path(__file__).resolve().parent / "assets"
BASE_CHECKPOINT = ASSETS / "base.safetensors"
DEVNET_RUN = "devnet"
DEVNET_DATASET_SEED = 2026
DEVNET_DATASET_SIZE = 512
DEVNET_EVAL_SEED = 2027
DEVNET_EVAL_SIZE = 128


def devnet_grpo(cfg: ModelConfig) -> GrpoParams:
    """The devnet's GRPO recipe for the committed tiny base (136k params, two-digit addition).

    Measured with the synchronous baseline, 30 steps, reward at temperature 1 on a fixed held-out set
    (128 tasks x 8 samples, same seeds before and after):
    - `benchmarks/bench_rl.py` (`devnet_eval_tasks`, 2 threads, TOPLOC proofs on): base 0.321 -> 0.414,
      0.426, 0.378 for three worker addresses (mean 0.406, 1.26x, worst 1.18x); per-step reward of the
      trained groups 0.33 (first 5 steps) -> 0.40 (last 5);
    - exploration runs (another held-out draw where the base scores 0.355, greedy 0.51, pass@8 0.83,
      1 thread): 0.480, 0.483, 0.439, 0.462 for four more worker addresses; the held-out reward keeps
      rising past step 30 (greedy 0.57 and pass@8 0.91 at step 30, so it learns, not only sharpens);
    - the old recipe (lr 2e-3, 4 prompts) ends at 0.01-0.06, lr 1e-3 at 0.05-0.2.
    A step is ~0.25 s of sampling, 1.5-4 s of TOPLOC proofs for the 256 completions and 0.1-0.5 s of
    training on 2 shared cores: 30 steps in about 2 minutes.

    Why these numbers:
    - learning rate 2e-4 with `devnet_optimizer` (betas (0.9, 0.99), 3 warmup steps). The trainer's AdamW
      starts with empty moments, and its first steps are sign steps that, for a gradient of a few hundred
      completions, move the tiny model's function far more than a random step of the same size: one step
      at 1e-3 takes the base from 0.35 to 0.2 (at 2e-3 to 0.06), whether the gradient is GRPO's or a plain
      supervised one, and the old default (2e-3, 4 prompts) ended at 0.01-0.06 after 30 steps. 5e-4 still
      drifts down; 1e-4 to 3e-4 rise, 2e-4 fastest without losing it later.
    - 32 prompts x 8 completions per step: the group gradient is the noise-limited part, and 4 or 8 prompts
      leave every lr either too slow or unstable; 16 prompts rise less (~0.42 at step 30), 64 and 128
      prompts only a little more (0.46, 0.49) at 2x and 4x the generation and proof time.
    - max_new_tokens 6: the longest answer is 3 digits + EOS; two spare tokens let a wrong, unterminated
      answer show up as such. Temperature 1, the design's clipping (eps 0.2, delta 4), grad-norm clip 1
      and the constant token budget G * prompts * max_new_tokens are unchanged.
    """
    group_size, prompts, max_new = 8, 32, 6
    if max_new > cfg.max_positions - 8:
        raise ValueError("model context too short for the devnet task")
    return GrpoParams(
        group_size=group_size,
        prompts_per_step=prompts,
        max_new_tokens=max_new,
        temperature=1.0,
        learning_rate=2e-4,
        clip_epsilon=0.2,
        clip_delta=4.0,
        max_grad_norm=1.0,
        token_budget=group_size * prompts * max_new,
        length_target=0,
        length_penalty=0.0003,
    )


def devnet_optimizer() -> OptimizerParams:
    """The trainer's AdamW settings that go with `devnet_grpo` (see there, and `node.rl.trainer`)."""
    return OptimizerParams(betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0, warmup_steps=3)


def devnet_policy() -> ValidatorPolicy:
    """Bounds for the fp32 CPU path, where prefill reproduces generation almost exactly.

    `swarmnode calibrate` measures them for a given checkpoint; these defaults hold the measured honest
    maximum with a wide margin (see spec/toploc.md).
    """
    return ValidatorPolicy(
        toploc_k=128,
        toploc_chunk=32,
        max_mean_exp_mismatches=1.0,
        max_mean_mant_err=0.5,
        sampling_tolerance=1e-3,
        eos_min_prob=1e-3,
        sample_fraction=1.0,
        min_stake_gwei=10**9,
        slash_gwei=5 * 10**8,
    )


def devnet_dataset() -> list[Task]:
    """Distinct two-digit additions, in a fixed order."""
    tasks = generate_tasks(DEVNET_PARAMS, DEVNET_DATASET_SEED, DEVNET_DATASET_SIZE * 2)
    unique = list({t.task_id: t for t in tasks}.values())
    return unique[:DEVNET_DATASET_SIZE]


def devnet_eval_tasks(size: int = DEVNET_EVAL_SIZE) -> list[Task]:
    """A fixed held-out evaluation set: distinct two-digit additions that are not in the training dataset.

    Reward measured on it at the start and the end of a run (the same tasks and sampling seeds both times,
    so the difference is not assignment noise) is what "reward rising" is judged by; the per-step reward of
    the trained groups swings by +-0.1 with which tasks a step happened to draw.
    """
    train = {t.task_id for t in devnet_dataset()}
    unique = {t.task_id: t for t in generate_tasks(DEVNET_PARAMS, DEVNET_EVAL_SEED, size * 4)}
    held_out = [t for t in unique.values() if t.task_id not in train]
    if len(held_out) < size:
        raise ValueError(f"only {len(held_out)} held-out tasks, {size} asked")
    return held_out[:size]


def dataset_hash(tasks: Sequence[Task]) -> bytes:
    return merkle_root([t.task_id for t in tasks])


@dataclass(frozen=True)
class RunSetup:
    descriptor: RunDescriptor
    tasks: list[Task]

    @property
    def dataset(self) -> dict[bytes, Task]:
        return {t.task_id: t for t in self.tasks}

    @property
    def dataset_ids(self) -> list[bytes]:
        return [t.task_id for t in self.tasks]


def devnet_run(
    trainer: bytes,
    cfg: ModelConfig,
    base_checkpoint: Path,
    created_ms: int,
    grpo: GrpoParams | None = None,
    policy: ValidatorPolicy | None = None,
) -> RunSetup:
    tasks = devnet_dataset()
    descriptor = RunDescriptor(
        run=DEVNET_RUN,
        trainer=trainer,
        model_config_hash=model_config_hash(cfg),
        base_checkpoint_hash=file_sha256(base_checkpoint),
        dataset_hash=dataset_hash(tasks),
        task_kind="arithmetic",
        grpo=grpo or devnet_grpo(cfg),
        async_level=2,
        policy=policy or devnet_policy(),
        created_ms=created_ms,
    )
    return RunSetup(descriptor, tasks)

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
from protocol.messages import GrpoParams, RunDescriptor, ValidatorPolicy

ASSETS = Path(__file__).resolve().parent / "assets"
BASE_CHECKPOINT = ASSETS / "base.safetensors"
DEVNET_RUN = "devnet"
DEVNET_DATASET_SEED = 2026
DEVNET_DATASET_SIZE = 512


def devnet_grpo(cfg: ModelConfig) -> GrpoParams:
    group_size, prompts, max_new = 8, 4, 6
    if max_new > cfg.max_positions - 8:
        raise ValueError("model context too short for the devnet task")
    return GrpoParams(
        group_size=group_size, prompts_per_step=prompts, max_new_tokens=max_new, temperature=1.0,
        learning_rate=2e-3, clip_epsilon=0.2, clip_delta=4.0, max_grad_norm=1.0,
        token_budget=group_size * prompts * max_new, length_target=0, length_penalty=0.0003,
    )


def devnet_policy() -> ValidatorPolicy:
    """Bounds for the fp32 CPU path, where prefill reproduces generation almost exactly.

    `swarmnode calibrate` measures them for a given checkpoint; these defaults hold the measured honest
    maximum with a wide margin (see spec/toploc.md).
    """
    return ValidatorPolicy(
        toploc_k=128, toploc_chunk=32, max_mean_exp_mismatches=1.0, max_mean_mant_err=0.5,
        sampling_tolerance=1e-3, eos_min_prob=1e-3, sample_fraction=1.0, min_stake_gwei=10**9,
        slash_gwei=5 * 10**8,
    )


def devnet_dataset() -> list[Task]:
    """Distinct two-digit additions, in a fixed order."""
    tasks = generate_tasks(DEVNET_PARAMS, DEVNET_DATASET_SEED, DEVNET_DATASET_SIZE * 2)
    unique = list({t.task_id: t for t in tasks}.values())
    return unique[:DEVNET_DATASET_SIZE]


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


def devnet_run(trainer: bytes, cfg: ModelConfig, base_checkpoint: Path, created_ms: int,
               grpo: GrpoParams | None = None, policy: ValidatorPolicy | None = None) -> RunSetup:
    tasks = devnet_dataset()
    descriptor = RunDescriptor(
        run=DEVNET_RUN, trainer=trainer, model_config_hash=model_config_hash(cfg),
        base_checkpoint_hash=file_sha256(base_checkpoint), dataset_hash=dataset_hash(tasks),
        task_kind="arithmetic", grpo=grpo or devnet_grpo(cfg), async_level=2, policy=policy or devnet_policy(),
        created_ms=created_ms,
    )
    return RunSetup(descriptor, tasks)

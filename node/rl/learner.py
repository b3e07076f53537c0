"""The trainer's GRPO step over accepted rollout groups, and its on-disk state.

The step is the design's: drop zero-advantage groups (online filtering), recompute logprobs under the
current weights with grad, take the claimed (validator-checked) logprobs of the sampling policy as the
old ones, apply the two-sided clipped loss over a constant token budget, clip the gradient norm, AdamW.

Optimizer decisions (measured on the devnet model, see `node.rl.run.devnet_grpo`):
- The RL optimizer starts fresh on a warm-started model, so its first updates are Adam's sign steps:
  with an empty second moment every parameter moves by the full learning rate in the sign of its
  gradient. For a batch of a few dozen completions the gradient is nearly low rank, so a sign step is
  coherent and moves the function far more than its size suggests (one step at lr 1e-3 drops the base's
  pass rate from 0.35 to 0.2, at 2e-3 to 0.06, for the RL *and* for a plain supervised gradient; a random
  sign perturbation of the same size does nothing). In the synchronous loop each batch gets one step, so
  the ratio is 1 when the gradient is taken and the eps/delta clipping cannot bound this. Hence a small
  learning rate, a linear warmup (`OptimizerParams.warmup_steps`, a pure function of the step, so a
  resumed trainer continues the same schedule) and beta2 0.99 so the second moment tracks the gradient
  scale after a few steps instead of a few hundred.
- The optimizer settings are the trainer's own (they are not part of the signed GrpoParams: nobody but
  the trainer needs them); they are written into the optimizer file and the JSON record and restored.

State on disk is step-stamped: `step-000042.safetensors` (weights, the config's hash in metadata),
`step-000042.optim.safetensors` (AdamW moments; hyper-parameters as JSON metadata) and a small JSON
record. Nothing is pickled, so a checkpoint a peer sends can never execute code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from swarmnode.node.errors import OperatorError
from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.environments.episodes import model_mask
from swarmnode.node.rl.grpo import GrpoLoss, grpo_loss, has_signal
from swarmnode.node.rl.model import ModelInfo, save_weights, state_dict_of
from swarmnode.node.rl.rollouts import unpack_logprobs
from swarmnode.protocol.messages import GrpoParams, RolloutGroup


class TrainerStateMismatch(OperatorError, RuntimeError):
    """The trainer directory holds state of the other kind (one process vs a sharded group)."""


@dataclass(frozen=True)
class OptimizerParams:
    """AdamW settings of the trainer (the learning rate itself is `GrpoParams.learning_rate`)."""

    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 0

    def lr_at(self, base_lr: float, step: int) -> float:
        """Learning rate of 1-based step `step`: linear warmup over `warmup_steps`, then constant."""
        if self.warmup_steps <= 0:
            return base_lr
        return base_lr * min(1.0, step / self.warmup_steps)


@dataclass(frozen=True)
class StepStats:
    step: int
    groups_used: int
    groups_dropped: int
    tokens: int
    loss: float
    grad_norm: float
    clipped_fraction: float
    mean_reward: float


def signal_groups(groups: Sequence[RolloutGroup]) -> list[RolloutGroup]:
    return [g for g in groups if has_signal(torch.tensor([c.reward for c in g.completions]))]


def mean_reward(groups: Sequence[RolloutGroup]) -> float:
    rewards = [c.reward for g in groups for c in g.completions]
    return sum(rewards) / max(len(rewards), 1)


@dataclass(frozen=True)
class CompletionBatch:
    """A step's completions flattened: what the loss needs besides the fresh logprobs.

    `claimed` are the sampler's logprobs (validator-checked), the loss's old policy. `sampled` marks the
    tokens the model sampled: a multi-turn completion's environment tokens are outside the loss.
    """

    prompts: list[list[int]]
    completions: list[list[int]]
    claimed: list[torch.Tensor]
    advantages: torch.Tensor
    sampled: list[torch.Tensor]

    def __len__(self) -> int:
        return len(self.completions)

    def select(self, indices: Sequence[int]) -> CompletionBatch:
        """The completions at `indices` (a rank's share of the batch)."""
        return CompletionBatch(
            [self.prompts[i] for i in indices],
            [self.completions[i] for i in indices],
            [self.claimed[i] for i in indices],
            self.advantages[list(indices)],
            [self.sampled[i] for i in indices],
        )


def completion_batch(groups: Sequence[RolloutGroup]) -> CompletionBatch:
    return CompletionBatch(
        [list(g.prompt_ids) for g in groups for _ in g.completions],
        [list(c.token_ids) for g in groups for c in g.completions],
        [unpack_logprobs(c.logprobs) for g in groups for c in g.completions],
        torch.tensor([c.advantage for g in groups for c in g.completions]),
        [model_mask(len(c.token_ids), c.env_spans) for g in groups for c in g.completions],
    )


def batch_loss(
    current: torch.Tensor, mask: torch.Tensor, batch: CompletionBatch, grpo: GrpoParams
) -> GrpoLoss:
    """The GRPO loss of `batch` given its fresh logprobs (B, T) with grad, right-padded under `mask`."""
    old = torch.zeros_like(current)
    for i, claimed in enumerate(batch.claimed):
        old[i, : claimed.numel()] = claimed.to(old.device)
    mask = mask.clone()
    for i, sampled in enumerate(batch.sampled):
        mask[i, : sampled.numel()] &= sampled.to(mask.device)
    return grpo_loss(
        current,
        old,
        batch.advantages.to(current.device),
        mask,
        clip_epsilon=grpo.clip_epsilon,
        clip_delta=grpo.clip_delta,
        token_budget=grpo.token_budget,
    )


def skipped_step(step: int, groups: Sequence[RolloutGroup], reward: float) -> StepStats:
    """The stats of a step with no group carrying signal: nothing trained, every group dropped."""
    return StepStats(step, 0, len(groups), 0, 0.0, 0.0, 0.0, reward)


def apply_update(
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    loss: torch.Tensor,
    grpo: GrpoParams,
    optim: OptimizerParams,
    step: int,
) -> torch.Tensor:
    """Backward `loss`, clip the gradient norm, and take one optimizer step at step `step`'s learning rate.

    Returns the gradient norm before clipping (a DTensor when the parameters are sharded). One rule for
    the single-process trainer and every rank of a trainer group. The parameters are read after the
    backward: FSDP2 swaps a module's parameters for unsharded ones between its forward and backward.
    """
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grpo.max_grad_norm)
    for group in optimizer.param_groups:
        group["lr"] = optim.lr_at(grpo.learning_rate, step)
    optimizer.step()
    return norm


class GrpoTrainer:
    """Owns the policy weights and the optimizer; one `step` per batch of accepted groups."""

    def __init__(
        self,
        engine: TransformersEngine,
        grpo: GrpoParams,
        step: int = 0,
        optim: OptimizerParams | None = None,
    ) -> None:
        self.engine = engine
        self.grpo = grpo
        self.optim = optim or OptimizerParams()
        self.step_count = step
        self.optimizer = torch.optim.AdamW(
            engine.model.parameters(),
            lr=grpo.learning_rate,
            betas=self.optim.betas,
            eps=self.optim.eps,
            weight_decay=self.optim.weight_decay,
        )

    @property
    def info(self) -> ModelInfo:
        return self.engine.info

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.engine.model.parameters())

    def step(self, groups: Sequence[RolloutGroup]) -> StepStats:
        used = signal_groups(groups)
        reward = mean_reward(groups)
        self.step_count += 1
        if not used:
            return skipped_step(self.step_count, groups, reward)
        batch = completion_batch(used)
        model = self.engine.model
        model.train()
        temperature = self.grpo.temperature
        current = self.engine.logprobs(batch.prompts, batch.completions, temperature=temperature, grad=True)
        out = batch_loss(current.values, current.mask, batch, self.grpo)
        norm = apply_update(self.optimizer, model, out.loss, self.grpo, self.optim, self.step_count)
        grad_norm = float(norm)
        model.eval()
        return StepStats(
            self.step_count,
            len(used),
            len(groups) - len(used),
            out.tokens,
            float(out.loss.item()),
            grad_norm,
            out.clipped_fraction,
            reward,
        )

    # --- persistence ------------------------------------------------------------------------------

    def save(self, directory: Path) -> Path:
        """Write weights, optimizer state and a JSON record for the current step; atomic per file."""
        directory.mkdir(parents=True, exist_ok=True)
        stem = directory / f"step-{self.step_count:06d}"
        weights = stem.with_suffix(".safetensors")
        tmp = weights.with_name(weights.name + ".tmp")
        digest = save_weights(state_dict_of(self.engine.model), self.engine.info.config_hash, tmp)
        os.replace(tmp, weights)
        tensors, meta = optimizer_tensors(self.optimizer)
        optim = directory / f"step-{self.step_count:06d}.optim.safetensors"
        save_file(tensors, str(optim) + ".tmp", metadata={"hyper": json.dumps(meta)})
        os.replace(str(optim) + ".tmp", optim)
        record = {
            "step": self.step_count,
            "weights": weights.name,
            "sha256": digest.hex(),
            "grpo": asdict(self.grpo),
            "optimizer": asdict(self.optim),
        }
        record_path = stem.with_suffix(".json")
        record_tmp = record_path.with_name(record_path.name + ".tmp")
        record_tmp.write_text(json.dumps(record, indent=1))
        os.replace(record_tmp, record_path)  # last: a record names only files that are complete
        return weights

    @classmethod
    def resume(
        cls, directory: Path, model_dir: Path, grpo: GrpoParams, optim: OptimizerParams | None = None
    ) -> GrpoTrainer | None:
        """The trainer at the newest complete step in `directory` (weights of the model in `model_dir`), or
        None when there is none.

        The optimizer settings are the ones recorded with the step unless `optim` overrides them.
        """
        records = sorted(directory.glob("step-*.json"))
        for record_path in reversed(records):
            try:
                record = json.loads(record_path.read_text())
            except (OSError, ValueError):
                continue
            if record.get("format") == "dcp":
                raise TrainerStateMismatch(
                    f"{record_path} was saved by a {record.get('world_size')}-rank trainer group: "
                    "run the trainer with [work] nproc > 1 (a group resumes at any size)"
                )
            weights = directory / record["weights"]
            optim_path = directory / f"step-{record['step']:06d}.optim.safetensors"
            if not (weights.exists() and optim_path.exists()):
                continue
            if optim is None and "optimizer" in record:
                saved = record["optimizer"]
                optim = OptimizerParams(
                    betas=(float(saved["betas"][0]), float(saved["betas"][1])),
                    eps=saved["eps"],
                    weight_decay=saved["weight_decay"],
                    warmup_steps=saved["warmup_steps"],
                )
            engine = TransformersEngine.from_folder(model_dir)
            engine.load_weights(weights)
            trainer = cls(engine, grpo, step=record["step"], optim=optim)
            load_optimizer(trainer.optimizer, optim_path)
            return trainer
        return None


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    """AdamW state as flat named tensors (safetensors) plus its hyper-parameters as JSON."""
    state = optimizer.state_dict()
    tensors = {}
    for index, slots in state["state"].items():
        for name, value in slots.items():
            tensors[f"{index}.{name}"] = torch.as_tensor(value).detach().cpu().contiguous()
    groups = [{k: v for k, v in g.items()} for g in state["param_groups"]]
    return tensors, {"param_groups": groups}


def load_optimizer(optimizer: torch.optim.Optimizer, path: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        meta = json.loads((handle.metadata() or {})["hyper"])
    tensors = load_file(str(path))
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    groups = meta["param_groups"]
    for group in groups:
        if "betas" in group:  # JSON turned the tuple into a list
            group["betas"] = tuple(group["betas"])
    optimizer.load_state_dict({"state": state, "param_groups": groups})

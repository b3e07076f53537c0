"""The trainer's GRPO step over accepted rollout groups, and its on-disk state.

The step is the design's: drop zero-advantage groups (online filtering), recompute logprobs under the
current weights with grad, take the claimed (validator-checked) logprobs of the sampling policy as the
old ones, apply the two-sided clipped loss over a constant token budget, clip the gradient norm, AdamW.

State on disk is step-stamped: `step-000042.safetensors` (weights, config in metadata),
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

from node.rl.engine import TransformersEngine
from node.rl.grpo import grpo_loss, has_signal
from node.rl.model import save_checkpoint, state_dict_of
from node.rl.rollouts import unpack_logprobs
from protocol.messages import GrpoParams, RolloutGroup


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


class GrpoTrainer:
    """Owns the policy weights and the optimizer; one `step` per batch of accepted groups."""

    def __init__(self, engine: TransformersEngine, grpo: GrpoParams, step: int = 0) -> None:
        self.engine = engine
        self.grpo = grpo
        self.step_count = step
        self.optimizer = torch.optim.AdamW(engine.model.parameters(), lr=grpo.learning_rate, weight_decay=0.0)

    def step(self, groups: Sequence[RolloutGroup]) -> StepStats:
        used = signal_groups(groups)
        rewards = [c.reward for g in groups for c in g.completions]
        mean_reward = sum(rewards) / max(len(rewards), 1)
        self.step_count += 1
        if not used:
            return StepStats(self.step_count, 0, len(groups), 0, 0.0, 0.0, 0.0, mean_reward)
        prompts = [list(g.prompt_ids) for g in used for _ in g.completions]
        completions = [list(c.token_ids) for g in used for c in g.completions]
        model = self.engine.model
        model.train()
        current = self.engine.logprobs(prompts, completions, temperature=self.grpo.temperature, grad=True)
        old = torch.zeros_like(current.values)
        for i, c in enumerate(c for g in used for c in g.completions):
            claimed = unpack_logprobs(c.logprobs)
            old[i, : claimed.numel()] = claimed
        advantages = torch.tensor([c.advantage for g in used for c in g.completions])
        out = grpo_loss(current.values, old, advantages, current.mask, clip_epsilon=self.grpo.clip_epsilon,
                        clip_delta=self.grpo.clip_delta, token_budget=self.grpo.token_budget)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), self.grpo.max_grad_norm))
        self.optimizer.step()
        model.eval()
        return StepStats(self.step_count, len(used), len(groups) - len(used), out.tokens, float(out.loss.item()),
                         grad_norm, out.clipped_fraction, mean_reward)

    # --- persistence ------------------------------------------------------------------------------

    def save(self, directory: Path) -> Path:
        """Write weights, optimizer state and a JSON record for the current step; atomic per file."""
        directory.mkdir(parents=True, exist_ok=True)
        stem = directory / f"step-{self.step_count:06d}"
        weights = stem.with_suffix(".safetensors")
        tmp = weights.with_name(weights.name + ".tmp")
        digest = save_checkpoint(state_dict_of(self.engine.model), self.engine.config, tmp)
        os.replace(tmp, weights)
        tensors, meta = optimizer_tensors(self.optimizer)
        optim = directory / f"step-{self.step_count:06d}.optim.safetensors"
        save_file(tensors, str(optim) + ".tmp", metadata={"hyper": json.dumps(meta)})
        os.replace(str(optim) + ".tmp", optim)
        record = {"step": self.step_count, "weights": weights.name, "sha256": digest.hex(), "grpo": asdict(self.grpo)}
        (stem.with_suffix(".json")).write_text(json.dumps(record, indent=1))
        return weights

    @classmethod
    def resume(cls, directory: Path, grpo: GrpoParams) -> GrpoTrainer | None:
        """The trainer at the newest complete step in `directory`, or None when there is none."""
        records = sorted(directory.glob("step-*.json"))
        for record_path in reversed(records):
            record = json.loads(record_path.read_text())
            weights = directory / record["weights"]
            optim = directory / f"step-{record['step']:06d}.optim.safetensors"
            if not (weights.exists() and optim.exists()):
                continue
            trainer = cls(TransformersEngine.from_checkpoint(weights), grpo, step=record["step"])
            load_optimizer(trainer.optimizer, optim)
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
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})

"""One rank's part of the sharded trainer: its FSDP2 shard of the model and of the AdamW state.

Every rank runs the same `ShardedPolicy` in lockstep (`node.trainer.commands` hands them rank 0's
commands): the GRPO step on its share of the batch, its part of the DCP resume state, its weights files of
a published checkpoint. The design decisions are `node.trainer.sharded`'s docstring.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from swarmnode.node.dataplane.checkpoint import (
    ShardPlan,
    WeightsFile,
    model_extra_files,
    pack_weights,
)
from swarmnode.node.dataplane.store import write_hashed
from swarmnode.node.rl.learner import (
    OptimizerParams,
    StepStats,
    apply_update,
    batch_loss,
    completion_batch,
    mean_reward,
    signal_groups,
    skipped_step,
)
from swarmnode.node.rl.model import ModelInfo, load_model
from swarmnode.node.rl.sampling import token_logprobs
from swarmnode.node.rl.tokenizer import load_tokenizer
from swarmnode.node.trainer.group import GroupInfo
from swarmnode.protocol.messages import GrpoParams, RolloutGroup, ShardInfo

DCP_SUFFIX = ".dcp"


# --- pure rules ------------------------------------------------------------------------------------


def rank_share(count: int, rank: int, world: int) -> list[int]:
    """The indices of a step's `count` completions that `rank` computes: dealt round-robin."""
    return list(range(rank, count, world))


def assign_files(files: Sequence[WeightsFile], world: int) -> list[int]:
    """The rank that writes each weights file: largest first to the least-loaded rank (ties: lower rank),
    so every rank writes about 1/N of the bytes and every rank computes the same assignment."""
    load = [0] * world
    owner = [0] * len(files)
    for index in sorted(range(len(files)), key=lambda i: (-files[i].nbytes, i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += files[index].nbytes
    return owner


def dcp_dir(directory: Path, step: int) -> Path:
    return directory / f"step-{step:06d}{DCP_SUFFIX}"

# --- the model on one rank -------------------------------------------------------------------------


def shard_model(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """FSDP2 over `model` in place: each decoder layer its own unit, the rest (embeddings, norm, head)
    the root's. bf16 compute with fp32 reduction on GPUs; fp32 throughout on the CPU."""
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if device.type == "cuda"
        else MixedPrecisionPolicy()
    )
    model.to(device)
    for layer in model.model.layers:  # type: ignore[union-attr]  # every supported architecture has them
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def completion_logprobs(
    model: torch.nn.Module,
    pad_id: int,
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    temperature: float,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token logprobs (B, T) of `completions` with grad, and their mask.

    Through the model's own forward (so FSDP's hooks gather each unit), then the rows at the generated
    positions; `TransformersEngine.logprobs` computes the same numbers from the hidden rows.
    """
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    longest = max(len(s) for s in seqs)
    t_max = max(1, max(len(c) for c in completions))
    ids = torch.full((len(seqs), longest), pad_id, dtype=torch.int64)
    index = torch.zeros((len(seqs), t_max), dtype=torch.int64)
    targets = torch.full((len(seqs), t_max), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(seqs), t_max), dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, : len(seqs[i])] = torch.tensor(seqs[i])
        index[i, : len(c)] = torch.arange(len(p) - 1, len(p) - 1 + len(c))
        targets[i, : len(c)] = torch.tensor(list(c), dtype=torch.int64)
        mask[i, : len(c)] = True
    logits = model(input_ids=ids.to(device), use_cache=False).logits.float()
    index = index.to(device)
    rows = logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))
    mask = mask.to(device)
    values = token_logprobs(rows, targets.to(device), temperature)
    return values * mask, mask


class ShardedPolicy:
    """One rank's part of the trainer: its shard of the weights and of the AdamW state."""

    def __init__(
        self,
        group: GroupInfo,
        model: torch.nn.Module,
        info: ModelInfo,
        grpo: GrpoParams,
        optim: OptimizerParams,
        step: int = 0,
    ) -> None:
        self.group = group
        self.model = shard_model(model, group.device)
        self.info = info
        self.grpo = grpo
        self.optim = optim
        self.step_count = step
        # what a command family above the trainer keeps on this rank, by its op prefix (DiLoCo's share of
        # the participant, once the group is one): the trainer only holds it
        self.family_state: dict[str, Any] = {}
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=grpo.learning_rate,
            betas=optim.betas,
            eps=optim.eps,
            weight_decay=optim.weight_decay,
        )

    @classmethod
    def open(
        cls, group: GroupInfo, model_dir: Path, grpo: GrpoParams, optim: OptimizerParams
    ) -> ShardedPolicy:
        _, info = load_tokenizer(model_dir)
        return cls(group, load_model(model_dir), info, grpo, optim)

    def local_bytes(self) -> int:
        """Bytes of this rank's parameter and optimizer-state shards (what FSDP divides by N)."""
        total = 0
        for p in self.model.parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            total += local.numel() * local.element_size()
        for slots in self.optimizer.state.values():
            for value in slots.values():
                if isinstance(value, torch.Tensor):
                    local = value.to_local() if isinstance(value, DTensor) else value
                    total += local.numel() * local.element_size()
        return total

    # --- the step ----------------------------------------------------------------------------------

    def step(self, groups: Sequence[RolloutGroup]) -> StepStats:
        """The GRPO step on this rank's share of the batch; collective (every rank calls it together)."""
        used = signal_groups(groups)
        reward = mean_reward(groups)
        self.step_count += 1
        if not used:
            return skipped_step(self.step_count, groups, reward)
        batch = completion_batch(used)
        share = rank_share(len(batch), self.group.rank, self.group.world_size)
        # A rank without a completion still runs the forward and backward (FSDP's collectives need every
        # rank): on the first completion, weighted zero.
        mine = batch.select(share or [0])
        weight = float(self.group.world_size) if share else 0.0
        self.model.train()
        values, mask = completion_logprobs(
            self.model, self.info.pad_token_id, mine.prompts, mine.completions, self.grpo.temperature,
            self.group.device,
        )
        out = batch_loss(values, mask, mine, self.grpo)
        weighted = out.loss * weight
        norm = apply_update(self.optimizer, self.model, weighted, self.grpo, self.optim, self.step_count)
        grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        self.model.eval()
        return self._gathered_stats(out_stats(out, bool(share)), len(used), len(groups), grad_norm, reward)

    def _gathered_stats(
        self, local: list[float], used: int, groups: int, grad_norm: float, reward: float
    ) -> StepStats:
        """The whole step's loss, tokens and clipped fraction from every rank's share."""
        totals = torch.tensor(local, dtype=torch.float64, device=self.group.device)
        dist.all_reduce(totals)
        loss, tokens, clipped = (float(v) for v in totals.tolist())
        return StepStats(
            self.step_count, used, groups - used, int(tokens), loss, grad_norm, clipped / max(tokens, 1.0),
            reward,
        )

    # --- resume state (DCP) ------------------------------------------------------------------------

    def save_state(self, directory: Path) -> Path:
        """Write this step's sharded model and optimizer state; every rank calls it together."""
        target = dcp_dir(directory, self.step_count)
        staging = target.with_name(target.name + ".tmp")
        if self.group.is_lead:
            directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(staging, ignore_errors=True)
        dist.barrier()
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(staging))
        dist.barrier()
        if self.group.is_lead:
            shutil.rmtree(target, ignore_errors=True)
            os.replace(staging, target)
        dist.barrier()
        return target

    def load_state(self, directory: Path, step: int) -> None:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(dcp_dir(directory, step)))
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        self.step_count = step

    # --- a published checkpoint, written by every rank ---------------------------------------------

    def write_model(self, partial_dir: Path, shard_size: int, files: Mapping[str, bytes]) -> list[ShardInfo]:
        """Write this rank's weights files of a model folder into `partial_dir`; every rank calls it.

        Returns the `ShardInfo`s this rank wrote (rank 0 also writes `files` and the weights index).
        """
        state = self.model.state_dict()
        sizes = [(name, t.numel() * t.element_size()) for name, t in state.items()]
        layout = pack_weights(sizes, shard_size)
        owners = assign_files(layout, self.group.world_size)
        partial_dir.mkdir(parents=True, exist_ok=True)
        infos = []
        for weights, owner in zip(layout, owners, strict=True):
            tensors = {}
            for name in weights.tensors:
                tensor = state[name]
                full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
                if owner == self.group.rank:
                    tensors[name] = full.detach().to("cpu").contiguous().clone()
                del full
            if owner == self.group.rank:
                data = ShardPlan(weights.name, tensors, nbytes=weights.nbytes).serialize()
                infos.append(write_file(partial_dir, weights.name, data))
        if self.group.is_lead:
            for extra in model_extra_files(layout, files):
                infos.append(write_file(partial_dir, extra.name, extra.data))
        return infos


@dataclass(frozen=True)
class RankMemory:
    """What one rank holds: its parameter and optimizer shards, its peak RSS and peak device memory."""

    state_bytes: int
    peak_rss_bytes: int
    peak_device_bytes: int

    @classmethod
    def of(cls, policy: ShardedPolicy) -> RankMemory:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        device = torch.cuda.max_memory_allocated() if policy.group.device.type == "cuda" else 0
        return cls(policy.local_bytes(), rss, device)


def out_stats(out: Any, counted: bool) -> list[float]:
    """(loss, tokens, clipped tokens) of a rank's share; zeros for a rank that had none."""
    if not counted:
        return [0.0, 0.0, 0.0]
    return [float(out.loss.item()), float(out.tokens), out.clipped_fraction * out.tokens]


def write_file(directory: Path, name: str, data: bytes) -> ShardInfo:
    return ShardInfo(name, len(data), write_hashed(directory, name, data))


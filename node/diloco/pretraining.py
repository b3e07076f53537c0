"""The reference pre-training data of a DiLoCo run, its loss and each trainer's batch order.

Decisions:
- Arithmetic lines ("123+45=168") from `node.rl.tasks.arithmetic`, encoded with the model folder's own
  tokenizer (its BOS first when it has one, its first EOS last), right-padded with the model's pad id to a
  fixed length (`pretraining_batches`). A batch carries the mask of its real tokens (`LmBatch`) and the
  next-token loss counts the targets under it (`lm_loss`): many models pad with an EOS id, so "ignore the
  pad id" would also drop the EOS targets. Right padding needs no attention mask: a causal model's real
  tokens never see the pads after them.
- Round r on a trainer uses batches `(r*H + h) mod len(data)` for h < H of its own list (`round_batches`),
  so a trainer's data order is a pure function of (data, round, H) in every process.
- Data is each trainer's own business (the spec fixes none); tests, the benchmark and
  `swarmnode diloco trainer` use this one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from swarmnode.node.rl.model import ModelInfo
from swarmnode.node.rl.tasks.arithmetic import ArithmeticParams, generate_tasks
from swarmnode.node.rl.tokenizer import ChatTokenizer

B = TypeVar("B")

PRETRAIN_TASKS = ArithmeticParams(min_value=0, max_value=999, operators="+-", num_operands=2)
PRETRAIN_SEQ_LEN = 16  # longest line "999+999=1998": 12 characters (at most 12 tokens) + BOS + EOS


@dataclass(frozen=True, eq=False)
class LmBatch:
    """Right-padded token ids [B, T] (int64) and the mask of their real tokens [B, T] (bool)."""

    ids: Tensor
    mask: Tensor

    def __post_init__(self) -> None:
        if self.ids.dim() != 2 or self.ids.dtype != torch.int64:
            raise ValueError(f"ids must be a 2-d int64 tensor, got {self.ids.dtype} {list(self.ids.shape)}")
        if self.mask.shape != self.ids.shape or self.mask.dtype != torch.bool:
            raise ValueError(f"mask must be bool of shape {list(self.ids.shape)}")


def pretraining_batches(
    tokenizer: ChatTokenizer,
    info: ModelInfo,
    seed: int,
    n_batches: int,
    batch_size: int,
    *,
    seq_len: int = PRETRAIN_SEQ_LEN,
    tasks: ArithmeticParams = PRETRAIN_TASKS,
) -> list[LmBatch]:
    """`n_batches` batches of `batch_size` lines "a+b=c" in the model's tokens: [BOS] + line + EOS, padded."""
    if n_batches < 1 or batch_size < 1:
        raise ValueError(f"need at least one batch of one line, got {n_batches} x {batch_size}")
    if seq_len > info.max_positions:
        raise ValueError(f"seq_len {seq_len} exceeds the model's {info.max_positions} positions")
    bos = tokenizer.tokenizer.bos_token_id
    frame = [int(bos)] if bos is not None else []
    ids = torch.full((n_batches * batch_size, seq_len), info.pad_token_id, dtype=torch.int64)
    mask = torch.zeros((n_batches * batch_size, seq_len), dtype=torch.bool)
    for row, task in enumerate(generate_tasks(tasks, seed, n_batches * batch_size)):
        line = frame + tokenizer.encode(task.prompt + task.target) + [tokenizer.eos_token_ids[0]]
        if len(line) > seq_len:
            text = task.prompt + task.target
            raise ValueError(f"line {text!r} needs {len(line)} tokens > seq_len {seq_len}")
        ids[row, : len(line)] = torch.tensor(line, dtype=torch.int64)
        mask[row, : len(line)] = True
    return [
        LmBatch(i.contiguous(), m.contiguous())
        for i, m in zip(ids.split(batch_size), mask.split(batch_size), strict=True)
    ]


def lm_loss(model: torch.nn.Module, batch: LmBatch) -> Tensor:
    """Mean next-token cross-entropy over the targets that are real tokens of `batch`."""
    logits = model(input_ids=batch.ids, use_cache=False).logits[:, :-1]
    keep = batch.mask[:, 1:]
    return torch.nn.functional.cross_entropy(logits[keep], batch.ids[:, 1:][keep])


def eval_loss(model: torch.nn.Module, batches: Sequence[LmBatch]) -> float:
    """Mean of `lm_loss` over `batches`, without gradients (held-out loss)."""
    with torch.no_grad():
        return sum(float(lm_loss(model, b)) for b in batches) / len(batches)


def round_batches(data: Sequence[B], round_index: int, inner_steps: int) -> list[B]:
    """The H batches a trainer uses in round `round_index`: indices (r*H + h) mod len(data)."""
    if not data:
        raise ValueError("a trainer needs at least one batch")
    start = round_index * inner_steps
    return [data[(start + h) % len(data)] for h in range(inner_steps)]

"""Inference engines: one small interface, and the transformers implementation (the CPU default).

What an engine gives each role:
- worker: `generate_group` — G completions of one prompt with our seeded Gumbel-max sampler
  (`node.rl.sampling`), each with its tokens, per-token logprobs, seed, EOS flag and the final hidden rows
  (the input of `lm_head`, after the final norm, one per generated token) that TOPLOC proofs commit to;
- validator: `prefill` / `prefill_batch` — the same rows and the logits at the generated positions,
  teacher-forced, to check the proofs, the sampling and the termination;
- trainer: `logprobs` — per-token logprobs of given completions under the current weights, with grad when
  asked; `load_weights` hot-swaps a checkpoint everywhere.

Decisions:
- Generation is our own loop over `model.model` (KV cache, the group batched as G copies of one prompt, so
  no padding), then `model.lm_head` on the last row; the rows handed out are exactly what `lm_head` consumed.
  transformers' `generate` would hide both the rows and the sampler.
- Row p of a completion is the hidden state whose logits produced token p, i.e. sequence position
  len(prompt) + p - 1; prefill returns the same positions. A batched prefill pads on the right, which causal
  attention never looks at, so no attention mask and no position shift is needed.
- Logprobs are under the temperature-scaled distribution softmax(logits / temperature) that the token was
  drawn from (`sampling.token_logprobs`); the trainer must pass the same temperature to `logprobs`.
- Engines are synchronous and not thread-safe: the runtime calls them from one `trio.to_thread` worker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel

from swarmnode.node.rl.model import ModelInfo, load_model, load_weights
from swarmnode.node.rl.sampling import sample_tokens, token_logprobs
from swarmnode.node.rl.tokenizer import ChatTokenizer, load_tokenizer

WeightsSource = Mapping[str, torch.Tensor] | str | os.PathLike[str]


@dataclass(frozen=True)
class Completion:
    """One sampled completion. `tokens` ends at (and includes) the first EOS, if any.

    logprobs: (T,) fp32, log-probability of each sampled token under softmax(logits / temperature).
    hidden_rows: (T, hidden) fp32, the lm_head input that produced each token (what TOPLOC hashes).
    """

    tokens: tuple[int, ...]
    logprobs: torch.Tensor
    hidden_rows: torch.Tensor
    seed: int
    ended_with_eos: bool


@dataclass(frozen=True)
class Prefill:
    """Teacher-forced results at the generated positions: rows (T, hidden) and raw logits (T, vocab), fp32."""

    hidden_rows: torch.Tensor
    logits: torch.Tensor


@dataclass(frozen=True)
class TokenLogprobs:
    """Per-token logprobs of a batch of completions, right-padded: values (B, T) fp32, mask (B, T) bool."""

    values: torch.Tensor
    mask: torch.Tensor


@runtime_checkable
class InferenceEngine(Protocol):
    """What workers, validators and the trainer need from a model runtime."""

    @property
    def info(self) -> ModelInfo: ...

    @property
    def tokenizer(self) -> ChatTokenizer: ...

    def generate_group(
        self, prompt_ids: Sequence[int], n: int, seeds: Sequence[int], max_new_tokens: int, temperature: float
    ) -> list[Completion]: ...

    def prefill(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Prefill: ...

    def prefill_batch(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Prefill]: ...

    def logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        temperature: float = 1.0,
        grad: bool = False,
    ) -> TokenLogprobs: ...

    def load_weights(self, source: WeightsSource) -> None: ...


def check_group_request(info: ModelInfo, prompt_ids: Sequence[int], n: int, seeds: Sequence[int],
                        max_new_tokens: int) -> None:
    """The arguments every engine's `generate_group` must refuse before doing any work."""
    if len(seeds) != n or n < 1:
        raise ValueError(f"need n >= 1 and one seed per completion, got n={n}, {len(seeds)} seeds")
    if not prompt_ids or max_new_tokens < 1 or len(prompt_ids) + max_new_tokens > info.max_positions:
        raise ValueError(
            f"prompt of {len(prompt_ids)} + {max_new_tokens} new tokens"
            f" exceeds {info.max_positions} positions"
        )


def truncate_at_eos(tokens: Sequence[int], eos_token_ids: Sequence[int]) -> tuple[int, ...]:
    """Tokens up to and including the first EOS (everything, if there is none)."""
    for i, token in enumerate(tokens):
        if token in eos_token_ids:
            return tuple(tokens[: i + 1])
    return tuple(tokens)


class TransformersEngine:
    """The transformers engine: fp32 on the CPU by default, exact enough that prefill matches generation."""

    def __init__(self, info: ModelInfo, tokenizer: ChatTokenizer, model: PreTrainedModel,
                 device: str | torch.device = "cpu") -> None:
        self._info = info
        self._tokenizer = tokenizer
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()  # type: ignore[arg-type]  # transformers types `to` oddly
        self._eos = torch.tensor(info.eos_token_ids, dtype=torch.int64, device=self.device)

    @classmethod
    def from_folder(
        cls,
        folder: str | os.PathLike[str],
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> TransformersEngine:
        """The model of a Hugging Face folder, with its tokenizer and special tokens."""
        tokenizer, info = load_tokenizer(folder)
        return cls(info, tokenizer, load_model(folder, dtype), device)

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def tokenizer(self) -> ChatTokenizer:
        return self._tokenizer

    # ------------------------------------------------------------------ worker

    def generate_group(
        self, prompt_ids: Sequence[int], n: int, seeds: Sequence[int], max_new_tokens: int, temperature: float
    ) -> list[Completion]:
        """n completions of one prompt, one seed each, batched with a KV cache; stops when all hit EOS."""
        check_group_request(self._info, prompt_ids, n, seeds, max_new_tokens)
        ids = torch.tensor([list(prompt_ids)] * n, dtype=torch.int64, device=self.device)
        rows, toks, logps = [], [], []
        with torch.no_grad():
            out = self.model.model(input_ids=ids, use_cache=True)
            done = torch.zeros(n, dtype=torch.bool, device=self.device)
            for pos in range(max_new_tokens):
                hidden = out.last_hidden_state[:, -1]
                logits = self.model.lm_head(hidden).float()
                tok = sample_tokens(logits, seeds, pos, temperature)
                rows.append(hidden.float())
                toks.append(tok)
                logps.append(token_logprobs(logits, tok, temperature))
                done |= torch.isin(tok, self._eos)
                if bool(done.all()) or pos == max_new_tokens - 1:
                    break
                out = self.model.model(
                    input_ids=tok[:, None], past_key_values=out.past_key_values, use_cache=True
                )
        all_rows = torch.stack(rows, 1).cpu()
        all_toks = torch.stack(toks, 1).cpu()
        all_logps = torch.stack(logps, 1).cpu()
        result = []
        for i in range(n):
            tokens = truncate_at_eos(all_toks[i].tolist(), self._info.eos_token_ids)
            t = len(tokens)
            result.append(
                Completion(
                    tokens=tokens,
                    logprobs=all_logps[i, :t].clone(),
                    hidden_rows=all_rows[i, :t].clone(),
                    seed=int(seeds[i]),
                    ended_with_eos=bool(tokens) and tokens[-1] in self._info.eos_token_ids,
                )
            )
        return result

    # ------------------------------------------------------------------ validator

    def prefill(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Prefill:
        """Teacher-forced rows and logits at the generated positions of one sequence."""
        return self.prefill_batch([(prompt_ids, completion_ids)])[0]

    def prefill_batch(
        self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = 64
    ) -> list[Prefill]:
        """`prefill` for many sequences, right-padded and run `batch_size` at a time.

        One forward per batch; `lm_head` runs only on the generated positions (packed, no padding), and
        each Prefill's tensors are views of the batch's packed rows and logits (one copy to the CPU).
        """
        result: list[Prefill] = []
        with torch.no_grad():
            for start in range(0, len(pairs), batch_size):
                chunk = pairs[start : start + batch_size]
                hidden, mask, _ = self._completion_hidden([p for p, _ in chunk], [c for _, c in chunk])
                rows = hidden[mask]  # (generated tokens of the batch, H), sequence after sequence
                logits = self.model.lm_head(rows).float().cpu()
                lengths = [len(c) for _, c in chunk]
                result.extend(
                    Prefill(hidden_rows=r, logits=lg)
                    for r, lg in zip(rows.float().cpu().split(lengths), logits.split(lengths), strict=True)
                )
        return result

    # ------------------------------------------------------------------ trainer

    def logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        temperature: float = 1.0,
        grad: bool = False,
    ) -> TokenLogprobs:
        """Per-token logprobs of `completions` under the current weights; differentiable when `grad`."""
        with torch.set_grad_enabled(grad):
            hidden, mask, targets = self._completion_hidden(prompts, completions)
            values = token_logprobs(self.model.lm_head(hidden), targets, temperature)
        return TokenLogprobs(values=values * mask, mask=mask)

    def load_weights(self, source: WeightsSource) -> None:
        """Hot-swap the weights from a `save_weights` file or a state dict (strict: same tensors, shapes)."""
        state = source if isinstance(source, Mapping) else load_weights(source, self._info.config_hash)
        self.model.load_state_dict(state, strict=True)

    # ------------------------------------------------------------------ shared

    def _completion_hidden(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Hidden rows at the generated positions, right-padded: rows (B, T, H), mask and targets (B, T)."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        if any(not p for p in prompts):
            raise ValueError("empty prompt: the first generated token needs a row to come from")
        seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
        longest = max(len(s) for s in seqs)
        if longest > self._info.max_positions:
            raise ValueError(f"sequence of {longest} tokens exceeds {self._info.max_positions} positions")
        t_max = max(1, max(len(c) for c in completions))
        ids = torch.full((len(seqs), longest), self._info.pad_token_id, dtype=torch.int64)
        index = torch.zeros((len(seqs), t_max), dtype=torch.int64)
        targets = torch.full((len(seqs), t_max), self._info.pad_token_id, dtype=torch.int64)
        mask = torch.zeros((len(seqs), t_max), dtype=torch.bool)
        for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            ids[i, : len(seqs[i])] = torch.tensor(seqs[i])
            index[i, : len(c)] = torch.arange(len(p) - 1, len(p) - 1 + len(c))
            targets[i, : len(c)] = torch.tensor(list(c), dtype=torch.int64)
            mask[i, : len(c)] = True
        hidden = self.model.model(input_ids=ids.to(self.device), use_cache=False).last_hidden_state
        index = index.to(self.device)
        rows = hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))
        return rows, mask.to(self.device), targets.to(self.device)

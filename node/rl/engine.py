"""Inference engines: one small interface, and the transformers implementation (the CPU default).

What an engine gives each role:
- worker: `generate_group` — G completions of one prompt with our seeded Gumbel-max sampler
  (`node.rl.sampling`), each with its tokens, per-token logprobs, seed, EOS flag and the final hidden rows
  (the input of `lm_head`, after the final norm, one per generated token) that TOPLOC proofs commit to;
  `generate_turns` — one model turn for each of many episodes at once, each on its own context;
- validator: `prefill` / `prefill_batch` — the same rows and the logits at the generated positions,
  teacher-forced, to check the proofs, the sampling and the termination;
- trainer: `logprobs` — per-token logprobs of given completions under the current weights, with grad when
  asked; `load_weights` hot-swaps a checkpoint everywhere.

Decisions:
- Generation is our own loop over `model.model` (KV cache, the group batched as G copies of one prompt, so
  no padding), then `model.lm_head` on the last row; the rows handed out are exactly what `lm_head` consumed.
  transformers' `generate` would hide both the rows and the sampler. Turns of different episodes have
  contexts of different lengths: they are left-padded, with an attention mask and position ids that start
  at each context's first token, which samples each row as alone up to float noise.
- Row p of a completion is the hidden state whose logits produced token p, i.e. sequence position
  len(prompt) + p - 1; prefill returns the same positions. A batched prefill pads on the right, which causal
  attention never looks at, so no attention mask and no position shift is needed.
- A validator's prefill shares each prompt's forward between its completions (a group is G completions of
  one prompt): one row holds the prompt once, then every completion but its last token, each attending to
  the prompt and to itself only (an explicit mask, position ids restarting after the prompt). Row 0 of
  every completion is the prompt's last position. On the devnet that is a quarter of the tokens of one row
  per completion; completions too long to share a row run alone, so long sequences cost what they did.
- Logprobs are under the temperature-scaled distribution softmax(logits / temperature) that the token was
  drawn from (`sampling.token_logprobs`); the trainer must pass the same temperature to `logprobs`.
- Engines are synchronous and not thread-safe: the runtime calls them from one `trio.to_thread` worker.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel

from swarmnode.node.rl.model import ModelInfo, load_model, load_weights
from swarmnode.node.rl.sampling import sample_rows, token_logprobs
from swarmnode.node.rl.tokenizer import ChatTokenizer, load_tokenizer
from swarmnode.protocol.messages import EnvSpan

WeightsSource = Mapping[str, torch.Tensor] | str | os.PathLike[str]

PREFILL_BATCH: Final = 64  # rows per prefill forward (a row: one sequence, or a prompt's packed completions)
PACKED_ROW_TOKENS: Final = 256  # a row packs several completions of one prompt up to this many tokens
_SHARED_PROMPT_ATTENTION: Final = ("sdpa", "eager")  # implementations that take an explicit 4-D float mask


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
    env_spans: tuple[EnvSpan, ...] = ()  # an episode's environment turns (then hidden_rows are the model's)


@dataclass(frozen=True)
class TurnRequest:
    """One model turn to sample: its context (the prompt and the episode so far), the completion's seed,
    the completion position of the turn's first token (its noise continues the completion's), and its
    token budget."""

    context: tuple[int, ...]
    seed: int
    first_position: int
    max_new_tokens: int


@dataclass(frozen=True)
class Prefill:
    """Teacher-forced results at the generated positions: rows (T, hidden) on the CPU and raw logits
    (T, vocab) on the engine's device, both fp32. The logits stay where they were computed: the checks that
    read them (the sampling check hashes noise for every vocabulary entry of every row) run there, and only
    their per-token results travel."""

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
        self, prompt_ids: Sequence[int], n: int, seeds: Sequence[int], max_new_tokens: int,
        temperature: float, first_position: int = 0,
    ) -> list[Completion]: ...

    def generate_turns(self, requests: Sequence[TurnRequest], temperature: float) -> list[Completion]: ...

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
        self, prompt_ids: Sequence[int], n: int, seeds: Sequence[int], max_new_tokens: int,
        temperature: float, first_position: int = 0,
    ) -> list[Completion]:
        """n completions of one prompt, one seed each, batched with a KV cache; stops when all hit EOS.

        The sampler's noise for the p-th new token is that of completion position `first_position + p`: a
        later turn of an episode passes the turns so far in `prompt_ids` and their length here."""
        check_group_request(self._info, prompt_ids, n, seeds, max_new_tokens)
        ids = torch.tensor([list(prompt_ids)] * n, dtype=torch.int64, device=self.device)
        return self._sample(ids, None, seeds, [first_position] * n, [max_new_tokens] * n, temperature)

    def generate_turns(self, requests: Sequence[TurnRequest], temperature: float) -> list[Completion]:
        """One model turn per request, all in one batch: contexts of different lengths, left-padded (an
        attention mask hides the padding, position ids start at each context's first token), each row with
        its own seed, noise positions and budget. The episodes of a submission take their later turns so."""
        for r in requests:
            check_group_request(self._info, r.context, 1, [r.seed], r.max_new_tokens)
        if not requests:
            return []
        width = max(len(r.context) for r in requests)
        ids = torch.full((len(requests), width), self._info.pad_token_id, dtype=torch.int64)
        mask = torch.zeros((len(requests), width), dtype=torch.int64)
        for i, r in enumerate(requests):
            ids[i, width - len(r.context) :] = torch.tensor(r.context, dtype=torch.int64)
            mask[i, width - len(r.context) :] = 1
        return self._sample(ids.to(self.device), mask.to(self.device), [r.seed for r in requests],
                            [r.first_position for r in requests], [r.max_new_tokens for r in requests],
                            temperature)

    def _sample(self, ids: torch.Tensor, mask: torch.Tensor | None, seeds: Sequence[int],
                first_positions: Sequence[int], budgets: Sequence[int],
                temperature: float) -> list[Completion]:
        """The decode loop: row i samples up to `budgets[i]` tokens with the noise of (seeds[i],
        first_positions[i] + p); `mask` (left padding) is None when every row's context is whole."""
        n = len(seeds)
        rows, toks, logps = [], [], []
        budget = torch.tensor(list(budgets), device=self.device)
        with torch.no_grad():
            if mask is None:
                out, at = self.model.model(input_ids=ids, use_cache=True), None
            else:
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                out = self.model.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                       use_cache=True)
                at = positions[:, -1:] + 1
            done = torch.zeros(n, dtype=torch.bool, device=self.device)
            for pos in range(max(budgets)):
                hidden = out.last_hidden_state[:, -1]
                logits = self.model.lm_head(hidden).float()
                tok = sample_rows(logits, seeds, [f + pos for f in first_positions], temperature)
                rows.append(hidden.float())
                toks.append(tok)
                logps.append(token_logprobs(logits, tok, temperature))
                done |= torch.isin(tok, self._eos) | (budget <= pos + 1)
                if bool(done.all()):
                    break
                if mask is None or at is None:
                    out = self.model.model(input_ids=tok[:, None], past_key_values=out.past_key_values,
                                           use_cache=True)
                else:
                    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                    out = self.model.model(input_ids=tok[:, None], attention_mask=mask, position_ids=at,
                                           past_key_values=out.past_key_values, use_cache=True)
                    at = at + 1
        all_rows = torch.stack(rows, 1).cpu()
        all_toks = torch.stack(toks, 1).cpu()
        all_logps = torch.stack(logps, 1).cpu()
        result = []
        for i in range(n):
            tokens = truncate_at_eos(all_toks[i, : budgets[i]].tolist(), self._info.eos_token_ids)
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
        self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], batch_size: int = PREFILL_BATCH
    ) -> list[Prefill]:
        """`prefill` for many sequences; completions of one prompt share its forward (module docstring).

        Rows run `batch_size` at a time; `lm_head` runs once, only on the generated positions, and each
        Prefill's tensors are views of one copy of the rows (on the CPU) and of the logits (on the model's
        device: see `Prefill`).
        """
        prompts, completions = [p for p, _ in pairs], [c for _, c in pairs]
        self._check_sequences(prompts, completions)
        if not pairs:
            return []
        rows = plan_rows(pairs, PACKED_ROW_TOKENS if self._shares_prompts else 0)
        shared = [r for r in rows if len(r) > 1]
        alone = [r[0] for r in rows if len(r) == 1]
        pieces: list[torch.Tensor] = []
        order: list[int] = []
        with torch.no_grad():
            for start in range(0, len(shared), batch_size):
                row_batch = shared[start : start + batch_size]
                pieces.append(self._shared_prompt_hidden(pairs, row_batch))
                order += [m for r in row_batch for m in r]
            for start in range(0, len(alone), batch_size):
                batch = alone[start : start + batch_size]
                hidden, mask, _ = self._completion_hidden([prompts[m] for m in batch],
                                                          [completions[m] for m in batch])
                pieces.append(hidden[mask])
                order += batch
            lengths = [len(c) for c in completions]
            found = torch.cat(pieces)  # members' rows in `order`; put them back in the order of `pairs`
            offset = [0] * len(pairs)
            at = 0
            for m in order:
                offset[m], at = at, at + lengths[m]
            back = torch.cat([torch.arange(offset[m], offset[m] + lengths[m]) for m in range(len(pairs))])
            packed = found[back.to(found.device)]
            logits = self.model.lm_head(packed).float()
        return [
            Prefill(hidden_rows=r, logits=lg)
            for r, lg in zip(packed.float().cpu().split(lengths), logits.split(lengths), strict=True)
        ]

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

    @property
    def _shares_prompts(self) -> bool:
        """Whether completions of one prompt may share a forward: every layer attends to all earlier
        positions (no sliding window, whose mask we would have to rebuild) through an implementation that
        takes our mask as given."""
        config = self.model.config
        layers = getattr(config, "layer_types", None) or ["full_attention"]
        return (
            getattr(config, "_attn_implementation", None) in _SHARED_PROMPT_ATTENTION
            and not getattr(config, "use_sliding_window", False)
            and all(kind == "full_attention" for kind in layers)
        )

    def _check_sequences(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> None:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts for {len(completions)} completions")
        if any(not p for p in prompts):
            raise ValueError("empty prompt: the first generated token needs a row to come from")
        longest = max((len(p) + len(c) for p, c in zip(prompts, completions, strict=True)), default=0)
        if longest > self._info.max_positions:
            raise ValueError(f"sequence of {longest} tokens exceeds {self._info.max_positions} positions")

    def _shared_prompt_hidden(
        self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], rows: Sequence[Sequence[int]]
    ) -> torch.Tensor:
        """Hidden rows at the generated positions of every member of `rows`, members in order, from one
        forward over the packed rows (`packed_layout`)."""
        layout = packed_layout(pairs, rows, self._info.pad_token_id)
        dtype = self.model.dtype
        mask = torch.zeros(layout.allowed.shape, dtype=dtype)
        mask.masked_fill_(~layout.allowed, torch.finfo(dtype).min)
        hidden = self.model.model(
            input_ids=layout.ids.to(self.device),
            attention_mask=mask[:, None].to(self.device),
            position_ids=layout.positions.to(self.device),
            use_cache=False,
        ).last_hidden_state
        return hidden.reshape(-1, hidden.shape[-1])[layout.gather.to(self.device)]

    def _completion_hidden(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Hidden rows at the generated positions, right-padded: rows (B, T, H), mask and targets (B, T)."""
        self._check_sequences(prompts, completions)
        seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
        longest = max(len(s) for s in seqs)
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


# ---------------------------------------------------------------------- shared-prompt rows (pure)


def plan_rows(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], limit: int) -> list[list[int]]:
    """Indices of `pairs` per forward row: completions of the same prompt share a row while it stays within
    `limit` tokens (the prompt once, each completion less its last token); a row that would not fit opens a
    new one. `limit` 0 gives one row per pair. Rows in order of their first member."""
    rows: list[list[int]] = []
    open_rows: dict[tuple[int, ...], tuple[int, int]] = {}  # prompt -> (row, tokens so far)
    for i, (prompt, completion) in enumerate(pairs):
        key, cost = tuple(prompt), max(len(completion) - 1, 0)
        row, used = open_rows.get(key, (-1, 0))
        if row >= 0 and used + cost <= limit:
            rows[row].append(i)
            open_rows[key] = (row, used + cost)
        else:
            rows.append([i])
            open_rows[key] = (len(rows) - 1, len(key) + cost)
    return rows


@dataclass(frozen=True)
class PackedLayout:
    """Rows of shared-prompt sequences, right-padded: ids, positions and `allowed` (query, key) pairs
    (B, L[, L]), and `gather`, the flat (row · L + position) index of every member's generated positions,
    members in row order."""

    ids: torch.Tensor
    positions: torch.Tensor
    allowed: torch.Tensor
    gather: torch.Tensor


def packed_layout(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], rows: Sequence[Sequence[int]], pad_token_id: int
) -> PackedLayout:
    """Each row is its prompt, then each member's completion but its last token at the positions it has
    in its own sequence. A position attends to earlier positions of its own segment and of the prompt
    (segments: 0 the prompt, i + 1 member i, -1 padding, which attends to padding only). A member's rows
    are the prompt's last position, then its own segment."""
    layouts = []
    for row in rows:
        prompt = list(pairs[row[0]][0])
        ids, positions, segments, gather = list(prompt), list(range(len(prompt))), [0] * len(prompt), []
        for s, member in enumerate(row, start=1):
            completion = list(pairs[member][1])
            if not completion:
                continue
            fed = completion[:-1]
            gather.append(len(prompt) - 1)
            gather.extend(range(len(ids), len(ids) + len(fed)))
            ids += fed
            positions += range(len(prompt), len(prompt) + len(fed))
            segments += [s] * len(fed)
        layouts.append((ids, positions, segments, gather))
    width = max(len(ids) for ids, _, _, _ in layouts)
    count = len(layouts)
    ids_t = torch.full((count, width), pad_token_id, dtype=torch.int64)
    positions_t = torch.zeros((count, width), dtype=torch.int64)
    segments_t = torch.full((count, width), -1, dtype=torch.int64)
    gather_t = []
    for r, (ids, positions, segments, gather) in enumerate(layouts):
        ids_t[r, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        positions_t[r, : len(ids)] = torch.tensor(positions, dtype=torch.int64)
        segments_t[r, : len(ids)] = torch.tensor(segments, dtype=torch.int64)
        gather_t.append(torch.tensor(gather, dtype=torch.int64) + r * width)
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    query, key = segments_t[:, :, None], segments_t[:, None, :]
    allowed = causal & ((query == key) | ((key == 0) & (query >= 0)))
    return PackedLayout(ids_t, positions_t, allowed, torch.cat(gather_t))

"""vLLM engine for workers on a GPU: same interface as `TransformersEngine`, vLLM for generation.

NOT RUN HERE: this file was written on a CPU machine without vLLM and without a GPU lent to its task;
`tests/rl/test_vllm_engine.py` (marked `gpu`) has never run. It follows ../shared/gpu/VLLM.md, which measured
the capture with vllm 0.26.0 on an H100, and the v1 logits-processor interface
(`vllm.v1.sample.logits_processor.LogitsProcessor`: `update_state(BatchUpdate)` with added
`(index, params, prompt_ids, output_ids)`, removed indices, moved `(a, b, direction)`, then `apply(logits)`).
Expect to fix details on the first GPU run.

How it works:
- Sampling is ours, not vLLM's. vLLM's sampler draws from its own RNG, which a validator cannot re-derive.
  Each request runs with `temperature=0` (vLLM's greedy argmax) and our logits processor rewrites its row to
  `logits / T + gumbel(seed, position)` (`node.rl.sampling`, the same noise the CPU engine and the validator
  use), so vLLM's argmax *is* our Gumbel-max sample. The per-request seed and temperature travel in
  `SamplingParams.extra_args`. The validator checks the tokens against its own (bf16 or fp32) prefill logits
  with `check_sampling`; bf16 logits differ from the prover's by ~1e-2, so the tolerance must be calibrated
  for the run's precision (as the TOPLOC bounds are), not the fp32 default.
- Hidden rows: `llm.apply_model` wraps `model.compute_logits` so it stores its `hidden_states` argument (the
  lm_head input, after the final norm; logits run outside CUDA graphs). Rows are mapped to requests inside
  the logits processor, which sees the same batch order as that call and knows which request owns each row
  from vLLM's own batch updates, never by position in the output list. A request's p-th row is taken when
  it has p output tokens; a mismatch raises rather than misaligning (which would fail every TOPLOC chunk).
- Requirements this relies on: `VLLM_ENABLE_V1_MULTIPROCESSING=0` (engine in-process, so the wrapper, the
  processor and this object share memory), async scheduling off (output lists must be current in `apply`),
  prompts short enough not to be chunked (a partially prefilled request's row would be a spurious sample).
- Logprobs are computed from the captured rows with the transformers copy's lm_head, under
  softmax(logits / T), as in `TransformersEngine`; vLLM's own logprobs are of its raw or processed logits.
- `prefill`, `prefill_batch` and `logprobs` run on a transformers copy of the weights on the same GPU (bf16):
  VLLM.md measured a transformers forward at 0.22 s against 0.58 s for vLLM's `prompt_logprobs` on the same
  prefill, and the trainer needs autograd anyway. This costs a second copy of the weights in GPU memory.
- `load_weights` pushes the tensors through vLLM's `model.load_weights` (HF names) and into the copy, then
  resets the prefix cache.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from node.rl.engine import (
    Completion,
    Prefill,
    TokenLogprobs,
    TransformersEngine,
    WeightsSource,
    check_group_request,
    truncate_at_eos,
)
from node.rl.model import ModelConfig, build_model, load_checkpoint, model_config_hash, write_hf_dir
from node.rl.sampling import gumbel_from_keys, position_key, scale_logits, token_logprobs
from node.rl.tokenizer import EOS_ID

EXTRA_KEY = "swarmnode_request"


@dataclass
class _Request:
    """One completion in flight: its sampler inputs and the rows captured so far (on the GPU)."""

    seed: int
    temperature: float
    rows: list[torch.Tensor] = field(default_factory=list)


@dataclass
class _Shared:
    """What the compute_logits wrapper, the logits processor and the engine share (one per engine)."""

    hidden: torch.Tensor | None = None
    requests: dict[int, _Request] = field(default_factory=dict)


def _processor_class(shared: _Shared) -> type:
    """A LogitsProcessor subclass bound to `shared` (vLLM instantiates it: the state rides on the class)."""
    from vllm.v1.sample.logits_processor import LogitsProcessor, MoveDirectionality

    class GumbelMaxProcessor(LogitsProcessor):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            self.slots: dict[int, tuple[_Request, list[int]]] = {}

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update: Any) -> None:
            if batch_update is None:
                return
            for index in batch_update.removed:
                self.slots.pop(index, None)
            for index, params, _prompt, output in batch_update.added:
                key = (params.extra_args or {}).get(EXTRA_KEY)
                if key is None:
                    self.slots.pop(index, None)
                else:
                    self.slots[index] = (shared.requests[key], output)
            for a, b, direction in batch_update.moved:
                slot_a, slot_b = self.slots.pop(a, None), self.slots.pop(b, None)
                if slot_a is not None:
                    self.slots[b] = slot_a
                if direction == MoveDirectionality.SWAP and slot_b is not None:
                    self.slots[a] = slot_b

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            if not self.slots:
                return logits
            hidden = shared.hidden
            if hidden is None or hidden.shape[0] != logits.shape[0]:
                raise RuntimeError("captured hidden rows do not line up with the logits batch")
            index, keys, temps = [], [], []
            for i, (req, output) in sorted(self.slots.items()):
                position = len(req.rows)
                if len(output) != position:
                    raise RuntimeError(f"request at {i}: {len(output)} outputs but {position} rows captured")
                req.rows.append(hidden[i].detach().clone())
                index.append(i)
                keys.append(position_key(req.seed, position))
                temps.append(req.temperature)
            rows = torch.tensor(index, device=logits.device)
            scores = torch.stack([scale_logits(logits[i], t) for i, t in zip(index, temps, strict=True)])
            noise = gumbel_from_keys(keys, logits.shape[-1], logits.device)
            sampled = torch.tensor([t > 0 for t in temps], device=logits.device)[:, None]
            logits[rows] = torch.where(sampled, scores + noise, scores).to(logits.dtype)
            return logits

    return GumbelMaxProcessor


class VLLMEngine:
    """Generation on vLLM with our sampler and row capture; prefill and logprobs on a transformers copy."""

    def __init__(
        self,
        checkpoint: str | os.PathLike[str],
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.3,
        workdir: str | os.PathLike[str] | None = None,
    ) -> None:
        # Process-wide by necessity (vLLM reads them at start): the engine in-process, and apply_model
        # allowed to take our closures (they never leave this process).
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        from vllm import LLM

        cfg, state = load_checkpoint(checkpoint)
        self._cfg = cfg
        self._tmp = tempfile.TemporaryDirectory(prefix="swarmnode-vllm-")  # kept alive with the engine
        model_dir = write_hf_dir(
            state, cfg, Path(workdir if workdir is not None else self._tmp.name) / "model"
        )
        self._shared = _Shared()
        self._next_key = 0
        self.llm = LLM(
            model=str(model_dir),
            skip_tokenizer_init=True,
            dtype=dtype,
            seed=0,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=cfg.max_positions,
            max_num_batched_tokens=max(8192, cfg.max_positions),
            async_scheduling=False,
            enable_prefix_caching=False,
            logits_processors=[_processor_class(self._shared)],
        )
        self.llm.apply_model(self._install_capture)
        torch_dtype = getattr(torch, dtype)
        hf = build_model(cfg, seed=0)
        hf.load_state_dict(state, strict=True)
        self._hf = TransformersEngine(cfg, hf.to(torch_dtype), device="cuda")

    def _install_capture(self, model: Any) -> str:
        shared, original = self._shared, model.compute_logits

        def compute_logits(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            shared.hidden = hidden_states
            return original(hidden_states, *args, **kwargs)

        model.compute_logits = compute_logits
        return type(model).__name__

    @property
    def config(self) -> ModelConfig:
        return self._cfg

    def generate_group(
        self, prompt_ids: Sequence[int], n: int, seeds: Sequence[int], max_new_tokens: int, temperature: float
    ) -> list[Completion]:
        """n completions of one prompt, sampled by our Gumbel-max inside vLLM's batch."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        check_group_request(self._cfg, prompt_ids, n, seeds, max_new_tokens)
        keys = list(range(self._next_key, self._next_key + n))
        self._next_key += n
        requests = [_Request(seed=int(s), temperature=temperature) for s in seeds]
        self._shared.requests.update(zip(keys, requests, strict=True))
        params = [
            SamplingParams(
                temperature=0.0,
                max_tokens=max_new_tokens,
                stop_token_ids=[EOS_ID],
                detokenize=False,
                extra_args={EXTRA_KEY: k},
            )
            for k in keys
        ]
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids))
        try:
            outputs = self.llm.generate([prompt] * n, params, use_tqdm=False)
        finally:
            for k in keys:
                self._shared.requests.pop(k, None)
        result = []
        for req, out in zip(requests, outputs, strict=True):
            tokens = list(out.outputs[0].token_ids)
            if len(req.rows) == len(tokens) + 1 and out.outputs[0].finish_reason == "stop":
                tokens.append(EOS_ID)  # vLLM left the stop token out of token_ids
            tokens = list(truncate_at_eos(tokens))
            if len(req.rows) < len(tokens):
                raise RuntimeError(f"{len(req.rows)} rows captured for {len(tokens)} tokens")
            rows = torch.stack(req.rows[: len(tokens)])
            with torch.no_grad():
                logits = self._hf.model.lm_head(rows.to(self._hf.model.lm_head.weight.dtype)).float()
                logps = token_logprobs(logits, torch.tensor(tokens, device=logits.device), temperature)
            result.append(
                Completion(
                    tokens=tuple(tokens),
                    logprobs=logps.cpu(),
                    hidden_rows=rows.float().cpu(),
                    seed=req.seed,
                    ended_with_eos=bool(tokens) and tokens[-1] == EOS_ID,
                )
            )
        return result

    def prefill(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Prefill:
        return self._hf.prefill(prompt_ids, completion_ids)

    def prefill_batch(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Prefill]:
        return self._hf.prefill_batch(pairs)

    def logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        temperature: float = 1.0,
        grad: bool = False,
    ) -> TokenLogprobs:
        return self._hf.logprobs(prompts, completions, temperature, grad)

    def load_weights(self, source: WeightsSource) -> None:
        """Hot-swap weights in vLLM and in the transformers copy."""
        if isinstance(source, Mapping):
            state = dict(source)
        else:
            cfg, state = load_checkpoint(source)
            if model_config_hash(cfg) != model_config_hash(self._cfg):
                raise ValueError(f"{source}: checkpoint is for another model config")
        self.llm.apply_model(lambda model: model.load_weights(iter(state.items())))
        self.llm.reset_prefix_cache()
        self._hf.load_weights(state)

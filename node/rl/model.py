"""The policy model: a small dataclass config, a tiny causal LM built from it, safetensors save/load.

Decisions:
- The architecture is transformers' Qwen2 (RMSNorm, RoPE, GQA, SwiGLU), built from a config in code, never
  downloaded, so the same weights load into vLLM on a GPU (it knows Qwen2) and into transformers on a CPU.
- Weights are initialised by our own loop over parameters in name order with an explicit `torch.Generator`
  (normal(0, init_std) for matrices, ones for norms, zeros for biases): reproducible from (config, seed)
  without touching the global RNG and without depending on transformers' init code, which changes between
  versions. transformers' own init still runs inside `build_model`, under `torch.random.fork_rng`, so the
  caller's global RNG state is left as it was.
- Untied embeddings: safetensors refuses shared tensors, and the TOPLOC rows are the lm_head *input*, which
  tying does not change.
- Checkpoints are one safetensors file whose metadata carries the canonical config JSON and its sha256
  (`model_config_hash`), so a file names the architecture it needs; nothing is ever unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen2Config

from node.rl.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

META_CONFIG = "swarmnode.model_config"
META_CONFIG_HASH = "swarmnode.model_config_hash"


@dataclass(frozen=True)
class ModelConfig:
    """Everything that fixes the architecture; its canonical JSON is hashed into checkpoint manifests."""

    vocab_size: int = VOCAB_SIZE
    hidden_size: int = 64
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = 64
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    init_std: float = 0.02


def config_json(cfg: ModelConfig) -> str:
    """Canonical JSON: sorted keys, no spaces, ASCII. Two peers with equal configs produce equal bytes."""
    return json.dumps(asdict(cfg), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def config_from_json(text: str) -> ModelConfig:
    """Inverse of `config_json`; unknown or missing fields raise (TypeError) rather than being guessed."""
    return ModelConfig(**json.loads(text))


def model_config_hash(cfg: ModelConfig) -> bytes:
    """sha256 of the canonical config JSON (32 bytes)."""
    return hashlib.sha256(config_json(cfg).encode()).digest()


def hf_config(cfg: ModelConfig) -> Qwen2Config:
    """The transformers config for `cfg` (fp32, untied embeddings, our special token ids)."""
    return Qwen2Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        rms_norm_eps=cfg.rms_norm_eps,
        initializer_range=cfg.init_std,
        tie_word_embeddings=False,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        dtype="float32",
    )


def init_weights(model: torch.nn.Module, seed: int, std: float) -> None:
    """Deterministic init from `seed` alone: parameters in name order, one explicit generator."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * std)


def build_model(cfg: ModelConfig, seed: int) -> PreTrainedModel:
    """A fresh fp32 model in eval mode, initialised from `seed`; the global RNG is left untouched."""
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(hf_config(cfg), dtype=torch.float32)
    init_weights(model, seed, cfg.init_std)
    return model.eval()


def state_dict_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached contiguous CPU copies of the weights, as they are written to a checkpoint."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}


def save_checkpoint(
    state: Mapping[str, torch.Tensor], cfg: ModelConfig, path: str | os.PathLike[str]
) -> bytes:
    """Write one safetensors file with the config in its metadata; returns the file's sha256."""
    meta = {"format": "pt", META_CONFIG: config_json(cfg), META_CONFIG_HASH: model_config_hash(cfg).hex()}
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    save_file(tensors, str(path), metadata=meta)
    return file_sha256(path)


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Read a checkpoint written by `save_checkpoint`; the stored hash must match the stored config."""
    with safe_open(str(path), framework="pt", device="cpu") as f:
        meta = f.metadata() or {}
        if META_CONFIG not in meta:
            raise ValueError(f"{path}: no {META_CONFIG} in safetensors metadata")
        cfg = config_from_json(meta[META_CONFIG])
        if meta.get(META_CONFIG_HASH) != model_config_hash(cfg).hex():
            raise ValueError(f"{path}: config hash in metadata does not match the config")
        state = {k: f.get_tensor(k) for k in f.keys()}
    return cfg, state


def load_model(path: str | os.PathLike[str]) -> tuple[ModelConfig, PreTrainedModel]:
    """Build the model a checkpoint names and load its weights (strict: every tensor must match)."""
    cfg, state = load_checkpoint(path)
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(hf_config(cfg), dtype=torch.float32)
    model.load_state_dict(state, strict=True)
    return cfg, model.eval()


def write_hf_dir(
    state: Mapping[str, torch.Tensor], cfg: ModelConfig, directory: str | os.PathLike[str]
) -> Path:
    """A transformers-style model directory (config.json + model.safetensors), the layout vLLM loads."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    hf = hf_config(cfg)
    hf.architectures = ["Qwen2ForCausalLM"]  # vLLM picks its model class from this field
    hf.to_json_file(str(out / "config.json"))
    save_checkpoint(state, cfg, out / "model.safetensors")
    return out


def file_sha256(path: str | os.PathLike[str]) -> bytes:
    """sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.digest()

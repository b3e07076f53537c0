"""The policy model: a Hugging Face causal-LM folder, what a run commits to about it, tiny ones built in code.

A run's model is a local folder in the layout transformers and vLLM load: `config.json`, safetensors weights
(`model.safetensors`, or shards listed by `model.safetensors.index.json`) and the tokenizer files with a chat
template. Nothing is downloaded: every load passes `local_files_only` and never runs remote code.

What a RunDescriptor commits to (spec/rollouts.md, The run's model):
- `model_config_hash`: sha256 of the bytes of `config.json`;
- `tokenizer_files`: (name, sha256) of each tokenizer file present, in name order, so a mismatch names the
  file that differs;
- `base_checkpoint_hash`: the Merkle root (crypto.merkle) over the sha256 of each weights file, in name
  order: the same rule as a checkpoint manifest's root over its shards.
File bytes, not parsed values, are hashed: a peer that holds the same folder holds the same bytes, and
there is no canonical form of a JSON config or a tokenizer to agree on.

Decisions:
- Supported architectures are the ones whose module layout the engines rely on (`model.model` gives the
  final-norm hidden states, `model.lm_head` the logits): Qwen2/Qwen2.5, Qwen3 and Llama. Another
  `model_type` is refused by name rather than half-working.
- EOS, padding and the context length come from the folder: the generation config's EOS ids (a list for
  instruct models) plus the tokenizer's, its pad token (else the first EOS), `max_position_embeddings`.
- Tiny models for tests and the devnet are built from a `ModelRecipe` in code and initialised by our own
  loop over parameters in name order with an explicit generator (reproducible from (recipe, seed), the
  global RNG untouched); embeddings are untied (safetensors refuses shared tensors, and the TOPLOC rows are
  the lm_head input, which tying does not change).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
)
from transformers.utils import logging as hf_logging

from swarmnode.crypto.merkle import merkle_root
from swarmnode.node.errors import OperatorError
from swarmnode.node.rl.recipes import SUPPORTED_MODEL_TYPES, ModelRecipe
from swarmnode.protocol.messages import FileDigest

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
# Every file a tokenizer may be made of (fast tokenizer, slow BPE/sentencepiece, template, extra tokens).
TOKENIZER_FILES = (
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "merges.txt",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
)
META_CONFIG_HASH = "swarmnode.model_config_hash"


class ModelFolderError(OperatorError, ValueError):
    """A folder that is not a loadable model; the message names the folder and the file."""


class ModelMismatch(OperatorError, ValueError):
    """A model folder that differs from what a run committed to; the message names the file."""


# --- what a run commits to ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCommitment:
    """The digests a RunDescriptor carries for its model (see the module docstring)."""

    config_hash: bytes
    tokenizer_files: tuple[FileDigest, ...]
    weights_root: bytes


def file_sha256(path: str | os.PathLike[str]) -> bytes:
    """sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.digest()


def _require(folder: Path, name: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise ModelFolderError(
            f"{folder}: no {name} (a model folder holds config.json, safetensors "
            "weights and tokenizer files, as save_pretrained writes them)"
        )
    return path


def weight_files(folder: str | os.PathLike[str]) -> list[str]:
    """Names of the weights files, in name order: the index's shards, or `model.safetensors`."""
    folder = Path(folder)
    index = folder / WEIGHTS_INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelFolderError(f"{index}: not a safetensors index ({exc})") from None
        if not names or any(Path(n).name != n for n in names):
            raise ModelFolderError(f"{index}: shard names must be plain file names")
    else:
        names = [WEIGHTS_FILE]
    for name in names:
        _require(folder, name)
    return names


def tokenizer_files(folder: str | os.PathLike[str]) -> list[str]:
    """Names of the tokenizer files present, in name order; a folder without any tokenizer is refused."""
    folder = Path(folder)
    names = [n for n in TOKENIZER_FILES if (folder / n).is_file()]
    if "tokenizer.json" not in names and "tokenizer.model" not in names and "vocab.json" not in names:
        raise ModelFolderError(f"{folder}: no tokenizer.json (nor tokenizer.model or vocab.json)")
    return names


def config_hash(folder: str | os.PathLike[str]) -> bytes:
    """sha256 of `config.json`: a RunDescriptor's (and a DiLoCo plan's) `model_config_hash`."""
    return file_sha256(_require(Path(folder), CONFIG_FILE))


def model_commitment(folder: str | os.PathLike[str]) -> ModelCommitment:
    """What a RunDescriptor records for this folder (hashes every weights file: seconds for a 7B model)."""
    folder = Path(folder)
    weights = [file_sha256(folder / n) for n in weight_files(folder)]
    return ModelCommitment(
        config_hash=config_hash(folder),
        tokenizer_files=tuple(FileDigest(n, file_sha256(folder / n)) for n in tokenizer_files(folder)),
        weights_root=merkle_root(weights),
    )


def check_commitment(folder: str | os.PathLike[str], expected: ModelCommitment) -> None:
    """Raise ModelMismatch naming the first file of `folder` that differs from `expected`."""
    folder = Path(folder)
    config = _require(folder, CONFIG_FILE)
    if file_sha256(config) != expected.config_hash:
        raise ModelMismatch(
            f"{config} differs from the run's model config (sha256 "
            f"{file_sha256(config).hex()[:16]}..., the run commits to "
            f"{expected.config_hash.hex()[:16]}...)"
        )
    want = {f.name: f.sha256 for f in expected.tokenizer_files}
    have = tokenizer_files(folder)
    for name in sorted(set(want) | set(have)):
        if name not in have:
            raise ModelMismatch(f"{folder / name} is missing: the run's tokenizer includes it")
        if name not in want:
            raise ModelMismatch(f"{folder / name} is not part of the run's tokenizer")
        if file_sha256(folder / name) != want[name]:
            raise ModelMismatch(f"{folder / name} differs from the run's tokenizer file of that name")
    names = weight_files(folder)
    if merkle_root([file_sha256(folder / n) for n in names]) != expected.weights_root:
        raise ModelMismatch(
            f"the weights in {folder} ({', '.join(names)}) differ from the run's base weights"
        )


# --- facts the roles need ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelInfo:
    """What every role reads from a run's model: sizes that bound a submission, and the special tokens."""

    model_type: str
    vocab_size: int  # rows of the embedding: every token id is below it
    hidden_size: int
    num_layers: int
    max_positions: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    config_hash: bytes


def _ids(value: object) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]  # type: ignore[attr-defined]


def read_config(folder: str | os.PathLike[str]) -> PretrainedConfig:
    """The folder's transformers config; an unsupported architecture is refused by name."""
    folder = Path(folder)
    path = _require(folder, CONFIG_FILE)
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except (ValueError, OSError, KeyError, TypeError, StrictDataclassError) as exc:
        raise ModelFolderError(f"{path}: not a transformers config ({exc})") from None
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ModelFolderError(
            f"{path}: model_type {config.model_type!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    return config


def model_info(
    folder: str | os.PathLike[str], tokenizer_eos: Sequence[int] = (), tokenizer_pad: int | None = None
) -> ModelInfo:
    """ModelInfo of a folder; EOS ids are the generation config's, the config's and the tokenizer's."""
    folder = Path(folder)
    config = read_config(folder)
    eos = _ids(config.eos_token_id)
    if (folder / GENERATION_CONFIG_FILE).is_file():
        generation = GenerationConfig.from_pretrained(str(folder), local_files_only=True)
        eos = _ids(generation.eos_token_id) + eos
    eos = list(dict.fromkeys(eos + list(tokenizer_eos)))  # ordered, unique
    if not eos:
        raise ModelFolderError(f"{folder}: neither the configs nor the tokenizer name an EOS token")
    pad = tokenizer_pad if tokenizer_pad is not None else config.pad_token_id
    vocab = int(config.vocab_size)
    if any(not 0 <= t < vocab for t in [*eos, *([pad] if pad is not None else [])]):
        raise ModelFolderError(f"{folder}: a special token id lies outside the vocabulary of {vocab}")
    return ModelInfo(
        model_type=config.model_type,
        vocab_size=vocab,
        hidden_size=int(config.hidden_size),
        num_layers=int(config.num_hidden_layers),
        max_positions=int(config.max_position_embeddings),
        eos_token_ids=tuple(eos),
        pad_token_id=int(pad if pad is not None else eos[0]),
        config_hash=config_hash(folder),
    )


def load_model(folder: str | os.PathLike[str], dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The folder's model in eval mode (never downloads, never runs remote code; global RNG untouched)."""
    read_config(folder)
    weight_files(folder)
    hf_logging.disable_progress_bar()
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), local_files_only=True, trust_remote_code=False, dtype=dtype
        )
    return model.eval()


# --- weights files outside a folder (trainer state, hot swaps) ------------------------------------------


def state_dict_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached contiguous CPU copies of the weights, as they are written to a checkpoint."""
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}


def save_weights(
    state: Mapping[str, torch.Tensor], config_hash: bytes, path: str | os.PathLike[str]
) -> bytes:
    """One safetensors file naming the config it belongs to in its metadata; returns the file's sha256."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state.items()}
    save_file(tensors, str(path), metadata={"format": "pt", META_CONFIG_HASH: config_hash.hex()})
    return file_sha256(path)


def load_weights(path: str | os.PathLike[str], config_hash: bytes) -> dict[str, torch.Tensor]:
    """Read a file written by `save_weights`; refused when it names another model config."""
    with safe_open(str(path), framework="pt", device="cpu") as f:
        stored = (f.metadata() or {}).get(META_CONFIG_HASH)
        if stored != config_hash.hex():
            raise ModelMismatch(f"{path}: weights for model config {stored}, not {config_hash.hex()}")
        return {k: f.get_tensor(k) for k in f.keys()}


# --- tiny models built in code --------------------------------------------------------------------------


_CONFIG_CLASSES: Mapping[str, Callable[..., PretrainedConfig]] = {
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
    "llama": LlamaConfig,
}
_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}


def hf_config(
    recipe: ModelRecipe, *, eos_token_id: int, pad_token_id: int, bos_token_id: int | None = None
) -> PretrainedConfig:
    """The transformers config of `recipe` (fp32, untied embeddings, the tokenizer's special ids)."""
    if recipe.arch not in _CONFIG_CLASSES:
        raise ValueError(f"arch {recipe.arch!r} is not one of {', '.join(_CONFIG_CLASSES)}")
    config = _CONFIG_CLASSES[recipe.arch](
        vocab_size=recipe.vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.hidden_size // recipe.num_heads,
        max_position_embeddings=recipe.max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": recipe.rope_theta},
        rms_norm_eps=recipe.rms_norm_eps,
        initializer_range=recipe.init_std,
        tie_word_embeddings=False,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        dtype="float32",
    )
    config.architectures = [_ARCHITECTURES[recipe.arch]]  # vLLM picks its model class from this field
    return config


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


def build_model(config: PretrainedConfig, seed: int, std: float = 0.02) -> PreTrainedModel:
    """A fresh fp32 model of `config` in eval mode, initialised from `seed`; the global RNG is untouched."""
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    init_weights(model, seed, std)
    return model.eval()


def save_model_folder(
    model: PreTrainedModel,
    tokenizer_folder: str | os.PathLike[str] | None,
    out: str | os.PathLike[str],
    *,
    max_shard_size: str | int = "2GB",
) -> Path:
    """`save_pretrained` of the model (safetensors) plus the tokenizer files copied byte for byte."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()
    model.save_pretrained(str(out), max_shard_size=max_shard_size)
    if tokenizer_folder is not None:
        for name in tokenizer_files(tokenizer_folder):
            (out / name).write_bytes((Path(tokenizer_folder) / name).read_bytes())
    return out

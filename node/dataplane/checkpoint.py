"""Checkpoints as safetensors files in two layouts; the manifest; load only what verifies.

A model checkpoint (a policy version the trainer publishes) is a Hugging Face model folder, so the
directory a relay or worker holds for a version is a folder transformers and vLLM load as it is:
- weights packed greedily, in state-dict order, into `model-00001-of-0000N.safetensors` of at most
  `shard_size` bytes of tensor data each (`model.safetensors` when one shard does), whole tensors only:
  a tensor larger than `shard_size` gets a shard of its own, as huggingface_hub's
  `split_torch_state_dict_into_shards` does, so such a shard exceeds `shard_size`;
- `model.safetensors.index.json` (`metadata.total_size`, `weight_map`) when there are several shards;
- the run's `config.json`, `generation_config.json` and tokenizer files, byte for byte as the caller gives
  them (`origin.model_folder_files`).
Other payloads (DiLoCo pseudo-gradients and outer state) use pieces: `shard-NNNNN-of-MMMMM.safetensors`,
where a tensor larger than a shard is cut into contiguous pieces `<name>#<i>` listed in the shard's
metadata (`swarmnode.pieces`), so shard sizes stay even. Either way a manifest lists its files in name
order and tied tensors are written under every name (strict `load_state_dict` needs each key).

Loading reads each file once, checks size and sha256 against the manifest, and parses those same bytes
with safetensors (never pickle): nothing is parsed that was not verified. Only `*.safetensors` files hold
tensors; the others (json, tokenizer) are verified and left to the engine that loads the folder. A model
checkpoint is also checked for the layout itself (`check_model_manifest`, `check_weight_map`), so the
state dict a worker hot-swaps is the model a relay's folder loads as.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import safetensors.torch
import torch

from swarmnode.crypto.merkle import merkle_root
from swarmnode.node.dataplane.errors import CheckpointInvalid
from swarmnode.protocol.messages import CheckpointManifest, ShardInfo
from swarmnode.protocol.shards import DEFAULT_SHARD_SIZE, MAX_SHARD_SIZE, check_manifest, is_safe_shard_name
from swarmnode.protocol.types import MIB

Layout = Literal["model", "pieces"]
MODEL_LAYOUT: Layout = "model"
PIECES_LAYOUT: Layout = "pieces"

PIECES_KEY = "swarmnode.pieces"
TENSOR_SUFFIX = ".safetensors"
# The file names transformers and vLLM look for (node.rl.model names the same; not imported from there
# because it pulls in transformers, which a relay never needs).
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
MAX_INDEX_SIZE = 16 * MIB  # a 70B model's index is about 100 KiB; parsed JSON costs several times its size

SHARD_NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")  # ShardInfo.name (protocol/messages.py)


@dataclass
class ShardPlan:
    """Tensors of one safetensors file; `pieces` maps a piece key to (tensor name, index, count, shape)."""

    name: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    pieces: dict[str, tuple[str, int, int, list[int]]] = field(default_factory=dict)
    nbytes: int = 0

    def serialize(self) -> bytes:
        metadata = {"format": "pt"}  # transformers refuses a safetensors file without it
        if self.pieces:
            metadata[PIECES_KEY] = json.dumps(self.pieces, sort_keys=True, separators=(",", ":"))
        return safetensors.torch.save(self.tensors, metadata=metadata)


@dataclass(frozen=True)
class FilePlan:
    """A file published as given: config, tokenizer, the weights index."""

    name: str
    data: bytes

    def serialize(self) -> bytes:
        return self.data


PlannedFile = ShardPlan | FilePlan


def _own_tensor(tensor: torch.Tensor, seen: set[int]) -> torch.Tensor:
    """A contiguous CPU tensor that shares storage with no other (safetensors refuses shared storage)."""
    t = tensor.detach().to("cpu").contiguous()
    storage = t.untyped_storage()
    if storage.data_ptr() in seen or storage.nbytes() != t.nbytes:
        t = t.clone()
    seen.add(t.untyped_storage().data_ptr())
    return t


# --- pieces layout (non-model payloads) ------------------------------------------------------------


def _items(
    state_dict: Mapping[str, torch.Tensor], shard_size: int
) -> Iterator[tuple[str, torch.Tensor, tuple | None]]:
    """(key, tensor, piece info or None): small tensors whole, large ones as flat pieces."""
    seen: set[int] = set()
    for name, tensor in state_dict.items():
        t = _own_tensor(tensor, seen)
        if t.nbytes <= shard_size or t.numel() <= 1:
            yield name, t, None
            continue
        flat = t.reshape(-1)
        per_piece = max(1, shard_size // t.element_size())
        count = (flat.numel() + per_piece - 1) // per_piece
        for i in range(count):
            piece = flat[i * per_piece : (i + 1) * per_piece].clone()
            yield f"{name}#{i}", piece, (name, i, count, list(t.shape))


def plan_shards(
    state_dict: Mapping[str, torch.Tensor], shard_size: int = DEFAULT_SHARD_SIZE
) -> list[ShardPlan]:
    """Pack a state dict into shards of at most `shard_size` tensor bytes, named `shard-00001-of-000NN`."""
    if shard_size < 1:
        raise ValueError("shard_size must be positive")
    names = set(state_dict)
    plans: list[ShardPlan] = []
    current = ShardPlan("")
    for key, tensor, piece in _items(state_dict, shard_size):
        if piece is not None and key in names:
            raise ValueError(f"piece key {key!r} collides with a tensor of that name")
        if current.tensors and current.nbytes + tensor.nbytes > shard_size:
            plans.append(current)
            current = ShardPlan("")
        current.tensors[key] = tensor
        current.nbytes += tensor.nbytes
        if piece is not None:
            current.pieces[key] = piece
    if current.tensors:
        plans.append(current)
    for i, plan in enumerate(plans):
        plan.name = f"shard-{i + 1:05d}-of-{len(plans):05d}{TENSOR_SUFFIX}"
    return plans


# --- model layout (a Hugging Face folder) ----------------------------------------------------------


@dataclass(frozen=True)
class WeightsFile:
    """One weights file of a model folder: its name, the tensors it holds in order, their bytes."""

    name: str
    tensors: tuple[str, ...]
    nbytes: int


def weights_file_name(index: int, count: int) -> str:
    return WEIGHTS_FILE if count == 1 else f"model-{index + 1:05d}-of-{count:05d}{TENSOR_SUFFIX}"


def pack_weights(sizes: Sequence[tuple[str, int]], shard_size: int) -> list[WeightsFile]:
    """Greedy packing of (tensor name, bytes) in order, whole tensors; an oversized one sits alone.

    A tensor that does not fit closes the file being filled; an oversized one then takes a file of its
    own, so reading the files in order gives the tensors in state-dict order. Names follow the count.
    Pure over sizes, so a sharded trainer plans the same files as one process without gathering anything.
    """
    if shard_size < 1:
        raise ValueError("shard_size must be positive")
    groups: list[list[tuple[str, int]]] = []
    current: list[tuple[str, int]] = []
    filled = 0
    for name, nbytes in sizes:
        if current and filled + nbytes > shard_size:
            groups.append(current)
            current, filled = [], 0
        current.append((name, nbytes))
        filled += nbytes
    if current:
        groups.append(current)
    if not groups:
        raise ValueError("a model checkpoint needs at least one tensor")
    return [
        WeightsFile(weights_file_name(i, len(groups)), tuple(n for n, _ in g), sum(b for _, b in g))
        for i, g in enumerate(groups)
    ]


def pack_whole_tensors(state_dict: Mapping[str, torch.Tensor], shard_size: int) -> list[ShardPlan]:
    """`pack_weights` over a state dict's tensors, holding the tensors themselves."""
    seen: set[int] = set()
    owned = {name: _own_tensor(tensor, seen) for name, tensor in state_dict.items()}
    layout = pack_weights([(name, t.nbytes) for name, t in owned.items()], shard_size)
    return [ShardPlan(f.name, {n: owned[n] for n in f.tensors}, nbytes=f.nbytes) for f in layout]


def weights_index(files: Sequence[WeightsFile] | Sequence[ShardPlan]) -> bytes:
    """`model.safetensors.index.json` for several weights shards, formatted as transformers writes it."""
    index = {
        "metadata": {"total_size": sum(f.nbytes for f in files)},
        "weight_map": {name: f.name for f in files for name in f.tensors},
    }
    return (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()


def check_model_files(files: Mapping[str, bytes]) -> None:
    """The non-weights files of a model checkpoint: config.json among them, plain names, none empty."""
    if CONFIG_FILE not in files:
        raise ValueError(f"a model checkpoint carries the run's {CONFIG_FILE}")
    for name, data in files.items():
        if not SHARD_NAME_PATTERN.fullmatch(name) or not is_safe_shard_name(name):
            raise ValueError(f"{name!r} is not a plain file name a manifest may carry")
        if name.endswith(TENSOR_SUFFIX) or name == WEIGHTS_INDEX_FILE:
            raise ValueError(f"{name!r} is a weights file name: weights come from the state dict")
        if not 1 <= len(data) <= MAX_SHARD_SIZE:
            raise ValueError(f"{name!r} has {len(data)} bytes, outside [1, {MAX_SHARD_SIZE}]")


def model_extra_files(weights: Sequence[WeightsFile], files: Mapping[str, bytes] | None) -> list[FilePlan]:
    """The files of a model folder besides the weights: `files` as given, and the index when there are
    several weights files."""
    files = files or {}
    check_model_files(files)
    extras = [FilePlan(n, d) for n, d in files.items()]
    if len(weights) > 1:
        extras.append(FilePlan(WEIGHTS_INDEX_FILE, weights_index(weights)))
    return extras


def plan_model_files(
    state_dict: Mapping[str, torch.Tensor],
    shard_size: int = DEFAULT_SHARD_SIZE,
    files: Mapping[str, bytes] | None = None,
) -> list[PlannedFile]:
    """The files of a Hugging Face model folder holding `state_dict`, in name order (the manifest's order).

    `files` are config.json, generation_config.json and the tokenizer files, published byte for byte.
    """
    check_model_files(files or {})
    weights = pack_whole_tensors(state_dict, shard_size)
    layout = [WeightsFile(w.name, tuple(w.tensors), w.nbytes) for w in weights]
    planned: list[PlannedFile] = [*weights, *model_extra_files(layout, files)]
    return sorted(planned, key=lambda p: p.name)


def plan_files(
    layout: Layout,
    state_dict: Mapping[str, torch.Tensor],
    shard_size: int = DEFAULT_SHARD_SIZE,
    files: Mapping[str, bytes] | None = None,
) -> list[PlannedFile]:
    """The files of a checkpoint in `layout`; only a model checkpoint carries files besides tensors."""
    if layout == MODEL_LAYOUT:
        return plan_model_files(state_dict, shard_size, files)
    if layout != PIECES_LAYOUT:
        raise ValueError(f"layout {layout!r} is neither {MODEL_LAYOUT!r} nor {PIECES_LAYOUT!r}")
    if files:
        raise ValueError("only a model checkpoint carries files besides tensors")
    return list(plan_shards(state_dict, shard_size))


# --- manifests -------------------------------------------------------------------------------------


def shard_info(name: str, data: bytes) -> ShardInfo:
    return ShardInfo(name, len(data), hashlib.sha256(data).digest())


def build_manifest(
    *,
    run: str,
    version: int,
    parent_version: int,
    model_config_hash: bytes,
    shards: Sequence[ShardInfo],
    created_ms: int,
) -> CheckpointManifest:
    """A manifest whose Merkle root is over the shard digests in order; checked before it is returned."""
    manifest = CheckpointManifest(
        run=run,
        version=version,
        parent_version=parent_version,
        model_config_hash=model_config_hash,
        total_size=sum(s.size for s in shards),
        shards=tuple(shards),
        merkle_root=merkle_root([s.sha256 for s in shards]),
        created_ms=created_ms,
    )
    check_manifest(manifest)
    if is_model_manifest(manifest):
        check_model_manifest(manifest)
    return manifest


def is_model_manifest(manifest: CheckpointManifest) -> bool:
    """A manifest that names `config.json` is a model checkpoint (a Hugging Face folder)."""
    return any(s.name == CONFIG_FILE for s in manifest.shards)


def check_model_manifest(manifest: CheckpointManifest) -> None:
    """Raise CheckpointInvalid unless a model checkpoint's file list has the layout (the index aside).

    Files in strictly ascending name order; `config.json` is the config the manifest names
    (`model_config_hash` is its sha256); weights are `model.safetensors` alone, or shards listed by an
    index of at most MAX_INDEX_SIZE bytes.
    """
    names = [s.name for s in manifest.shards]
    if any(a >= b for a, b in zip(names, names[1:], strict=False)):
        raise CheckpointInvalid("a model checkpoint lists its files in name order")
    by_name = {s.name: s for s in manifest.shards}
    config = by_name.get(CONFIG_FILE)
    if config is None or config.sha256 != manifest.model_config_hash:
        raise CheckpointInvalid(f"the checkpoint's {CONFIG_FILE} is not the model config its manifest names")
    tensor_files = [n for n in names if n.endswith(TENSOR_SUFFIX)]
    index = by_name.get(WEIGHTS_INDEX_FILE)
    if index is None and tensor_files != [WEIGHTS_FILE]:
        raise CheckpointInvalid(
            f"without {WEIGHTS_INDEX_FILE} the weights are {WEIGHTS_FILE} alone, not {tensor_files}"
        )
    if index is not None and index.size > MAX_INDEX_SIZE:
        raise CheckpointInvalid(f"{WEIGHTS_INDEX_FILE} of {index.size} bytes exceeds {MAX_INDEX_SIZE}")


def check_weight_map(index: bytes, tensor_files: Sequence[str]) -> dict[str, str]:
    """The index's tensor → file map; refused unless it names exactly the checkpoint's weights files."""
    try:
        weight_map = json.loads(index)["weight_map"]
        ok = isinstance(weight_map, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointInvalid(f"{WEIGHTS_INDEX_FILE} is not a safetensors index: {exc}") from None
    if not ok:
        raise CheckpointInvalid(f"{WEIGHTS_INDEX_FILE}: weight_map maps tensor names to file names")
    if set(weight_map.values()) != set(tensor_files):
        raise CheckpointInvalid(
            f"{WEIGHTS_INDEX_FILE} names files {sorted(set(weight_map.values()))}, "
            f"the checkpoint holds {sorted(tensor_files)}"
        )
    return weight_map


# --- loading ---------------------------------------------------------------------------------------


def _metadata(data: bytes) -> dict[str, str]:
    (header_len,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8 : 8 + header_len])
    return header.get("__metadata__") or {}


def parse_shard(data: bytes) -> tuple[dict[str, torch.Tensor], dict[str, tuple[str, int, int, list[int]]]]:
    """Tensors and piece table of one verified shard's bytes (safetensors only)."""
    try:
        tensors = safetensors.torch.load(data)
        pieces_json = _metadata(data).get(PIECES_KEY)
        pieces = {k: tuple(v) for k, v in json.loads(pieces_json).items()} if pieces_json else {}
    except (ValueError, KeyError, TypeError, struct.error, safetensors.SafetensorError) as exc:
        raise CheckpointInvalid(f"shard is not a valid swarmnode safetensors file: {exc}") from None
    return tensors, pieces  # type: ignore[return-value]


def read_verified_shard(directory: Path, info: ShardInfo) -> bytes:
    """The shard's bytes, read once and checked against the manifest: the bytes checked are the bytes used."""
    try:
        data = (directory / info.name).read_bytes()
    except FileNotFoundError:
        raise CheckpointInvalid(f"shard {info.name} is missing from {directory}") from None
    if len(data) != info.size or hashlib.sha256(data).digest() != info.sha256:
        raise CheckpointInvalid(f"shard {info.name} in {directory} does not match the manifest")
    return data


def verify_file(directory: Path, info: ShardInfo) -> None:
    """Check a file that is not parsed here (config, tokenizer) against the manifest, in 1 MiB blocks."""
    h, size = hashlib.sha256(), 0
    try:
        with open(directory / info.name, "rb") as f:
            for block in iter(lambda: f.read(MIB), b""):
                h.update(block)
                size += len(block)
    except FileNotFoundError:
        raise CheckpointInvalid(f"shard {info.name} is missing from {directory}") from None
    if size != info.size or h.digest() != info.sha256:
        raise CheckpointInvalid(f"shard {info.name} in {directory} does not match the manifest")


def load_checkpoint(directory: Path, manifest: CheckpointManifest) -> dict[str, torch.Tensor]:
    """The state dict of a complete, verified checkpoint directory (blocking: run in a thread).

    Every file the manifest names is verified; tensors come from the `*.safetensors` files only.
    """
    check_manifest(manifest)
    directory = Path(directory)
    if is_model_manifest(manifest):
        return _load_model(directory, manifest)
    return _load_pieces(directory, manifest)


def _load_model(directory: Path, manifest: CheckpointManifest) -> dict[str, torch.Tensor]:
    check_model_manifest(manifest)
    tensor_files = [s.name for s in manifest.shards if s.name.endswith(TENSOR_SUFFIX)]
    weight_map: dict[str, str] | None = None
    for info in manifest.shards:
        if info.name == WEIGHTS_INDEX_FILE:  # read first: it names where each tensor must sit
            weight_map = check_weight_map(read_verified_shard(directory, info), tensor_files)
    state: dict[str, torch.Tensor] = {}
    for info in manifest.shards:
        if info.name == WEIGHTS_INDEX_FILE:
            continue
        if not info.name.endswith(TENSOR_SUFFIX):
            verify_file(directory, info)
            continue
        tensors, pieces = parse_shard(read_verified_shard(directory, info))
        if pieces:
            raise CheckpointInvalid(f"{info.name}: a model checkpoint holds whole tensors, not pieces")
        for key, tensor in tensors.items():
            if key in state:
                raise CheckpointInvalid(f"tensor {key!r} appears twice")
            if weight_map is not None and weight_map.get(key) != info.name:
                raise CheckpointInvalid(
                    f"tensor {key!r} sits in {info.name}, the index says {weight_map.get(key)}"
                )
            state[key] = tensor
    if weight_map is not None and set(weight_map) != set(state):
        missing = sorted(set(weight_map) - set(state))[:3]
        raise CheckpointInvalid(f"{WEIGHTS_INDEX_FILE} lists tensors no shard holds: {missing}")
    return state


def _load_pieces(directory: Path, manifest: CheckpointManifest) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    pieces: dict[str, dict[int, torch.Tensor]] = {}
    shapes: dict[str, tuple[int, list[int]]] = {}
    for info in manifest.shards:
        if not info.name.endswith(TENSOR_SUFFIX):
            verify_file(directory, info)
            continue
        tensors, table = parse_shard(read_verified_shard(directory, info))
        for key, tensor in tensors.items():
            if key in table:
                name, index, count, shape = table[key]
                pieces.setdefault(name, {})[index] = tensor
                shapes[name] = (count, shape)
            elif key in state:
                raise CheckpointInvalid(f"tensor {key!r} appears twice")
            else:
                state[key] = tensor
    for name, parts in pieces.items():
        count, shape = shapes[name]
        if name in state or sorted(parts) != list(range(count)):
            raise CheckpointInvalid(f"pieces of {name!r} are incomplete or clash with a tensor")
        joined = torch.cat([parts[i] for i in range(count)])
        if joined.numel() != _numel(shape):
            raise CheckpointInvalid(f"pieces of {name!r} do not fill shape {shape}")
        state[name] = joined.view(shape)
    return state


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def state_digest(state_dict: Mapping[str, torch.Tensor]) -> bytes:
    """sha256 over names, dtypes, shapes and bytes in name order: equal digests, equal weights."""
    h = hashlib.sha256()
    for name in sorted(state_dict):
        t = state_dict[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{list(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.digest()

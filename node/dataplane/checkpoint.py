"""Checkpoints as safetensors shards: split a state dict, build the manifest, load only what verifies.

Tensors are packed greedily, in state-dict order, into shards of at most `shard_size` bytes of tensor data
(the safetensors header adds a few KiB). A tensor larger than a shard is cut into contiguous pieces of its
flattened data, each stored as its own tensor `<name>#<i>` and listed in the shard's safetensors metadata
(`swarmnode.pieces`), so shard sizes stay even and a 1 GB embedding matrix does not become one 1 GB shard.
Loading reads each shard's bytes once, checks size and sha256 against the manifest, and parses those
same bytes with safetensors (never pickle): nothing is parsed that was not verified.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import safetensors.torch
import torch

from crypto.merkle import merkle_root
from node.dataplane.errors import CheckpointInvalid
from protocol.messages import CheckpointManifest, ShardInfo
from protocol.shards import DEFAULT_SHARD_SIZE, check_manifest

PIECES_KEY = "swarmnode.pieces"


@dataclass
class ShardPlan:
    """The tensors of one shard; `pieces` maps a piece key to (tensor name, index, count, shape)."""

    name: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    pieces: dict[str, tuple[str, int, int, list[int]]] = field(default_factory=dict)
    nbytes: int = 0

    def serialize(self) -> bytes:
        metadata = {"format": "pt"}
        if self.pieces:
            metadata[PIECES_KEY] = json.dumps(self.pieces, sort_keys=True, separators=(",", ":"))
        return safetensors.torch.save(self.tensors, metadata=metadata)


def _own_tensor(tensor: torch.Tensor, seen: set[int]) -> torch.Tensor:
    """A contiguous CPU tensor that shares storage with no other (safetensors refuses shared storage)."""
    t = tensor.detach().to("cpu").contiguous()
    storage = t.untyped_storage()
    if storage.data_ptr() in seen or storage.nbytes() != t.nbytes:
        t = t.clone()
    seen.add(t.untyped_storage().data_ptr())
    return t


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
        plan.name = f"shard-{i + 1:05d}-of-{len(plans):05d}.safetensors"
    return plans


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
    return manifest


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


def load_checkpoint(directory: Path, manifest: CheckpointManifest) -> dict[str, torch.Tensor]:
    """The state dict of a complete, verified checkpoint directory (blocking: run in a thread)."""
    check_manifest(manifest)
    state: dict[str, torch.Tensor] = {}
    pieces: dict[str, dict[int, torch.Tensor]] = {}
    shapes: dict[str, tuple[int, list[int]]] = {}
    for info in manifest.shards:
        tensors, table = parse_shard(read_verified_shard(Path(directory), info))
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

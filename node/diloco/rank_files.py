"""A trainer group's DiLoCo files, rank by rank: who owns which tensor, the per-rank payload file names,
the keys a payload or outer state holds, and reading such a directory one tensor at a time.

Pure rules and file reading, no collectives: `sharded` runs them on every rank of the group, and the
group's participant (`participant`, rank 0) digests the outer state the ranks just wrote with them.

- Ownership: the trainable tensors are dealt to ranks by their fp32 size, one tensor per unit
  (`deal_tensors`, the same greedy rule as `assign_files`), from global shapes: every rank computes the
  same dealing without a collective.
- A rank's payload files are its own `plan_shards` names under its rank (`rank_file_name`), so no rank
  plans another's files.
- `PayloadFiles` reads any pieces-layout directory (one process's or a group's), one file's sha256 checked
  before its tensors are read; `stream_digest` and `stream_theta_digest` feed `content_digest_items` one
  tensor at a time, so no rank holds a whole payload or θ.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from swarmnode.node.dataplane.checkpoint import PIECES_KEY, TENSOR_SUFFIX, WeightsFile, verify_file
from swarmnode.node.dataplane.errors import CheckpointInvalid
from swarmnode.node.diloco.algorithm import MOMENTUM_PREFIX, STEP_KEY, THETA_PREFIX, content_digest_items
from swarmnode.node.diloco.compression import SCALE_SUFFIX, decompress
from swarmnode.node.trainer.rank import assign_files
from swarmnode.protocol.messages import ShardInfo

RANK_FILE_PREFIX = "rank-"


# --- pure rules ------------------------------------------------------------------------------------


def deal_tensors(sizes: Sequence[tuple[str, int]], world: int) -> dict[str, int]:
    """The rank owning each tensor: largest first to the least-loaded rank (ties: lower rank)."""
    units = [WeightsFile(name, (name,), nbytes) for name, nbytes in sizes]
    return {name: owner for (name, _), owner in zip(sizes, assign_files(units, world), strict=True)}


def rank_file_name(rank: int, name: str) -> str:
    """A rank's payload file: its own `plan_shards` name under its rank, so ranks never collide."""
    return f"{RANK_FILE_PREFIX}{rank:05d}-{name}"


def check_payload_names(names: Iterable[str], compression: str) -> None:
    """ValueError when an int8 payload could not hold both a parameter and another's scale."""
    names = set(names)
    if compression == "int8" and any(n + SCALE_SUFFIX in names for n in names):
        raise ValueError("a parameter is named like another's int8 scale: an int8 payload cannot hold both")


def payload_keys(names: Sequence[str], compression: str) -> set[str]:
    """The tensor keys of a payload over `names`: the names, plus their scales for int8."""
    keys = set(names)
    if compression == "int8":
        keys |= {name + SCALE_SUFFIX for name in names}
    return keys


def outer_keys(names: Sequence[str]) -> set[str]:
    """The tensor keys of an outer state over `names`."""
    return {THETA_PREFIX + n for n in names} | {MOMENTUM_PREFIX + n for n in names} | {STEP_KEY}


# --- reading a pieces-layout directory one tensor at a time ----------------------------------------


@dataclass(frozen=True)
class _Part:
    file: str
    key: str
    index: int  # piece index; 0 for a whole tensor
    count: int  # pieces; 0 for a whole tensor
    shape: tuple[int, ...]


class PayloadFiles:
    """A payload or outer-state directory in the pieces layout, whatever its split into files (one
    process's or a group's), read by tensor name. Headers only route; a file's sha256 is checked against
    its `ShardInfo` before any tensor is read from it (once per instance)."""

    def __init__(self, directory: Path, shards: Sequence[ShardInfo]) -> None:
        self.directory = Path(directory)
        self._infos = {s.name: s for s in shards}
        self._verified: set[str] = set()
        self._parts: dict[str, list[_Part]] = {}
        for info in shards:
            if info.name.endswith(TENSOR_SUFFIX):
                self._index(info.name)
        for name, parts in self._parts.items():
            _check_parts(name, parts)

    def _index(self, file: str) -> None:
        try:
            with safe_open(str(self.directory / file), framework="pt") as f:
                keys = list(f.keys())
                table = _pieces_table(file, (f.metadata() or {}).get(PIECES_KEY))
        except FileNotFoundError:
            raise CheckpointInvalid(f"shard {file} is missing from {self.directory}") from None
        except (SafetensorError, OSError) as exc:
            raise CheckpointInvalid(f"{file}: not a safetensors file ({exc})") from exc
        for key in keys:
            if key in table:
                name, index, count, shape = table[key]
                self._parts.setdefault(name, []).append(_Part(file, key, index, count, shape))
            else:
                self._parts.setdefault(key, []).append(_Part(file, key, 0, 0, ()))

    def names(self) -> set[str]:
        return set(self._parts)

    def check_names(self, expected: set[str], what: str) -> None:
        missing, extra = sorted(expected - self.names()), sorted(self.names() - expected)
        if missing or extra:
            raise ValueError(f"{what}: missing {missing[:3]}, unexpected {extra[:3]}")

    def tensor(self, name: str) -> torch.Tensor:
        parts = self._parts.get(name)
        if parts is None:
            raise ValueError(f"no tensor {name!r} in {self.directory}")
        if parts[0].count == 0:
            return self._read(parts[0])
        ordered = sorted(parts, key=lambda p: p.index)
        joined = torch.cat([self._read(p).reshape(-1) for p in ordered])
        shape = ordered[0].shape
        if joined.numel() != math.prod(shape):
            raise CheckpointInvalid(f"pieces of {name!r} do not fill shape {list(shape)}")
        return joined.view(shape)

    def tensors(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        return {name: self.tensor(name) for name in sorted(names)}

    def _read(self, part: _Part) -> torch.Tensor:
        if part.file not in self._verified:
            info = self._infos[part.file]
            verify_file(self.directory, info)
            self._verified.add(part.file)
        with safe_open(str(self.directory / part.file), framework="pt") as f:
            return f.get_tensor(part.key)


def _pieces_table(file: str, raw: str | None) -> dict[str, tuple[str, int, int, tuple[int, ...]]]:
    if raw is None:
        return {}
    try:
        table = json.loads(raw)
        out = {}
        for key, (name, index, count, shape) in table.items():
            if not (isinstance(name, str) and isinstance(index, int) and isinstance(count, int)):
                raise TypeError(key)
            out[str(key)] = (name, index, count, tuple(int(d) for d in shape))
        return out
    except (ValueError, TypeError) as exc:
        raise CheckpointInvalid(f"{file}: malformed {PIECES_KEY} metadata") from exc


def _check_parts(name: str, parts: Sequence[_Part]) -> None:
    if parts[0].count == 0:
        if len(parts) != 1:
            raise CheckpointInvalid(f"tensor {name!r} appears twice")
        return
    counts = {(p.count, p.shape) for p in parts}
    if len(counts) != 1 or sorted(p.index for p in parts) != list(range(parts[0].count)):
        raise CheckpointInvalid(f"pieces of {name!r} are incomplete or clash with a tensor")


def stream_digest(files: PayloadFiles, names: Sequence[str], compression: str) -> bytes:
    """`content_digest` of a contribution's decompressed payload, holding one tensor at a time."""

    def items() -> Iterator[tuple[str, torch.Tensor]]:
        for name in sorted(names):
            one = files.tensors(payload_keys([name], compression))
            yield name, decompress(one, compression)[name]

    return content_digest_items(items())


def stream_theta_digest(files: PayloadFiles, names: Sequence[str]) -> bytes:
    """The content digest of the θ in an outer-state directory (a round's `base`, a `DilocoOuterState`'s
    `theta`), holding one tensor at a time: rank 0 reads it from the files the ranks just wrote."""
    return content_digest_items((name, files.tensor(THETA_PREFIX + name)) for name in sorted(names))

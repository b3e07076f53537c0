"""Tensors in and out of contributions: load a verified contribution's payload and decompress it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from swarmnode.node.dataplane.checkpoint import load_checkpoint
from swarmnode.node.diloco.compression import decompress
from swarmnode.protocol.diloco import Contribution


def load_delta(
    directory: Path,
    contribution: Contribution,
    compression: str,
    *,
    like: Mapping[str, torch.Tensor] | None,
    max_abs: float | None = None,
) -> dict[str, torch.Tensor]:
    """The float32 pseudo-gradient of a verified contribution directory (blocking: run in a thread).

    Raises CheckpointInvalid when the files do not match the manifest and ValueError when the payload is
    not one the run's compression produces for the model `like` (names, shapes, dtypes, finite values, no
    element above `max_abs`).
    """
    payload = load_checkpoint(directory, contribution.manifest)
    return decompress(payload, compression, like=like, max_abs=max_abs)

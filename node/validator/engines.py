"""The engines of the retained checkpoint versions (`CheckpointEngines`).

Decisions:
- One engine per retained checkpoint version (`CheckpointEngines`, the newest `async_level + 1`), each a
  TransformersEngine of the run's model folder (on CUDA in bf16 when there is one) with the version's
  weights; a pruned version's engine is reused for the next one. All torch work (loading weights, judging)
  runs in threads under one lock: the engines are not thread-safe, and on a CPU parallel judging would
  only share the same cores.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from swarmnode.node.rl.engine import TransformersEngine
from swarmnode.node.rl.engines import open_engine


class CheckpointEngines:
    """The engines of the newest `keep` checkpoint versions, with the trainer's Merkle root of each.

    Blocking (it loads weights): call `load` from a thread. Not thread-safe: one caller at a time.
    """

    def __init__(self, model_dir: Path, keep: int) -> None:
        if keep < 1:
            raise ValueError("keep at least one version")
        self.keep = keep
        self._model_dir = model_dir
        self._spare: TransformersEngine | None = self._open()
        self.parameters = sum(p.numel() for p in self._spare.model.parameters())
        self.model_info = self._spare.info  # the run's model: what `check_fields` bounds by
        self.tokenizer = self._spare.tokenizer  # the run's prompts
        self._engines: dict[int, TransformersEngine] = {}
        self._roots: dict[int, bytes] = {}

    def _open(self) -> TransformersEngine:
        """A validator's prefill engine: transformers, on CUDA in bf16 when there is one (engines.py)."""
        engine = open_engine("transformers", self._model_dir, role="validator")
        assert isinstance(engine, TransformersEngine)
        return engine

    @property
    def newest(self) -> int | None:
        return max(self._engines) if self._engines else None

    def versions(self) -> list[int]:
        return sorted(self._engines)

    def roots(self) -> dict[int, bytes]:
        return dict(self._roots)

    def holds(self, version: int) -> bool:
        return version in self._engines

    def engine(self, version: int) -> TransformersEngine:
        return self._engines[version]

    def load(self, version: int, merkle_root: bytes, state: Mapping[str, torch.Tensor]) -> bool:
        """Hold `version`; False when it is held already or older than every version kept."""
        if version in self._engines:
            return False
        if len(self._engines) >= self.keep and version < min(self._engines):
            return False
        if len(self._engines) >= self.keep:
            oldest = min(self._engines)
            engine = self._engines.pop(oldest)
            del self._roots[oldest]
        elif self._spare is not None:
            engine, self._spare = self._spare, None
        else:
            engine = self._open()
        engine.load_weights(state)
        self._engines[version] = engine
        self._roots[version] = merkle_root
        return True

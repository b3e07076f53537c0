"""How this worker behaves: honestly, unless the composition root hands it another conduct.

A worker differs from an honest one at three points of its pipeline: the weights it loads, the
submission it builds, and how many counters it takes. `Conduct` names those three, `HONEST` is what the
protocol asks, and the devnet's dishonest workers (`swarmnode.testing.cheats`) implement the same seam,
so no dishonest code lives in the worker package.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from swarmnode.node.rl.engine import InferenceEngine
from swarmnode.node.rl.rollouts import build_submission
from swarmnode.node.rl.tasks import Task
from swarmnode.protocol.messages import RolloutSubmission, RunDescriptor


class Conduct(Protocol):
    @property
    def name(self) -> str:
        """"" when honest: shown in the worker's status and logs."""
        ...

    @property
    def paced(self) -> bool:
        """False: every counter the run allows, at once (no pace, no share)."""
        ...

    def weights(self, state: Mapping[str, torch.Tensor], version: int) -> Mapping[str, torch.Tensor]:
        """The weights to generate with, given the verified checkpoint's (blocking)."""
        ...

    def build(
        self,
        engine: InferenceEngine,
        descriptor: RunDescriptor,
        dataset: Mapping[bytes, Task],
        dataset_ids: Sequence[bytes],
        worker: bytes,
        version: int,
        root: bytes,
        counter: int,
    ) -> RolloutSubmission:
        """The `counter`-th submission on checkpoint (`version`, `root`) (blocking)."""
        ...


@dataclass(frozen=True)
class Honest:
    """The protocol's worker: the checkpoint's own weights, `build_submission`, paced."""

    name: str = ""
    paced: bool = True

    def weights(self, state: Mapping[str, torch.Tensor], version: int) -> Mapping[str, torch.Tensor]:
        return state

    def build(
        self,
        engine: InferenceEngine,
        descriptor: RunDescriptor,
        dataset: Mapping[bytes, Task],
        dataset_ids: Sequence[bytes],
        worker: bytes,
        version: int,
        root: bytes,
        counter: int,
    ) -> RolloutSubmission:
        return build_submission(engine, descriptor, dataset, dataset_ids, worker, version, root, counter)


HONEST = Honest()

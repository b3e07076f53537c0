"""Building one submission: the verified checkpoint read into memory, the generation, its timing.

Every function here blocks (reading a checkpoint, generating and proving): the work runs them in a thread.
The worker's `Conduct` (`conduct.HONEST`, or a devnet cheat the composition root chose) decides the
weights as they are read and the submission as it is built.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from swarmnode.node.dataplane.checkpoint import load_checkpoint
from swarmnode.node.dataplane.follower import VerifiedCheckpoint
from swarmnode.node.rl.engine import InferenceEngine
from swarmnode.node.rl.tasks import Task
from swarmnode.node.worker.conduct import Conduct
from swarmnode.protocol.messages import RolloutSubmission, RunDescriptor


@dataclass(frozen=True)
class CheckpointRef:
    version: int
    root: bytes


@dataclass(frozen=True)
class LoadedWeights:
    """A verified checkpoint read into memory (with the cheat's change, if any), waiting to be swapped in."""

    ref: CheckpointRef
    state: Mapping[str, torch.Tensor]


def prepare_weights(checkpoint: VerifiedCheckpoint, conduct: Conduct) -> LoadedWeights:
    """Read a verified checkpoint's state dict (blocking: run in a thread)."""
    manifest = checkpoint.manifest
    state = load_checkpoint(checkpoint.directory, manifest)
    ref = CheckpointRef(manifest.version, manifest.merkle_root)
    return LoadedWeights(ref, conduct.weights(state, manifest.version))


def make_submission(
    engine: InferenceEngine,
    descriptor: RunDescriptor,
    dataset: Mapping[bytes, Task],
    dataset_ids: Sequence[bytes],
    worker: bytes,
    ref: CheckpointRef,
    counter: int,
    conduct: Conduct,
) -> RolloutSubmission:
    """The `counter`-th submission on checkpoint `ref`, as the worker's conduct builds it (blocking)."""
    return conduct.build(engine, descriptor, dataset, dataset_ids, worker, ref.version, ref.root, counter)


@dataclass(frozen=True)
class Built:
    submission: RolloutSubmission
    wall_s: float
    cpu_s: float
    tokens: int


def timed_build(make: Callable[[], RolloutSubmission]) -> Built:
    """Run `make` in this thread, measuring wall time and this thread's CPU time."""
    wall, cpu = time.perf_counter(), time.thread_time()
    submission = make()
    tokens = sum(len(c.token_ids) for g in submission.groups for c in g.completions)
    return Built(submission, time.perf_counter() - wall, time.thread_time() - cpu, tokens)

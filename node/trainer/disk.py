"""What a trainer keeps on disk across restarts: the run's descriptor, its published checkpoints, and
its own saved states (the newest `KEEP_SAVES`).

Decisions:
- The descriptor is written once (atomically: a temporary file, then `os.replace`) and read back on every
  start, so a restarted trainer publishes the same run; one that names another run, trainer or set of
  co-trainers is refused (`RunMismatch`), never overwritten.
- A restart serves again only the versions it published completely (manifest signed by us, every shard
  verified) that are still retained; anything else found on disk is removed.
- A save is pruned record first, so no record ever names a missing file.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from swarmnode.node.dataplane.catalog import Catalog
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.node.errors import RunMismatch
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.node.rl.run import DEVNET_MAX_NEW_TOKENS, devnet_run
from swarmnode.node.rl.tasks import Task
from swarmnode.node.trainer.rank import dcp_dir
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.errors import ProtocolError
from swarmnode.protocol.messages import RunDescriptor
from swarmnode.protocol.shards import is_retained, verify_manifest


def load_or_create_descriptor(
    path: Path,
    run: str,
    trainer: bytes,
    model_dir: Path,
    tasks: Sequence[Task],
    co_trainers: tuple[bytes, ...] = (),
    max_new_tokens: int = DEVNET_MAX_NEW_TOKENS,
    environment: str = "",
) -> RunDescriptor:
    """The run's descriptor as first published from this data dir, or a new one with the devnet's recipe
    on this model folder and these tasks (then stored)."""
    if path.exists():
        try:
            descriptor = decode(RunDescriptor, path.read_bytes())
        except ProtocolError as exc:
            raise RunMismatch(
                f"{path} cannot be read as a run descriptor ({exc}): written by an older swarmnode, or "
                "damaged. Move it (and the data dir's trainer state) away to start a new run."
            ) from exc
        if descriptor.run != run or descriptor.trainer != trainer or descriptor.co_trainers != co_trainers:
            raise RunMismatch(
                f"{path} describes run {descriptor.run!r} of trainer 0x{descriptor.trainer.hex()} "
                f"with {len(descriptor.co_trainers)} co-trainers, not run {run!r} of 0x{trainer.hex()} "
                f"with {len(co_trainers)}"
            )
        return descriptor
    created = devnet_run(trainer, model_dir, wall_ms(), tasks=tasks, max_new_tokens=max_new_tokens,
                         environment=environment).descriptor
    if len(tasks) < created.grpo.prompts_per_step:  # every worker's first step would die assigning its tasks
        from swarmnode.node.errors import OperatorError

        prompts = created.grpo.prompts_per_step
        raise OperatorError(
            f"[work] tasks has {len(tasks)} tasks; the run takes {prompts} prompts per step and needs at "
            f"least {prompts} distinct tasks: add tasks"
        )
    descriptor = replace(created, run=run, co_trainers=co_trainers)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(encode(descriptor))
    os.replace(tmp, path)
    return descriptor


def restore_published(
    store: ShardStore, catalog: Catalog, *, run: str, trainer: bytes, step: int, async_level: int
) -> list[int]:
    """List the versions a previous life published that are still retained at `step`; remove the rest.

    Only complete versions whose manifest we signed and whose every shard is present come back; versions
    newer than `step` (a trainer state that was lost) and unfinished publications are removed.
    """
    kept: list[int] = []
    remove: list[int] = []
    for version, complete in sorted(store.versions_on_disk().items()):
        envelope = store.load_manifest(version)
        if not complete or envelope is None or version > step or not is_retained(version, step, async_level):
            remove.append(version)
            continue
        try:
            manifest = verify_manifest(envelope, run=run, trainer=trainer, now_ms=wall_ms())
        except ProtocolError:
            remove.append(version)
            continue
        held = store.verified_shards(manifest)
        if manifest.version != version or len(held) != len(manifest.shards):
            remove.append(version)
            continue
        catalog.add(manifest, envelope, held)
        kept.append(version)
    store.remove(remove)
    return kept


def prune_saves(directory: Path, keep_from: int) -> None:
    """Delete trainer states of steps below `keep_from` (the record first, so none names a missing file)."""
    for record in directory.glob("step-*.json"):
        step = int(record.stem.removeprefix("step-"))
        if step < keep_from:
            record.unlink(missing_ok=True)
            (directory / f"step-{step:06d}.safetensors").unlink(missing_ok=True)
            (directory / f"step-{step:06d}.optim.safetensors").unlink(missing_ok=True)
            shutil.rmtree(dcp_dir(directory, step), ignore_errors=True)

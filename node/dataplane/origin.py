"""The trainer's side of the broadcast: cut a state dict into shards, sign the manifest, serve the shards.

A policy version is published in the model layout (node/dataplane/checkpoint.py): a Hugging Face folder
with the run's config and tokenizer files (`model_folder_files`), so a relay's copy loads in transformers
and vLLM as it is. Other payloads (DiLoCo) keep the pieces layout, the default.

Publishing writes every shard into `<version>.partial/`, hashing each chunk as it is written (one pass over
the bytes), while the next shard is being serialized in another thread; it then signs the manifest, renames
the directory into place and lists the version in the catalog, so the origin never announces or serves a
version it does not hold whole. The control plane gossips the catalog entry's `head` on
`swarm/<run>/checkpoints` (a manifest of a large model exceeds a gossip message); followers fetch the
signed manifest envelope returned here from the `manifest` and `latest` endpoints, and check it against
the head.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.dataplane.catalog import Catalog
from swarmnode.node.dataplane.checkpoint import (
    CONFIG_FILE,
    MODEL_LAYOUT,
    PIECES_LAYOUT,
    Layout,
    PlannedFile,
    build_manifest,
    plan_files,
)
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.protocol.envelope import seal
from swarmnode.protocol.messages import CheckpointManifest, ShardInfo
from swarmnode.protocol.shards import DEFAULT_SHARD_SIZE, manifest_head, versions_to_prune


def model_folder_files(folder: str | os.PathLike[str]) -> dict[str, bytes]:
    """The files a model checkpoint carries beside its weights: config.json, generation_config.json (if
    present) and the tokenizer files, read byte for byte from the run's model folder (blocking)."""
    from swarmnode.node.rl import (
        model,  # imports transformers (2 s): only a trainer calls this, never a relay
    )

    folder = Path(folder)
    if not (folder / model.CONFIG_FILE).is_file():
        raise model.ModelFolderError(f"{folder}: no {model.CONFIG_FILE}")
    optional = [n for n in (model.GENERATION_CONFIG_FILE,) if (folder / n).is_file()]
    names = [model.CONFIG_FILE, *optional, *model.tokenizer_files(folder)]
    return {name: (folder / name).read_bytes() for name in names}


class Sealer:
    """Signs messages for one run with strictly increasing sequence numbers.

    Receivers drop a (sender, seq) they have seen, so seqs must never repeat, across restarts too: the
    counter starts at the wall clock in microseconds. A node that also signs on the control plane should
    share one Sealer (or one counter) between both.
    """

    def __init__(self, identity: NodeIdentity, run: str, clock_ms: Callable[[], int] = wall_ms) -> None:
        self.identity = identity
        self.run = run
        self.clock_ms = clock_ms
        self._seq = clock_ms() * 1000

    def __call__(self, message: Any) -> bytes:
        self._seq = max(self._seq + 1, self.clock_ms() * 1000)
        return seal(self.identity, message, run=self.run, seq=self._seq, ts=self.clock_ms())


async def _serialize_each(
    plans: Sequence[PlannedFile], out: trio.MemorySendChannel[tuple[str, bytes]]
) -> None:
    """Serialize the files one by one in a thread: file k+1 is made while file k is hashed and written.

    The channel holds nothing (capacity 0), so at most two serialized files are in memory at once.
    """
    async with out:
        for plan in plans:
            data = await trio.to_thread.run_sync(plan.serialize)
            await out.send((plan.name, data))
            del data


class Origin:
    """Publishes checkpoints of one run into a store and catalog that a `ShardService` serves."""

    def __init__(
        self,
        seal: Sealer,
        store: ShardStore,
        catalog: Catalog,
        *,
        shard_size: int = DEFAULT_SHARD_SIZE,
        async_level: int = 2,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.seal = seal
        self.store = store
        self.catalog = catalog
        self.shard_size = shard_size
        self.async_level = async_level
        self.clock_ms = clock_ms

    async def publish(
        self,
        state_dict: Mapping[str, torch.Tensor],
        *,
        version: int,
        parent_version: int,
        model_config_hash: bytes,
        layout: Layout = PIECES_LAYOUT,
        files: Mapping[str, bytes] | None = None,
    ) -> tuple[CheckpointManifest, bytes]:
        """Write, hash and sign version `version`; returns the manifest and its signed envelope.

        `layout="model"` publishes a Hugging Face folder: `files` (`model_folder_files`) must hold the
        config.json whose sha256 is `model_config_hash`. Everything is checked before anything is written.
        """
        latest = self.catalog.latest_version
        if latest is not None and version <= latest:
            raise ValueError(f"version {version} is not newer than the published {latest}")
        config = (files or {}).get(CONFIG_FILE)
        if layout == MODEL_LAYOUT and (
            config is None or hashlib.sha256(config).digest() != model_config_hash
        ):
            raise ValueError(f"a model checkpoint carries the {CONFIG_FILE} of model_config_hash")
        plans = await trio.to_thread.run_sync(plan_files, layout, state_dict, self.shard_size, files)
        infos: list[ShardInfo] = []
        serialized, ready = trio.open_memory_channel[tuple[str, bytes]](0)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_serialize_each, plans, serialized)
                async with ready:
                    async for name, data in ready:
                        digest = await trio.to_thread.run_sync(self.store.write_shard, version, name, data)
                        infos.append(ShardInfo(name, len(data), digest))
                        del data
        except BaseExceptionGroup as group:  # one stage failed and the other was cancelled: its error alone
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        return await self.publish_written(
            version=version, parent_version=parent_version, model_config_hash=model_config_hash, shards=infos
        )

    async def publish_written(
        self,
        *,
        version: int,
        parent_version: int,
        model_config_hash: bytes,
        shards: Sequence[ShardInfo],
    ) -> tuple[CheckpointManifest, bytes]:
        """Sign and list version `version` whose files are already in its partial directory.

        The second half of `publish`, and the whole of it for a sharded trainer whose ranks each wrote
        the files they own (`store.write_shard`) and reported their `ShardInfo`s: the manifest lists
        `shards` in name order, and nothing is announced unless every listed file is on disk.
        """
        latest = self.catalog.latest_version
        if latest is not None and version <= latest:
            raise ValueError(f"version {version} is not newer than the published {latest}")
        infos = sorted(shards, key=lambda s: s.name)
        partial = self.store.partial_dir(version)
        missing = [s.name for s in infos if not (partial / s.name).is_file()]
        if missing:
            raise ValueError(f"version {version} lists files nobody wrote: {missing[:3]}")
        manifest = build_manifest(
            run=self.seal.run,
            version=version,
            parent_version=parent_version,
            model_config_hash=model_config_hash,
            shards=infos,
            created_ms=self.clock_ms(),
        )
        envelope = self.seal(manifest)
        head = await trio.to_thread.run_sync(manifest_head, manifest)
        self.store.save_manifest(version, envelope)
        await trio.to_thread.run_sync(self.store.finalize, version)
        self.catalog.add(manifest, envelope, set(range(len(infos))), head)
        stale = versions_to_prune(self.catalog.versions(), version, self.async_level)
        for old in stale:
            self.catalog.remove(old)
        await trio.to_thread.run_sync(self.store.remove, stale)
        return manifest, envelope

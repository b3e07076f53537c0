"""Shared fixtures for data-plane tests: keys, small manifests, a seeded state dict, in-process nodes."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

import torch
import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.dataplane.catalog import Catalog
from swarmnode.node.dataplane.checkpoint import build_manifest, shard_info
from swarmnode.node.dataplane.downloader import DownloadConfig
from swarmnode.node.dataplane.http_server import HttpServer, ServerConfig
from swarmnode.node.dataplane.origin import Sealer
from swarmnode.node.dataplane.roles import FollowerNode, FollowerNodeConfig
from swarmnode.node.dataplane.shard_endpoints import ShardService
from swarmnode.node.dataplane.sources import ScoringConfig
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.protocol.envelope import seal
from swarmnode.protocol.messages import CheckpointManifest, ShardHave, ShardInfo
from swarmnode.protocol.shards import encode_bitfield
from swarmnode.testing.processes import role_key
from swarmnode.testing.relay_faults import Fault, FaultyService

RUN = "test-run"
TRAINER = NodeIdentity(hashlib.sha256(b"dataplane-trainer").digest())
STRANGER = NodeIdentity(hashlib.sha256(b"dataplane-stranger").digest())
CONFIG_HASH = hashlib.sha256(b"model-config").digest()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def blobs(count: int, size: int, seed: int = 0) -> list[tuple[str, bytes]]:
    """`count` named pseudo-random shards of `size` bytes."""
    out = []
    for i in range(count):
        stream = hashlib.shake_256(f"{seed}/{i}".encode()).digest(size)
        out.append((f"shard-{i:03d}.safetensors", stream))
    return out


def manifest_for(
    shards: Sequence[tuple[str, bytes]] | Sequence[ShardInfo], version: int = 1, run: str = RUN
) -> CheckpointManifest:
    infos = [s if isinstance(s, ShardInfo) else shard_info(*s) for s in shards]
    return build_manifest(
        run=run,
        version=version,
        parent_version=max(0, version - 1),
        model_config_hash=CONFIG_HASH,
        shards=infos,
        created_ms=now_ms(),
    )


def signed(manifest: CheckpointManifest, identity: NodeIdentity = TRAINER, *, ts: int | None = None) -> bytes:
    return seal(
        identity, manifest, run=manifest.run, seq=manifest.version + 1, ts=now_ms() if ts is None else ts
    )


def small_state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16),
        "layers.0.weight": torch.randn(32, 32, generator=g),
        "layers.0.bias": torch.randn(32, generator=g),
        "step": torch.tensor(7, dtype=torch.int64),
        "mask": torch.rand(5, 5, generator=g) > 0.5,
    }


# --- in-process shard servers ----------------------------------------------------------------------


class ServedCopy:
    """A full copy of some shards on disk, served over HTTP (optionally with a fault) until `stop()`."""

    def __init__(self, root, shards, manifest, *, fault=None, config=None, key=STRANGER):
        self.store = ShardStore(root, manifest.run)
        self.catalog = Catalog(manifest.run)
        for name, data in shards:
            self.store.write_shard(manifest.version, name, data)
        envelope = signed(manifest)
        self.store.save_manifest(manifest.version, envelope)
        self.store.finalize(manifest.version)
        self.catalog.add(manifest, envelope, range(len(manifest.shards)))
        self.sealer = Sealer(key, manifest.run)
        self.service = ShardService(self.catalog, self.store, endpoint="", seal=self.sealer)
        handler = self.service if fault is None else FaultyService(self.service, Fault(fault), self.sealer)
        self.server = HttpServer(handler, config or ServerConfig())
        self.scope = trio.CancelScope()
        self.endpoint = ""

    async def _serve(self, task_status):
        with self.scope:
            await self.server.serve(task_status=task_status)

    async def start(self, nursery):
        port = await nursery.start(self._serve)
        self.endpoint = self.service.endpoint = f"http://127.0.0.1:{port}"
        return self.endpoint

    def stop(self):
        """Kill the server and every connection it has, as a crash would."""
        self.scope.cancel()


def have_all(endpoint, manifest):
    return ShardHave(
        run=manifest.run,
        version=manifest.version,
        merkle_root=manifest.merkle_root,
        bitfield=encode_bitfield(range(len(manifest.shards)), len(manifest.shards)),
        endpoint=endpoint,
    )


async def wait_until(predicate, poll: float = 0.01) -> None:
    """Poll a counter that has no event of its own (a server's byte count)."""
    while not predicate():  # noqa: ASYNC110 - counters are not events
        await trio.sleep(poll)


# --- in-process role nodes ---------------------------------------------------------------------------

FAST_SCORING = ScoringConfig(backoff_base=0.05, backoff_max=0.5)


async def run_node(node, completed, *, task_status):
    """Run a node inside its own cancel scope, so a test can kill just this node."""
    with trio.CancelScope() as scope:
        node.scope = scope
        await node.run(completed, task_status=task_status)


def follower_node(tmp_path, name, key, peers, *, worker, rate=None, async_level=2):
    """A relay (`worker=False`: serves, keeps `async_level` versions) or a worker (newest only, silent)."""
    config = FollowerNodeConfig(
        root=tmp_path / name,
        run=RUN,
        trainer=TRAINER.address,
        identity=role_key(key),
        peers=peers,
        newest_only=worker,
        serve=not worker,
        async_level=async_level,
        server=ServerConfig(upload_rate=rate, chunk_size=16 * 1024),
        download=DownloadConfig(parallel_shards=4, stall_timeout=1.0),
        scoring=FAST_SCORING,
        seed=key,
    )
    return FollowerNode(config)

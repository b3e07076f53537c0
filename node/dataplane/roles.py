"""The data plane of each role, assembled from the parts: origin (trainer), relay, worker.

`OriginNode` serves what the trainer publishes. `FollowerNode` is a relay (`newest_only=False`, serves)
or a worker (`newest_only=True`, serving optional): it follows manifests and fetches shards. Both take
their peers as plain endpoints here and learn from them over HTTP (`feeds`); the runtime may instead feed
`manifests` (a channel of manifest or `CheckpointHead` envelopes) and `book` (ShardHave claims) from
gossip and the DHT, and leave `peers` empty.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.dataplane.catalog import Catalog
from swarmnode.node.dataplane.downloader import DownloadConfig, Downloader
from swarmnode.node.dataplane.feeds import follow_haves, follow_manifests
from swarmnode.node.dataplane.follower import Follower, FollowerConfig, VerifiedCheckpoint
from swarmnode.node.dataplane.http_client import ClientConfig, HttpClient
from swarmnode.node.dataplane.http_server import Handler, HttpServer, ServerConfig
from swarmnode.node.dataplane.origin import Origin, Sealer
from swarmnode.node.dataplane.progress import ProgressSink
from swarmnode.node.dataplane.shard_endpoints import ShardService
from swarmnode.node.dataplane.sources import ScoringConfig, SourceBook
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.protocol.shards import DEFAULT_SHARD_SIZE


def _endpoint(host: str, port: int) -> str:
    return f"http://{host}:{port}"


class OriginNode:
    """The trainer's store, catalog and shard server; `origin.publish(...)` makes a version available."""

    def __init__(
        self,
        root: Path,
        identity: NodeIdentity,
        run: str,
        *,
        server: ServerConfig | None = None,
        shard_size: int = DEFAULT_SHARD_SIZE,
        async_level: int = 2,
        mount: Callable[[Handler], Handler] | None = None,
    ) -> None:
        self.store = ShardStore(root, run)
        self.catalog = Catalog(run)
        self.seal = Sealer(identity, run)
        self.origin = Origin(
            self.seal, self.store, self.catalog, shard_size=shard_size, async_level=async_level
        )
        self.server_config = server or ServerConfig()
        self.server: HttpServer | None = None
        self.endpoint = ""
        self.mount = mount  # wraps the shard service, to serve more on the same endpoint (DiLoCo)

    def statistics(self) -> dict[str, object]:
        assert self.server is not None
        return {"endpoint": self.endpoint, "server": self.server.stats.as_dict(), **self.catalog.statistics()}

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        service = ShardService(self.catalog, self.store, endpoint="", seal=self.seal)
        handler: Handler = service if self.mount is None else self.mount(service)
        self.server = HttpServer(handler, self.server_config)
        service.server_stats = self.server.stats
        async with trio.open_nursery() as nursery:
            port = await nursery.start(self.server.serve)
            self.endpoint = service.endpoint = _endpoint(self.server_config.host, port)
            task_status.started(self.endpoint)


@dataclass(frozen=True)
class FollowerNodeConfig:
    root: Path
    run: str
    trainer: bytes
    identity: NodeIdentity
    peers: dict[str, float] = field(default_factory=dict)  # endpoint → weight in the source book
    newest_only: bool = False  # True for workers
    serve: bool = True
    async_level: int = 2
    server: ServerConfig = ServerConfig()
    download: DownloadConfig = DownloadConfig()
    scoring: ScoringConfig = ScoringConfig()
    seed: int | None = None


class FollowerNode:
    """A relay or a worker: follows manifests, fetches and verifies shards, optionally serves them."""

    def __init__(self, config: FollowerNodeConfig, *, progress: ProgressSink | None = None) -> None:
        self.config = config
        self.store = ShardStore(config.root, config.run)
        self.catalog = Catalog(config.run)
        self.seal = Sealer(config.identity, config.run)
        download = config.download
        self.client = HttpClient(
            ClientConfig(stall_timeout=download.stall_timeout, recv_low_water=download.recv_low_water)
        )
        self.book = SourceBook(config.scoring)
        self.downloader = Downloader(
            self.client, self.book, config.download, rng=random.Random(config.seed), progress=progress
        )
        follower_config = FollowerConfig(
            config.run, config.trainer, async_level=config.async_level, newest_only=config.newest_only
        )
        self.follower = Follower(follower_config, self.store, self.catalog, self.downloader)
        self.service = ShardService(self.catalog, self.store, endpoint="", seal=self.seal)
        self.server = HttpServer(self.service, config.server) if config.serve else None
        if self.server is not None:
            self.service.server_stats = self.server.stats
        self.endpoint = ""
        self.manifests, self._manifest_queue = trio.open_memory_channel[bytes](16)  # manifests and heads

    def statistics(self) -> dict[str, object]:
        stats: dict[str, object] = {
            "endpoint": self.endpoint,
            "follower": self.follower.statistics(),
            "downloader": self.downloader.statistics(),
            "client": self.client.statistics(),
            "sources": self.book.statistics(),
            **self.catalog.statistics(),
        }
        if self.server is not None:
            stats["server"] = self.server.stats.as_dict()
        return stats

    async def run(
        self,
        completed: trio.MemorySendChannel[VerifiedCheckpoint] | None = None,
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve (if configured), follow the peers, and hand each verified version to `completed`."""
        cfg = self.config
        async with trio.open_nursery() as nursery:
            if self.server is not None:
                port = await nursery.start(self.server.serve)
                self.endpoint = self.service.endpoint = _endpoint(cfg.server.host, port)
                self.book.own_endpoint = self.endpoint
            await nursery.start(self.follower.run, self._manifest_queue, completed)
            if cfg.peers:
                nursery.start_soon(
                    follow_manifests, self.client, list(cfg.peers), self.catalog, self.manifests.clone()
                )
                nursery.start_soon(follow_haves, self.client, cfg.peers, self.catalog, self.book)
            task_status.started(self.endpoint)

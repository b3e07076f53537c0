"""One store namespace of a DiLoCo trainer's holdings: files, catalog, shard endpoints, and a downloader.

`node.diloco.holdings` keeps one per (trainer, kind) of a run (`<run>.t<i>` contributions, `<run>.o<i>`
outer states). A fetched version is asked for only from peers that served the signed message naming it,
and every byte is still checked against the author's signed manifest, so a version is served again as soon
as it is whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import trio

from swarmnode.node.dataplane.catalog import Catalog
from swarmnode.node.dataplane.downloader import DownloadConfig, Downloader
from swarmnode.node.dataplane.http_client import HttpClient
from swarmnode.node.dataplane.origin import Sealer
from swarmnode.node.dataplane.shard_endpoints import ShardService
from swarmnode.node.dataplane.sources import SourceBook
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.protocol.messages import CheckpointManifest, ShardHave
from swarmnode.protocol.shards import encode_bitfield


class Namespace:
    """One store namespace: files, catalog and shard endpoints, plus a downloader fed with local claims."""

    def __init__(
        self, root: Path, name: str, seal: Sealer, client: HttpClient, download: DownloadConfig
    ) -> None:
        self.name = name
        self.store = ShardStore(root, name)
        self.catalog = Catalog(name)
        self.service = ShardService(self.catalog, self.store, endpoint="", seal=seal)
        self.book = SourceBook()
        self.downloader = Downloader(client, self.book, download)

    async def fetch(self, manifest: CheckpointManifest, envelope: bytes, sources: Iterable[str]) -> Path:
        """The version's verified directory, downloading its shards from `sources` if not held yet.

        A source is asked for a version only because it served the signed message naming it, so each
        is recorded as holding every shard; the downloader still checks every byte against the manifest.
        """
        version = manifest.version
        entry = self.catalog.get(version)
        if entry is not None and entry.manifest.merkle_root != manifest.merkle_root:
            await trio.to_thread.run_sync(self.store.remove, [version])
            self.catalog.remove(version)
            entry = None
        if entry is not None and entry.complete:
            return self.store.complete_dir(version)
        if entry is None:
            self.store.save_manifest(version, envelope)
            entry = self.catalog.add(manifest, envelope)
        every = encode_bitfield(range(len(manifest.shards)), len(manifest.shards))
        for source in sources:
            self.book.observe(ShardHave(self.name, version, manifest.merkle_root, every, source))
        await self.downloader.fetch(
            self.store, manifest, set(entry.held), lambda i: self.catalog.mark_held(version, i)
        )
        directory = await trio.to_thread.run_sync(self.store.finalize, version)
        self.catalog.mark_complete(version)
        return directory

    def drop(self, versions: Iterable[int]) -> None:
        versions = list(versions)
        for version in versions:
            self.catalog.remove(version)
            self.book.forget_version(version)
        self.store.remove(versions)


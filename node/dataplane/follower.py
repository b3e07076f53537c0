"""Follow a run's checkpoints: verify each manifest, fetch its shards, publish it whole, prune the old.

Relays and workers both run a `Follower`; they differ in one switch. A relay (`newest_only=False`) fetches
every retained version, since validators and lagging workers still ask for them. A worker
(`newest_only=True`) abandons an older download as soon as a newer manifest verifies: it only ever
hot-swaps forward. Either way a version is handed on (`completed` channel) only after every shard
verified and its directory was renamed into place, so a crash mid-download leaves nothing loadable.

Manifests arrive as raw envelope bytes on a channel (from a `ManifestRequest` or the HTTP `latest` long
poll) and are trusted only when the run's trainer signed them. Gossip brings `CheckpointHead` envelopes on
the same channel: a head the follower wants is resolved into its manifest over HTTP (`heads`), at most one
resolution per version at a time, and the manifest is then taken exactly as one that arrived whole.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from swarmnode.node.dataplane.catalog import Catalog
from swarmnode.node.dataplane.downloader import Downloader
from swarmnode.node.dataplane.heads import ManifestResolver, Unresolved
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.protocol.codec import decode
from swarmnode.protocol.envelope import Envelope
from swarmnode.protocol.errors import Ignore, ProtocolError, Reason, Reject
from swarmnode.protocol.messages import CheckpointHead, CheckpointManifest
from swarmnode.protocol.shards import is_retained, verify_head, verify_manifest, versions_to_prune

MAX_RESOLVING = 4  # heads being resolved into manifests at once (one per version)


@dataclass(frozen=True)
class FollowerConfig:
    run: str
    trainer: bytes  # the run's trainer address: the only valid manifest signer
    async_level: int = 2
    newest_only: bool = False
    fsync: bool = False


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A complete checkpoint on disk whose every shard matched the trainer-signed manifest."""

    manifest: CheckpointManifest
    envelope: bytes
    directory: Path


@dataclass
class FollowerStats:
    accepted: int = 0
    completed: int = 0
    pruned: int = 0
    verdicts: Counter[str] = field(default_factory=Counter)  # "reject:WRONG_SENDER", "ignore:DUPLICATE", ...
    head_verdicts: Counter[str] = field(default_factory=Counter)  # the same, for heads

    def as_dict(self) -> dict[str, object]:
        return {
            "manifests_accepted": self.accepted,
            "versions_completed": self.completed,
            "versions_pruned": self.pruned,
            "manifest_verdicts": dict(self.verdicts),
            "head_verdicts": dict(self.head_verdicts),
        }


class Follower:
    def __init__(
        self,
        config: FollowerConfig,
        store: ShardStore,
        catalog: Catalog,
        downloader: Downloader,
        *,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.config = config
        self.store = store
        self.catalog = catalog
        self.downloader = downloader
        self.clock_ms = clock_ms
        self.stats = FollowerStats()
        self.resolver = ManifestResolver(
            downloader.client, downloader.book, trainer=config.trainer, clock_ms=clock_ms
        )
        self._downloads: dict[int, trio.CancelScope] = {}
        self._resolving: dict[int, trio.CancelScope] = {}
        self._nursery: trio.Nursery | None = None
        self._completed: trio.MemorySendChannel[VerifiedCheckpoint] | None = None

    def statistics(self) -> dict[str, object]:
        return {
            **self.stats.as_dict(),
            **self.resolver.stats.as_dict(),
            "downloading": sorted(self._downloads),
            "resolving": sorted(self._resolving),
        }

    async def run(
        self,
        manifests: trio.MemoryReceiveChannel[bytes],
        completed: trio.MemorySendChannel[VerifiedCheckpoint] | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Resume what is on disk, then take manifests and heads until the channel closes and work ends."""
        self._completed = completed
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self._restore()
            task_status.started()
            async with manifests:
                async for envelope in manifests:
                    self.take(envelope)

    def take(self, envelope: bytes) -> None:
        """A manifest or a head envelope, by its type; anything else is counted as a manifest verdict."""
        try:
            kind = decode(Envelope, envelope).type
        except ProtocolError as verdict:
            self.stats.verdicts[f"{verdict.verdict}:{verdict.reason.name}"] += 1
            return
        if kind == CheckpointHead.TYPE:
            self.offer_head(envelope)
        else:
            self.offer(envelope)

    def offer(self, envelope: bytes) -> CheckpointManifest | None:
        """Verify a manifest envelope and start fetching its version; the verdict is counted, never raised."""
        try:
            manifest = self._admit(envelope)
        except ProtocolError as verdict:
            self.stats.verdicts[f"{verdict.verdict}:{verdict.reason.name}"] += 1
            return None
        self._accept(manifest, envelope)
        return manifest

    def offer_head(self, envelope: bytes) -> CheckpointHead | None:
        """Verify a head envelope and resolve its manifest over HTTP; the verdict is counted, never raised."""
        assert self._nursery is not None, "start run() first"
        try:
            head = self._admit_head(envelope)
        except ProtocolError as verdict:
            self.stats.head_verdicts[f"{verdict.verdict}:{verdict.reason.name}"] += 1
            return None
        self.stats.head_verdicts["accept"] += 1
        if self.config.newest_only:
            for version in [v for v in self._resolving if v < head.version]:
                self._resolving.pop(version).cancel()
        scope = trio.CancelScope()
        self._resolving[head.version] = scope
        self._nursery.start_soon(self._resolve, head, scope)
        return head

    def _admit(self, envelope: bytes) -> CheckpointManifest:
        cfg = self.config
        manifest = verify_manifest(envelope, run=cfg.run, trainer=cfg.trainer, now_ms=self.clock_ms())
        self._check_wanted(manifest.version, manifest.merkle_root)
        return manifest

    def _admit_head(self, envelope: bytes) -> CheckpointHead:
        cfg = self.config
        head = verify_head(envelope, run=cfg.run, trainer=cfg.trainer, now_ms=self.clock_ms())
        self._check_wanted(head.version, head.merkle_root)
        if head.version in self._resolving:
            raise Ignore(Reason.DUPLICATE, f"the manifest of version {head.version} is being fetched")
        if len(self._resolving) >= MAX_RESOLVING:
            raise Ignore(Reason.BUSY, f"{MAX_RESOLVING} manifests are being fetched")
        return head

    def _check_wanted(self, version: int, merkle_root: bytes) -> None:
        """Ignore a version this follower holds, has pruned, or (newest only) has passed."""
        cfg = self.config
        known = self.catalog.get(version)
        if known is not None:
            if known.manifest.merkle_root != merkle_root:
                raise Ignore(Reason.DUPLICATE, f"a different manifest for version {version} came first")
            raise Ignore(Reason.DUPLICATE, f"version {version} is known")
        latest = self.catalog.latest_version
        if latest is not None:
            if not is_retained(version, latest, cfg.async_level):
                raise Ignore(Reason.STALE, f"version {version} is past retention (latest {latest})")
            if cfg.newest_only and version < latest:
                raise Ignore(Reason.STALE, f"version {version} is older than {latest}")

    def _accept(
        self, manifest: CheckpointManifest, envelope: bytes, head: CheckpointHead | None = None
    ) -> None:
        self.stats.accepted += 1
        self.stats.verdicts["accept"] += 1
        resolving = self._resolving.pop(manifest.version, None)
        if resolving is not None:  # the manifest came whole (a long poll) while its head was resolved
            resolving.cancel()
        self.store.save_manifest(manifest.version, envelope)
        self.catalog.add(manifest, envelope, head=head)
        self._start(manifest)
        self._prune()

    async def _resolve(self, head: CheckpointHead, scope: trio.CancelScope) -> None:
        try:
            with scope:
                try:
                    manifest, envelope = await self.resolver.resolve(head)
                except Unresolved:
                    return
                if self._resolving.get(head.version) is scope:
                    del self._resolving[head.version]
                try:
                    self._check_wanted(manifest.version, manifest.merkle_root)
                except ProtocolError as verdict:  # overtaken while it was fetched
                    self.stats.verdicts[f"{verdict.verdict}:{verdict.reason.name}"] += 1
                    return
                self._accept(manifest, envelope, head)
        finally:
            if self._resolving.get(head.version) is scope:
                del self._resolving[head.version]

    # --- downloads ---------------------------------------------------------------------------------

    def _start(self, manifest: CheckpointManifest) -> None:
        assert self._nursery is not None, "start run() first"
        if self.config.newest_only:
            for version, scope in self._downloads.items():
                if version < manifest.version:
                    scope.cancel()
        scope = trio.CancelScope()
        self._downloads[manifest.version] = scope
        self._nursery.start_soon(self._download, manifest, scope)

    async def _download(self, manifest: CheckpointManifest, scope: trio.CancelScope) -> None:
        version = manifest.version
        try:
            with scope:
                entry = self.catalog.get(version)
                if entry is None:
                    return
                if not entry.complete:
                    await self.downloader.fetch(
                        self.store, manifest, set(entry.held), lambda i: self.catalog.mark_held(version, i)
                    )
                    directory = await trio.to_thread.run_sync(self.store.finalize, version, self.config.fsync)
                    self.catalog.mark_complete(version)
                    self.stats.completed += 1
                else:
                    directory = self.store.complete_dir(version)
                if self._completed is not None:
                    await self._completed.send(VerifiedCheckpoint(manifest, entry.envelope, directory))
        finally:
            if self._downloads.get(version) is scope:
                del self._downloads[version]

    # --- retention ---------------------------------------------------------------------------------

    def _prune(self) -> None:
        latest = self.catalog.latest_version
        if latest is None:
            return
        stale = versions_to_prune(self.catalog.versions(), latest, self.config.async_level)
        for version in list(self._resolving):
            if not is_retained(version, latest, self.config.async_level) or (
                self.config.newest_only and version < latest
            ):
                self._resolving.pop(version).cancel()
        for version in stale:
            scope = self._downloads.pop(version, None)
            if scope is not None:
                scope.cancel()
            self.catalog.remove(version)
            self.downloader.book.forget_version(version)
            self.stats.pruned += 1
        if stale:
            assert self._nursery is not None
            self._nursery.start_soon(trio.to_thread.run_sync, self.store.remove, stale)

    async def _restore(self) -> None:
        """Pick up versions already on disk: re-verify their manifests, resume incomplete downloads."""
        on_disk = await trio.to_thread.run_sync(self.store.versions_on_disk)
        bad: list[int] = []
        restored: list[CheckpointManifest] = []
        for version in sorted(on_disk):
            envelope = self.store.load_manifest(version)
            try:
                if envelope is None:
                    raise Reject(Reason.MISSING_FIELD, "manifest file vanished")
                manifest = verify_manifest(
                    envelope, run=self.config.run, trainer=self.config.trainer, now_ms=self.clock_ms()
                )
            except ProtocolError:
                bad.append(version)
                continue
            held = await trio.to_thread.run_sync(self.store.verified_shards, manifest)
            entry = self.catalog.add(manifest, envelope, held)
            if on_disk[version]:
                self.catalog.mark_complete(version)
            elif entry.complete:  # every shard verified but not yet renamed: crashed in between
                self.catalog.mark_complete(version)
                await trio.to_thread.run_sync(self.store.finalize, version, self.config.fsync)
            restored.append(manifest)
        if bad:
            await trio.to_thread.run_sync(self.store.remove, bad)
        self._prune()
        latest = self.catalog.latest_version
        for manifest in restored:
            if self.catalog.get(manifest.version) is None:
                continue
            if self.config.newest_only and manifest.version != latest:
                continue
            self._start(manifest)

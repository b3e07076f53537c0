"""What a node holds, in memory: verified manifests and, per version, which shards are verified on disk.

Each entry also gives the version's `CheckpointHead` (what the trainer gossips on `checkpoints`; the full
signed manifest is served over HTTP from here).

The HTTP service answers from it (manifests, `have`, which shard files may be served), the follower and
the origin write to it, and the control plane can watch it (`wait_changed`) to gossip `ShardHave`. One
`trio.Event` is swapped on every change, so waiters re-check their own condition (no lost wake-ups).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import trio

from swarmnode.protocol.messages import CheckpointHead, CheckpointManifest, ShardInfo
from swarmnode.protocol.shards import manifest_head


@dataclass
class VersionEntry:
    manifest: CheckpointManifest
    envelope: bytes  # the trainer-signed manifest, served as is
    held: set[int] = field(default_factory=set)
    complete: bool = False
    index: dict[str, int] = field(default_factory=dict)  # shard name → position in the manifest
    _head: CheckpointHead | None = None

    def __post_init__(self) -> None:
        self.index = {s.name: i for i, s in enumerate(self.manifest.shards)}

    @property
    def head(self) -> CheckpointHead:
        """The head gossiped for this version (hashing the manifest once, on first use)."""
        if self._head is None:
            self._head = manifest_head(self.manifest)
        return self._head

    def held_shard(self, name: str) -> ShardInfo | None:
        """The manifest entry of shard `name` if it is verified here."""
        i = self.index.get(name)
        return self.manifest.shards[i] if i is not None and i in self.held else None


class Catalog:
    def __init__(self, run: str) -> None:
        self.run = run
        self._versions: dict[int, VersionEntry] = {}
        self._changed = trio.Event()
        self.generation = 0

    # --- queries -----------------------------------------------------------------------------------

    def get(self, version: int) -> VersionEntry | None:
        return self._versions.get(version)

    def versions(self) -> list[int]:
        return sorted(self._versions)

    @property
    def latest(self) -> VersionEntry | None:
        return self._versions[max(self._versions)] if self._versions else None

    @property
    def latest_version(self) -> int | None:
        return max(self._versions) if self._versions else None

    def statistics(self) -> dict[str, object]:
        return {
            "versions": {
                str(v): {"held": len(e.held), "shards": len(e.manifest.shards), "complete": e.complete}
                for v, e in sorted(self._versions.items())
            }
        }

    # --- changes -----------------------------------------------------------------------------------

    def _touch(self) -> None:
        self.generation += 1
        self._changed.set()
        self._changed = trio.Event()

    def add(
        self,
        manifest: CheckpointManifest,
        envelope: bytes,
        held: Iterable[int] = (),
        head: CheckpointHead | None = None,
    ) -> VersionEntry:
        """Record a verified manifest (idempotent for the same version); `head`: its head, if known."""
        entry = self._versions.get(manifest.version)
        if entry is None:
            held_set = set(held)
            complete = len(held_set) == len(manifest.shards)
            entry = VersionEntry(manifest, envelope, held_set, complete, _head=head)
            self._versions[manifest.version] = entry
            self._touch()
        return entry

    def mark_held(self, version: int, index: int) -> None:
        entry = self._versions.get(version)
        if entry is not None and index not in entry.held:
            entry.held.add(index)
            self._touch()

    def mark_complete(self, version: int) -> None:
        entry = self._versions.get(version)
        if entry is not None and not entry.complete:
            entry.complete = True
            self._touch()

    def remove(self, version: int) -> None:
        if self._versions.pop(version, None) is not None:
            self._touch()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def newer_than(self, version: int) -> VersionEntry | None:
        latest = self.latest
        return latest if latest is not None and latest.manifest.version > version else None

    async def wait_newer_than(self, version: int) -> VersionEntry:
        """The newest entry, once one is newer than `version` (callers bound the wait)."""
        while (entry := self.newer_than(version)) is None:
            await self.wait_changed()
        return entry

    async def wait_held_more_than(self, version: int, count: int) -> VersionEntry:
        """The version's entry, once known here with over `count` shards held (callers bound the wait)."""
        while (entry := self._versions.get(version)) is None or len(entry.held) <= count:
            await self.wait_changed()
        return entry

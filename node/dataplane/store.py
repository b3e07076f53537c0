"""Shards on disk: one directory per version, partial files resumable, completion by atomic rename.

Layout under `root/<run>/`:

    <version>.partial/manifest.msgpack   the trainer-signed manifest envelope, written first
    <version>.partial/<shard>.part       bytes received so far; never served, resumed by byte offset
    <version>.partial/<shard>            a shard whose sha256 matched the manifest (servable)
    <version>/                           the same directory renamed once every shard verified

A shard file exists under its own name only after its digest matched, and a version directory exists
under its own name only after every shard did, so a crash at any point leaves nothing loadable that is
not whole. Loaders read only `<version>/` (`complete_dir`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from swarmnode.protocol.messages import CheckpointManifest, ShardInfo
from swarmnode.protocol.shards import MANIFEST_FILE, PART_SUFFIX

_PARTIAL = ".partial"
WRITE_CHUNK = 1 << 20  # hashed, then written, while it sits in the CPU cache (L2-sized)


class DigestMismatch(Exception):
    """A finished transfer did not hash to the manifest's digest; `contributors` maps source → bytes given."""

    def __init__(self, shard: str, contributors: dict[str, int]) -> None:
        super().__init__(f"shard {shard} does not match its sha256 (bytes from {sorted(contributors)})")
        self.shard = shard
        self.contributors = contributors


class PartialShard:
    """One shard being received: the `.part` file, its running sha256 and who contributed which bytes.

    Bytes are hashed as they are written, so completion costs one digest comparison, not a re-read.
    Resuming after a restart re-hashes the bytes already on disk (`resume`).
    """

    def __init__(self, directory: Path, info: ShardInfo) -> None:
        self.info = info
        self.part = directory / (info.name + PART_SUFFIX)
        self.final = directory / info.name
        self.offset = 0
        self.contributors: dict[str, int] = {}
        self._hasher = hashlib.sha256()
        self._fd = -1

    def resume(self) -> None:
        """Open the `.part` file and hash what it already holds (blocking: run in a thread)."""
        self._fd = os.open(self.part, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(self._fd).st_size
        if size > self.info.size:
            os.ftruncate(self._fd, 0)
            size = 0
        offset, step = 0, 4 << 20
        while offset < size:
            chunk = os.pread(self._fd, min(step, size - offset), offset)
            if not chunk:
                break
            self._hasher.update(chunk)
            offset += len(chunk)
        self.offset = offset
        if offset:
            self.contributors["(disk)"] = offset

    def absorb(self, data: memoryview | bytes, source: str) -> None:
        """Hash and append received bytes (the caller never passes more than the shard's remaining size)."""
        self._hasher.update(data)
        view = memoryview(data)
        while view:
            written = os.pwrite(self._fd, view, self.offset)
            self.offset += written
            view = view[written:]
        self.contributors[source] = self.contributors.get(source, 0) + len(data)

    @property
    def remaining(self) -> int:
        return self.info.size - self.offset

    def commit(self, fsync: bool = False) -> None:
        """Rename `.part` to the shard's name if every byte arrived and the digest matches; else raise."""
        if self.offset != self.info.size or self._hasher.digest() != self.info.sha256:
            contributors = dict(self.contributors)
            self.discard()
            raise DigestMismatch(self.info.name, contributors)
        if fsync:
            os.fsync(self._fd)
        self.close()
        os.replace(self.part, self.final)

    def discard(self) -> None:
        """Forget every byte: a mixed or corrupt prefix cannot be trusted."""
        if self._fd >= 0:
            os.ftruncate(self._fd, 0)
        self.offset = 0
        self.contributors = {}
        self._hasher = hashlib.sha256()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class ShardStore:
    """The shard files of one run on local disk (blocking file operations: call from a thread if slow)."""

    def __init__(self, root: Path, run: str) -> None:
        self.dir = Path(root) / run
        self.dir.mkdir(parents=True, exist_ok=True)

    def partial_dir(self, version: int) -> Path:
        return self.dir / f"{version}{_PARTIAL}"

    def complete_dir(self, version: int) -> Path:
        return self.dir / str(version)

    def is_complete(self, version: int) -> bool:
        return self.complete_dir(version).is_dir()

    def versions_on_disk(self) -> dict[int, bool]:
        """Version → complete, for every version directory that holds a manifest."""
        found: dict[int, bool] = {}
        for entry in self.dir.iterdir():
            name, complete = (
                (entry.name[: -len(_PARTIAL)], False) if entry.name.endswith(_PARTIAL) else (entry.name, True)
            )
            if name.isdigit() and (entry / MANIFEST_FILE).is_file():
                found[int(name)] = found.get(int(name), False) or complete
        return found

    def _existing_dir(self, version: int) -> Path | None:
        for directory in (self.complete_dir(version), self.partial_dir(version)):
            if directory.is_dir():
                return directory
        return None

    def save_manifest(self, version: int, envelope: bytes) -> None:
        """Write the signed manifest into the version's directory (creating `<v>.partial/` if new)."""
        directory = self._existing_dir(version) or self.partial_dir(version)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / (MANIFEST_FILE + PART_SUFFIX)
        tmp.write_bytes(envelope)
        os.replace(tmp, directory / MANIFEST_FILE)

    def load_manifest(self, version: int) -> bytes | None:
        directory = self._existing_dir(version)
        if directory is None:
            return None
        try:
            return (directory / MANIFEST_FILE).read_bytes()
        except FileNotFoundError:
            return None

    def verified_shards(self, manifest: CheckpointManifest) -> set[int]:
        """Indices of shards present under their final name with the manifest's size (verified on arrival)."""
        directory = self._existing_dir(manifest.version)
        if directory is None:
            return set()
        held = set()
        for index, shard in enumerate(manifest.shards):
            try:
                if (directory / shard.name).stat().st_size == shard.size:
                    held.add(index)
            except FileNotFoundError:
                pass
        return held

    def open_verified(self, version: int, name: str) -> int | None:
        """An fd on a verified shard for serving, or None. Survives a concurrent completion rename."""
        for directory in (self.complete_dir(version), self.partial_dir(version), self.complete_dir(version)):
            try:
                return os.open(directory / name, os.O_RDONLY)
            except (FileNotFoundError, NotADirectoryError):
                continue
        return None

    def partial(self, version: int, info: ShardInfo) -> PartialShard:
        """The receiving state of one shard (call `resume()` on it, in a thread, before absorbing)."""
        directory = self.partial_dir(version)
        directory.mkdir(parents=True, exist_ok=True)
        return PartialShard(directory, info)

    def write_shard(self, version: int, name: str, data: bytes | memoryview) -> bytes:
        """Store a shard we produced ourselves (the origin) and return its sha256 (`write_hashed`)."""
        return write_hashed(self.partial_dir(version), name, data)

    def finalize(self, version: int, fsync: bool = False) -> Path:
        """Atomically publish a fully verified version: `<v>.partial/` becomes `<v>/`."""
        final = self.complete_dir(version)
        if final.is_dir():
            return final
        partial = self.partial_dir(version)
        for leftover in partial.glob("*" + PART_SUFFIX):
            leftover.unlink()
        if fsync:
            _fsync_dir(partial)
        os.rename(partial, final)
        if fsync:
            _fsync_dir(self.dir)
        return final

    def remove(self, versions: Iterable[int]) -> None:
        for version in versions:
            for directory in (self.complete_dir(version), self.partial_dir(version)):
                shutil.rmtree(directory, ignore_errors=True)


def write_hashed(directory: Path, name: str, data: bytes | memoryview) -> bytes:
    """Write `data` as `directory/name` (aside, then renamed into place) and return its sha256.

    Each chunk is hashed and then written while it is still in the CPU cache, so a producer reads its
    serialized bytes once instead of twice (hash, then write). The origin and every rank of a sharded
    trainer write their files through it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (name + PART_SUFFIX)
    hasher = hashlib.sha256()
    view = memoryview(data).cast("B")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        offset = 0
        while offset < len(view):
            chunk = view[offset : offset + WRITE_CHUNK]
            hasher.update(chunk)
            while chunk:
                written = os.pwrite(fd, chunk, offset)
                offset += written
                chunk = chunk[written:]
    finally:
        os.close(fd)
    os.replace(tmp, directory / name)
    return hasher.digest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""Fetch every shard of a checkpoint from many sources at once, verifying each against the manifest.

One scheduler per version starts a transfer whenever a slot is free and the source book offers a holder,
taking shards half-received first, then the rarest (fewest holders), ties in an order shuffled per node:
two relays fetching from the origin pick different shards, so each soon holds something the other and
the workers lack, and shards reach the next tier while the rest are still in flight (BitTorrent's rule).
A transfer streams straight into the shard's `.part` file, hashing as it writes; it resumes from the byte
where the last attempt stopped, from whichever source is chosen next. Failures are scored against the
source and the shard goes back to the queue:

- no byte for `stall_timeout` → Stalled; early close or reset → Truncated (bytes so far are kept);
- wrong status, length or Content-Range → BadResponse; 404 for a claimed shard → the claim is retracted;
- complete but wrong sha256 → the bytes are discarded and the source banned if it alone supplied them.

Hashing and writing run inline on the event loop in chunks of up to 1 MiB: measured here, handing each
chunk to a worker thread cost more (thread hops) than it gained; a chunk blocks the loop about 1 ms.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field

import trio

from swarmnode.node.dataplane.errors import BadResponse, Busy, FailureKind, NotHeld, PeerFault
from swarmnode.node.dataplane.http_client import RECV_LOW_WATER, ClientResponse, HttpClient
from swarmnode.node.dataplane.progress import NullProgress, ProgressSink
from swarmnode.node.dataplane.sources import SourceBook
from swarmnode.node.dataplane.store import DigestMismatch, PartialShard, ShardStore
from swarmnode.protocol.messages import CheckpointManifest, ShardInfo
from swarmnode.protocol.shards import parse_content_range, shard_path


@dataclass(frozen=True)
class DownloadConfig:
    parallel_shards: int = 8  # transfers at once, across all versions this downloader fetches
    stall_timeout: float = 10.0
    fsync: bool = False  # fsync each shard before it is renamed into place (power-loss durability)
    recv_low_water: int = RECV_LOW_WATER  # bytes a body read waits for before waking (http_client)


@dataclass
class DownloadStats:
    shards_verified: int = 0
    bytes_received: int = 0
    bytes_discarded: int = 0  # received, then thrown away for a digest mismatch
    failures: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        return {
            "shards_verified": self.shards_verified,
            "bytes_received": self.bytes_received,
            "bytes_discarded": self.bytes_discarded,
            "failures": dict(self.failures),
        }


class Downloader:
    def __init__(
        self,
        client: HttpClient,
        book: SourceBook,
        config: DownloadConfig = DownloadConfig(),
        *,
        rng: random.Random | None = None,
        progress: ProgressSink | None = None,
    ) -> None:
        self.client = client
        self.book = book
        self.config = config
        self.rng = rng or random.Random()
        self.progress: ProgressSink = progress or NullProgress()
        self.stats = DownloadStats()
        self._active = 0

    def statistics(self) -> dict[str, object]:
        return {**self.stats.as_dict(), "active_transfers": self._active}

    async def fetch(
        self,
        store: ShardStore,
        manifest: CheckpointManifest,
        held: set[int],
        on_verified: Callable[[int], None],
    ) -> None:
        """Return once every shard not in `held` is verified on disk (`on_verified(index)` for each).

        Runs until done or cancelled: with no source for a shard it waits for the book to change.
        """
        version = manifest.version
        pending = [i for i in range(len(manifest.shards)) if i not in held]
        rank = list(range(len(manifest.shards)))
        self.rng.shuffle(rank)
        partials: dict[int, PartialShard] = {}
        running: set[int] = set()
        done_bytes = sum(manifest.shards[i].size for i in held)
        self.progress.begin(version, manifest.total_size, done_bytes)
        try:
            async with trio.open_nursery() as nursery:
                while pending or running:
                    wake_at = self._start_ready(
                        nursery, store, manifest, pending, running, partials, rank, on_verified
                    )
                    with trio.move_on_at(wake_at):
                        await self.book.wait_changed()
        finally:
            for partial in partials.values():
                partial.close()
            self.progress.end(version)

    def _start_ready(
        self,
        nursery: trio.Nursery,
        store: ShardStore,
        manifest: CheckpointManifest,
        pending: list[int],
        running: set[int],
        partials: dict[int, PartialShard],
        rank: list[int],
        on_verified: Callable[[int], None],
    ) -> float:
        """Start every pending shard that has a free source and slot; return when to look again."""
        now = trio.current_time()
        wake_at = float("inf")
        holders = {i: len(self.book.holders(manifest, i)) for i in pending}
        started = {i for i, p in partials.items() if p.offset}
        for index in sorted(pending, key=lambda i: (i not in started, holders[i], rank[i])):
            if self._active >= self.config.parallel_shards:
                break
            source = self.book.pick(manifest, index, now, self.rng)
            if source is None:
                later = self.book.next_eligible(manifest, index, now)
                if later is not None:
                    wake_at = min(wake_at, later)
                continue
            pending.remove(index)
            running.add(index)
            self._active += 1
            self.book.began(source)
            nursery.start_soon(
                self._attempt, store, manifest, index, source, pending, running, partials, on_verified
            )
        return wake_at

    async def _attempt(
        self,
        store: ShardStore,
        manifest: CheckpointManifest,
        index: int,
        source: str,
        pending: list[int],
        running: set[int],
        partials: dict[int, PartialShard],
        on_verified: Callable[[int], None],
    ) -> None:
        """One transfer of one shard from one source; on any peer fault the shard is queued again."""
        info = manifest.shards[index]
        version = manifest.version
        started = trio.current_time()
        partial = partials.get(index)
        received = 0
        ok = scored = False
        try:
            if partial is None:
                partial = store.partial(version, info)
                await trio.to_thread.run_sync(partial.resume)
                partials[index] = partial
            before = partial.offset
            try:
                if partial.remaining:  # a crash between the last write and the rename leaves none
                    await self._transfer(manifest, info, partial, source)
            finally:
                received = max(0, partial.offset - before)
            partial.commit(self.config.fsync)
            ok = True
        except PeerFault as fault:
            self._count(fault.kind)
            if isinstance(fault, NotHeld):
                self.book.retract(source, version, index)
            self.book.failed(source, fault.kind, received, trio.current_time() - started, trio.current_time())
            scored = True
        except DigestMismatch as mismatch:
            self._count(FailureKind.BAD_HASH)
            self.stats.bytes_discarded += info.size
            self.progress.rewind(version, info.size)
            peers = [p for p in mismatch.contributors if p != "(disk)"]
            if peers:  # bytes from our own disk alone (a restart) are nobody's fault
                self.book.failed(
                    source, FailureKind.BAD_HASH, 0, trio.current_time() - started, trio.current_time()
                )
                scored = True
            for peer in peers:
                self.book.corrupt(peer, trio.current_time(), sole=len(peers) == 1)
        finally:
            self._active -= 1
            running.discard(index)
            if ok:
                partials.pop(index, None)
                self.stats.shards_verified += 1
                self.book.succeeded(source, received, trio.current_time() - started)
                on_verified(index)
            else:
                if not scored:  # cancelled, or our own failure: nobody to blame
                    self.book.ended(source)
                if index not in pending:
                    pending.append(index)
                    pending.sort()

    def _count(self, kind: FailureKind) -> None:
        self.stats.failures[kind.value] = self.stats.failures.get(kind.value, 0) + 1

    async def _transfer(
        self, manifest: CheckpointManifest, info: ShardInfo, partial: PartialShard, source: str
    ) -> None:
        """Stream the shard's missing tail from `source` into `partial` (kept on failure, for resuming)."""
        headers = [("range", f"bytes={partial.offset}-")] if partial.offset else []
        target = shard_path(manifest.run, manifest.version, info.name)
        async with self.client.request(source, "GET", target, headers) as response:
            _check_response(response, info, partial)
            async with aclosing(response.chunks(self.config.stall_timeout)) as chunks:
                async for chunk in chunks:
                    partial.absorb(chunk, source)
                    self.stats.bytes_received += len(chunk)
                    self.progress.advance(manifest.version, len(chunk))


def _check_response(response: ClientResponse, info: ShardInfo, partial: PartialShard) -> None:
    """The response must carry exactly the bytes we asked for; a 200 to a range restarts the shard."""
    url = response.endpoint.url()
    if response.status == 404:
        raise NotHeld(url, f"404 for {info.name}")
    if response.status == 503:
        raise Busy(url, "503")
    if response.status == 200:
        if response.content_length != info.size:
            raise BadResponse(url, f"{info.name}: {response.content_length} bytes, manifest says {info.size}")
        if partial.offset:
            partial.discard()  # the server ignored our Range: take the whole body
        return
    if response.status == 206:
        span = parse_content_range(response.headers.get("content-range", ""))
        if span != (partial.offset, info.size, info.size) or response.content_length != partial.remaining:
            raise BadResponse(url, f"{info.name}: Content-Range {span} for bytes {partial.offset}-")
        return
    raise BadResponse(url, f"{info.name}: unexpected status {response.status}")

"""Turn a gossiped `CheckpointHead` into its full signed manifest, fetched over HTTP (spec/shards.md, heads).

The `checkpoints` topic carries only the trainer-signed head: a manifest of a large model (up to 1.5 MiB)
does not fit one gossip message. A follower asks the sources it already knows (the origin and relays in
its `SourceBook`) for `GET /shards/1.0.0/<run>/<version>/manifest`, in this order: sources that claim the
head's (version, root) in a `ShardHave` first, then by score; banned sources never. A response is kept
only if the run's trainer signed it, it passes `check_manifest` and it is the manifest the head names
(`verify_manifest_for_head`). A source that answers with anything else is banned like one that served a
corrupt shard; one that does not hold the version yet (404) or fails is merely skipped. Passes over the
sources repeat with a doubling pause until one answers or `RESOLVE_TIMEOUT_S` runs out; a later head for
the same version (the trainer republishes) starts again. The caller runs at most one resolution per
version, each fetching one manifest at a time, every response capped at `MAX_MANIFEST_ENVELOPE` bytes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from swarmnode.node.dataplane.errors import PeerFault
from swarmnode.node.dataplane.http_client import HttpClient
from swarmnode.node.dataplane.sources import SourceBook
from swarmnode.protocol.errors import ProtocolError, Reject
from swarmnode.protocol.messages import CheckpointHead, CheckpointManifest
from swarmnode.protocol.shards import MAX_MANIFEST_ENVELOPE, manifest_path, verify_manifest_for_head

RETRY_BASE_S = 0.25  # pause after a pass over the sources found no matching manifest, doubling
RETRY_MAX_S = 4.0
RESOLVE_TIMEOUT_S = 300.0  # then the head is dropped (counted); the trainer's next republish retries


class Unresolved(Exception):
    """No source served the manifest a head names within `RESOLVE_TIMEOUT_S`."""


@dataclass
class ResolverStats:
    resolved: int = 0
    requests: int = 0
    not_held: int = 0  # 404 (or another status): the source does not hold the version yet
    faults: Counter[str] = field(default_factory=Counter)  # connection-level failures, by kind
    refused: Counter[str] = field(default_factory=Counter)  # manifests that did not verify, by reason
    timeouts: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "manifests_resolved": self.resolved,
            "manifest_requests": self.requests,
            "manifest_not_held": self.not_held,
            "manifest_faults": dict(self.faults),
            "manifests_refused": dict(self.refused),
            "resolve_timeouts": self.timeouts,
        }


class ManifestResolver:
    """Fetches the manifest a trusted head names from the book's sources. Time is trio's clock."""

    def __init__(
        self,
        client: HttpClient,
        book: SourceBook,
        *,
        trainer: bytes,
        clock_ms: Callable[[], int],
        timeout_s: float = RESOLVE_TIMEOUT_S,
        retry_s: tuple[float, float] = (RETRY_BASE_S, RETRY_MAX_S),
    ) -> None:
        self.client = client
        self.book = book
        self.trainer = trainer
        self.clock_ms = clock_ms
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.stats = ResolverStats()

    async def resolve(self, head: CheckpointHead) -> tuple[CheckpointManifest, bytes]:
        """The manifest `head` names and its signed envelope; Unresolved past the timeout."""
        pause = self.retry_s[0]
        with trio.move_on_after(self.timeout_s):
            while True:
                sources = self.book.manifest_sources(head.version, head.merkle_root, trio.current_time())
                for endpoint in sources:
                    found = await self._ask(endpoint, head)
                    if found is not None:
                        self.stats.resolved += 1
                        return found
                with trio.move_on_after(pause):
                    if not sources:
                        await self.book.wait_changed()  # a first source may appear any moment
                    else:
                        await trio.sleep_forever()
                pause = min(pause * 2, self.retry_s[1])
        self.stats.timeouts += 1
        raise Unresolved(f"no source served the manifest of version {head.version} in {self.timeout_s:g} s")

    async def _ask(self, endpoint: str, head: CheckpointHead) -> tuple[CheckpointManifest, bytes] | None:
        self.stats.requests += 1
        try:
            status, _, body = await self.client.get(
                endpoint, manifest_path(head.run, head.version), MAX_MANIFEST_ENVELOPE
            )
        except PeerFault as fault:
            self.stats.faults[fault.kind.value] += 1
            return None
        if status != 200:
            self.stats.not_held += 1
            return None
        try:
            manifest = await trio.to_thread.run_sync(
                lambda: verify_manifest_for_head(body, head, trainer=self.trainer, now_ms=self.clock_ms())
            )
        except ProtocolError as verdict:
            self.stats.refused[verdict.reason.name] += 1
            if isinstance(verdict, Reject):  # not the trainer's, not well formed, or not the head's
                self.book.corrupt(endpoint, trio.current_time(), sole=True)
            return None
        return manifest, body

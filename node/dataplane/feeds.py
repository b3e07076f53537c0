"""HTTP stand-ins for the control plane: learn manifests and shard availability by long-polling peers.

With gossip and the DHT wired in, checkpoint heads arrive on `swarm/<run>/checkpoints` and `ShardHave` on
`swarm/<run>/shards`; until then (and as a fallback behind NAT'd gossip) a node can follow the same facts
from the HTTP endpoints of peers it knows: `latest?after=V` for manifests, `have?after=N` per version.
Both feed the same interfaces the control plane uses: a channel of manifest envelopes and the SourceBook.
Nothing here is trusted: manifests are verified by the Follower, `ShardHave` envelopes here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import trio
import trio.lowlevel

from swarmnode.node.dataplane.catalog import Catalog
from swarmnode.node.dataplane.errors import PeerFault
from swarmnode.node.dataplane.http_client import HttpClient
from swarmnode.node.dataplane.sources import SourceBook
from swarmnode.protocol.errors import ProtocolError
from swarmnode.protocol.messages import CheckpointManifest
from swarmnode.protocol.shards import MAX_MANIFEST_ENVELOPE, have_path, latest_manifest_path, verify_have
from swarmnode.protocol.types import KIB

MAX_MANIFEST_BYTES = MAX_MANIFEST_ENVELOPE
MAX_HAVE_BYTES = 8 * KIB


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def follow_manifests(
    client: HttpClient,
    endpoints: list[str],
    catalog: Catalog,
    out: trio.MemorySendChannel[bytes],
    *,
    wait_s: int = 20,
    retry_s: float = 0.5,
) -> None:
    """Long-poll each endpoint's `latest` manifest and pass every new envelope to `out` (unverified)."""
    async with trio.open_nursery() as nursery:
        for endpoint in endpoints:
            nursery.start_soon(_follow_one, client, endpoint, catalog, out.clone(), wait_s, retry_s)
    await out.aclose()


async def _follow_one(
    client: HttpClient,
    endpoint: str,
    catalog: Catalog,
    out: trio.MemorySendChannel[bytes],
    wait_s: int,
    retry_s: float,
) -> None:
    last: bytes | None = None
    backoff = retry_s
    async with out:
        while True:
            target = latest_manifest_path(catalog.run, catalog.latest_version, wait_s)
            try:
                status, _, body = await client.get(
                    endpoint, target, MAX_MANIFEST_BYTES, head_timeout=wait_s + 5
                )
            except PeerFault:
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = retry_s
            if status == 200 and body != last:
                last = body
                await out.send(body)
                await trio.lowlevel.checkpoint()  # let the follower judge it before asking again
            elif status != 204:
                await trio.sleep(retry_s)  # 404 (nothing yet), the same rejected manifest again, or an error


async def follow_haves(
    client: HttpClient,
    endpoints: Mapping[str, float],
    catalog: Catalog,
    book: SourceBook,
    *,
    wait_s: int = 10,
    retry_s: float = 0.25,
) -> None:
    """Track what each endpoint holds of every version this node is still fetching; feed the book.

    `endpoints` maps each endpoint to its weight in the book (e.g. the origin below 1 so relays carry the
    load). Polling a version stops once it is complete here or the endpoint holds all of it.
    """
    for endpoint, weight in endpoints.items():
        book.add(endpoint, weight)
    polling: set[tuple[str, int]] = set()  # (endpoint, version) being polled or known to be whole there
    async with trio.open_nursery() as nursery:
        while True:
            for version in catalog.versions():
                entry = catalog.get(version)
                if entry is None or entry.complete:
                    continue
                for endpoint in endpoints:
                    if (endpoint, version) not in polling:
                        polling.add((endpoint, version))
                        nursery.start_soon(
                            _poll_have,
                            client,
                            endpoint,
                            entry.manifest,
                            catalog,
                            book,
                            polling,
                            wait_s,
                            retry_s,
                        )
            await catalog.wait_changed()


async def _poll_have(
    client: HttpClient,
    endpoint: str,
    manifest: CheckpointManifest,
    catalog: Catalog,
    book: SourceBook,
    polling: set[tuple[str, int]],
    wait_s: int,
    retry_s: float,
) -> None:
    version = manifest.version
    known = -1
    try:
        while known < len(manifest.shards):
            entry = catalog.get(version)
            if entry is None or entry.complete:
                polling.discard((endpoint, version))
                return
            target = have_path(manifest.run, version, known if known >= 0 else None, wait_s)
            try:
                status, _, body = await client.get(endpoint, target, MAX_HAVE_BYTES, head_timeout=wait_s + 5)
            except PeerFault:
                await trio.sleep(retry_s * 4)
                continue
            if status != 200:
                await trio.sleep(retry_s)
                continue
            try:
                have = verify_have(body, manifest, endpoint, now_ms=_now_ms())
            except ProtocolError:
                await trio.sleep(retry_s * 4)  # a peer sending junk: ask it rarely
                continue
            book.observe(have)
            count = bin(int.from_bytes(have.bitfield, "big")).count("1")
            if count <= known:
                await trio.sleep(retry_s)
            known = max(known, count)
        return  # the endpoint holds every shard: keep the pair in `polling` so it is not asked again
    except BaseException:
        polling.discard((endpoint, version))
        raise

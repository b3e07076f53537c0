"""The shard HTTP endpoints (spec/shards.md, Endpoints): what origins, relays and serving workers answer.

Answers come from the node's `Catalog` (what is verified) and `ShardStore` (the files); nothing that has
not verified against the trainer-signed manifest is ever served. Long polls (`latest` and `have` with
`?after=N&wait=S`) let followers learn of a new version or newly verified shards within milliseconds
without the control plane; with gossip they are merely a fallback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import trio

from swarmnode.node.dataplane.catalog import Catalog
from swarmnode.node.dataplane.http_server import (
    BytesBody,
    FileBody,
    Request,
    Response,
    ServerStats,
    simple_response,
)
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.protocol.messages import ShardHave
from swarmnode.protocol.shards import (
    Route,
    Unsatisfiable,
    content_range,
    encode_bitfield,
    parse_range,
    parse_route,
)

MSGPACK = "application/msgpack"
OCTETS = "application/octet-stream"
MAX_WAIT_S = 30

Sealer = Callable[[Any], bytes]  # signs a message into an envelope with this node's identity


class ShardService:
    """Request handler for one run: manifests, shards (GET/HEAD, Range), `have`, statistics."""

    def __init__(
        self,
        catalog: Catalog,
        store: ShardStore,
        *,
        endpoint: str,
        seal: Sealer,
        server_stats: ServerStats | None = None,
        extra_stats: Callable[[], dict[str, object]] | None = None,
    ) -> None:
        self.catalog = catalog
        self.store = store
        self.endpoint = endpoint
        self.seal = seal
        self.server_stats = server_stats
        self.extra_stats = extra_stats
        self._have_cache: dict[int, tuple[int, bytes]] = {}

    async def __call__(self, request: Request) -> Response:
        route = parse_route(request.target, MAX_WAIT_S)
        if route is None:
            return simple_response(404, "no such path")
        if route.kind == "stats":
            return _msgpack(self.statistics())
        if route.run != self.catalog.run:
            return simple_response(404, f"run {route.run} is not served here")
        if route.kind == "shard":
            return self._shard(route, request.headers.get("range"))
        if route.kind == "latest":
            return await self._latest(route)
        if route.kind == "manifest":
            entry = self.catalog.get(route.version)
            if entry is None:
                return simple_response(404, f"version {route.version} unknown")
            return Response(200, [("content-type", MSGPACK)], BytesBody(entry.envelope))
        return await self._have(route)

    def statistics(self) -> dict[str, object]:
        stats: dict[str, object] = {"endpoint": self.endpoint, **self.catalog.statistics()}
        if self.server_stats is not None:
            stats["server"] = self.server_stats.as_dict()
        if self.extra_stats is not None:
            stats.update(self.extra_stats())
        return stats

    async def _latest(self, route: Route) -> Response:
        entry = None
        with trio.move_on_after(route.wait_s):
            entry = await self.catalog.wait_newer_than(route.after)
        if entry is None:
            return Response(204) if route.wait_s else simple_response(404, "no manifest yet")
        return Response(200, [("content-type", MSGPACK)], BytesBody(entry.envelope))

    async def _have(self, route: Route) -> Response:
        with trio.move_on_after(route.wait_s):
            await self.catalog.wait_held_more_than(route.version, route.after)
        entry = self.catalog.get(route.version)  # as it is now, on a timeout too
        if entry is None:
            return simple_response(404, f"version {route.version} unknown")
        count = len(entry.held)
        for stale in [v for v in self._have_cache if self.catalog.get(v) is None]:
            del self._have_cache[stale]
        cached = self._have_cache.get(route.version)
        if cached is None or cached[0] != count:
            manifest = entry.manifest
            have = ShardHave(
                run=manifest.run,
                version=manifest.version,
                merkle_root=manifest.merkle_root,
                bitfield=encode_bitfield(entry.held, len(manifest.shards)),
                endpoint=self.endpoint,
            )
            cached = self._have_cache[route.version] = (count, self.seal(have))
        return Response(200, [("content-type", MSGPACK)], BytesBody(cached[1]))

    def _shard(self, route: Route, range_header: str | None) -> Response:
        entry = self.catalog.get(route.version)
        info = entry.held_shard(route.name) if entry is not None else None
        if info is None:
            return simple_response(404, f"{route.name} of version {route.version} is not held here")
        size = info.size
        try:
            span = parse_range(range_header, size)
        except Unsatisfiable:
            return simple_response(416, "range not satisfiable", [("content-range", f"bytes */{size}")])
        fd = self.store.open_verified(route.version, route.name)
        if fd is None:
            return simple_response(404, f"{route.name} of version {route.version} was pruned")
        headers = [
            ("content-type", OCTETS),
            ("accept-ranges", "bytes"),
            ("etag", f'"{info.sha256.hex()}"'),
            ("cache-control", "public, max-age=31536000, immutable"),
        ]
        if span is None:
            return Response(200, headers, FileBody(fd, 0, size))
        start, end = span
        headers.append(("content-range", content_range(start, end, size)))
        return Response(206, headers, FileBody(fd, start, end - start))


def _msgpack(value: dict[str, object]) -> Response:
    return Response(200, [("content-type", MSGPACK)], BytesBody(msgpack.packb(value, use_bin_type=True)))

"""A misbehaving shard server, for fault tests and demos: never part of an honest node.

`FaultyService` wraps the `ShardService` of a relay that really holds the shards and answers shard
requests with the genuine bytes spoiled by one chosen fault; `forge` instead serves, as the latest
manifest, one signed by the bad node's own key. Each is something a real peer can do, and the downloader
must survive all of them without loading a bad byte or hanging.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from enum import StrEnum

import trio

from swarmnode.node.dataplane.http_server import BytesBody, Request, Response, StreamBody
from swarmnode.node.dataplane.origin import Sealer
from swarmnode.node.dataplane.shard_endpoints import MSGPACK, OCTETS, ShardService
from swarmnode.protocol.messages import CheckpointManifest
from swarmnode.protocol.shards import Unsatisfiable, content_range, parse_range, parse_route
from swarmnode.protocol.types import MIB


class Fault(StrEnum):
    CORRUPT = "corrupt"  # right length, one byte flipped
    TRUNCATE = "truncate"  # announces the full length, closes halfway
    STALL = "stall"  # sends half, then nothing, connection held open
    SHORT = "short"  # a complete response that is shorter than the shard
    FORGE = "forge"  # a manifest signed by someone other than the trainer


class FaultyService:
    def __init__(self, inner: ShardService, fault: Fault, forger: Sealer | None = None) -> None:
        self.inner = inner
        self.fault = fault
        self.forger = forger
        self.faulty_responses = 0

    async def __call__(self, request: Request) -> Response:
        route = parse_route(request.target, 30)
        if route is None:
            return await self.inner(request)
        if self.fault is Fault.FORGE and route.kind == "latest":
            forged = self._forged()
            if forged is not None:
                self.faulty_responses += 1
                return Response(200, [("content-type", MSGPACK)], BytesBody(forged))
        if route.kind == "shard" and self.fault is not Fault.FORGE:
            entry = self.inner.catalog.get(route.version)
            info = entry.held_shard(route.name) if entry is not None else None
            fd = self.inner.store.open_verified(route.version, route.name) if info is not None else None
            if info is not None and fd is not None:
                self.faulty_responses += 1
                return self._faulty_shard(fd, info.size, request.headers.get("range"))
        return await self.inner(request)

    def _forged(self) -> bytes | None:
        latest = self.inner.catalog.latest
        if latest is None or self.forger is None:
            return None
        real = latest.manifest
        fake = CheckpointManifest(
            run=real.run,
            version=real.version + 1000,
            parent_version=real.version,
            model_config_hash=real.model_config_hash,
            total_size=real.total_size,
            shards=real.shards,
            merkle_root=real.merkle_root,
            created_ms=real.created_ms,
        )
        return self.forger(fake)

    def _faulty_shard(self, fd: int, size: int, range_header: str | None) -> Response:
        """The real bytes of the shard, spoiled by the fault."""
        try:
            span = parse_range(range_header, size)
        except Unsatisfiable:
            os.close(fd)
            return Response(416, [("content-range", f"bytes */{size}")])
        start, end = span or (0, size)
        headers = [("content-type", OCTETS)]
        status = 200
        if span is not None:
            status = 206
            headers.append(("content-range", content_range(start, end, size)))
        length = end - start
        if self.fault is Fault.SHORT:
            data = os.pread(fd, length // 2, start)
            os.close(fd)
            return Response(status, headers, BytesBody(data))
        return Response(status, headers, StreamBody(length, lambda: self._chunks(fd, start, length)))

    async def _chunks(self, fd: int, start: int, length: int) -> AsyncIterator[bytes]:
        try:
            limit = length if self.fault is Fault.CORRUPT else length // 2
            flip = length // 2  # CORRUPT: one byte in the middle, the rest genuine
            sent = 0
            while sent < limit:
                chunk = bytearray(os.pread(fd, min(MIB, limit - sent), start + sent))
                if not chunk:
                    return
                if self.fault is Fault.CORRUPT and sent <= flip < sent + len(chunk):
                    chunk[flip - sent] ^= 0xFF
                yield bytes(chunk)
                sent += len(chunk)
        finally:
            os.close(fd)
        if self.fault is Fault.STALL:
            await trio.sleep_forever()

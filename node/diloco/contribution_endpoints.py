"""The HTTP endpoints of a DiLoCo trainer (spec/diloco.md, Endpoints), on the data plane's server.

`/diloco/1.0.0/...` answers from the `Holdings` (the run, our outer state, contributions we hold, our
votes), with long polls; `/shards/1.0.0/<namespace>/...` is handed to that namespace's `ShardService`, so
contribution and outer-state shards are served exactly like checkpoint shards (Range, ETag, `have`).
Every body is a signed envelope or a verified shard: nothing here needs to be trusted by the fetcher.
"""

from __future__ import annotations

from collections.abc import Callable

import msgpack
import trio

from swarmnode.node.dataplane.http_server import (
    BytesBody,
    Handler,
    Request,
    Response,
    ServerStats,
    simple_response,
)
from swarmnode.node.dataplane.shard_endpoints import MSGPACK
from swarmnode.node.diloco.holdings import Holdings
from swarmnode.protocol import diloco as rules
from swarmnode.protocol import shards

MAX_WAIT_S = 30


class DilocoService:
    """Request handler for one trainer of one DiLoCo run."""

    def __init__(
        self, holdings: Holdings, *, extra_stats: Callable[[], dict[str, object]] | None = None
    ) -> None:
        self.holdings = holdings
        self.server_stats: ServerStats | None = None
        self.extra_stats = extra_stats

    async def __call__(self, request: Request) -> Response:
        target = request.target
        if target.startswith(shards.PATH_PREFIX + "/"):
            shard_route = shards.parse_route(target, MAX_WAIT_S)
            if shard_route is None:
                return simple_response(404, "no such path")
            if shard_route.kind == "stats":
                return _msgpack(self.statistics())
            ns = self.holdings.namespaces.get(shard_route.run)
            if ns is None:
                return simple_response(404, f"namespace {shard_route.run} is not served here")
            return await ns.service(request)
        route = rules.parse_route(target, MAX_WAIT_S)
        if route is None or route.run != self.holdings.plan.run:
            return simple_response(404, "no such path")
        if route.kind == "plan":
            return _envelope(self.holdings.plan_envelope)
        if route.kind == "outer":
            return await self._outer(route)
        if route.kind == "vote":
            return await self._poll(route, lambda: self.holdings.votes.get(route.round))
        return await self._poll(route, lambda: self._contribution(route))

    def _contribution(self, route: rules.Route) -> bytes | None:
        held = self.holdings.contribution(route.round, route.trainer)
        return None if held is None else held.envelope

    async def _poll(self, route: rules.Route, lookup: Callable[[], bytes | None]) -> Response:
        with trio.move_on_after(route.wait_s):
            while (found := lookup()) is None:
                await self.holdings.wait_changed()
        found = lookup()
        if found is None:
            return Response(204) if route.wait_s else simple_response(404, "not held")
        return _envelope(found)

    async def _outer(self, route: rules.Route) -> Response:
        def newer() -> bytes | None:
            held = self.holdings.outer
            if held is None or held.state.message.round <= route.after:
                return None
            return held.envelope

        return await self._poll(route, newer)

    def statistics(self) -> dict[str, object]:
        stats: dict[str, object] = {"diloco": self.holdings.statistics()}
        if self.server_stats is not None:
            stats["server"] = self.server_stats.as_dict()
        if self.extra_stats is not None:
            stats.update(self.extra_stats())
        return stats


def mounted(checkpoints: Handler, service: DilocoService) -> Handler:
    """One endpoint for an RL trainer of a multi-trainer run: DiLoCo paths and namespaces go to `service`,
    everything else (the run's checkpoint shards) to `checkpoints`."""

    async def handle(request: Request) -> Response:
        target = request.target
        if target.startswith(rules.PATH_PREFIX + "/"):
            return await service(request)
        if target.startswith(shards.PATH_PREFIX + "/"):
            route = shards.parse_route(target, MAX_WAIT_S)
            if route is not None and route.run in service.holdings.namespaces:
                return await service(request)
        return await checkpoints(request)

    return handle


def _envelope(data: bytes) -> Response:
    return Response(200, [("content-type", MSGPACK)], BytesBody(data))


def _msgpack(value: dict[str, object]) -> Response:
    return Response(
        200, [("content-type", MSGPACK)], BytesBody(msgpack.packb(value, use_bin_type=True, default=str))
    )

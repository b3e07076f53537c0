"""Probe: a role-less node for measurements and tests. It joins like any node (bootstrap address only),
publishes numbered `ShardHave` probes at a fixed rate on a topic, and times DHT provider lookups.

A probe's ShardHave holds nothing (empty bitfield, version 0), so real relays and workers can safely
ignore it; its `endpoint` carries `probe/<index>/<wall-clock ns at publish>` so receivers that record
deliveries (node.runtime, `record_deliveries`) yield one-way latencies on a single machine.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import ClassVar

import trio

from swarmnode.node.p2p.gossip import Delivery
from swarmnode.node.p2p.records import ROLES, role_key
from swarmnode.node.roles.base import RoleNet, RoleService
from swarmnode.protocol.messages import ShardHave

log = logging.getLogger(__name__)

PROBE_PREFIX = "probe/"


@dataclass
class ProbePlan:
    kind: str = "shards"
    rate: float = 1.0  # messages per second
    count: int = 0
    wait_subscribers: int = 1  # publish once this many peers subscribe to the topic
    wait_timeout: float = 60.0
    lookups: int = 0  # provider lookups of every role, timed
    linger: float = 2.0  # stay connected after the last publication so it propagates


@dataclass
class ProbeReport:
    published: list[tuple[int, int]] = field(default_factory=list)  # (index, wall ns)
    subscribers_seen: int = 0
    lookups: dict[str, list[float]] = field(default_factory=dict)
    lookup_found: dict[str, list[list[str]]] = field(default_factory=dict)  # peer ids per lookup


def probe_tag(index: int, wall_ns: int) -> str:
    return f"{PROBE_PREFIX}{index}/{wall_ns}"


def parse_probe_tag(tag: str) -> tuple[int, int] | None:
    if not tag.startswith(PROBE_PREFIX):
        return None
    parts = tag[len(PROBE_PREFIX) :].split("/")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


class ProbeWork:
    def __init__(self, plan: ProbePlan) -> None:
        self.plan = plan
        self.report = ProbeReport()
        self.done = trio.Event()

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        return None

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        plan = self.plan
        with trio.move_on_after(plan.wait_timeout):
            while net.gossip.topic_peers(plan.kind) < plan.wait_subscribers:  # noqa: ASYNC110 - libp2p state
                await trio.sleep(0.1)
        self.report.subscribers_seen = net.gossip.topic_peers(plan.kind)
        for _ in range(plan.lookups):
            for role in ROLES:
                started = trio.current_time()
                found = await net.discovery.find_providers(role_key(net.run, role))
                self.report.lookups.setdefault(role, []).append(trio.current_time() - started)
                self.report.lookup_found.setdefault(role, []).append(sorted(str(p.peer_id) for p in found))
        if plan.count:
            await self._publish(net)
        await trio.sleep(plan.linger)
        self.done.set()
        await trio.sleep_forever()

    async def _publish(self, net: RoleNet) -> None:
        plan = self.plan
        interval = 1.0 / plan.rate
        start = trio.current_time()
        for index in range(plan.count):
            await trio.sleep_until(start + index * interval)
            wall = time.time_ns()
            message = ShardHave(
                run=net.run, version=0, merkle_root=bytes(32), bitfield=b"", endpoint=probe_tag(index, wall)
            )
            await net.publish(plan.kind, message)
            self.report.published.append((index, wall))


class Probe(RoleService):
    ROLE: ClassVar[str] = "probe"
    SUBSCRIBES: ClassVar[tuple[str, ...]] = ()
    NEEDS: ClassVar[tuple[str, ...]] = ()
    ANNOUNCE: ClassVar[bool] = False
    FETCH_RUN_RECORD: ClassVar[bool] = False

    def __init__(self, plan: ProbePlan) -> None:
        self.probe_work = ProbeWork(plan)
        super().__init__(self.probe_work)

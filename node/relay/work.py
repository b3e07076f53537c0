"""Relay work: follow every retained checkpoint, re-serve its verified shards, announce what it holds.

A relay announces a version twice over: as a DHT provider of the version (`RoleNet.provide_checkpoint`,
stopped when the version is pruned) and with a signed `ShardHave` on the `shards` topic, repeated every
`ANNOUNCE_INTERVAL` for the versions it holds (gossip drops; late joiners need it too).
"""

from __future__ import annotations

import logging

import trio

from swarmnode.node.config import NodeConfig
from swarmnode.node.dataplane.follower import VerifiedCheckpoint
from swarmnode.node.p2p.gossip import Delivery
from swarmnode.node.roles.base import RoleNet
from swarmnode.node.roles.follow import SwarmFollower
from swarmnode.protocol.messages import ShardHave
from swarmnode.protocol.shards import encode_bitfield

log = logging.getLogger(__name__)

ANNOUNCE_INTERVAL = 10.0


def full_have(checkpoint: VerifiedCheckpoint, endpoint: str) -> ShardHave:
    """The claim that `endpoint` holds every shard of a verified checkpoint."""
    manifest = checkpoint.manifest
    count = len(manifest.shards)
    return ShardHave(
        run=manifest.run,
        version=manifest.version,
        merkle_root=manifest.merkle_root,
        bitfield=encode_bitfield(range(count), count),
        endpoint=endpoint,
    )


class SwarmRelayWork:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.follower: SwarmFollower | None = None
        self.held: dict[int, ShardHave] = {}
        self.announced = 0

    def status(self) -> dict[str, object]:
        stats = self.follower.statistics() if self.follower is not None else {}
        server = stats.get("server", {})
        return {
            "versions_held": sorted(self.held),
            "announced": self.announced,
            "bytes_served": server.get("bytes_served", 0) if isinstance(server, dict) else 0,
            "data_plane": stats,
        }

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.follower = SwarmFollower(net, self.config, newest_only=False, serve=True)
        send, receive = trio.open_memory_channel[VerifiedCheckpoint](8)
        async with trio.open_nursery() as nursery:
            task_status.started()
            endpoint = await nursery.start(self.follower.run, send)
            nursery.start_soon(self._reannounce, net)
            async for checkpoint in receive:
                await self._hold(net, checkpoint, endpoint)

    async def _hold(self, net: RoleNet, checkpoint: VerifiedCheckpoint, endpoint: str) -> None:
        version = checkpoint.manifest.version
        have = full_have(checkpoint, endpoint)
        self.held[version] = have
        log.info("holding checkpoint", extra={"version": version})
        await net.publish("shards", have)
        self.announced += 1
        self._forget_pruned(net)
        await net.provide_checkpoint(version)

    def _forget_pruned(self, net: RoleNet) -> None:
        assert self.follower is not None and self.follower.node is not None
        kept = set(self.follower.node.catalog.versions())
        for version in [v for v in self.held if v not in kept]:
            del self.held[version]
            net.stop_providing_checkpoint(version)

    async def _reannounce(self, net: RoleNet) -> None:
        while True:
            await trio.sleep(ANNOUNCE_INTERVAL)
            if self.follower is not None and self.follower.node is not None:
                self._forget_pruned(net)
            for have in list(self.held.values()):
                await net.publish("shards", have)
                self.announced += 1

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        if self.follower is not None:
            await self.follower.on_gossip(delivery)

"""Follow a run's checkpoints through the swarm: the data plane (node.dataplane) joined to the control plane.

Facts arrive three ways and feed the same `FollowerNode` (which trusts none of them):
- gossip `checkpoints`: the trainer's signed `CheckpointHead` → the follower's manifest channel, which
  fetches the full manifest it names from the HTTP sources below (`node.dataplane.heads`);
- gossip `shards`: a peer's `ShardHave` → the source book, only when its endpoint is the one the sender
  announced in its signed Hello (nobody can point others at a third party's server);
- HTTP long polls of every relay (and, for relays and validators, the trainer) found through the DHT:
  `latest` manifests and `have` bitfields. Gossip is fast but drops under load; the polls are the
  floor that makes a missed message cost latency, never progress.

Only the descriptor's lead `trainer` is a trainer-role source: the co-trainers of a multi-trainer (DiLoCo)
run provide role "trainer" too, but serve no checkpoint of this run (`checkpoint_sources`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import trio

from swarmnode.node.config import NodeConfig
from swarmnode.node.dataplane.feeds import follow_haves, follow_manifests
from swarmnode.node.dataplane.follower import VerifiedCheckpoint
from swarmnode.node.dataplane.http_server import ServerConfig
from swarmnode.node.dataplane.roles import FollowerNode, FollowerNodeConfig
from swarmnode.node.p2p.gossip import Delivery
from swarmnode.node.p2p.peers import PeerRecord
from swarmnode.node.roles.base import RoleNet
from swarmnode.protocol.codec import encode
from swarmnode.protocol.errors import ProtocolError
from swarmnode.protocol.messages import CheckpointHead, ShardHave
from swarmnode.protocol.shards import check_have

log = logging.getLogger(__name__)

SOURCE_ROLES = {"relay": 1.0, "trainer": 0.3}  # the origin weighs less, so relays carry the load
WATCH_INTERVAL = 1.0


def checkpoints_dir(config: NodeConfig) -> Path:
    return config.data_dir / "checkpoints"


def checkpoint_sources(found: Mapping[str, Sequence[PeerRecord]], lead: bytes) -> list[tuple[str, float]]:
    """The HTTP endpoints to follow and their weights: every relay, and of the trainers only the lead."""
    sources = []
    for role, weight in SOURCE_ROLES.items():
        for peer in found.get(role, ()):
            if peer.http_endpoint and (role != "trainer" or peer.address == lead):
                sources.append((peer.http_endpoint, weight))
    return sources


class SwarmFollower:
    """A FollowerNode fed by gossip and by the HTTP feeds of the relays (and trainer) the DHT finds."""

    def __init__(self, net: RoleNet, config: NodeConfig, *, newest_only: bool, serve: bool) -> None:
        self.net = net
        self.config = config
        self.newest_only = newest_only
        self.serve = serve
        self.node: FollowerNode | None = None
        self.followed: set[str] = set()
        self.gossip_heads = 0
        self.gossip_haves = 0
        self.haves_refused = 0
        self.manifests_dropped = 0

    def statistics(self) -> dict[str, object]:
        counts = {
            "endpoints_followed": sorted(self.followed),
            "gossip_heads": self.gossip_heads,
            "gossip_haves": self.gossip_haves,
            "haves_refused": self.haves_refused,
            "manifests_dropped": self.manifests_dropped,
        }
        return counts | (self.node.statistics() if self.node is not None else {})

    async def run(
        self,
        completed: trio.MemorySendChannel[VerifiedCheckpoint],
        *,
        task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Wait for the run's descriptor (it names the trainer, the only manifest signer), then follow."""
        record = await self.net.wait_run_record()
        descriptor = record.descriptor
        server = ServerConfig(host=self.config.http_host, port=self.config.http_port)
        self.node = FollowerNode(
            FollowerNodeConfig(
                root=checkpoints_dir(self.config),
                run=self.net.run,
                trainer=descriptor.trainer,
                identity=self.net.identity,
                newest_only=self.newest_only,
                serve=self.serve,
                async_level=descriptor.async_level,
                server=server,
            )
        )
        async with trio.open_nursery() as nursery:
            endpoint = await nursery.start(self.node.run, completed)
            nursery.start_soon(self._watch_sources, nursery, descriptor.trainer)
            task_status.started(endpoint)

    async def _watch_sources(self, nursery: trio.Nursery, lead: bytes) -> None:
        """Start the HTTP feeds of every newly found source (a restarted one may come back elsewhere)."""
        node = self.node
        assert node is not None
        while True:
            found = {role: self.net.peers(role) for role in SOURCE_ROLES}
            for endpoint, weight in checkpoint_sources(found, lead):
                if endpoint in self.followed or endpoint == node.endpoint:
                    continue
                self.followed.add(endpoint)
                log.info("following checkpoint source", extra={"endpoint": endpoint})
                node.book.add(endpoint, weight)
                nursery.start_soon(
                    follow_manifests, node.client, [endpoint], node.catalog, node.manifests.clone()
                )
                nursery.start_soon(follow_haves, node.client, {endpoint: weight}, node.catalog, node.book)
            await trio.sleep(WATCH_INTERVAL)

    def _announced_endpoint(self, address: bytes) -> str | None:
        directory = self.net.directory
        if directory is None:
            return None
        for record in directory.records.values():
            if record.address == address:
                return record.http_endpoint
        return None

    async def on_gossip(self, delivery: Delivery) -> bool:
        """Take a `checkpoints` or `shards` delivery; False for anything else (or before the run is known)."""
        node = self.node
        message = delivery.opened.message
        if node is None:
            return False
        if isinstance(message, CheckpointHead):
            self.gossip_heads += 1
            try:
                node.manifests.send_nowait(encode(delivery.opened.envelope))
            except trio.WouldBlock:
                self.manifests_dropped += 1  # the HTTP long poll brings the manifest too
            return True
        if isinstance(message, ShardHave):
            self.gossip_haves += 1
            self._observe_have(message, delivery.opened.sender)
            return True
        return False

    def _observe_have(self, have: ShardHave, sender: bytes) -> None:
        node = self.node
        assert node is not None
        if have.endpoint != self._announced_endpoint(sender):
            self.haves_refused += 1
            return
        entry = node.catalog.get(have.version)
        if entry is None or entry.complete:
            return
        try:
            check_have(have, entry.manifest)
        except ProtocolError:
            self.haves_refused += 1
            return
        node.book.observe(have)

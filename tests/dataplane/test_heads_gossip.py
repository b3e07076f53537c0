"""Done when (issue #20): the manifest of a 32B-parameter checkpoint is announced on gossip and resolved end
to end over HTTP, and so is the largest manifest the codec admits (8192 shards, 128-character names).

Two real libp2p hosts (NodeRuntime: Noise, yamux, Kademlia, GossipSub with our validators). The trainer
holds only the signed manifest in its store (no weights) and gossips the catalog entry's head, as the
trainer work does; the receiver's follower verifies the head, asks the trainer's HTTP endpoint (found in
its signed Hello) for the manifest, and keeps it only when it is the one the head names. No `latest` long
poll runs, so the manifest can only have come by way of the head.
"""

from __future__ import annotations

import hashlib
import secrets
from pathlib import Path

import pytest
import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.merkle import merkle_root
from swarmnode.node.dataplane.catalog import Catalog
from swarmnode.node.dataplane.downloader import Downloader
from swarmnode.node.dataplane.follower import Follower, FollowerConfig
from swarmnode.node.dataplane.http_client import HttpClient
from swarmnode.node.dataplane.http_server import ServerConfig
from swarmnode.node.dataplane.roles import OriginNode
from swarmnode.node.dataplane.sources import SourceBook
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.node.p2p.gossip import MAX_GOSSIP_ENVELOPE, Delivery
from swarmnode.node.p2p.ports import free_port
from swarmnode.node.relay.service import Relay
from swarmnode.node.roles.base import RoleNet
from swarmnode.node.runtime import NodeRuntime
from swarmnode.node.trainer.service import IdleTrainerWork, Trainer
from swarmnode.protocol.codec import encode
from swarmnode.protocol.messages import CheckpointHead, CheckpointManifest, ShardInfo
from swarmnode.protocol.shards import DEFAULT_SHARD_SIZE, MAX_SHARD_SIZE, MAX_SHARDS
from tests.p2p.helpers import node_config, replaced, wait_until

PARAMS_32B = 32_000_000_000


def synthetic_32b_shards() -> tuple[ShardInfo, ...]:
    """The weights files of a 32B-parameter bf16 checkpoint cut at the default 50 MiB: digests made up."""
    total = PARAMS_32B * 2
    count = -(-total // DEFAULT_SHARD_SIZE)
    sizes = [DEFAULT_SHARD_SIZE] * (count - 1) + [total - DEFAULT_SHARD_SIZE * (count - 1)]
    return tuple(
        ShardInfo(f"model-{i + 1:05d}-of-{count:05d}.safetensors", size, hashlib.sha256(b"%d" % i).digest())
        for i, size in enumerate(sizes)
    )


def maximal_shards() -> tuple[ShardInfo, ...]:
    return tuple(
        ShardInfo(f"{i:05d}-" + "y" * 118 + ".bin", MAX_SHARD_SIZE, hashlib.sha256(b"%d" % i).digest())
        for i in range(MAX_SHARDS)
    )


class ManifestOnlyTrainerWork(IdleTrainerWork):
    """A trainer whose origin lists versions it holds only the signed manifest of, and gossips their heads."""

    def __init__(self, root: Path, port: int) -> None:
        super().__init__()
        self.root, self.port = root, port
        self.origin: OriginNode | None = None
        self.net: RoleNet | None = None

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.net = net
        self.origin = OriginNode(self.root, net.identity, net.run, server=ServerConfig(port=self.port))
        async with trio.open_nursery() as nursery:
            await nursery.start(self.origin.run)
            task_status.started()

    def hold_manifest(self, version: int, shards: tuple[ShardInfo, ...]) -> tuple[CheckpointManifest, bytes]:
        """Sign a manifest and write it alone into the version's directory, as a restarted origin finds it."""
        assert self.origin is not None and self.net is not None
        manifest = CheckpointManifest(
            run=self.net.run,
            version=version,
            parent_version=max(0, version - 1),
            model_config_hash=hashlib.sha256(b"config.json").digest(),
            total_size=sum(s.size for s in shards),
            shards=shards,
            merkle_root=merkle_root([s.sha256 for s in shards]),
            created_ms=1_800_000_000_000,
        )
        envelope = self.origin.seal(manifest)
        self.origin.store.save_manifest(version, envelope)
        self.origin.catalog.add(manifest, envelope)
        return manifest, envelope

    async def gossip_head(self, version: int) -> bytes:
        """What the trainer work does for its newest version: the catalog entry's head, on `checkpoints`."""
        assert self.origin is not None and self.net is not None
        entry = self.origin.catalog.get(version)
        assert entry is not None
        return await self.net.publish("checkpoints", entry.head)


class HeadFollowingWork:
    """A follower fed only by gossip: heads in, manifests fetched from the trainer's announced endpoint."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.follower: Follower | None = None
        self.book = SourceBook()
        self.heads: trio.MemorySendChannel[bytes] | None = None

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        record = await net.wait_run_record()
        trainer = record.descriptor.trainer
        store, catalog = ShardStore(self.root, net.run), Catalog(net.run)
        downloader = Downloader(HttpClient(), self.book)
        self.follower = Follower(FollowerConfig(net.run, trainer), store, catalog, downloader)
        self.heads, receive = trio.open_memory_channel[bytes](16)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.follower.run, receive)
            task_status.started()
            for peer in await net.wait_for_role("trainer"):
                if peer.address == trainer and peer.http_endpoint:
                    self.book.add(peer.http_endpoint, 0.3)

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        if isinstance(delivery.opened.message, CheckpointHead) and self.heads is not None:
            self.heads.send_nowait(encode(delivery.opened.envelope))


@pytest.mark.timeout(120)
def test_a_32b_manifest_and_the_largest_manifest_are_announced_by_head_and_resolved_over_http(
    tmp_path: Path,
) -> None:
    names = ["trainer", "relay"]
    identities = [NodeIdentity(secrets.token_bytes(32)) for _ in names]
    ports, http_ports = [free_port() for _ in names], [free_port() for _ in names]
    bootstrap = f"/ip4/127.0.0.1/tcp/{ports[0]}/p2p/{identities[0].peer_id}"
    configs = [
        replaced(
            node_config(tmp_path, name, name, port=ports[i], bootstrap=(bootstrap,) if i else ()),
            http_port=http_ports[i],
        )
        for i, name in enumerate(names)
    ]
    trainer_work = ManifestOnlyTrainerWork(tmp_path / "origin", http_ports[0])
    receiver = HeadFollowingWork(tmp_path / "receiver")

    async def announce(version: int) -> bytes:
        """Gossip the head until the receiver holds the manifest (gossip may drop; trainers republish)."""
        head_envelope = b""
        while receiver.follower is None or receiver.follower.catalog.get(version) is None:
            head_envelope = await trainer_work.gossip_head(version)
            with trio.move_on_after(2):
                while receiver.follower is None or receiver.follower.catalog.get(version) is None:  # noqa: ASYNC110
                    await trio.sleep(0.05)
        return head_envelope

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            runtimes = []
            for config, identity, service in zip(
                configs, identities, [Trainer(trainer_work), Relay(receiver)], strict=True
            ):
                runtime = NodeRuntime(config, identity, service)
                await nursery.start(runtime.run)
                runtimes.append(runtime)
            trainer_net, relay_net = runtimes[0].net, runtimes[1].net
            assert trainer_net is not None and relay_net is not None
            await wait_until(lambda: len(receiver.book.manifest_sources(0, bytes(32), 0.0)) == 1, timeout=30)
            await wait_until(lambda: trainer_net.gossip.topic_peers("checkpoints") >= 1, timeout=30)

            for version, shards in ((1, synthetic_32b_shards()), (2, maximal_shards())):
                manifest, envelope = trainer_work.hold_manifest(version, shards)
                head_envelope = await announce(version)
                assert len(head_envelope) < 600 < MAX_GOSSIP_ENVELOPE
                follower = receiver.follower
                assert follower is not None
                entry = follower.catalog.get(version)
                assert entry is not None and entry.manifest == manifest and entry.envelope == envelope
                assert entry.head == trainer_work.origin.catalog.get(version).head  # type: ignore[union-attr]
                assert follower.store.load_manifest(version) == envelope
                if version == 1:
                    assert 1_200 <= len(manifest.shards) <= 1_400
                    assert manifest.total_size == PARAMS_32B * 2
                else:
                    assert len(envelope) > MAX_GOSSIP_ENVELOPE  # could never have been gossiped whole

            stats = receiver.follower.statistics()  # type: ignore[union-attr]
            assert stats["manifests_resolved"] == 2 and stats["head_verdicts"]["accept"] == 2
            assert stats["manifests_accepted"] == 2 and stats["manifest_verdicts"] == {"accept": 2}
            assert relay_net.gossip.stats["checkpoints"].rejected == {}
            nursery.cancel_scope.cancel()

    trio.run(main)

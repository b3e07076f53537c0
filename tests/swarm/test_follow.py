"""Checkpoints through the swarm, in process: a trainer's origin, a relay, a following worker, real libp2p.

The worker is given nothing but the bootstrap address: it finds the relay through the DHT, hears the
checkpoint head on gossip (and fetches the manifest it names) or the manifest on its HTTP long poll,
fetches the shards from the relay, verifies them, and the relay announces what it holds on `shards` and
as a DHT provider of the version.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import torch
import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.dataplane.checkpoint import load_checkpoint
from swarmnode.node.dataplane.follower import VerifiedCheckpoint
from swarmnode.node.dataplane.http_server import ServerConfig
from swarmnode.node.dataplane.roles import OriginNode
from swarmnode.node.p2p.gossip import Delivery
from swarmnode.node.p2p.peers import PeerRecord
from swarmnode.node.p2p.ports import free_port
from swarmnode.node.relay.service import Relay
from swarmnode.node.relay.work import SwarmRelayWork
from swarmnode.node.roles.base import RoleNet, RoleService
from swarmnode.node.roles.bootstrap import Bootstrap
from swarmnode.node.roles.follow import SOURCE_ROLES, SwarmFollower, checkpoint_sources
from swarmnode.node.runtime import NodeRuntime
from swarmnode.node.trainer.service import IdleTrainerWork, Trainer
from swarmnode.node.worker.service import Worker
from tests.p2p.helpers import node_config, replaced, wait_until


def _state(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {f"layer{i}.weight": torch.randn(64, 256, generator=generator) for i in range(4)}


class OriginOnlyTrainerWork(IdleTrainerWork):
    """A trainer that publishes what the test tells it to, through the real origin and gossip."""

    def __init__(self, root: Path, port: int) -> None:
        super().__init__()
        self.root, self.port = root, port
        self.origin: OriginNode | None = None
        self.net: RoleNet | None = None

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.net = net
        self.origin = OriginNode(
            self.root, net.identity, net.run, server=ServerConfig(port=self.port), shard_size=100_000
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(self.origin.run)
            task_status.started()

    async def publish(self, version: int) -> bytes:
        assert self.origin is not None and self.net is not None
        manifest, _ = await self.origin.origin.publish(
            _state(version), version=version, parent_version=max(version - 1, 0), model_config_hash=bytes(32)
        )
        entry = self.origin.catalog.get(version)
        assert entry is not None
        await self.net.publish("checkpoints", entry.head)  # as the trainer work does
        return manifest.merkle_root


class FollowingWork:
    """A worker that only follows checkpoints (what the worker work does before generating)."""

    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]
        self.config = config
        self.follower: SwarmFollower | None = None
        self.completed: list[VerifiedCheckpoint] = []

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.follower = SwarmFollower(net, self.config, newest_only=True, serve=False)
        send, receive = trio.open_memory_channel[VerifiedCheckpoint](4)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.follower.run, send)
            task_status.started()
            async for checkpoint in receive:
                self.completed.append(checkpoint)

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        assert self.follower is not None
        await self.follower.on_gossip(delivery)


def test_a_checkpoint_reaches_a_worker_through_a_relay_found_in_the_dht(tmp_path: Path) -> None:
    names = ["bootstrap", "trainer", "relay", "worker"]
    identities = [NodeIdentity(secrets.token_bytes(32)) for _ in names]
    ports = [free_port() for _ in names]
    http_ports = [free_port() for _ in names]
    bootstrap = f"/ip4/127.0.0.1/tcp/{ports[0]}/p2p/{identities[0].peer_id}"
    configs = [
        replaced(
            node_config(tmp_path, name, name, port=ports[i], bootstrap=(bootstrap,) if i else ()),
            http_port=http_ports[i],
        )
        for i, name in enumerate(names)
    ]
    trainer_work = OriginOnlyTrainerWork(tmp_path / "origin", http_ports[1])
    relay_work = SwarmRelayWork(configs[2])
    worker_work = FollowingWork(configs[3])
    services: list[RoleService] = [Bootstrap(), Trainer(trainer_work), Relay(relay_work), Worker(worker_work)]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            runtimes = []
            for config, identity, service in zip(configs, identities, services, strict=True):
                runtime = NodeRuntime(config, identity, service)
                await nursery.start(runtime.run)
                runtimes.append(runtime)
            worker_net = runtimes[3].net
            assert worker_net is not None
            await wait_until(lambda: bool(worker_net.peers("relay")), timeout=30)

            root0 = await trainer_work.publish(0)
            await wait_until(lambda: len(worker_work.completed) >= 1, timeout=60)
            got = worker_work.completed[0]
            assert got.manifest.version == 0 and got.manifest.merkle_root == root0
            state = await trio.to_thread.run_sync(load_checkpoint, got.directory, got.manifest)
            assert all(torch.equal(state[k], v) for k, v in _state(0).items())

            relay_endpoint = f"http://127.0.0.1:{http_ports[2]}"
            follower = worker_work.follower
            assert follower is not None
            await wait_until(lambda: relay_endpoint in follower.followed, timeout=10)
            stats = follower.statistics()
            assert (
                f"http://127.0.0.1:{http_ports[1]}" not in stats["endpoints_followed"]
            )  # workers use relays
            assert relay_work.status()["versions_held"] == [0] and relay_work.announced >= 1

            # the relay announces after it holds the version (announcements are spaced): look until found
            async def relay_provides_v0() -> bool:
                providers = await worker_net.find_checkpoint_providers(0)
                return identities[2].peer_id in {str(p.peer_id) for p in providers}

            with trio.fail_after(30):
                while not await relay_provides_v0():  # noqa: ASYNC110 - the DHT offers no event to wait on
                    await trio.sleep(0.5)

            root1 = await trainer_work.publish(1)
            await wait_until(lambda: any(c.manifest.version == 1 for c in worker_work.completed), timeout=60)
            assert worker_work.completed[-1].manifest.merkle_root == root1
            assert relay_work.status()["bytes_served"] > 0
            nursery.cancel_scope.cancel()

    trio.run(main)


def _peer(n: int, role: str, endpoint: str) -> PeerRecord:
    return PeerRecord(f"peer-{n}", bytes([n]) * 20, role, endpoint, "test", 0.0)


def test_only_the_lead_trainer_is_a_trainer_role_source() -> None:
    """Co-trainers of a DiLoCo run provide role "trainer" too but serve no checkpoint of the run."""
    lead, co_trainer = _peer(1, "trainer", "http://lead:1"), _peer(2, "trainer", "http://co:2")
    relays = [_peer(3, "relay", "http://relay-a:3"), _peer(4, "relay", "http://relay-b:4")]
    relays.append(_peer(5, "relay", ""))
    found = {"trainer": [co_trainer, lead], "relay": relays}
    sources = checkpoint_sources(found, lead.address)
    assert sources == [
        ("http://relay-a:3", SOURCE_ROLES["relay"]),
        ("http://relay-b:4", SOURCE_ROLES["relay"]),  # a relay without an endpoint is skipped
        ("http://lead:1", SOURCE_ROLES["trainer"]),
    ]
    assert checkpoint_sources({"trainer": [co_trainer]}, lead.address) == []  # the lead not found yet
    assert checkpoint_sources(found, co_trainer.address)[-1] == ("http://co:2", SOURCE_ROLES["trainer"])

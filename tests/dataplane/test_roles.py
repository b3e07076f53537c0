"""Origin, relays and workers wired over HTTP feeds, all in one trio.run (the multi-process twin is slow)."""

from __future__ import annotations

import torch
import trio

from swarmnode.node.dataplane.checkpoint import load_checkpoint, state_digest
from swarmnode.node.dataplane.roles import OriginNode
from tests.dataplane.helpers import RUN, TRAINER, follower_node, run_node, wait_until


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"layer{i}": torch.randn(128, 256, generator=g) for i in range(8)}  # 8 x 128 KiB


def test_a_checkpoint_reaches_every_worker_through_relays_even_when_one_dies(tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            origin = OriginNode(tmp_path / "origin", TRAINER, RUN, shard_size=128 * 1024)
            await nursery.start(origin.run)
            relays = [
                follower_node(
                    tmp_path, f"relay{i}", 1 + i, {origin.endpoint: 1.0}, worker=False, rate=2_000_000
                )
                for i in range(2)
            ]
            for relay in relays:
                await nursery.start(run_node, relay, None)
            peers = {relay.endpoint: 1.0 for relay in relays}
            done_send, done = trio.open_memory_channel(8)
            workers = [follower_node(tmp_path, f"worker{i}", 10 + i, peers, worker=True) for i in range(3)]
            for worker in workers:
                await nursery.start(run_node, worker, done_send)

            state = _state(1)
            manifest, _ = await origin.origin.publish(
                state, version=1, parent_version=0, model_config_hash=bytes(32)
            )
            with trio.fail_after(30):
                await wait_until(lambda: relays[0].server.stats.bytes_served >= manifest.total_size // 2)
                relays[0].scope.cancel()  # killed mid-transfer
                results = [await done.receive() for _ in workers]
            for result in results:
                assert result.manifest == manifest
                loaded = await trio.to_thread.run_sync(load_checkpoint, result.directory, result.manifest)
                assert state_digest(loaded) == state_digest(state)
            served = [relay.server.stats.bytes_served for relay in relays]
            assert served[1] > 0 and sum(served) >= 3 * manifest.total_size
            # the origin sent each relay one copy, not the workers theirs
            assert origin.server.stats.bytes_served <= 2 * manifest.total_size + 64 * 1024
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_workers_follow_successive_versions_and_relays_prune(tmp_path):
    async def main():
        async with trio.open_nursery() as nursery:
            origin = OriginNode(tmp_path / "origin", TRAINER, RUN, shard_size=256 * 1024, async_level=0)
            await nursery.start(origin.run)
            relay = follower_node(tmp_path, "relay", 1, {origin.endpoint: 1.0}, worker=False, async_level=0)
            await nursery.start(run_node, relay, None)
            done_send, done = trio.open_memory_channel(8)
            worker = follower_node(tmp_path, "worker", 2, {relay.endpoint: 1.0}, worker=True, async_level=0)
            await nursery.start(run_node, worker, done_send)
            with trio.fail_after(30):
                for version in (1, 2, 3):
                    manifest, _ = await origin.origin.publish(
                        _state(version),
                        version=version,
                        parent_version=version - 1,
                        model_config_hash=bytes(32),
                    )
                    result = await done.receive()
                    assert result.manifest.version == version
            await trio.sleep(0.2)  # pruning of the relay's files runs in a thread
            for node in (origin, relay, worker):
                assert node.catalog.versions() == [2, 3]
            assert sorted(relay.store.versions_on_disk()) == [2, 3]
            nursery.cancel_scope.cancel()

    trio.run(main)

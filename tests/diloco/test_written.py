"""Contributions and outer states whose files a trainer group wrote itself: signed only when every listed
file is there, served and restored like a one-process trainer's, and restored without loading tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.node.dataplane.checkpoint import load_checkpoint, plan_shards, shard_info
from swarmnode.node.diloco.algorithm import content_digest
from swarmnode.node.diloco.compression import Compressor, decompress
from swarmnode.node.diloco.holdings import Holdings
from swarmnode.node.diloco.rank_files import rank_file_name
from swarmnode.protocol import diloco as rules
from swarmnode.protocol.messages import ShardInfo
from tests.diloco.helpers import identities, tiny_plan

SHARD = 4 * 1024


def tensors(seed: int, sizes: list[int]) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(n, generator=gen) for i, n in enumerate(sizes)}


def write_as_ranks(directory: Path, state: dict[str, torch.Tensor], world: int) -> list[ShardInfo]:
    """The tensors dealt round-robin to `world` ranks, each writing its own files as a group does."""
    infos = []
    names = sorted(state)
    for rank in range(world):
        mine = {n: state[n] for n in names[rank::world]}
        for plan in plan_shards(mine, SHARD) if mine else []:
            data = plan.serialize()
            name = rank_file_name(rank, plan.name)
            (directory / name).write_bytes(data)
            infos.append(shard_info(name, data))
    return infos


def holdings(root: Path) -> Holdings:
    keys = identities(2)
    plan, envelope = tiny_plan(keys, compression="fp16")
    return Holdings(root, keys[0], plan, envelope, shard_size=SHARD)


sizes = st.lists(st.integers(1, 3000), min_size=1, max_size=5)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=sizes, world=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_a_written_contribution_is_signed_held_and_restored_without_its_payload(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], world: int, seed: int
) -> None:
    root = tmp_path_factory.mktemp("written")
    payload = Compressor("fp16").compress(tensors(seed, sizes))

    async def main() -> None:
        mine = holdings(root)
        partial = await mine.contribution_partial(0)
        partial.mkdir(parents=True, exist_ok=True)
        infos = write_as_ranks(partial, payload, world)
        held = await mine.publish_contribution_written(0, mine.plan.initial_digest, infos)
        assert held.delta is None and mine.contribution(0, mine.me) is held
        found = rules.verify_contribution(
            held.envelope, plan=mine.plan, digest=mine.plan_digest, round=0, now_ms=mine.clock_ms()
        )
        loaded = load_checkpoint(held.directory, found.manifest)  # what any peer loads
        assert content_digest(loaded) == content_digest(payload)

        again = holdings(root)
        assert again.restore(load=False) == (None, None)  # no outer state yet
        back = again.contribution(0, mine.me)
        assert back is not None and back.envelope == held.envelope and back.delta is None
        whole = holdings(root)
        whole.restore()
        delta = whole.contribution(0, mine.me).delta  # type: ignore[union-attr]
        assert delta is not None and content_digest(delta) == content_digest(decompress(payload, "fp16"))

    trio.run(main)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=sizes, world=st.integers(1, 3), seed=st.integers(0, 2**16), drop=st.integers(0, 100))
def test_a_file_nobody_wrote_is_refused_and_nothing_is_signed(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], world: int, seed: int, drop: int
) -> None:
    root = tmp_path_factory.mktemp("missing")
    state = tensors(seed, sizes)

    async def main() -> None:
        mine = holdings(root)
        partial = await mine.outer_partial(1)
        partial.mkdir(parents=True, exist_ok=True)
        infos = write_as_ranks(partial, state, world)
        (partial / infos[drop % len(infos)].name).unlink()
        with pytest.raises(ValueError, match="nobody wrote"):
            await mine.publish_outer_written(1, infos, theta=bytes(32), parent=bytes(32), contributors=())
        assert mine.outer is None and not list((root / "messages").iterdir())

    trio.run(main)


def test_a_written_outer_state_restores_unloaded_and_a_tampered_one_not_at_all(tmp_path: Path) -> None:
    state = tensors(5, [100, 2000, 7])
    theta = content_digest(state)

    async def main() -> None:
        mine = holdings(tmp_path)
        stale = await mine.outer_partial(1)
        stale.mkdir(parents=True, exist_ok=True)
        (stale / "left-by-a-crash.safetensors").write_bytes(b"junk")
        partial = await mine.outer_partial(1)
        assert not partial.exists()  # a crashed attempt's files are gone
        partial.mkdir(parents=True)
        infos = write_as_ranks(partial, state, 2)
        held = await mine.publish_outer_written(1, infos, theta=theta, parent=theta, contributors=())
        assert sorted(p.name for p in held.directory.glob("*.safetensors")) == sorted(i.name for i in infos)

        back, loaded = holdings(tmp_path).restore(load=False)
        assert back is not None and loaded is None and back.envelope == held.envelope
        _, whole = holdings(tmp_path).restore()
        assert whole is not None and content_digest(whole) == theta

        victim = held.directory / infos[0].name
        data = bytearray(victim.read_bytes())
        data[-1] ^= 1
        victim.write_bytes(bytes(data))
        assert holdings(tmp_path).restore(load=False) == (None, None)

    trio.run(main)

"""Shards on disk and safetensors checkpoints: split, verify, resume, complete atomically, load only whole."""

from __future__ import annotations

import hashlib
import json
import os
import random

import pytest
import torch
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.node.dataplane.catalog import Catalog
from swarmnode.node.dataplane.checkpoint import (
    PIECES_KEY,
    ShardPlan,
    load_checkpoint,
    plan_shards,
    shard_info,
    state_digest,
)
from swarmnode.node.dataplane.errors import CheckpointInvalid
from swarmnode.node.dataplane.origin import Origin, Sealer
from swarmnode.node.dataplane.store import WRITE_CHUNK, DigestMismatch, ShardStore
from swarmnode.protocol.shards import PART_SUFFIX
from tests.dataplane.helpers import RUN, TRAINER, blobs, manifest_for, signed, small_state


def _write_checkpoint(store, state, shard_size, version=1):
    plans = plan_shards(state, shard_size)
    infos = []
    for plan in plans:
        data = plan.serialize()
        infos.append(shard_info(plan.name, data))
        store.write_shard(version, plan.name, data)
    manifest = manifest_for(infos, version)
    store.save_manifest(version, signed(manifest))
    return manifest, store.finalize(version)


def test_split_and_load_round_trip(tmp_path):
    state = small_state()
    manifest, directory = _write_checkpoint(ShardStore(tmp_path, RUN), state, shard_size=4096)
    assert len(manifest.shards) > 1
    assert state_digest(load_checkpoint(directory, manifest)) == state_digest(state)


def test_a_tensor_larger_than_a_shard_is_split_into_pieces_and_rejoined(tmp_path):
    state = {"big": torch.arange(10_000, dtype=torch.float32).view(100, 100), "small": torch.ones(3)}
    plans = plan_shards(state, shard_size=8_000)
    assert all(p.nbytes <= 8_000 for p in plans)
    assert sum(len(p.pieces) for p in plans) == 5
    manifest, directory = _write_checkpoint(ShardStore(tmp_path, RUN), state, shard_size=8_000)
    loaded = load_checkpoint(directory, manifest)
    assert torch.equal(loaded["big"], state["big"]) and loaded["big"].shape == (100, 100)
    header_len = int.from_bytes((directory / manifest.shards[0].name).read_bytes()[:8], "little")
    header = json.loads((directory / manifest.shards[0].name).read_bytes()[8 : 8 + header_len])
    assert PIECES_KEY in header["__metadata__"]


def test_tied_and_view_tensors_are_saved(tmp_path):
    base = torch.randn(8, 4)
    state = {"embed": base, "lm_head": base, "half": base[:4]}
    manifest, directory = _write_checkpoint(ShardStore(tmp_path, RUN), state, shard_size=1 << 20)
    assert state_digest(load_checkpoint(directory, manifest)) == state_digest(state)


def test_serialisation_is_deterministic():
    a = [p.serialize() for p in plan_shards(small_state(1), 4096)]
    b = [p.serialize() for p in plan_shards(small_state(1), 4096)]
    assert a == b


def test_a_corrupted_shard_is_never_loaded(tmp_path):
    manifest, directory = _write_checkpoint(ShardStore(tmp_path, RUN), small_state(), shard_size=4096)
    path = directory / manifest.shards[1].name
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointInvalid):
        load_checkpoint(directory, manifest)


def test_a_missing_shard_is_never_loaded(tmp_path):
    manifest, directory = _write_checkpoint(ShardStore(tmp_path, RUN), small_state(), shard_size=4096)
    (directory / manifest.shards[0].name).unlink()
    with pytest.raises(CheckpointInvalid):
        load_checkpoint(directory, manifest)


def test_bytes_that_match_the_digest_but_are_not_safetensors_are_refused(tmp_path):
    store = ShardStore(tmp_path, RUN)
    junk = [("a.safetensors", b"\xff" * 64)]
    manifest = manifest_for(junk)
    store.write_shard(1, "a.safetensors", junk[0][1])
    store.save_manifest(1, signed(manifest))
    with pytest.raises(CheckpointInvalid):
        load_checkpoint(store.finalize(1), manifest)


# --- partial shards --------------------------------------------------------------------------------


def test_a_partial_shard_resumes_by_offset_and_commits(tmp_path):
    store = ShardStore(tmp_path, RUN)
    name, data = blobs(1, 10_000)[0]
    info = shard_info(name, data)
    first = store.partial(1, info)
    first.resume()
    first.absorb(memoryview(data)[:4_000], "a")
    first.close()  # a crash: only the .part file is left
    assert not (store.partial_dir(1) / name).exists()

    second = store.partial(1, info)
    second.resume()
    assert second.offset == 4_000
    second.absorb(data[4_000:], "b")
    second.commit()
    assert (store.partial_dir(1) / name).read_bytes() == data
    assert not (store.partial_dir(1) / (name + ".part")).exists()


def test_a_wrong_digest_discards_everything_and_names_the_contributors(tmp_path):
    store = ShardStore(tmp_path, RUN)
    name, data = blobs(1, 1_000)[0]
    partial = store.partial(1, shard_info(name, data))
    partial.resume()
    partial.absorb(data[:500], "good")
    partial.absorb(bytes(500), "evil")
    with pytest.raises(DigestMismatch) as exc:
        partial.commit()
    assert exc.value.contributors == {"good": 500, "evil": 500}
    assert partial.offset == 0 and os.path.getsize(partial.part) == 0
    assert not partial.final.exists()


def test_a_part_file_longer_than_the_shard_is_restarted(tmp_path):
    store = ShardStore(tmp_path, RUN)
    name, data = blobs(1, 100)[0]
    (store.partial_dir(1)).mkdir(parents=True)
    (store.partial_dir(1) / (name + ".part")).write_bytes(bytes(500))
    partial = store.partial(1, shard_info(name, data))
    partial.resume()
    assert partial.offset == 0


# --- versions --------------------------------------------------------------------------------------


def test_a_version_is_complete_only_after_the_rename(tmp_path):
    store = ShardStore(tmp_path, RUN)
    shards = blobs(2, 100)
    manifest = manifest_for(shards)
    store.save_manifest(1, signed(manifest))
    store.write_shard(1, *shards[0])
    assert store.versions_on_disk() == {1: False}
    assert store.verified_shards(manifest) == {0}
    assert not store.is_complete(1)
    store.write_shard(1, *shards[1])
    store.finalize(1)
    assert store.versions_on_disk() == {1: True} and store.is_complete(1)
    assert store.verified_shards(manifest) == {0, 1}
    fd = store.open_verified(1, shards[1][0])
    assert fd is not None and os.read(fd, 200) == shards[1][1]
    os.close(fd)
    assert store.open_verified(1, "nope") is None


def test_remove_prunes_both_forms(tmp_path):
    store = ShardStore(tmp_path, RUN)
    for version in (1, 2):
        store.save_manifest(version, b"x")
    store.finalize(1)
    store.remove([1, 2])
    assert store.versions_on_disk() == {}


def test_state_digest_sees_every_byte():
    state = small_state()
    other = {k: v.clone() for k, v in state.items()}
    other["layers.0.bias"][3] += 1
    assert state_digest(state) != state_digest(other)
    assert state_digest(state) == state_digest({k: state[k] for k in reversed(list(state))})


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    size=st.one_of(
        st.integers(0, 3 * WRITE_CHUNK + 1),
        st.sampled_from([WRITE_CHUNK - 1, WRITE_CHUNK, WRITE_CHUNK + 1, 2 * WRITE_CHUNK]),
    ),
    leftover=st.integers(0, 2 * WRITE_CHUNK),
    seed=st.integers(0, 2**32 - 1),
)
def test_write_shard_hashes_exactly_the_bytes_it_writes(tmp_path, size, leftover, seed):
    """One pass: the digest returned is the sha256 of the file left on disk, whatever `.part` was there."""
    rng = random.Random(seed)
    data = rng.randbytes(size)
    store = ShardStore(tmp_path / str(seed), RUN)
    store.partial_dir(1).mkdir(parents=True, exist_ok=True)
    (store.partial_dir(1) / ("s" + PART_SUFFIX)).write_bytes(b"\xff" * leftover)  # a crashed earlier try
    digest = store.write_shard(1, "s", memoryview(data))
    assert digest == hashlib.sha256(data).digest()
    assert (store.partial_dir(1) / "s").read_bytes() == data
    assert not (store.partial_dir(1) / ("s" + PART_SUFFIX)).exists()


def test_a_pipelined_publish_lists_the_digests_of_the_files_it_wrote(tmp_path):
    """Serialization overlaps hashing and writing; the manifest must still name each file's own digest."""
    state = small_state(5)
    store, catalog = ShardStore(tmp_path, RUN), Catalog(RUN)
    origin = Origin(Sealer(TRAINER, RUN), store, catalog, shard_size=4096)

    async def publish():
        return await origin.publish(state, version=1, parent_version=0, model_config_hash=bytes(32))

    manifest, _ = trio.run(publish)
    expected = [shard_info(p.name, p.serialize()) for p in plan_shards(state, 4096)]
    assert len(expected) > 2 and list(manifest.shards) == expected
    directory = store.complete_dir(1)
    for info in manifest.shards:
        assert hashlib.sha256((directory / info.name).read_bytes()).digest() == info.sha256
    assert state_digest(load_checkpoint(directory, manifest)) == state_digest(state)


def test_a_publish_that_fails_midway_announces_nothing(tmp_path, monkeypatch):
    """A serialization error on a later file stops the writer too; the catalog never lists the version."""
    state = small_state(5)
    store, catalog = ShardStore(tmp_path, RUN), Catalog(RUN)
    origin = Origin(Sealer(TRAINER, RUN), store, catalog, shard_size=4096)
    calls = {"n": 0}
    real = ShardPlan.serialize

    def flaky(plan):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk gone")
        return real(plan)

    monkeypatch.setattr(ShardPlan, "serialize", flaky)

    async def publish():
        await origin.publish(state, version=1, parent_version=0, model_config_hash=bytes(32))

    with pytest.raises(OSError, match="disk gone"):
        trio.run(publish)
    assert catalog.get(1) is None and not store.is_complete(1)

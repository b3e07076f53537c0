"""Checkpoint heads: the pure rules (protocol/shards.py), the manifest size bound, and a follower resolving a
gossiped head into its manifest over HTTP from the sources it knows (node/dataplane/heads.py)."""

from __future__ import annotations

import dataclasses

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.crypto.merkle import merkle_root
from swarmnode.node.dataplane.catalog import Catalog
from swarmnode.node.dataplane.http_server import HttpServer, ServerConfig
from swarmnode.node.dataplane.origin import Sealer
from swarmnode.node.dataplane.shard_endpoints import ShardService
from swarmnode.node.dataplane.store import ShardStore
from swarmnode.node.p2p.gossip import DEFAULT_POLICIES, MAX_GOSSIP_ENVELOPE
from swarmnode.protocol.codec import encode
from swarmnode.protocol.envelope import ENVELOPE_OVERHEAD, seal
from swarmnode.protocol.errors import Reason, Reject
from swarmnode.protocol.messages import CheckpointHead, CheckpointManifest, ManifestResponse, ShardInfo
from swarmnode.protocol.shards import (
    MAX_MANIFEST_ENVELOPE,
    MAX_SHARD_SIZE,
    MAX_SHARDS,
    check_head,
    check_manifest,
    check_manifest_matches_head,
    manifest_digest,
    manifest_head,
    verify_head,
    verify_manifest_for_head,
)
from tests.dataplane.helpers import RUN, STRANGER, TRAINER, blobs, have_all, manifest_for, now_ms, signed
from tests.dataplane.test_follower import Harness, _run

# --- strategies ----------------------------------------------------------------------------------

names = st.from_regex(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}", fullmatch=True).filter(
    lambda n: not n.endswith(".part")
)
shard_infos = st.lists(
    st.builds(ShardInfo, names, st.integers(1, MAX_SHARD_SIZE), st.binary(min_size=32, max_size=32)),
    min_size=1,
    max_size=24,
    unique_by=lambda s: s.name,
)


@st.composite
def manifests(draw: st.DrawFn) -> CheckpointManifest:
    shards = tuple(draw(shard_infos))
    version = draw(st.integers(0, 2**64 - 1))
    parent = 0 if version == 0 else draw(st.integers(0, version - 1))
    return CheckpointManifest(
        run=RUN,
        version=version,
        parent_version=parent,
        model_config_hash=draw(st.binary(min_size=32, max_size=32)),
        total_size=sum(s.size for s in shards),
        shards=shards,
        merkle_root=merkle_root([s.sha256 for s in shards]),
        created_ms=draw(st.integers(0, 2**64 - 1)),
    )


def _other(value: object) -> object:
    """A value of the same type that differs."""
    if isinstance(value, bytes):
        return bytes([value[0] ^ 1]) + value[1:]
    if isinstance(value, str):
        return value + "x" if len(value) < 64 else value[:-1]
    assert isinstance(value, int)
    return value + 1 if value < 2**64 - 1 else value - 1


HEADER_FIELDS = [f.name for f in dataclasses.fields(CheckpointHead) if f.name != "manifest_digest"]


# --- rules ---------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(manifests())
def test_the_head_of_a_valid_manifest_is_valid_and_matches_it(manifest: CheckpointManifest) -> None:
    check_manifest(manifest)
    head = manifest_head(manifest)
    check_head(head)
    check_manifest_matches_head(manifest, head)
    assert head.shard_count == len(manifest.shards) and head.manifest_digest == manifest_digest(manifest)
    envelope = seal(TRAINER, manifest, run=RUN, seq=1, ts=now_ms())
    assert verify_manifest_for_head(envelope, head, trainer=TRAINER.address, now_ms=now_ms()) == manifest


@settings(max_examples=80, deadline=None)
@given(manifests(), st.sampled_from([*HEADER_FIELDS, "manifest_digest"]))
def test_a_head_differing_in_one_field_refuses_the_manifest(manifest: CheckpointManifest, name: str) -> None:
    head = manifest_head(manifest)
    changed = dataclasses.replace(head, **{name: _other(getattr(head, name))})
    with pytest.raises(Reject) as exc:
        check_manifest_matches_head(manifest, changed)
    assert exc.value.reason is (Reason.BAD_HASH if name == "manifest_digest" else Reason.RULE_VIOLATION)


@settings(max_examples=80, deadline=None)
@given(manifests(), st.data())
def test_a_manifest_differing_only_in_its_shard_list_is_bad_hash(
    manifest: CheckpointManifest, data: st.DataObject
) -> None:
    """Names and sizes are outside the Merkle root: only the digest catches a list rewritten under it."""
    head = manifest_head(manifest)
    i = data.draw(st.integers(0, len(manifest.shards) - 1))
    shard = manifest.shards[i]
    new_name = data.draw(names.filter(lambda n: n not in {s.name for s in manifest.shards}))
    shards = list(manifest.shards)
    shards[i] = dataclasses.replace(shard, name=new_name)
    forged = dataclasses.replace(manifest, shards=tuple(shards))
    check_manifest(forged)  # internally consistent, same root, same header
    envelope = seal(TRAINER, forged, run=RUN, seq=1, ts=now_ms())
    with pytest.raises(Reject) as exc:
        verify_manifest_for_head(envelope, head, trainer=TRAINER.address, now_ms=now_ms())
    assert exc.value.reason is Reason.BAD_HASH


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, MAX_SHARDS + 2),
    st.integers(0, (MAX_SHARDS + 2) * MAX_SHARD_SIZE + 2),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
)
def test_check_head_accepts_exactly_the_consistent_heads(
    count: int, total: int, version: int, parent: int
) -> None:
    head = dataclasses.replace(
        manifest_head(manifest_for(blobs(1, 10))),
        shard_count=count,
        total_size=total,
        version=version,
        parent_version=parent,
    )
    lineage = parent == 0 if version == 0 else parent < version
    consistent = 1 <= count <= MAX_SHARDS and count <= total <= count * MAX_SHARD_SIZE and lineage
    if consistent:
        check_head(head)
    else:
        with pytest.raises(Reject) as exc:
            check_head(head)
        assert exc.value.reason is Reason.RULE_VIOLATION


def test_only_the_trainers_head_for_this_run_verifies() -> None:
    head = manifest_head(manifest_for(blobs(2, 10)))
    good = seal(TRAINER, head, run=RUN, seq=1, ts=now_ms())
    assert verify_head(good, run=RUN, trainer=TRAINER.address, now_ms=now_ms()) == head
    with pytest.raises(Reject) as exc:
        verify_head(
            seal(STRANGER, head, run=RUN, seq=1, ts=now_ms()),
            run=RUN,
            trainer=TRAINER.address,
            now_ms=now_ms(),
        )
    assert exc.value.reason is Reason.WRONG_SENDER
    inconsistent = seal(TRAINER, dataclasses.replace(head, shard_count=0), run=RUN, seq=2, ts=now_ms())
    with pytest.raises(Reject) as exc:
        verify_head(inconsistent, run=RUN, trainer=TRAINER.address, now_ms=now_ms())
    assert exc.value.reason is Reason.RULE_VIOLATION


# --- the size bound --------------------------------------------------------------------------------


def maximal_manifest() -> CheckpointManifest:
    """The largest manifest the codec admits: 8192 shards of 4 GiB, 128-character names, widest integers."""
    shards = tuple(
        ShardInfo(f"{i:05d}-" + "x" * 118 + ".bin", MAX_SHARD_SIZE, i.to_bytes(32, "big"))
        for i in range(MAX_SHARDS)
    )
    return CheckpointManifest(
        run="r" * 64,
        version=2**64 - 1,
        parent_version=2**64 - 2,
        model_config_hash=bytes(32),
        total_size=MAX_SHARDS * MAX_SHARD_SIZE,
        shards=shards,
        merkle_root=merkle_root([s.sha256 for s in shards]),
        created_ms=2**64 - 1,
    )


def test_the_maximal_manifest_fits_its_caps_and_its_head_fits_gossip() -> None:
    manifest = maximal_manifest()
    assert all(len(s.name) == 128 for s in manifest.shards)
    check_manifest(manifest)
    body = encode(manifest)
    assert len(body) == 1_564_932 <= CheckpointManifest.MAX_SIZE  # the figure spec/shards.md states
    envelope = seal(TRAINER, manifest, run=manifest.run, seq=2**64 - 1, ts=2**64 - 1)
    assert MAX_GOSSIP_ENVELOPE < len(envelope) <= MAX_MANIFEST_ENVELOPE  # why heads exist
    assert len(encode(ManifestResponse(200, envelope))) <= ManifestResponse.MAX_SIZE
    head = manifest_head(manifest)
    head_envelope = seal(TRAINER, head, run=manifest.run, seq=2**64 - 1, ts=2**64 - 1)
    assert len(encode(head)) <= CheckpointHead.MAX_SIZE
    assert (
        len(head_envelope)
        <= DEFAULT_POLICIES["checkpoints"].max_bytes
        == CheckpointHead.MAX_SIZE + ENVELOPE_OVERHEAD
    )


# --- a follower resolves heads over HTTP -----------------------------------------------------------

V1 = blobs(3, 20_000, seed=11)


def signed_head(manifest: CheckpointManifest, identity=TRAINER, **changes) -> bytes:  # type: ignore[no-untyped-def]
    head = dataclasses.replace(manifest_head(manifest), **changes)
    return seal(identity, head, run=RUN, seq=manifest.version + 100, ts=now_ms())


class ManifestOnly:
    """A server that holds a (possibly lying) signed manifest for a version and no shard at all."""

    def __init__(self, tmp_path, manifest: CheckpointManifest, envelope: bytes) -> None:  # type: ignore[no-untyped-def]
        self.store = ShardStore(tmp_path, RUN)
        self.store.save_manifest(manifest.version, envelope)
        self.catalog = Catalog(RUN)
        self.catalog.add(manifest, envelope)
        self.service = ShardService(self.catalog, self.store, endpoint="", seal=Sealer(STRANGER, RUN))
        self.endpoint = ""

    async def start(self, nursery: trio.Nursery) -> str:
        port = await nursery.start(HttpServer(self.service, ServerConfig()).serve)
        self.endpoint = self.service.endpoint = f"http://127.0.0.1:{port}"
        return self.endpoint


def test_a_head_is_resolved_from_a_source_and_its_version_fetched(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def body(nursery: trio.Nursery) -> None:
        h = Harness(tmp_path)
        await h.start(nursery)
        manifest = manifest_for(V1)
        await h.serve(nursery, V1, manifest, "src")
        await h.send.send(signed_head(manifest))
        done = await h.done.receive()
        assert done.manifest == manifest
        assert h.catalog.get(1).head == manifest_head(manifest)
        stats = h.follower.statistics()
        assert stats["head_verdicts"] == {"accept": 1} and stats["manifests_resolved"] == 1
        assert stats["resolving"] == []

    _run(body)


def test_a_source_serving_another_manifest_is_banned_and_the_next_one_serves(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def body(nursery: trio.Nursery) -> None:
        h = Harness(tmp_path)
        await h.start(nursery)
        manifest = manifest_for(V1)
        head = manifest_head(manifest)
        # a trainer-signed manifest of the same version and root whose shard list was rewritten
        renamed = (dataclasses.replace(manifest.shards[0], name="other.safetensors"), *manifest.shards[1:])
        liar = dataclasses.replace(manifest, shards=renamed)
        lying = ManifestOnly(tmp_path / "liar", liar, seal(TRAINER, liar, run=RUN, seq=5, ts=now_ms()))
        forged = ManifestOnly(
            tmp_path / "forger", manifest, seal(STRANGER, manifest, run=RUN, seq=5, ts=now_ms())
        )
        v9 = manifest_for(blobs(1, 5), version=9)
        empty = ManifestOnly(tmp_path / "empty", v9, seal(TRAINER, v9, run=RUN, seq=5, ts=now_ms()))
        for server in (lying, forged, empty):
            await server.start(nursery)
            h.book.observe(have_all(server.endpoint, manifest))  # claims rank them before the honest copy
        # `empty` holds version 9 only: it answers 404 for version 1
        honest = await h.serve(nursery, V1, manifest, "honest")
        h.book.get(honest.endpoint).weight = 1e-6  # asked last
        await h.send.send(signed_head(manifest))
        done = await h.done.receive()
        assert done.manifest == manifest and h.catalog.get(1).head == head
        stats = h.follower.resolver.stats
        assert dict(stats.refused) == {"BAD_HASH": 1, "WRONG_SENDER": 1} and stats.not_held >= 1
        now = trio.current_time()
        assert (
            h.book.get(lying.endpoint).banned_until > now and h.book.get(forged.endpoint).banned_until > now
        )
        assert h.book.get(empty.endpoint).banned_until == 0 and h.book.get(honest.endpoint).banned_until == 0
        assert h.book.manifest_sources(1, head.merkle_root, now) == [empty.endpoint, honest.endpoint]

    _run(body)


def test_forged_duplicate_and_unwanted_heads_fetch_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def body(nursery: trio.Nursery) -> None:
        h = Harness(tmp_path, newest_only=True)
        await h.start(nursery)
        manifest = manifest_for(V1)
        await h.send.send(signed_head(manifest, STRANGER))
        await h.send.send(signed_head(manifest, shard_count=0))
        await h.send.send(
            seal(TRAINER, manifest_head(manifest_for(V1, run="other")), run="other", seq=1, ts=now_ms())
        )
        await trio.testing.wait_all_tasks_blocked()
        assert h.follower.statistics()["resolving"] == [] and h.follower.resolver.stats.requests == 0
        await h.send.send(signed_head(manifest))  # no source yet: it waits for one
        await h.send.send(signed_head(manifest))
        await trio.testing.wait_all_tasks_blocked()
        assert h.follower.statistics()["resolving"] == [1]
        await h.serve(nursery, V1, manifest, "src")
        await h.done.receive()
        await h.send.send(signed_head(manifest))  # known now
        v0 = manifest_for(blobs(1, 10), version=0)
        await h.send.send(signed_head(v0))  # older than the newest: a worker skips it
        await trio.testing.wait_all_tasks_blocked()
        verdicts = h.follower.stats.head_verdicts
        assert verdicts == {
            "reject:WRONG_SENDER": 1,
            "reject:RULE_VIOLATION": 1,
            "ignore:WRONG_RUN": 1,
            "accept": 1,
            "ignore:DUPLICATE": 2,
            "ignore:STALE": 1,
        }
        assert h.follower.resolver.stats.resolved == 1

    _run(body)


def test_a_newer_head_cancels_an_older_resolution_on_a_worker(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def body(nursery: trio.Nursery) -> None:
        h = Harness(tmp_path, newest_only=True)
        await h.start(nursery)
        v1, v2 = manifest_for(V1, version=1), manifest_for(blobs(2, 1000, seed=2), version=2)
        await h.send.send(signed_head(v1))  # never served anywhere
        await trio.testing.wait_all_tasks_blocked()
        await h.serve(nursery, blobs(2, 1000, seed=2), v2, "v2")
        await h.send.send(signed_head(v2))
        done = await h.done.receive()
        assert done.manifest.version == 2
        assert h.follower.statistics()["resolving"] == [] and h.catalog.versions() == [2]

    _run(body)


def test_a_manifest_arriving_whole_ends_the_resolution_of_its_head(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def body(nursery: trio.Nursery) -> None:
        h = Harness(tmp_path)
        await h.start(nursery)
        manifest = manifest_for(V1)
        await h.send.send(signed_head(manifest))  # no source: resolving
        await trio.testing.wait_all_tasks_blocked()
        assert h.follower.statistics()["resolving"] == [1]
        await h.send.send(signed(manifest))  # the `latest` long poll brought it
        await trio.testing.wait_all_tasks_blocked()
        assert h.follower.statistics()["resolving"] == [] and h.catalog.versions() == [1]

    _run(body)

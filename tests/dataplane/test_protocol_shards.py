"""protocol/shards.py: the pure rules (manifest checks, bitfields, retention, paths, ranges)."""

from __future__ import annotations

import dataclasses

import pytest

from swarmnode.protocol.envelope import MAX_CLOCK_SKEW_MS, seal
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.protocol.messages import ShardHave, ShardInfo
from swarmnode.protocol.shards import (
    Unsatisfiable,
    check_have,
    check_manifest,
    content_range,
    decode_bitfield,
    encode_bitfield,
    have_path,
    is_retained,
    latest_manifest_path,
    parse_content_range,
    parse_endpoint,
    parse_range,
    parse_route,
    shard_path,
    verify_have,
    verify_manifest,
    versions_to_prune,
)
from tests.dataplane.helpers import RUN, STRANGER, TRAINER, blobs, manifest_for, now_ms, signed

# --- manifest ------------------------------------------------------------------------------------


def test_a_built_manifest_passes_and_verifies():
    manifest = manifest_for(blobs(3, 100))
    check_manifest(manifest)
    assert verify_manifest(signed(manifest), run=RUN, trainer=TRAINER.address, now_ms=now_ms()) == manifest


def _broken(**changes):
    return dataclasses.replace(manifest_for(blobs(3, 100)), **changes)


@pytest.mark.parametrize(
    "changes,reason",
    [
        ({"shards": ()}, Reason.RULE_VIOLATION),
        ({"total_size": 301}, Reason.RULE_VIOLATION),
        ({"merkle_root": bytes(32)}, Reason.BAD_HASH),
        ({"parent_version": 1}, Reason.RULE_VIOLATION),
        ({"version": 0, "parent_version": 3}, Reason.RULE_VIOLATION),
    ],
)
def test_inconsistent_manifests_are_rejected(changes, reason):
    with pytest.raises(Reject) as exc:
        check_manifest(_broken(**changes))
    assert exc.value.reason is reason


@pytest.mark.parametrize("name", ["..", ".hidden", "manifest.msgpack", "x.part"])
def test_reserved_shard_names_are_rejected(name):
    shards = [ShardInfo(name, 5, bytes(32))]
    with pytest.raises(Reject):
        check_manifest(manifest_for(shards))


def test_duplicate_and_empty_shards_are_rejected():
    with pytest.raises(Reject):
        manifest_for([ShardInfo("a", 5, bytes(32)), ShardInfo("a", 5, bytes(32))])
    with pytest.raises(Reject):
        manifest_for([ShardInfo("a", 0, bytes(32))])


def test_a_manifest_signed_by_anyone_but_the_trainer_is_rejected():
    envelope = signed(manifest_for(blobs(2, 10)), STRANGER)
    with pytest.raises(Reject) as exc:
        verify_manifest(envelope, run=RUN, trainer=TRAINER.address, now_ms=now_ms())
    assert exc.value.reason is Reason.WRONG_SENDER


def test_a_manifest_for_another_run_is_ignored():
    envelope = signed(manifest_for(blobs(2, 10), run="other-run"))
    with pytest.raises(Ignore) as exc:
        verify_manifest(envelope, run=RUN, trainer=TRAINER.address, now_ms=now_ms())
    assert exc.value.reason is Reason.WRONG_RUN


def test_an_old_manifest_is_accepted_but_one_from_the_future_is_not():
    manifest = manifest_for(blobs(2, 10))
    old = signed(manifest, ts=now_ms() - 10 * MAX_CLOCK_SKEW_MS)
    assert verify_manifest(old, run=RUN, trainer=TRAINER.address, now_ms=now_ms()) == manifest
    future = signed(manifest, ts=now_ms() + 2 * MAX_CLOCK_SKEW_MS)
    with pytest.raises(Ignore):
        verify_manifest(future, run=RUN, trainer=TRAINER.address, now_ms=now_ms())


def test_tampered_manifest_bytes_are_rejected():
    envelope = bytearray(signed(manifest_for(blobs(2, 10))))
    envelope[len(envelope) // 2] ^= 1
    with pytest.raises(Reject):
        verify_manifest(bytes(envelope), run=RUN, trainer=TRAINER.address, now_ms=now_ms())


# --- bitfield ------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 7, 8, 9, 17, 8192])
def test_bitfield_round_trip(count):
    held = {0, count - 1, count // 2}
    data = encode_bitfield(held, count)
    assert len(data) == (count + 7) // 8
    assert decode_bitfield(data, count) == held


def test_bitfield_is_msb_first():
    assert encode_bitfield({0}, 8) == b"\x80"
    assert encode_bitfield({7, 8}, 9) == b"\x01\x80"


@pytest.mark.parametrize("data,count", [(b"", 1), (b"\x00\x00", 8), (b"\x01", 7), (b"\xff", 4)])
def test_malformed_bitfields_are_rejected(data, count):
    with pytest.raises(Reject):
        decode_bitfield(data, count)


def test_encode_refuses_an_index_out_of_range():
    with pytest.raises(ValueError):
        encode_bitfield({8}, 8)


def _have(manifest, **changes):
    fields = dict(
        run=manifest.run,
        version=manifest.version,
        merkle_root=manifest.merkle_root,
        bitfield=encode_bitfield({1}, len(manifest.shards)),
        endpoint="http://127.0.0.1:9000",
    )
    fields.update(changes)
    return ShardHave(**fields)


def test_have_checks():
    manifest = manifest_for(blobs(3, 10))
    assert check_have(_have(manifest), manifest) == {1}
    with pytest.raises(Reject) as exc:
        check_have(_have(manifest, merkle_root=bytes(32)), manifest)
    assert exc.value.reason is Reason.UNKNOWN_CHECKPOINT
    with pytest.raises(Ignore):
        check_have(_have(manifest, version=9), manifest)
    with pytest.raises(Reject):
        check_have(_have(manifest, endpoint="ftp://x:1"), manifest)
    with pytest.raises(Reject):
        check_have(_have(manifest, bitfield=b"\x00\x00"), manifest)


def test_a_signed_have_must_name_the_endpoint_it_came_from():
    manifest = manifest_for(blobs(3, 10))
    envelope = seal(STRANGER, _have(manifest), run=RUN, seq=1, ts=now_ms())
    assert verify_have(envelope, manifest, "http://127.0.0.1:9000", now_ms=now_ms()).bitfield == b"\x40"
    with pytest.raises(Reject):
        verify_have(envelope, manifest, "http://127.0.0.1:9001", now_ms=now_ms())


# --- retention -----------------------------------------------------------------------------------


def test_retention_keeps_async_level_plus_two_versions():
    assert [v for v in range(11) if is_retained(v, 10, 2)] == [7, 8, 9, 10]
    assert versions_to_prune([3, 6, 7, 10], 10, 2) == [3, 6]
    assert versions_to_prune([0, 1], 1, 0) == []
    assert versions_to_prune([0, 1, 2], 2, 0) == [0]


# --- endpoints, paths, ranges --------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["https://a:1", "http://a", "http://a:1/x", "http://a:1?q", "http://u@a:1", "http://a:99999", "a:1"],
)
def test_bad_endpoints_are_rejected(url):
    with pytest.raises(Reject):
        parse_endpoint(url)


def test_endpoints_parse():
    assert parse_endpoint("http://127.0.0.1:8080").port == 8080
    assert parse_endpoint("http://[::1]:8080/").url() == "http://[::1]:8080"


def test_paths_round_trip_through_the_router():
    assert parse_route(shard_path(RUN, 3, "a.safetensors"), 30).name == "a.safetensors"
    route = parse_route(latest_manifest_path(RUN, 4, 99), 30)
    assert (route.kind, route.after, route.wait_s) == ("latest", 4, 30)
    assert parse_route(latest_manifest_path(RUN, None, 5), 30).after == -1
    route = parse_route(have_path(RUN, 2, 3, 5), 30)
    assert (route.kind, route.version, route.after) == ("have", 2, 3)
    assert parse_route("/shards/1.0.0/stats", 30).kind == "stats"


@pytest.mark.parametrize(
    "target",
    [
        "/",
        "/shards/1.0.0/Run/1/manifest",
        "/shards/1.0.0/r/01/manifest",
        "/shards/1.0.0/r/1/shard/..",
        "/shards/1.0.0/r/1/shard/a.part",
        "/shards/1.0.0/r/1/shard/a/b",
        "/shards/1.0.0/r/1/manifest?wait=1",
        "/shards/1.0.0/r/1/shard/a?wait=1",
        "/shards/1.0.0/r/1/have?after=-1&wait=1",
        "/shards/1.0.0/r/99999999999999999999/manifest",
    ],
)
def test_unknown_targets_route_nowhere(target):
    assert parse_route(target, 30) is None


@pytest.mark.parametrize(
    "header,span",
    [
        (None, None),
        ("bytes=0-", (0, 100)),
        ("bytes=10-19", (10, 20)),
        ("bytes=10-1000", (10, 100)),
        ("bytes=-30", (70, 100)),
        ("bytes=-300", (0, 100)),
        ("bytes=5-4", None),
        ("bytes=0-1,5-6", None),
        ("items=0-1", None),
        ("bytes=-", None),
    ],
)
def test_range_header(header, span):
    assert parse_range(header, 100) == span


@pytest.mark.parametrize("header", ["bytes=100-", "bytes=200-300", "bytes=-0"])
def test_unsatisfiable_ranges(header):
    with pytest.raises(Unsatisfiable):
        parse_range(header, 100)


def test_content_range_round_trip():
    assert parse_content_range(content_range(10, 20, 100)) == (10, 20, 100)
    assert parse_content_range("bytes 5-4/100") is None
    assert parse_content_range("bytes 0-100/100") is None
    assert parse_content_range("bytes */100") is None

"""Conformance cases for the shard data plane: manifests, heads, ShardHave, bitfields, ranges, routes and
retention.

The `shards` suite of node/conformance.py: scripts/gen_vectors.py writes `SUITES` to
spec/vectors/shards/*.json; tests/dataplane/test_vectors.py fails when the committed files and these cases
disagree, and replays the files. Invalid cases outnumber valid ones: the reasons are the contract.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import msgpack

from swarmnode.crypto.merkle import merkle_root
from swarmnode.protocol.codec import encode, to_wire
from swarmnode.protocol.envelope import MAX_CLOCK_SKEW_MS, Envelope, seal, signing_digest
from swarmnode.protocol.messages import CheckpointHead, CheckpointManifest, ShardHave, ShardInfo
from swarmnode.protocol.shards import (
    MAX_SHARD_SIZE,
    MAX_SHARDS,
    encode_bitfield,
    have_path,
    latest_manifest_path,
    manifest_head,
    manifest_path,
    shard_path,
)
from swarmnode.protocol.shards_conformance import (
    check_bitfield_case,
    check_have_case,
    check_head_case,
    check_head_match_case,
    check_head_of_case,
    check_manifest_case,
    check_range_case,
    check_retention_case,
    check_route_case,
)
from tests.conformance.keys import NOW_MS, RUN, vector_identity

Vector = dict[str, Any]
TRAINER, OTHER = vector_identity(1), vector_identity(2)
ENDPOINT = "http://192.0.2.10:8000"


def _h(data: bytes) -> str:
    return "0x" + data.hex()


def _case(
    name: str, kind: str, inp: dict[str, Any], check: Callable[[dict[str, Any]], dict[str, Any]]
) -> Vector:
    return {"name": name, "kind": kind, "input": inp, "expect": check(inp)}


def _shards(n: int) -> tuple[ShardInfo, ...]:
    return tuple(
        ShardInfo(f"shard-{i + 1:05d}-of-{n:05d}.safetensors", 1000 + i, bytes([i + 1]) * 32)
        for i in range(n)
    )


def _manifest(**changes: Any) -> CheckpointManifest:
    shards = changes.pop("shards", _shards(3))
    fields: dict[str, Any] = dict(
        run=RUN,
        version=7,
        parent_version=6,
        model_config_hash=bytes(range(32)),
        total_size=sum(s.size for s in shards),
        shards=shards,
        merkle_root=merkle_root([s.sha256 for s in shards]),
        created_ms=NOW_MS,
    )
    fields.update(changes)
    return CheckpointManifest(**fields)


def _sealed(message: Any, identity: Any = TRAINER, ts: int = NOW_MS, run: str = RUN) -> bytes:
    return seal(identity, message, run=run, seq=11, ts=ts)


def _unvalidated_envelope(manifest: CheckpointManifest) -> bytes:
    """A correctly signed envelope around a body that `encode` would refuse (the builder validates)."""
    body = msgpack.packb(to_wire(manifest), use_bin_type=True)
    sig = TRAINER.sign(signing_digest(manifest.TYPE, RUN, TRAINER.address, 11, NOW_MS, body))
    return encode(Envelope(1, manifest.TYPE, RUN, TRAINER.address, 11, NOW_MS, body, sig))


def manifest_cases() -> Iterator[Vector]:
    def case(name: str, envelope: bytes, now_ms: int = NOW_MS) -> Vector:
        inp = {"run": RUN, "trainer": _h(TRAINER.address), "now_ms": now_ms, "envelope": _h(envelope)}
        return _case(f"manifest/{name}", "shard-manifest", inp, check_manifest_case)

    yield case("valid", _sealed(_manifest()))
    yield case("valid-old-timestamp", _sealed(_manifest()), now_ms=NOW_MS + 30 * MAX_CLOCK_SKEW_MS)
    yield case("valid-version-0", _sealed(_manifest(version=0, parent_version=0)))
    yield case("invalid-signed-by-another-key", _sealed(_manifest(), OTHER))
    yield case("ignore-other-run", _sealed(_manifest(run="other-run"), run="other-run"))
    yield case("ignore-from-the-future", _sealed(_manifest(), ts=NOW_MS + 2 * MAX_CLOCK_SKEW_MS))
    yield case("invalid-body-run-differs", _sealed(_manifest(run="other-run")))
    yield case("invalid-wrong-merkle-root", _unvalidated_envelope(_manifest(merkle_root=bytes(32))))
    yield case("invalid-total-size", _unvalidated_envelope(_manifest(total_size=1)))
    yield case("invalid-no-shards", _unvalidated_envelope(_manifest(shards=(), total_size=0)))
    yield case("invalid-parent-not-older", _unvalidated_envelope(_manifest(parent_version=7)))
    dup = _shards(2)
    yield case("invalid-duplicate-names", _unvalidated_envelope(_manifest(shards=(dup[0], dup[0]))))
    for bad_name in ("..", "manifest.msgpack", "x.part"):
        shards = (dataclasses.replace(_shards(1)[0], name=bad_name),)
        yield case(
            f"invalid-reserved-name-{bad_name.strip('.') or 'dotdot'}",
            _unvalidated_envelope(_manifest(shards=shards)),
        )
    zero = (dataclasses.replace(_shards(1)[0], size=0),)
    yield case("invalid-empty-shard", _unvalidated_envelope(_manifest(shards=zero, total_size=0)))
    flipped = bytearray(_sealed(_manifest()))
    flipped[-10] ^= 1  # inside the signature
    yield case("invalid-tampered-signature", bytes(flipped))


def _head(**changes: Any) -> CheckpointHead:
    return dataclasses.replace(manifest_head(_manifest()), **changes)


def head_cases() -> Iterator[Vector]:
    """A gossiped head: signed by the run's trainer and internally consistent (spec/shards.md, heads)."""

    def case(name: str, envelope: bytes, now_ms: int = NOW_MS) -> Vector:
        inp = {"run": RUN, "trainer": _h(TRAINER.address), "now_ms": now_ms, "envelope": _h(envelope)}
        return _case(f"head/{name}", "shard-head", inp, check_head_case)

    yield case("valid", _sealed(_head()))
    yield case("valid-version-0", _sealed(_head(version=0, parent_version=0)))
    yield case("valid-max-shards", _sealed(_head(shard_count=MAX_SHARDS, total_size=MAX_SHARDS)))
    yield case("invalid-signed-by-another-key", _sealed(_head(), OTHER))
    yield case("invalid-manifest-not-head", _sealed(_manifest()))
    yield case("ignore-other-run", _sealed(_head(run="other-run"), run="other-run"))
    yield case("ignore-from-the-future", _sealed(_head(), ts=NOW_MS + 2 * MAX_CLOCK_SKEW_MS))
    yield case("invalid-body-run-differs", _sealed(_head(run="other-run")))
    yield case("invalid-no-shards", _sealed(_head(shard_count=0, total_size=0)))
    yield case("invalid-too-many-shards", _sealed(_head(shard_count=MAX_SHARDS + 1)))
    yield case("invalid-total-below-shard-count", _sealed(_head(shard_count=3, total_size=2)))
    yield case("invalid-total-above-max-shards", _sealed(_head(shard_count=1, total_size=MAX_SHARD_SIZE + 1)))
    yield case("invalid-parent-not-older", _sealed(_head(parent_version=7)))
    yield case("invalid-version-0-with-parent", _sealed(_head(version=0, parent_version=1)))
    flipped = bytearray(_sealed(_head()))
    flipped[-10] ^= 1  # inside the signature
    yield case("invalid-tampered-signature", bytes(flipped))


def head_of_cases() -> Iterator[Vector]:
    """The head a trainer gossips for a manifest: its canonical bytes and the manifest body's sha256."""

    def case(name: str, manifest: CheckpointManifest) -> Vector:
        inp = {"run": RUN, "trainer": _h(TRAINER.address), "now_ms": NOW_MS}
        inp["manifest"] = _h(_sealed(manifest))
        return _case(f"head-of/{name}", "shard-head-of", inp, check_head_of_case)

    yield case("three-shards", _manifest())
    yield case("version-0", _manifest(version=0, parent_version=0))
    long = tuple(
        ShardInfo(f"model-{i + 1:05d}-of-00040-{'x' * 95}.safetensors", 50 << 20, bytes([i + 1]) * 32)
        for i in range(40)
    )
    yield case("forty-long-names", _manifest(shards=long))


def head_match_cases() -> Iterator[Vector]:
    """A manifest fetched for a trusted head is kept only if it is the manifest the head names."""
    manifest = _manifest()
    head = manifest_head(manifest)

    def case(name: str, envelope: bytes, named: CheckpointHead = head) -> Vector:
        inp = {
            "run": RUN,
            "trainer": _h(TRAINER.address),
            "now_ms": NOW_MS,
            "head": _h(_sealed(named)),
            "manifest": _h(envelope),
        }
        return _case(f"head-match/{name}", "shard-head-match", inp, check_head_match_case)

    yield case("valid", _sealed(manifest))
    yield case("valid-old-timestamp", _sealed(manifest, ts=NOW_MS - 30 * MAX_CLOCK_SKEW_MS))
    yield case("invalid-signed-by-another-key", _sealed(manifest, OTHER))
    yield case("invalid-head-not-manifest", _sealed(head))
    bad_root = _unvalidated_envelope(_manifest(merkle_root=bytes(32)))
    yield case("invalid-manifest-inconsistent", bad_root, _head(merkle_root=bytes(32)))
    for field, value in [
        ("version", 8),
        ("parent_version", 5),
        ("model_config_hash", bytes(32)),
        ("total_size", manifest.total_size + 1),
        ("shard_count", 4),
        ("merkle_root", bytes(32)),
        ("created_ms", NOW_MS + 1),
    ]:
        name = f"invalid-head-{field.replace('_', '-')}-differs"
        yield case(name, _sealed(manifest), _head(**{field: value}))
    yield case("invalid-head-digest-differs", _sealed(manifest), _head(manifest_digest=bytes(32)))
    renamed = (dataclasses.replace(manifest.shards[0], name="renamed.safetensors"), *manifest.shards[1:])
    yield case("invalid-shard-renamed-same-root", _sealed(_manifest(shards=renamed)))
    resized = (dataclasses.replace(manifest.shards[0], size=999), manifest.shards[1])
    resized += (dataclasses.replace(manifest.shards[2], size=manifest.shards[2].size + 1),)
    yield case("invalid-sizes-moved-same-total", _sealed(_manifest(shards=resized)))


def bitfield_cases() -> Iterator[Vector]:
    def case(name: str, bitfield: bytes, count: int) -> Vector:
        inp = {"shard_count": count, "bitfield": _h(bitfield)}
        return _case(f"bitfield/{name}", "shard-bitfield", inp, check_bitfield_case)

    yield case("valid-first", encode_bitfield({0}, 3), 3)
    yield case("valid-9-of-9", encode_bitfield(range(9), 9), 9)
    yield case("valid-none-of-16", bytes(2), 16)
    yield case("invalid-too-short", b"", 1)
    yield case("invalid-too-long", bytes(2), 8)
    yield case("invalid-spare-bit-set", b"\x01", 7)
    yield case("invalid-spare-bits-set-9", b"\xff\xff", 9)


def have_cases() -> Iterator[Vector]:
    manifest = _manifest()

    def have(**changes: Any) -> ShardHave:
        fields: dict[str, Any] = dict(
            run=RUN,
            version=manifest.version,
            merkle_root=manifest.merkle_root,
            bitfield=encode_bitfield({0, 2}, 3),
            endpoint=ENDPOINT,
        )
        fields.update(changes)
        return ShardHave(**fields)

    def case(name: str, envelope: bytes, endpoint: str = ENDPOINT) -> Vector:
        inp = {
            "run": RUN,
            "trainer": _h(TRAINER.address),
            "now_ms": NOW_MS,
            "manifest": _h(_sealed(manifest)),
            "have": _h(envelope),
            "endpoint": endpoint,
        }
        return _case(f"have/{name}", "shard-have", inp, check_have_case)

    yield case("valid", _sealed(have(), OTHER))
    yield case("invalid-other-endpoint", _sealed(have(), OTHER), endpoint="http://192.0.2.11:8000")
    yield case("invalid-other-root", _sealed(have(merkle_root=bytes(32)), OTHER))
    yield case("ignore-other-version", _sealed(have(version=8), OTHER))
    yield case("invalid-bitfield-length", _sealed(have(bitfield=bytes(2)), OTHER))
    yield case(
        "invalid-endpoint-scheme",
        _sealed(have(endpoint="https://192.0.2.10:8000"), OTHER),
        "https://192.0.2.10:8000",
    )


def range_cases() -> Iterator[Vector]:
    for name, header in [
        ("none", None),
        ("from-start", "bytes=0-"),
        ("middle", "bytes=100-199"),
        ("past-end-clipped", "bytes=900-5000"),
        ("suffix", "bytes=-100"),
        ("unsatisfiable-start", "bytes=1000-"),
        ("unsatisfiable-empty-suffix", "bytes=-0"),
        ("ignored-multiple", "bytes=0-1,5-9"),
        ("ignored-reversed", "bytes=9-5"),
        ("ignored-unit", "pages=0-1"),
    ]:
        yield _case(f"range/{name}", "shard-range", {"header": header, "size": 1000}, check_range_case)


def route_cases() -> Iterator[Vector]:
    for name, target in [
        ("latest", latest_manifest_path(RUN)),
        ("latest-poll", latest_manifest_path(RUN, 6, 20)),
        ("latest-poll-capped", latest_manifest_path(RUN, None, 900)),
        ("manifest", manifest_path(RUN, 7)),
        ("shard", shard_path(RUN, 7, "shard-00001-of-00003.safetensors")),
        ("have-poll", have_path(RUN, 7, 1, 5)),
        ("stats", "/shards/1.0.0/stats"),
        ("unknown-traversal", shard_path(RUN, 7, "..")),
        ("unknown-partial-file", shard_path(RUN, 7, "a.safetensors.part")),
        ("unknown-leading-zero", f"/shards/1.0.0/{RUN}/07/manifest"),
        ("unknown-query-on-shard", shard_path(RUN, 7, "a") + "?wait=1"),
        ("unknown-version-2^64", f"/shards/1.0.0/{RUN}/18446744073709551616/manifest"),
        ("unknown-prefix", f"/shards/2.0.0/{RUN}/7/manifest"),
    ]:
        yield _case(f"route/{name}", "shard-route", {"target": target, "max_wait_s": 30}, check_route_case)


def retention_cases() -> Iterator[Vector]:
    for latest, level in [(10, 2), (10, 0), (1, 2), (64, 64)]:
        inp = {
            "versions": list(range(max(0, latest - 5), latest + 1)),
            "latest": latest,
            "async_level": level,
        }
        yield _case(f"retention/latest-{latest}-async-{level}", "shard-retention", inp, check_retention_case)


SUITES: dict[str, Callable[[], Iterator[Vector]]] = {
    "shards-manifest": manifest_cases,
    "shards-head": head_cases,
    "shards-head-of": head_of_cases,
    "shards-head-match": head_match_cases,
    "shards-have": have_cases,
    "shards-bitfield": bitfield_cases,
    "shards-range": range_cases,
    "shards-route": route_cases,
    "shards-retention": retention_cases,
}

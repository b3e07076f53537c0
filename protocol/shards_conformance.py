"""Replays spec/vectors/shards/*.json through the real shard rules (protocol/shards.py).

The rules are pure, so their replay sits beside them and needs nothing of the node; node/conformance.py
lists it as the `shards` suite. Each handler takes a vector's `input` and returns what our implementation
produces; a vector passes when that equals its `expect`. Verdicts are
`{"verdict": "accept" | "reject" | "ignore", "reason": code}`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarmnode.protocol.codec import encode
from swarmnode.protocol.errors import ProtocolError
from swarmnode.protocol.messages import CheckpointHead
from swarmnode.protocol.shards import (
    Unsatisfiable,
    decode_bitfield,
    encode_bitfield,
    is_retained,
    manifest_head,
    parse_range,
    parse_route,
    verify_have,
    verify_head,
    verify_manifest,
    verify_manifest_for_head,
)


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.removeprefix("0x"))


def _verdict(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return {"verdict": "accept", **run()}
    except ProtocolError as exc:
        return {"verdict": exc.verdict, "reason": int(exc.reason)}


def check_manifest_case(inp: dict[str, Any]) -> dict[str, Any]:
    def run() -> dict[str, Any]:
        m = verify_manifest(
            _hex(inp["envelope"]), run=inp["run"], trainer=_hex(inp["trainer"]), now_ms=inp["now_ms"]
        )
        return {
            "version": m.version,
            "total_size": m.total_size,
            "shards": len(m.shards),
            "merkle_root": "0x" + m.merkle_root.hex(),
        }

    return _verdict(run)


def _head_summary(head: CheckpointHead) -> dict[str, Any]:
    return {
        "version": head.version,
        "shard_count": head.shard_count,
        "total_size": head.total_size,
        "merkle_root": "0x" + head.merkle_root.hex(),
        "manifest_digest": "0x" + head.manifest_digest.hex(),
    }


def check_head_case(inp: dict[str, Any]) -> dict[str, Any]:
    """A gossiped head envelope: trusted only when the run's trainer signed it and it is consistent."""

    def run() -> dict[str, Any]:
        head = verify_head(
            _hex(inp["envelope"]), run=inp["run"], trainer=_hex(inp["trainer"]), now_ms=inp["now_ms"]
        )
        return _head_summary(head)

    return _verdict(run)


def check_head_of_case(inp: dict[str, Any]) -> dict[str, Any]:
    """The head a trainer gossips for a manifest, as canonical bytes."""

    def run() -> dict[str, Any]:
        manifest = verify_manifest(
            _hex(inp["manifest"]), run=inp["run"], trainer=_hex(inp["trainer"]), now_ms=inp["now_ms"]
        )
        head = manifest_head(manifest)
        return {**_head_summary(head), "head": "0x" + encode(head).hex()}

    return _verdict(run)


def check_head_match_case(inp: dict[str, Any]) -> dict[str, Any]:
    """A manifest envelope fetched over HTTP for a trusted head: kept only if it is the one the head names."""
    trainer = _hex(inp["trainer"])
    head = verify_head(_hex(inp["head"]), run=inp["run"], trainer=trainer, now_ms=inp["now_ms"])

    def run() -> dict[str, Any]:
        data = _hex(inp["manifest"])
        manifest = verify_manifest_for_head(data, head, trainer=trainer, now_ms=inp["now_ms"])
        return {"version": manifest.version, "shards": len(manifest.shards)}

    return _verdict(run)


def check_bitfield_case(inp: dict[str, Any]) -> dict[str, Any]:
    def run() -> dict[str, Any]:
        held = decode_bitfield(_hex(inp["bitfield"]), inp["shard_count"])
        if encode_bitfield(held, inp["shard_count"]) != _hex(inp["bitfield"]):
            raise AssertionError("bitfield does not re-encode to itself")
        return {"held": sorted(held)}

    return _verdict(run)


def check_have_case(inp: dict[str, Any]) -> dict[str, Any]:
    trusted = verify_manifest(
        _hex(inp["manifest"]), run=inp["run"], trainer=_hex(inp["trainer"]), now_ms=inp["now_ms"]
    )

    def run() -> dict[str, Any]:
        have = verify_have(_hex(inp["have"]), trusted, inp["endpoint"], now_ms=inp["now_ms"])
        return {"held": sorted(decode_bitfield(have.bitfield, len(trusted.shards)))}

    return _verdict(run)


def check_range_case(inp: dict[str, Any]) -> dict[str, Any]:
    try:
        span = parse_range(inp["header"], inp["size"])
    except Unsatisfiable:
        return {"status": 416}
    if span is None:
        return {"status": 200}
    return {"status": 206, "start": span[0], "end": span[1]}


def check_retention_case(inp: dict[str, Any]) -> dict[str, Any]:
    kept = [v for v in inp["versions"] if is_retained(v, inp["latest"], inp["async_level"])]
    return {"retained": kept, "pruned": [v for v in inp["versions"] if v not in kept]}


def check_route_case(inp: dict[str, Any]) -> dict[str, Any]:
    route = parse_route(inp["target"], inp["max_wait_s"])
    if route is None:
        return {"status": 404}
    return {
        "kind": route.kind,
        "run": route.run,
        "version": route.version,
        "name": route.name,
        "after": route.after,
        "wait_s": route.wait_s,
    }


SHARD_HANDLERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "shard-manifest": check_manifest_case,
    "shard-head": check_head_case,
    "shard-head-of": check_head_of_case,
    "shard-head-match": check_head_match_case,
    "shard-bitfield": check_bitfield_case,
    "shard-have": check_have_case,
    "shard-range": check_range_case,
    "shard-retention": check_retention_case,
    "shard-route": check_route_case,
}

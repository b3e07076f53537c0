"""Replays spec/vectors/shards/*.json through the real shard rules (protocol/shards.py).

Each handler takes a vector's `input` and returns what our implementation produces; a vector passes when
that equals its `expect`. Verdicts are `{"verdict": "accept" | "reject" | "ignore", "reason": code}`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol.errors import ProtocolError
from protocol.shards import (
    Unsatisfiable,
    decode_bitfield,
    encode_bitfield,
    is_retained,
    parse_range,
    parse_route,
    verify_have,
    verify_manifest,
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
    "shard-bitfield": check_bitfield_case,
    "shard-have": check_have_case,
    "shard-range": check_range_case,
    "shard-retention": check_retention_case,
    "shard-route": check_route_case,
}

"""Conformance handlers for the networking formats (spec/vectors/p2p/*.json).

Same document shape and verdict convention as node/conformance.py: `{suite, cases: [{name, kind, input,
expect}]}`. These kinds are meant to join `node.conformance.HANDLERS`; until then
tests/p2p/test_vectors.py replays them through `P2P_HANDLERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from node.p2p.gossip import DEFAULT_POLICIES, check_gossip_message
from node.p2p.records import (
    InvalidRecord,
    checkpoint_key,
    checkpoint_name,
    open_run_record,
    role_key,
    role_name,
    run_record_key,
)
from protocol import ids
from protocol.codec import to_json
from protocol.envelope import ReplayWindow
from protocol.errors import ProtocolError


def _hex(text: str) -> bytes:
    return bytes.fromhex(text[2:] if text.startswith("0x") else text)


def check_dht_key(inp: dict[str, Any]) -> dict[str, Any]:
    """Provider key of a role or checkpoint name, and the run record key, or `invalid`."""
    try:
        if "role" in inp:
            name, key = role_name(inp["run"], inp["role"]), role_key(inp["run"], inp["role"])
        else:
            name, key = (
                checkpoint_name(inp["run"], inp["version"]),
                checkpoint_key(inp["run"], inp["version"]),
            )
        return {"name": name, "key": "0x" + key.hex(), "run_record_key": run_record_key(inp["run"])}
    except InvalidRecord as exc:
        return {"invalid": str(exc)}


def check_run_record(inp: dict[str, Any]) -> dict[str, Any]:
    trainer = _hex(inp["trainer"]) if inp.get("trainer") else None
    try:
        record = open_run_record(inp["key"], _hex(inp["value"]), trainer=trainer)
    except InvalidRecord:
        return {"verdict": "reject"}
    return {
        "verdict": "accept",
        "trainer": "0x" + record.sender.hex(),
        "created_ms": record.descriptor.created_ms,
    }


def check_gossip_topic(inp: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"topic": ids.topic(inp["run"], inp["kind"])}
    except ValueError:
        return {"invalid": True}


def check_gossip_message_case(inp: dict[str, Any]) -> dict[str, Any]:
    policy = DEFAULT_POLICIES[inp["kind"]]
    replay = ReplayWindow()
    for earlier in inp.get("accepted_before", []):
        check_gossip_message(policy, _hex(earlier), run=inp["run"], now_ms=inp["now_ms"], replay=replay)
    try:
        opened = check_gossip_message(
            policy, _hex(inp["data"]), run=inp["run"], now_ms=inp["now_ms"], replay=replay
        )
    except ProtocolError as exc:
        return {"verdict": exc.verdict, "reason": int(exc.reason)}
    return {"verdict": "accept", "type": opened.envelope.type, "fields": to_json(opened.message)}


P2P_HANDLERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "dht_key": check_dht_key,
    "run_record": check_run_record,
    "gossip_topic": check_gossip_topic,
    "gossip_message": check_gossip_message_case,
}

"""Replays spec/vectors/p2p/*.json through the real networking rules (DHT records, gossip topics, messages
and authority); node/conformance.py lists it as the `p2p` suite.

Same document shape and verdict convention as every suite: `{suite, cases: [{name, kind, input, expect}]}`.
The rules live in node/p2p (records, gossip policy), so their replay does too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarmnode.node.p2p.gossip import (
    DEFAULT_POLICIES,
    AuthorityView,
    LedgerView,
    authorise,
    check_gossip_message,
    check_ledger_entry,
)
from swarmnode.node.p2p.records import (
    InvalidRecord,
    checkpoint_key,
    checkpoint_name,
    open_run_record,
    role_key,
    role_name,
    run_record_key,
)
from swarmnode.protocol import ids
from swarmnode.protocol.codec import decode, to_json
from swarmnode.protocol.envelope import ReplayWindow
from swarmnode.protocol.errors import ProtocolError
from swarmnode.protocol.ledger_messages import LedgerEntry


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


def _authority_view(view: dict[str, Any]) -> AuthorityView:
    ledger = view.get("ledger")
    return AuthorityView(
        trainer=_hex(view["trainer"]) if view.get("trainer") else None,
        ledger=None
        if ledger is None
        else LedgerView(
            validators=frozenset(_hex(a) for a in ledger["validators"]),
            registered=frozenset(_hex(a) for a in ledger["registered"]),
            former={_hex(a): ms for a, ms in ledger["former"].items()},
            as_of_ms=ledger["as_of_ms"],
            ledger_id=ledger.get("ledger_id"),
        ),
    )


def check_gossip_authority(inp: dict[str, Any]) -> dict[str, Any]:
    """Topic authority of a signer (and, given `entry`, a ledger entry's operation) under a view."""
    view = _authority_view(inp["view"])
    try:
        authorise(inp["kind"], _hex(inp["sender"]), inp["ts_ms"], view)
        if "entry" in inp:
            check_ledger_entry(decode(LedgerEntry, _hex(inp["entry"])), view)
    except ProtocolError as exc:
        return {"verdict": exc.verdict, "reason": int(exc.reason)}
    return {"verdict": "accept"}


P2P_HANDLERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "dht_key": check_dht_key,
    "run_record": check_run_record,
    "gossip_topic": check_gossip_topic,
    "gossip_message": check_gossip_message_case,
    "gossip_authority": check_gossip_authority,
}

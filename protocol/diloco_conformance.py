"""Replays spec/vectors/diloco/*.json through the real DiLoCo rules (protocol/diloco.py).

The rules are pure, so their replay sits beside them; only the payload kind, which decompresses tensors,
needs the node (node/diloco/conformance.py adds it). Each handler takes a vector's `input` and returns what
our implementation produces; a vector passes when that equals its `expect`. Verdicts are
`{"verdict": "accept" | "reject" | "ignore", "reason": code}`. Byte strings are `0x` hex; an entry is
`[trainer, digest]`; messages given as bodies (not envelopes) are their canonical encoding.
`{"error": "out-of-range"}` marks an input outside a function's domain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from swarmnode.protocol import diloco as rules
from swarmnode.protocol.codec import decode
from swarmnode.protocol.errors import ProtocolError
from swarmnode.protocol.messages import DilocoEntry, DilocoRun, RunDescriptor
from swarmnode.protocol.runs import run_trainers

OUT_OF_RANGE = "out-of-range"  # the input is outside the function's domain: it MUST be refused


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.removeprefix("0x"))


def _h(data: bytes) -> str:
    return "0x" + data.hex()


def _verdict(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return {"verdict": "accept", **run()}
    except ProtocolError as exc:
        return {"verdict": exc.verdict, "reason": int(exc.reason)}


def _entries(items: list[list[str]]) -> tuple[DilocoEntry, ...]:
    return tuple(DilocoEntry(_hex(t), _hex(d)) for t, d in items)


def _entry_list(entries: tuple[DilocoEntry, ...]) -> list[list[str]]:
    return [[_h(e.trainer), _h(e.digest)] for e in entries]


def _plan(inp: dict[str, Any]) -> DilocoRun:
    """The trusted run a message case is judged against (itself a valid vector of the run suite)."""
    return rules.verify_plan(
        _hex(inp["plan"]), run=inp["run"], owner=_hex(inp["owner"]), now_ms=inp["now_ms"]
    )


def check_run_case(inp: dict[str, Any]) -> dict[str, Any]:
    def run() -> dict[str, Any]:
        plan = rules.verify_plan(
            _hex(inp["envelope"]), run=inp["run"], owner=_hex(inp["owner"]), now_ms=inp["now_ms"]
        )
        return {
            "plan_digest": _h(rules.plan_digest(plan)),
            "trainers": [_h(t) for t in plan.trainers],
            "namespaces": [
                [rules.contribution_namespace(plan.run, i), rules.outer_namespace(plan.run, i)]
                for i in range(len(plan.trainers))
            ],
        }

    return _verdict(run)


def check_contribution_case(inp: dict[str, Any]) -> dict[str, Any]:
    plan = _plan(inp)

    def run() -> dict[str, Any]:
        base = _hex(inp["base"]) if inp["base"] is not None else None
        c = rules.verify_contribution(
            _hex(inp["envelope"]),
            plan=plan,
            digest=rules.plan_digest(plan),
            round=inp["round"],
            base=base,
            now_ms=inp["now_ms"],
        )
        return {
            "trainer": _h(c.sender),
            "digest": _h(c.digest),
            "merkle_root": _h(c.manifest.merkle_root),
            "shards": len(c.manifest.shards),
        }

    return _verdict(run)


def check_vote_case(inp: dict[str, Any]) -> dict[str, Any]:
    plan = _plan(inp)

    def run() -> dict[str, Any]:
        base = _hex(inp["base"]) if inp["base"] is not None else None
        vote = rules.verify_vote(
            _hex(inp["envelope"]),
            plan=plan,
            digest=rules.plan_digest(plan),
            round=inp["round"],
            base=base,
            now_ms=inp["now_ms"],
        )
        return {"voter": _h(vote.sender), "entries": _entry_list(vote.message.entries)}

    return _verdict(run)


def check_outer_case(inp: dict[str, Any]) -> dict[str, Any]:
    plan = _plan(inp)

    def run() -> dict[str, Any]:
        state = rules.verify_outer_state(
            _hex(inp["envelope"]), plan=plan, digest=rules.plan_digest(plan), now_ms=inp["now_ms"]
        )
        return {"trainer": _h(state.sender), "round": state.message.round, "theta": _h(state.message.theta)}

    return _verdict(run)


def check_decide_case(inp: dict[str, Any]) -> dict[str, Any]:
    me = _hex(inp["me"])
    own = _entries(inp["own"])
    votes = {_hex(voter): _entries(entries) for voter, entries in inp["votes"].items()}
    return {"decided": _entry_list(rules.decide(me, own, votes))}


def check_lineage_case(inp: dict[str, Any]) -> dict[str, Any]:
    support = {_hex(base): {_hex(t) for t in trainers} for base, trainers in inp["support"].items()}
    return {"winner": _h(rules.winning_base(_hex(inp["mine"]), support))}


def check_join_case(inp: dict[str, Any]) -> dict[str, Any]:
    offers = [(_hex(o["sender"]), o["round"], _hex(o["theta"])) for o in inp["offers"]]
    choice = rules.choose_outer_state(offers)
    return {"choice": None if choice is None else {"round": choice[0], "theta": _h(choice[1])}}


def check_route_case(inp: dict[str, Any]) -> dict[str, Any]:
    route = rules.parse_route(inp["target"], inp["max_wait_s"])
    if route is None:
        return {"status": 404}
    return {
        "kind": route.kind,
        "run": route.run,
        "round": route.round,
        "trainer": _h(route.trainer) if route.trainer else None,
        "after": route.after,
        "wait_s": route.wait_s,
    }


def check_owner_case(inp: dict[str, Any]) -> dict[str, Any]:
    trainers = [_hex(t) for t in inp["trainers"]]
    try:
        owner = rules.rollout_owner(_hex(inp["digest"]), trainers)
    except ValueError:
        return {"error": OUT_OF_RANGE}
    return {"owner": _h(owner), "index": trainers.index(owner)}


def check_rl_plan_case(inp: dict[str, Any]) -> dict[str, Any]:
    def run() -> dict[str, Any]:
        plan = decode(DilocoRun, _hex(inp["plan"]))
        descriptor = decode(RunDescriptor, _hex(inp["descriptor"]))
        rules.check_rl_plan(plan, descriptor)
        return {"trainers": [_h(t) for t in run_trainers(descriptor)]}

    return _verdict(run)


DILOCO_RULE_HANDLERS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "diloco-run": check_run_case,
    "diloco-contribution": check_contribution_case,
    "diloco-vote": check_vote_case,
    "diloco-outer": check_outer_case,
    "diloco-decide": check_decide_case,
    "diloco-lineage": check_lineage_case,
    "diloco-join": check_join_case,
    "diloco-route": check_route_case,
    "diloco-owner": check_owner_case,
    "diloco-rl-plan": check_rl_plan_case,
}

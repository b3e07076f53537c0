"""spec/vectors/p2p/*.json: current with the cases, and passing through the real code paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.gen_vectors import VECTORS, generators_of, render
from swarmnode.node.conformance import suite_named
from swarmnode.node.p2p.conformance import P2P_HANDLERS

SUITE = suite_named("p2p")
SUITES = generators_of(SUITE)


def file_for(suite: str) -> Path:
    return SUITE.file_for(VECTORS, suite)


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_committed_vectors_are_current(suite: str) -> None:
    stale = "stale vectors: run scripts/gen_vectors.py"
    assert file_for(suite).read_text() == render(suite, SUITES[suite]()), stale


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_vectors_replay(suite: str) -> None:
    document = json.loads(file_for(suite).read_text())
    assert document["suite"] == suite
    invalid = 0
    for case in document["cases"]:
        got = P2P_HANDLERS[case["kind"]](case["input"])
        assert got == case["expect"], case["name"]
        invalid += got.get("verdict", "accept") != "accept" or "invalid" in got
    assert invalid >= len(document["cases"]) / 2 or suite == "p2p-gossip-topics"


def test_expected_verdicts_are_the_documented_ones() -> None:
    by_name = {c["name"]: c["expect"] for s in SUITES for c in json.loads(file_for(s).read_text())["cases"]}
    assert by_name["gossip-message/invalid-forged-sender"] == {"verdict": "reject", "reason": 500}
    assert by_name["gossip-message/invalid-oversized-for-topic"] == {"verdict": "reject", "reason": 402}
    assert by_name["gossip-message/invalid-verdict-on-shards"] == {"verdict": "reject", "reason": 403}
    assert by_name["gossip-message/ignore-replay"] == {"verdict": "ignore", "reason": 202}
    assert by_name["run-record/invalid-non-namespaced-key"] == {"verdict": "reject"}
    assert by_name["dht-key/role-relay"]["name"] == "swarmnode/vector-run/role/relay"

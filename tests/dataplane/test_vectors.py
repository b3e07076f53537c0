"""spec/vectors/shards/*.json: current with the cases, and passing through the real code paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.gen_vectors import VECTORS, generators_of, render
from swarmnode.node.conformance import suite_named
from swarmnode.protocol.shards_conformance import SHARD_HANDLERS

SUITE = suite_named("shards")
SUITES = generators_of(SUITE)


def file_for(suite: str) -> Path:
    return SUITE.file_for(VECTORS, suite)


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_committed_vectors_are_current(suite: str) -> None:
    assert file_for(suite).read_text() == render(suite, SUITES[suite]()), (
        "stale vectors: run scripts/gen_vectors.py"
    )


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_vectors_replay(suite: str) -> None:
    document = json.loads(file_for(suite).read_text())
    assert document["suite"] == suite and document["cases"]
    for case in document["cases"]:
        assert SHARD_HANDLERS[case["kind"]](case["input"]) == case["expect"], case["name"]


def test_expected_verdicts_are_the_documented_ones() -> None:
    by_name = {c["name"]: c["expect"] for s in SUITES for c in json.loads(file_for(s).read_text())["cases"]}
    assert by_name["manifest/valid"]["verdict"] == "accept"
    assert by_name["manifest/valid-old-timestamp"]["verdict"] == "accept"
    assert by_name["manifest/invalid-signed-by-another-key"] == {"verdict": "reject", "reason": 501}
    assert by_name["manifest/invalid-wrong-merkle-root"] == {"verdict": "reject", "reason": 608}
    assert by_name["manifest/ignore-from-the-future"] == {"verdict": "ignore", "reason": 206}
    assert by_name["manifest/invalid-tampered-signature"] == {"verdict": "reject", "reason": 500}
    assert by_name["head/valid"]["shard_count"] == 3
    assert by_name["head/invalid-signed-by-another-key"] == {"verdict": "reject", "reason": 501}
    assert by_name["head/invalid-manifest-not-head"] == {"verdict": "reject", "reason": 411}
    assert by_name["head/invalid-no-shards"] == {"verdict": "reject", "reason": 600}
    assert by_name["head-of/three-shards"]["head"].startswith("0x89a372756e")  # a 9-field map, `run` first
    assert by_name["head-match/valid"] == {"verdict": "accept", "version": 7, "shards": 3}
    assert by_name["head-match/invalid-head-merkle-root-differs"] == {"verdict": "reject", "reason": 600}
    assert by_name["head-match/invalid-head-digest-differs"] == {"verdict": "reject", "reason": 608}
    assert by_name["head-match/invalid-shard-renamed-same-root"] == {"verdict": "reject", "reason": 608}
    assert by_name["have/invalid-other-root"] == {"verdict": "reject", "reason": 607}
    assert by_name["bitfield/invalid-spare-bit-set"] == {"verdict": "reject", "reason": 600}
    assert by_name["range/unsatisfiable-start"] == {"status": 416}
    assert by_name["range/suffix"] == {"status": 206, "start": 900, "end": 1000}
    assert by_name["route/unknown-traversal"] == {"status": 404}
    assert by_name["route/latest-poll-capped"]["wait_s"] == 30
    assert by_name["retention/latest-10-async-2"]["retained"] == [7, 8, 9, 10]


def test_every_handler_kind_has_cases_and_invalid_cases_abound() -> None:
    cases = [c for s in SUITES for c in SUITES[s]()]
    assert {c["kind"] for c in cases} == set(SHARD_HANDLERS)
    invalid = [
        c
        for c in cases
        if c["expect"].get("verdict", "accept") != "accept" or c["expect"].get("status") in (404, 416)
    ]
    verdicts = [c for c in cases if "verdict" in c["expect"]]
    assert len([c for c in verdicts if c["expect"]["verdict"] != "accept"]) > len(verdicts) / 2
    assert invalid

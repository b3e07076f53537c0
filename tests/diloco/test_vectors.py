"""spec/vectors/diloco/*.json: current with the cases, and passing through the real code paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.gen_vectors import VECTORS, generators_of, render
from swarmnode.node.conformance import suite_named
from swarmnode.node.diloco.conformance import DILOCO_HANDLERS

SUITE = suite_named("diloco")
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
        assert DILOCO_HANDLERS[case["kind"]](case["input"]) == case["expect"], case["name"]


def _by_name() -> dict[str, dict[str, object]]:
    return {c["name"]: c["expect"] for s in SUITES for c in json.loads(file_for(s).read_text())["cases"]}


def test_expected_verdicts_are_the_documented_ones() -> None:
    by_name = _by_name()
    for name in ("run/valid", "contribution/valid", "vote/valid", "outer/valid", "outer/valid-skipped-round"):
        assert by_name[name]["verdict"] == "accept", name
    assert by_name["run/invalid-signed-by-a-trainer"] == {"verdict": "reject", "reason": 501}
    assert by_name["run/invalid-run-id-too-long"] == {"verdict": "reject", "reason": 600}
    assert by_name["contribution/invalid-from-a-non-trainer"] == {"verdict": "reject", "reason": 501}
    assert by_name["contribution/invalid-tampered-signature"] == {"verdict": "reject", "reason": 500}
    assert by_name["contribution/ignore-past-round"] == {"verdict": "ignore", "reason": 203}
    assert by_name["contribution/ignore-future-round"] == {"verdict": "ignore", "reason": 205}
    assert by_name["contribution/ignore-another-base"] == {"verdict": "ignore", "reason": 205}
    assert by_name["contribution/invalid-merkle-root-differs"] == {"verdict": "reject", "reason": 608}
    assert by_name["contribution/invalid-manifest-root-not-over-shards"] == {
        "verdict": "reject",
        "reason": 608,
    }
    assert by_name["contribution/invalid-manifest-signed-by-another"] == {"verdict": "reject", "reason": 501}
    assert by_name["vote/invalid-without-own-entry"] == {"verdict": "reject", "reason": 600}
    assert by_name["route/unknown-uppercase-trainer"] == {"status": 404}
    assert by_name["route/outer-poll-capped"]["wait_s"] == 30


def test_the_contributor_set_rule_on_its_named_cases() -> None:
    by_name = _by_name()

    def authors(name: str) -> int:
        decided = by_name[f"decide/{name}"]["decided"]
        assert isinstance(decided, list)
        return len(decided)

    assert authors("all-agree") == 3
    assert authors("late-author-left-out-by-itself") == authors("late-author-left-out-by-others") == 2
    assert authors("held-by-one-voter-counts-for-all") == 3
    assert authors("crashed-after-contributing") == 3
    assert authors("equivocating-author-dropped") == 2


def test_the_rl_run_rules_on_their_named_cases() -> None:
    by_name = _by_name()
    assert by_name["owner/high-bit-set"]["index"] == 2  # 2^63 mod 3, read unsigned
    assert by_name["owner/all-ones-prefix-of-4"]["index"] == 3
    assert by_name["owner/big-endian"]["index"] == 1
    assert by_name["owner/order-as-given"]["owner"] != by_name["owner/order-as-given-reversed"]["owner"]
    assert by_name["owner/no-trainers"] == {"error": "out-of-range"}
    assert by_name["rl-plan/valid"]["verdict"] == "accept"
    assert by_name["rl-plan/invalid-other-run"] == {"verdict": "reject", "reason": 204}
    for name in ("trainer-set-mismatch", "missing-co-trainer", "other-model-hash", "inner-lr-one-ulp-off"):
        assert by_name[f"rl-plan/invalid-{name}"] == {"verdict": "reject", "reason": 600}, name


def test_every_handler_kind_has_cases_and_invalid_cases_abound() -> None:
    cases = [c for s in SUITES for c in SUITES[s]()]
    assert {c["kind"] for c in cases} == set(DILOCO_HANDLERS)
    messages = [
        c
        for c in cases
        if c["kind"] in ("diloco-run", "diloco-contribution", "diloco-vote", "diloco-outer", "diloco-rl-plan")
    ]
    refused = [c for c in messages if c["expect"]["verdict"] != "accept"]
    assert len(refused) > 2 * (len(messages) - len(refused))

"""The committed core vectors (spec/vectors/*.json) are exactly what the cases generate, and every one
passes the real code."""

from __future__ import annotations

import copy
import json

import pytest

from scripts.gen_vectors import VECTORS, generators_of, render
from swarmnode.node.conformance import load, run_case, suite_named

CORE = suite_named("core")
SUITES = {name: list(generate()) for name, generate in generators_of(CORE).items()}
ALL_CASES = [(suite, case) for suite, cases in SUITES.items() for case in cases]


@pytest.mark.parametrize("suite,case", ALL_CASES, ids=[c["name"] for _, c in ALL_CASES])
def test_live_case_passes(suite, case):
    result = run_case(CORE, suite, case)
    assert result.passed, result.detail


def test_committed_vectors_match_generated():
    committed = {path.stem: path.read_text() for path in VECTORS.glob("*.json")}
    generated = {suite: render(suite, cases) for suite, cases in SUITES.items()}
    assert committed.keys() == generated.keys(), "run scripts/gen_vectors.py"
    for suite in generated:
        stale = f"spec/vectors/{suite}.json is stale: run scripts/gen_vectors.py"
        assert committed[suite] == generated[suite], stale


def test_committed_vectors_pass():
    results = [run_case(CORE, suite, case) for suite, cases in load(CORE, VECTORS) for case in cases]
    assert results and all(r.passed for r in results), [r for r in results if not r.passed][:3]


def _hex_paths(value, path=()):
    """Every hex string inside a vector, as a path into the nested structure."""
    if isinstance(value, str) and value.startswith("0x") and len(value) > 2:
        yield path
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _hex_paths(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _hex_paths(v, path + (i,))


def _corrupt(case, path):
    broken = copy.deepcopy(case)
    holder = broken
    for key in path[:-1]:
        holder = holder[key]
    text = holder[path[-1]]
    data = bytearray(bytes.fromhex(text[2:]))
    data[len(data) // 2] ^= 0x01
    holder[path[-1]] = "0x" + data.hex()
    return broken


VALID = [(s, c) for s, c in ALL_CASES if c["expect"].get("verdict", "accept") == "accept"]


@pytest.mark.parametrize("suite,case", VALID, ids=[c["name"] for _, c in VALID])
def test_corrupting_any_byte_field_of_a_valid_vector_fails(suite, case):
    """One flipped bit in any input or expected byte string must make the case fail."""
    paths = list(_hex_paths(case["input"], ("input",))) + list(_hex_paths(case["expect"], ("expect",)))
    assert paths
    for path in paths:
        if path[:2] == ("input", "accepted_before"):
            continue  # corrupting a context message changes the context, not the case under test
        assert not run_case(CORE, suite, _corrupt(case, path)).passed, f"corrupting {path} went unnoticed"


def test_vector_files_are_json_with_suite_names():
    for path in VECTORS.glob("*.json"):
        document = json.loads(path.read_text())
        assert document["suite"] == path.stem and document["cases"]

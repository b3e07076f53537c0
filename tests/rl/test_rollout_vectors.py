"""spec/vectors/rollouts/*.json: what tests/rl/cases_rollouts.py generates, replayed through the `rollouts`
suite `swarmnode conformance` runs, and failing when any expected value changes.

The validation vectors carry the worker's logprobs, float32 values from the model whose last bits depend on
the CPU's vector instructions (AVX-512 and AVX2 kernels round differently). Where the regenerated file is
not byte-identical, the comparison falls back to every other field exactly and the logprobs within 1e-5
(the validator's own tolerance is 1e-3); the committed files must still replay everywhere.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from scripts.gen_vectors import VECTORS, generators_of, render
from swarmnode.node.cli.main import main
from swarmnode.node.conformance import load, run_case, suite_named
from swarmnode.node.rl.rollouts import unpack_logprobs
from swarmnode.protocol.codec import decode, to_json
from swarmnode.protocol.envelope import Envelope
from swarmnode.protocol.messages import RolloutSubmission

SUITE = suite_named("rollouts")
SUITES = generators_of(SUITE)
OUT = SUITE.folder(VECTORS)

Case = dict[str, Any]


def file_for(suite: str) -> Path:
    return SUITE.file_for(VECTORS, suite)


@pytest.fixture(scope="module")
def generated() -> dict[str, list[Case]]:
    return {suite: list(cases()) for suite, cases in SUITES.items()}


def committed(suite: str) -> list[Case]:
    document = json.loads(file_for(suite).read_text())
    assert document["suite"] == suite
    return document["cases"]


def _without_logprobs(case: Case) -> tuple[Case, list[torch.Tensor]]:
    """A validation case with its envelope decoded and the logprobs taken out (returned separately)."""
    envelope = decode(Envelope, bytes.fromhex(case["input"]["envelope"][2:]))
    sub = decode(RolloutSubmission, envelope.body)
    # Malformed cases carry logprob bytes that are not whole float32 values: the whole float32 values among
    # them are compared with the tolerance (their last bits follow the machine), the odd tail exactly.
    def split(c: Any) -> tuple[bytes, bytes]:
        whole = len(c.logprobs) // 4 * 4
        return c.logprobs[:whole], c.logprobs[whole:]

    logprobs = [unpack_logprobs(split(c)[0]) for g in sub.groups for c in g.completions]
    groups = tuple(
        dataclasses.replace(
            g, completions=tuple(dataclasses.replace(c, logprobs=split(c)[1]) for c in g.completions)
        )
        for g in sub.groups
    )
    opened = {
        "type": envelope.type,
        "run": envelope.run,
        "sender": envelope.sender.hex(),
        "seq": envelope.seq,
        "ts": envelope.ts,
        "submission": to_json(dataclasses.replace(sub, groups=groups)),
    }
    return {**case, "input": {**case["input"], "envelope": opened}}, logprobs


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_committed_vectors_are_current(suite: str, generated: dict[str, list[Case]]) -> None:
    stale = "stale vectors: run scripts/gen_vectors.py"
    if file_for(suite).read_text() == render(suite, generated[suite]):
        return
    assert suite == "rollouts-validation", stale
    ours, theirs = committed(suite), generated[suite]
    assert len(ours) == len(theirs), stale
    for old, new in zip(ours, theirs, strict=True):
        (old_rest, old_logprobs), (new_rest, new_logprobs) = _without_logprobs(old), _without_logprobs(new)
        assert old_rest == new_rest, f"{old['name']}: {stale}"
        for a, b in zip(old_logprobs, new_logprobs, strict=True):
            close = a.shape == b.shape and torch.allclose(a, b, atol=1e-5, equal_nan=True)
            assert close, f"{old['name']}: {stale}"


def test_vector_files_are_the_suites() -> None:
    assert sorted(p.name for p in OUT.glob("*.json")) == sorted(file_for(s).name for s in SUITES)
    assert sum(p.stat().st_size for p in OUT.glob("*.json")) < 400_000


def test_committed_vectors_replay() -> None:
    suites = load(SUITE, VECTORS)
    assert [name for name, _ in suites] == sorted(SUITES, key=lambda s: file_for(s).name)
    results = [run_case(SUITE, suite, case) for suite, cases in suites for case in cases]
    assert results and all(r.passed for r in results), [(r.name, r.detail) for r in results if not r.passed]


def test_swarmnode_conformance_replays_them() -> None:
    """`swarmnode conformance --suite rollouts` replays exactly these files."""
    result = CliRunner().invoke(main, ["conformance", "--suite", "rollouts"])
    total = sum(len(committed(s)) for s in SUITES)
    assert result.exit_code == 0, result.output
    assert f"all {total} cases passed" in result.output


def _changes(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, changed value) for every leaf of an expectation, and a longer and a shorter copy of a list."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _changes(item, (*path, key))
    elif isinstance(value, list):
        yield path, [*value, value[0] if value else 0]
        if value:
            yield path, value[:-1]
        for i, item in enumerate(value):
            yield from _changes(item, (*path, i))
    elif isinstance(value, bool):
        yield path, not value
    elif isinstance(value, int | float):
        yield path, value + 1
    elif isinstance(value, str) and value.startswith("0x") and len(value) > 2:
        data = bytearray(bytes.fromhex(value[2:]))
        data[len(data) // 2] ^= 0x01
        yield path, "0x" + data.hex()
    else:
        yield path, value + "x"


def _changed(expect: dict[str, Any], path: tuple[Any, ...], new: Any) -> dict[str, Any]:
    broken = copy.deepcopy(expect)
    holder = broken
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = new
    return broken


@pytest.mark.parametrize("suite", sorted(SUITES))
def test_every_changed_expectation_fails(suite: str) -> None:
    """Each expected value, list length and key matters: changing any one makes the case fail."""
    for case in committed(suite):
        expect = case["expect"]
        variants = [_changed(expect, path, new) for path, new in _changes(expect)]
        variants += [{k: v for k, v in expect.items() if k != key} for key in expect]
        for broken in variants:
            assert not run_case(SUITE, suite, {**case, "expect": broken}).passed, (case["name"], broken)


def test_every_rollout_kind_has_cases_and_errors_are_covered(generated: dict[str, list[Case]]) -> None:
    cases = [c for s in SUITES for c in generated[s]]
    kinds = {c["kind"] for c in cases}
    assert kinds == {
        "task_id",
        "dataset_hash",
        "assignment",
        "seed",
        "sampling",
        "sampling_rule",
        "rewards",
        "validation",
    } and kinds <= set(SUITE.handlers)
    assert all(c["description"] for c in cases) and len({c["name"] for c in cases}) == len(cases)
    validation = [c for c in generated["rollouts-validation"] if c["expect"]["verdict"] != "accept"]
    assert len(validation) > len(generated["rollouts-validation"]) / 2


def test_expected_values_are_the_documented_ones() -> None:
    by_name = {c["name"]: c["expect"] for s in SUITES for c in committed(s)}
    # spec/validation.md: honest work is accepted; each devnet cheat gets its reason code
    assert by_name["validation/accept/honest"] == {"verdict": "accept", "tokens": 6}
    assert by_name["validation/accept/honest-equal-rewards"]["verdict"] == "accept"
    assert by_name["validation/reject/tampered-prompt"] == {"verdict": "reject", "reason": 602}
    assert by_name["validation/reject/forged-reward"] == {"verdict": "reject", "reason": 603}
    # check 6 runs before check 5 (a grader may execute the text): forged rewards and a bad proof is 605
    assert by_name["validation/reject/forged-reward-and-swapped-proof"] == {
        "verdict": "reject",
        "reason": 605,
        "failing_chunks": [1],
    }
    assert by_name["validation/reject/perturbed-model"] == {
        "verdict": "reject",
        "reason": 605,
        "failing_chunks": [0, 1],
    }
    assert by_name["validation/reject/wrong-seed"] == {"verdict": "reject", "reason": 606}
    assert by_name["validation/reject/tokens-off-sampler"] == {"verdict": "reject", "reason": 606}
    assert by_name["validation/reject/swapped-proof"]["failing_chunks"] == [1]
    assert by_name["validation/reject/not-staked"]["reason"] == 601
    assert by_name["validation/ignore/stale"] == {"verdict": "ignore", "reason": 203}
    assert by_name["validation/ignore/unknown-checkpoint"] == {"verdict": "ignore", "reason": 607}
    assert by_name["validation/reject/wrong-checkpoint-root"]["reason"] == 608
    for name in ("step-not-bound-to-version", "cherry-picked-task", "counter-beyond-bound"):
        assert by_name[f"validation/reject/{name}"] == {"verdict": "reject", "reason": 602}
    assert by_name["validation/reject/forged-advantages"]["reason"] == 603
    assert by_name["validation/reject/stopped-early"]["reason"] == 604
    # spec/validation.md check 2b: every field outside what the run allows is 609, before any model check
    malformed = [
        "wrong-group-size", "wrong-group-count", "missing-proof", "extra-proof", "proof-short",
        "eos-flag-wrong", "eos-not-last", "token-outside-vocab", "token-outside-vocab-after-eos",
        "token-2^63", "token-u64-max",
        "empty-completion", "completion-too-long", "prompt-token-outside-vocab", "logprobs-short",
        "logprobs-odd-length", "logprob-nan",
    ]
    for name in malformed:
        assert by_name[f"validation/reject/{name}"] == {"verdict": "reject", "reason": 609}, name
    assert by_name["validation/ignore/body-of-another-run"] == {"verdict": "ignore", "reason": 204}
    # spec/rollouts.md: the seed binds the step, so completions claimed under another counter fail 606
    assert by_name["validation/reject/seed-of-another-step"] == {"verdict": "reject", "reason": 606}
    assert by_name["seed/other-counter"] != by_name["seed/completion-0"] != by_name["seed/other-version"]
    assert by_name["seed/error-step-2^64"] == {"error": "out-of-range"}
    assert by_name["validation/reject/forged-logprobs"]["reason"] == 600
    assert by_name["validation/reject/bad-signature"]["reason"] == 500
    # spec/rollouts.md: step = (version << 32) | counter; out-of-range inputs are refused
    assert by_name["assignment/v3-counter-0-four"]["step"] == 3 << 32
    assert by_name["assignment/largest-step"]["step"] == 2**64 - 1
    assert sorted(by_name["assignment/whole-small-dataset"]["indices"]) == [0, 1, 2, 3, 4]
    for name in ("counter-2^32", "counter-negative", "version-2^32", "more-prompts-than-tasks"):
        assert by_name[f"assignment/error-{name}"] == {"error": "out-of-range"}
    assert by_name["seed/error-index-2^32"] == {"error": "out-of-range"}
    assert all(0 <= e["seed"] < 2**63 for n, e in by_name.items() if n.startswith("seed/") and "seed" in e)
    assert by_name["rewards/all-wrong"]["advantages"] == [0.0, 0.0]
    assert by_name["rewards/length-target"]["rewards"][:2] == [1 - 0.0003, 1 - 2 * 0.0003]
    assert by_name["sampling-rule/honest"]["mismatches"] == []
    assert by_name["sampling-rule/one-token-changed"]["mismatches"] == [2]
    assert by_name["sampling-rule/near-tie-within-tolerance"]["mismatches"] == []
    assert by_name["sampling-rule/near-tie-beyond-tolerance"]["mismatches"] == [1]

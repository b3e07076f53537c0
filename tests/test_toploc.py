"""TOPLOC proofs: byte compatibility with the reference library, verification, the two-tier verdicts."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import swarmnode.crypto.toploc as toploc
from swarmnode.crypto.toploc import (
    CALIBRATION_FLOOR,
    NO_MATCH,
    PRIME,
    REFERENCE_THRESHOLDS,
    Bound,
    CalibratedPolicy,
    ChunkCheck,
    ChunkThresholds,
    InvalidActivations,
    MalformedProof,
    ProofCountMismatch,
    ToplocAggregate,
    ToplocError,
    aggregate,
    build_proofs,
    calibrate,
    chunk_count,
    decode_proof,
    encode_proof,
    judge,
    proof_size,
    verify_proofs,
)

REFERENCE_DIR = Path(__file__).parent / "data" / "toploc_reference"


def _load_recipe_module() -> Any:
    spec = importlib.util.spec_from_file_location("toploc_reference_generate", REFERENCE_DIR / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECIPE = _load_recipe_module()
VECTORS = json.loads((REFERENCE_DIR / "vectors.json").read_text())


def _rows(case: dict[str, Any], recipe: dict[str, Any]) -> torch.Tensor:
    bits = RECIPE.rows_bits(case["tokens"], case["hidden"], recipe)
    return torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _check(exp: int = 0, mean: float = 0.0, median: float = 0.0, passed: bool = True) -> ChunkCheck:
    return ChunkCheck(exp, mean, median, passed)


# Reference compatibility


@pytest.mark.parametrize("case", VECTORS["cases"], ids=lambda c: c["name"])
def test_reference_proof_bytes(case: dict[str, Any]) -> None:
    proofs = build_proofs(_rows(case, case["rows"]), k=case["k"], chunk=case["chunk"])
    assert [p.hex() for p in proofs] == case["proofs"]


@pytest.mark.parametrize(
    "case, check",
    [(case, check) for case in VECTORS["cases"] for check in case["checks"]],
    ids=lambda v: v["name"],
)
def test_reference_verification_statistics(case: dict[str, Any], check: dict[str, Any]) -> None:
    hex_proofs = check["proofs"] if check["proofs"] is not None else case["proofs"]
    results = verify_proofs(
        _rows(case, check["rows"]), [bytes.fromhex(p) for p in hex_proofs], k=case["k"], chunk=case["chunk"]
    )
    assert [[r.exp_mismatches, r.mant_err_mean, r.mant_err_median] for r in results] == check["results"]


def test_reference_vectors_exercise_the_modulus_search() -> None:
    moduli = {int(p[:4], 16) for case in VECTORS["cases"] for p in case["proofs"]}
    assert PRIME in moduli and min(moduli) < PRIME - 9


# Hand-derived vectors


def test_hand_derived_line() -> None:
    # top-2 of |x|: index 2 (-2.0 = 0xC000 = 49152) and index 1 (1.0 = 0x3F80 = 16256); m = 65497.
    # Line through (1, 16256), (2, 49152): slope 32896, intercept 16256 - 32896 = 48857 (mod 65497).
    rows = torch.tensor([[0.0, 1.0, -2.0, 0.5]])
    assert build_proofs(rows, k=2, chunk=1) == [bytes.fromhex("ffd9 bed9 8080")]


def test_hand_derived_modulus_step() -> None:
    # Indices 0 and 65497 collide mod 65497, so m = 65496 and the points are (0, 1.0), (1, 2.0).
    rows = torch.zeros(1, PRIME + 1)
    rows[0, 0], rows[0, PRIME] = 1.0, 2.0
    assert build_proofs(rows, k=2, chunk=1) == [bytes.fromhex("ffd8 3f80 0080")]


def test_ties_go_to_the_lower_index() -> None:
    # 32 x 64 equal values: the first four flat indices win, the polynomial is the constant 1.0.
    rows = torch.ones(32, 64)
    expected = bytes.fromhex("ffd9 3f80" + " 0000" * 3)
    assert build_proofs(rows, k=4, chunk=32) == [expected]
    # A tie inside the candidate window (the fast path) resolves the same way.
    rows = torch.zeros(32, 64)
    rows.view(-1)[[5, 9, 70, 700]] = 3.0
    rows.view(-1)[67] = 4.0
    poly = toploc._interpolate(np.array([[5, 9, 67, 70]]), np.array([[0x4040, 0x4040, 0x4080, 0x4040]]))
    assert build_proofs(rows, k=4, chunk=32) == [encode_proof(PRIME, poly[0].tolist())]


# Round trips


def test_identical_rows_pass_with_zero_error() -> None:
    rows = _randn(100, 96)
    checks = verify_proofs(rows, build_proofs(rows))
    assert len(checks) == chunk_count(100) == 4
    assert all(c == _check() for c in checks)


def test_small_relative_noise_passes() -> None:
    rows = _randn(128, 256, seed=1)
    noisy = rows * (1 + 1e-6 * _randn(128, 256, seed=2))
    checks = verify_proofs(noisy, build_proofs(rows))
    assert all(c.passed for c in checks)
    assert aggregate(checks).mean_mant_err < 0.05


def test_different_rows_fail() -> None:
    checks = verify_proofs(_randn(64, 256, seed=3), build_proofs(_randn(64, 256, seed=4)))
    assert not any(c.passed for c in checks)
    assert all(c.exp_mismatches > REFERENCE_THRESHOLDS.max_exp_mismatches for c in checks)


def test_fp32_rows_prove_their_bf16_rounding() -> None:
    rows = _randn(40, 64, seed=5)
    assert build_proofs(rows) == build_proofs(rows.to(torch.bfloat16))
    assert build_proofs(rows.half()) == build_proofs(rows.half().to(torch.bfloat16))


def test_last_short_chunk() -> None:
    rows = _randn(70, 64, seed=6)
    proofs = build_proofs(rows)
    assert len(proofs) == 3 and all(len(p) == proof_size() for p in proofs)
    assert proofs[:2] == build_proofs(rows[:64])
    assert proofs[2] == build_proofs(rows[64:])[0]
    assert all(c == _check() for c in verify_proofs(rows, proofs))


def test_chunk_with_fewer_values_than_k_is_zero_padded() -> None:
    rows = _randn(3, 16, seed=7)  # 48 values, k = 128
    (proof,) = build_proofs(rows)
    decoded = decode_proof(proof)
    assert decoded.coefficients[48:] == (0,) * 80
    assert verify_proofs(rows, [proof]) == [_check()]


def test_blocking_does_not_change_proofs(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _randn(100, 64, seed=8)
    expected = build_proofs(rows)
    monkeypatch.setattr(toploc, "_BLOCK_ELEMENTS", 1)
    assert build_proofs(rows) == expected


def test_empty_rows() -> None:
    rows = torch.zeros(0, 64)
    assert build_proofs(rows) == []
    assert verify_proofs(rows, []) == []


# Dropped, reordered and malformed proofs


def test_dropped_proof_is_a_count_mismatch() -> None:
    rows = _randn(96, 64, seed=9)
    proofs = build_proofs(rows)
    with pytest.raises(ProofCountMismatch) as info:
        verify_proofs(rows, proofs[:-1])
    assert (info.value.expected, info.value.got) == (3, 2)
    with pytest.raises(ProofCountMismatch):
        verify_proofs(rows, [*proofs, proofs[0]])


def test_reordered_proofs_fail_their_chunks() -> None:
    rows = _randn(96, 64, seed=10)
    p0, p1, p2 = build_proofs(rows)
    summary = aggregate(verify_proofs(rows, [p1, p0, p2]))
    assert summary.failed_chunks == (0, 1)


def _tamper(proof: bytes, offset: int, value: int) -> bytes:
    return proof[:offset] + value.to_bytes(2, "big") + proof[offset + 2 :]


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda p: _tamper(p, 0, 0), "modulus is zero"),
        (lambda p: _tamper(p, 0, PRIME + 1), "above"),
        (lambda p: _tamper(p, 2, PRIME), "not reduced"),
        (lambda p: _tamper(p, 0, 100), "cannot separate"),
        (lambda p: p[:-2], "length"),
        (lambda p: p + b"\x00", "length"),
        (lambda p: b"", "length"),
        (lambda p: p.hex(), "expected bytes"),
    ],
)
def test_malformed_proofs_are_rejected(mutate: Any, reason: str) -> None:
    rows = _randn(64, 32, seed=11)
    proofs = build_proofs(rows)
    proofs[1] = mutate(proofs[1])
    with pytest.raises(MalformedProof, match=reason) as info:
        verify_proofs(rows, proofs)
    assert info.value.index == 1
    assert isinstance(info.value, ToplocError) and isinstance(info.value, ValueError)


def test_nonzero_coefficient_beyond_a_short_chunk_is_rejected() -> None:
    rows = _randn(2, 16, seed=12)  # 32 points, so degree < 32
    (proof,) = build_proofs(rows)
    with pytest.raises(MalformedProof, match="above degree 31"):
        verify_proofs(rows, [_tamper(proof, 2 + 2 * 40, 1)])


def test_structure_is_checked_before_any_activation_work(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _randn(64, 32, seed=13)
    proofs = build_proofs(rows)

    def no_work(*args: object) -> None:
        raise AssertionError("activations evaluated before the proofs were checked")

    monkeypatch.setattr(toploc, "_top_points", no_work)
    with pytest.raises(MalformedProof):
        verify_proofs(rows, [proofs[0], _tamper(proofs[1], 0, 0)])
    with pytest.raises(ProofCountMismatch):
        verify_proofs(rows, proofs[:1])


@pytest.mark.parametrize(
    "rows, k, chunk",
    [
        (torch.zeros(4), 128, 32),
        (torch.zeros(4, 0), 128, 32),
        (torch.zeros(4, 8, dtype=torch.int64), 128, 32),
        (torch.zeros(4, 8, dtype=torch.float64), 128, 32),
        (torch.zeros(4, 8), 0, 32),
        (torch.zeros(4, 8), PRIME + 1, 32),
        (torch.zeros(4, 8), 128, 0),
    ],
)
def test_unusable_activations_are_the_callers_error(rows: torch.Tensor, k: int, chunk: int) -> None:
    with pytest.raises(InvalidActivations):
        build_proofs(rows, k=k, chunk=chunk)
    with pytest.raises(InvalidActivations) as info:
        verify_proofs(rows, [], k=k, chunk=chunk)
    # A validator maps ToplocError to a rejection of the prover: its own rows must never raise one.
    assert not isinstance(info.value, ToplocError)


def test_encode_refuses_non_canonical_input() -> None:
    with pytest.raises(ValueError):
        encode_proof(0, [1, 2])
    with pytest.raises(ValueError):
        encode_proof(PRIME, [PRIME])


# Statistics


def test_no_matching_exponent_reports_the_sentinel() -> None:
    rows = _randn(32, 16, seed=14)
    zero_poly = encode_proof(PRIME, [0] * 128)
    (check,) = verify_proofs(rows, [zero_poly])
    assert check == ChunkCheck(128, NO_MATCH, NO_MATCH, False)


def test_thresholds_are_inclusive() -> None:
    rows = _randn(32, 64, seed=15)
    proofs = build_proofs(rows)
    noisy = rows * (1 + 0.02 * _randn(32, 64, seed=16))
    (check,) = verify_proofs(noisy, proofs)
    exact = ChunkThresholds(check.exp_mismatches, check.mant_err_mean, check.mant_err_median)
    assert verify_proofs(noisy, proofs, thresholds=exact)[0].passed
    tighter = dataclasses.replace(exact, max_exp_mismatches=check.exp_mismatches - 1)
    assert check.exp_mismatches == 0 or not verify_proofs(noisy, proofs, thresholds=tighter)[0].passed


def test_chunk_check_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        _check().passed = False  # type: ignore[misc]


# Field arithmetic against plain Python


def _brute_modulus(indices: list[int]) -> int:
    return next(m for m in range(PRIME, 0, -1) if len({i % m for i in indices}) == len(indices))


def _lagrange_value(xs: list[int], ys: list[int], at: int) -> int:
    total = 0
    for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):
        term = yi
        for j, xj in enumerate(xs):
            if j != i:
                term = term * (at - xj) * pow(xi - xj, PRIME - 2, PRIME) % PRIME
        total += term
    return total % PRIME


def test_deep_modulus_search() -> None:
    # Forty colliding pairs rule out 65497..65458; the search must step past several blocks.
    indices = sorted({v for j in range(40) for v in (3 * j, 3 * j + PRIME - j)})
    found = toploc._find_moduli(np.array([indices]))
    assert found.tolist() == [_brute_modulus(indices)] and found.item() <= PRIME - 40


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 4 * PRIME), min_size=1, max_size=40, unique=True))
def test_modulus_search_matches_brute_force(indices: list[int]) -> None:
    assert toploc._find_moduli(np.array([indices])).tolist() == [_brute_modulus(indices)]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(0, PRIME - 1), min_size=1, max_size=12, unique=True),
    st.lists(st.integers(0, 65535), min_size=12, max_size=12),
    st.integers(0, PRIME - 1),
)
def test_interpolation_matches_lagrange(xs: list[int], ys: list[int], at: int) -> None:
    ys = ys[: len(xs)]
    coefficients = toploc._interpolate(np.array([xs]), np.array([ys]))
    assert toploc._evaluate(coefficients, np.array([xs])).tolist() == [[y % PRIME for y in ys]]
    value = toploc._evaluate(coefficients, np.array([[at]])).item()
    assert value == _lagrange_value(xs, [y % PRIME for y in ys], at)


# Properties


@settings(max_examples=25, deadline=None)
@given(
    tokens=st.integers(1, 70),
    hidden=st.integers(1, 48),
    k=st.integers(1, 40),
    chunk=st.integers(1, 40),
    seed=st.integers(0, 2**31),
    scale=st.sampled_from([1e-3, 1.0, 1e4]),
)
def test_proofs_have_fixed_size_and_are_deterministic(
    tokens: int, hidden: int, k: int, chunk: int, seed: int, scale: float
) -> None:
    rows = _randn(tokens, hidden, seed=seed) * scale
    proofs = build_proofs(rows, k=k, chunk=chunk)
    assert len(proofs) == chunk_count(tokens, chunk)
    assert all(len(p) == proof_size(k) == 2 + 2 * k for p in proofs)
    assert build_proofs(rows.clone(), k=k, chunk=chunk) == proofs
    assert all(c == _check() for c in verify_proofs(rows, proofs, k=k, chunk=chunk))


# Two tiers


def test_aggregate_averages_chunks_and_lists_failures() -> None:
    checks = [_check(2, 1.0, 1.0), _check(40, 3.0, 2.0, passed=False), _check(0, 0.5, 0.0)]
    assert aggregate(checks) == ToplocAggregate(14.0, 1.5, (1,))
    assert aggregate([]) == ToplocAggregate(0.0, 0.0, ())


def test_judge_names_each_broken_bound() -> None:
    policy = CalibratedPolicy(max_mean_exp_mismatches=4.0, max_mean_mant_err=1.0)
    assert judge(ToplocAggregate(4.0, 1.0, ()), policy).passed
    verdict = judge(ToplocAggregate(4.5, 1.0, ()), policy)
    assert not verdict.passed
    assert [(e.bound, e.observed, e.limit) for e in verdict.exceeded] == [
        (Bound.MEAN_EXP_MISMATCHES, 4.5, 4.0)
    ]
    verdict = judge(ToplocAggregate(1.0, 2.0, (3, 7)), policy)
    assert [e.bound for e in verdict.exceeded] == [Bound.REFERENCE_CHUNKS, Bound.MEAN_MANT_ERR]
    assert verdict.failed_chunks == (3, 7) and verdict.exceeded[0].observed == 2.0
    assert [e.bound for e in judge(ToplocAggregate(math.nan, 0.0, ()), policy).exceeded] == [
        Bound.MEAN_EXP_MISMATCHES
    ]


def test_calibrate_takes_the_honest_maximum_times_the_margin() -> None:
    honest = [ToplocAggregate(3.0, 0.8, ()), ToplocAggregate(6.0, 1.2, ())]
    policy = calibrate(honest, 1.5)
    assert policy.max_mean_exp_mismatches == 9.0
    assert policy.max_mean_mant_err == pytest.approx(1.8)


def test_calibrate_floor_keeps_an_exact_path_from_a_zero_bound() -> None:
    policy = calibrate([ToplocAggregate(0.0, 0.0, ())], 2.0)
    assert policy == CALIBRATION_FLOOR
    assert judge(ToplocAggregate(0.25, 0.01, ()), policy).passed
    custom = CalibratedPolicy(0.5, 0.1)
    assert calibrate([ToplocAggregate(0.1, 0.0, ())], 3.0, floor=custom) == CalibratedPolicy(0.5, 0.1)


def test_calibrated_policy_end_to_end() -> None:
    # fp32 rows checked against themselves measure zero; 1% weight-like noise must not pass the policy.
    rows = _randn(128, 256, seed=17)
    proofs = build_proofs(rows)
    policy = calibrate([aggregate(verify_proofs(rows, proofs))], 2.0)
    cheat = aggregate(verify_proofs(rows, build_proofs(rows * (1 + 0.01 * _randn(128, 256, seed=18)))))
    assert not cheat.failed_chunks  # the reference thresholds alone would accept it
    assert not judge(cheat, policy).passed


@pytest.mark.parametrize(
    "honest, margin",
    [([], 2.0), ([ToplocAggregate(1.0, 1.0, ())], 0.5), ([ToplocAggregate(1.0, 1.0, ())], math.inf)],
)
def test_calibrate_refuses_bad_input(honest: list[ToplocAggregate], margin: float) -> None:
    with pytest.raises(ValueError):
        calibrate(honest, margin)


def test_calibrate_refuses_an_honest_run_that_fails_tier_one() -> None:
    with pytest.raises(ValueError, match="refusing"):
        calibrate([ToplocAggregate(50.0, 1.0, (0,))], 2.0)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_policy_bounds_must_be_finite_and_non_negative(bad: float) -> None:
    with pytest.raises(ValueError):
        CalibratedPolicy(bad, 1.0)


# The spec's reference snippets are the code's twin


def _spec_snippets() -> dict[str, Any]:
    text = (Path(__file__).parents[1] / "spec" / "toploc.md").read_text()
    namespace: dict[str, Any] = {"PRIME": PRIME, "NoInjectiveModulus": toploc.NoInjectiveModulus}
    for block in text.split("```python\n")[1:]:
        exec(block.split("```")[0], namespace)  # our own normative text, not input
    return namespace


SPEC = _spec_snippets()


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 6),
    hidden=st.integers(1, 24),
    k=st.integers(1, 20),
    values=st.lists(
        st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -3.0, 1e-3, 7.5]), min_size=144, max_size=144
    ),
)
def test_spec_snippets_define_the_same_proof(rows: int, hidden: int, k: int, values: list[float]) -> None:
    tensor = torch.tensor(values[: rows * hidden]).reshape(rows, hidden)
    bits = [b & 0xFFFF for b in tensor.to(torch.bfloat16).view(torch.int16).reshape(-1).tolist()]
    n = min(k, len(bits))
    chosen = SPEC["select"](bits, n)
    m = SPEC["modulus"](chosen)
    coefficients = SPEC["interpolate"]([i % m for i in chosen], [bits[i] for i in chosen])
    assert build_proofs(tensor, k=k, chunk=rows) == [encode_proof(m, coefficients + [0] * (k - n))]

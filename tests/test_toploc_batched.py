"""The batched TOPLOC paths give exactly the per-chunk reference: proof bytes, statistics, refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import swarmnode.crypto.toploc as toploc
from swarmnode.crypto.toploc import (
    PRIME,
    MalformedProof,
    ProofCountMismatch,
    build_proofs,
    build_proofs_batch,
    encode_proof,
    verify_proofs,
    verify_proofs_batch,
)


def _spec_snippets() -> dict[str, Any]:
    text = (Path(__file__).parents[1] / "spec" / "toploc.md").read_text()
    namespace: dict[str, Any] = {"PRIME": PRIME, "NoInjectiveModulus": toploc.NoInjectiveModulus}
    for block in text.split("```python\n")[1:]:
        exec(block.split("```")[0], namespace)  # our own normative text, not input
    return namespace


SPEC = _spec_snippets()


def _reference_proofs(rows: torch.Tensor, k: int, chunk: int) -> list[bytes]:
    """One chunk at a time with the spec's pure-Python select, modulus and interpolate."""
    bits_rows = rows.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
    proofs = []
    for start in range(0, rows.shape[0], chunk):
        bits = bits_rows[start : start + chunk].reshape(-1).tolist()
        n = min(k, len(bits))
        chosen = SPEC["select"](bits, n)
        m = SPEC["modulus"](chosen)
        coefficients = SPEC["interpolate"]([i % m for i in chosen], [bits[i] for i in chosen])
        proofs.append(encode_proof(m, coefficients + [0] * (k - n)))
    return proofs


# Values with many ties (bf16 rounding of a few levels) and a wide spread, so the boundary rule matters.
_values = st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -3.0, 1e-3, 7.5, 1e4, -1e4])


@st.composite
def _batches(draw: st.DrawFn) -> tuple[list[torch.Tensor], int, int]:
    hidden = draw(st.integers(1, 12))
    k, chunk = draw(st.integers(1, 40)), draw(st.integers(1, 9))
    lengths = draw(st.lists(st.integers(0, 20), min_size=0, max_size=6))
    seed = draw(st.integers(0, 2**31))
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for t in lengths:
        if draw(st.booleans()):
            levels = torch.tensor(draw(st.lists(_values, min_size=4, max_size=4)))
            rows.append(levels[torch.randint(0, 4, (t, hidden), generator=gen)])
        else:
            rows.append(torch.randn(t, hidden, generator=gen) * draw(st.sampled_from([1e-3, 1.0, 1e4])))
    return rows, k, chunk


@settings(max_examples=40, deadline=None)
@given(_batches())
def test_batched_proofs_equal_the_per_chunk_reference(batch: tuple[list[torch.Tensor], int, int]) -> None:
    rows, k, chunk = batch
    batched = build_proofs_batch(rows, k=k, chunk=chunk)
    assert batched == [_reference_proofs(r, k, chunk) for r in rows]
    assert batched == [build_proofs(r, k=k, chunk=chunk) for r in rows]


@settings(max_examples=20, deadline=None)
@given(_batches(), st.integers(0, 2**31))
def test_batched_verification_equals_one_completion_at_a_time(
    batch: tuple[list[torch.Tensor], int, int], seed: int
) -> None:
    rows, k, chunk = batch
    proofs = build_proofs_batch(rows, k=k, chunk=chunk)
    gen = torch.Generator().manual_seed(seed)
    noisy = [r * (1 + 0.02 * torch.randn(r.shape, generator=gen)) for r in rows]
    assert verify_proofs_batch(noisy, proofs, k=k, chunk=chunk) == [
        verify_proofs(r, p, k=k, chunk=chunk) for r, p in zip(noisy, proofs, strict=True)
    ]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 300), st.integers(1, 4), st.integers(0, 2**31), st.booleans())
def test_fast_interpolation_equals_newton(n: int, chunks: int, seed: int, near_prime: bool) -> None:
    rng = np.random.default_rng(seed)
    low = PRIME - 4 * n if near_prime else 0
    pool = np.arange(max(low, 0), PRIME)
    x = np.stack([np.sort(rng.choice(pool, n, replace=False)) for _ in range(chunks)])
    y = rng.integers(0, 65536, (chunks, n))
    coefficients = toploc._interpolate(x, y)
    assert (coefficients == toploc._interpolate_reference(x, y.copy())).all()
    at = rng.integers(0, PRIME, (chunks, 7))
    assert (toploc._evaluate(coefficients, at) == toploc._evaluate_reference(coefficients, at)).all()
    assert (toploc._evaluate(coefficients, x) == y % PRIME).all()


def test_a_wide_model_and_mixed_chunk_heights_match_the_reference() -> None:
    gen = torch.Generator().manual_seed(5)
    rows = [torch.randn(t, 512, generator=gen) for t in (1, 31, 32, 33, 70)]
    assert build_proofs_batch(rows) == [_reference_proofs(r, 128, 32) for r in rows]


def test_hidden_sizes_must_agree() -> None:
    with pytest.raises(toploc.InvalidActivations):
        build_proofs_batch([torch.zeros(2, 8), torch.zeros(2, 9)])


def test_a_fault_names_its_completion_and_proof() -> None:
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randn(t, 16, generator=gen) for t in (40, 70, 10)]
    proofs = build_proofs_batch(rows)
    tampered = [list(p) for p in proofs]
    tampered[1][2] = b"\x00\x00" + tampered[1][2][2:]  # modulus zero in completion 1, chunk 2
    tampered[2][0] = tampered[2][0][:-2] + b"\xff\xff"  # a later fault does not mask the first
    with pytest.raises(MalformedProof) as err:
        verify_proofs_batch(rows, tampered)
    assert (err.value.completion, err.value.index, err.value.reason) == (1, 2, "modulus is zero")
    with pytest.raises(ProofCountMismatch) as count:
        verify_proofs_batch(rows, [proofs[0], proofs[1][:-1], proofs[2]])
    assert (count.value.completion, count.value.expected, count.value.got) == (1, 3, 2)


def test_structure_of_every_completion_is_checked_before_any_activation_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [torch.randn(40, 8), torch.randn(40, 8)]
    proofs = build_proofs_batch(rows)

    def no_work(*args: object) -> None:
        raise AssertionError("activations touched before the proofs were checked")

    monkeypatch.setattr(toploc, "_top_points", no_work)
    with pytest.raises(MalformedProof):
        verify_proofs_batch(rows, [proofs[0], [proofs[1][0], b"\x00" * 258]])


@settings(max_examples=40, deadline=None)
@given(_batches())
def test_the_tie_window_path_equals_the_reference(batch: tuple[list[torch.Tensor], int, int]) -> None:
    """Chunks longer than `_DIRECT_KEY_LENGTH` (real models: 32 x 4096 values) rank with the tie window;
    forced here on small chunks, it gives the reference's proofs too."""
    rows, k, chunk = batch
    saved = toploc._DIRECT_KEY_LENGTH
    toploc._DIRECT_KEY_LENGTH = 0
    try:
        batched = build_proofs_batch(rows, k=k, chunk=chunk)
    finally:
        toploc._DIRECT_KEY_LENGTH = saved
    assert batched == [_reference_proofs(r, k, chunk) for r in rows]


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 300), st.integers(1, 6), st.integers(0, 2**31), st.sampled_from([2, 5, 32768]))
def test_direct_key_and_tie_window_select_the_same_points(
    length: int, rows: int, seed: int, levels: int
) -> None:
    """Many ties, and a padding value (-1) at the end that neither path may choose."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = torch.randint(0, levels, (rows, length), generator=gen, dtype=torch.int16)
    magnitude[:, -1] = -1
    n = int(torch.randint(1, length, (1,), generator=gen))
    direct = toploc._select_top(magnitude, n)
    saved = toploc._DIRECT_KEY_LENGTH
    toploc._DIRECT_KEY_LENGTH = 0
    try:
        window = toploc._select_top(magnitude, n)
    finally:
        toploc._DIRECT_KEY_LENGTH = saved
    assert torch.equal(direct, window)
    for r in range(rows):
        assert direct[r].tolist() == SPEC["select"](magnitude[r, :-1].tolist(), n)


def test_the_field_power_tables_are_the_computed_basis() -> None:
    x = np.array([[0.0, 1.0, 2.0, PRIME - 1.0, 12345.0]])
    for degree in (1, 7, 128, 256):
        table = toploc._PowerBasis.of(x, degree)
        width = table.low.shape[-1]
        low = toploc._powers(x, width)
        high = toploc._powers(toploc._reduce(low[..., -1] * x), table.high.shape[-1])
        assert (table.low == low).all() and (table.high == high).all()

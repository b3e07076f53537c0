"""TOPLOC proofs: a locality-sensitive commitment to the final hidden states of a generation.

Byte-compatible with PrimeIntellect's reference library `toploc` (0.1.6, the path that takes one
(tokens, hidden) tensor with `skip_prefill=True`): for bf16 rows without ties at the top-k boundary the
same rows give the same proof bytes and the same verification statistics. `spec/toploc.md` is the
normative text; the decisions it records:

- Rows of any supported float dtype are first rounded to bfloat16 (round-to-nearest-even). The
  reference only accepts bf16 (fp32 gives null proofs there), so for bf16 rows nothing changes, and a
  fp32 devnet path proves exactly what the bf16 rounding of its rows would.
- Top-k ranks by the magnitude bits of the bf16 value (`bits & 0x7FFF`, integer order = |x| order,
  NaN above inf) and breaks ties at the boundary by the lower flat index. The reference inherits
  torch.topk's tie order, which is unspecified on CPU; with bf16 a tie at the boundary is common,
  so a fixed rule is what makes proofs reproducible across devices.
- The interpolating polynomial is unique, so coefficients are computed in whatever order is fastest
  (batched over chunks, int64 arithmetic mod 65497) and still equal the reference's Newton expansion.
- Verification follows the reference's tensor path: indices are reduced by the proof's modulus even
  when the validator's top-k holds an index the prover did not commit to (the polynomial then yields
  an unrelated value, which almost always counts as an exponent mismatch); the median of the mantissa
  errors is the upper median; a chunk with no matching exponent reports 2**64 for both statistics.
- Decoding is stricter than the reference (which reads any length and a zero modulus): only the
  canonical encoding an honest builder emits is accepted, and all proofs are checked before any
  activation work is done.
- Beyond the reference: a chunk with fewer than k values (a short last chunk of a narrow model) uses
  all of its values as points and zero-pads the coefficients; the reference fails there.

Two tiers of verdicts (DESIGN.md, TOPLOC): `ChunkCheck.passed` applies the reference thresholds per
chunk; `judge` applies a run's `CalibratedPolicy` to the submission's `aggregate`, because a quantised
or noised model stays far below the reference thresholds while sitting 2-3x above honest statistics.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import torch

# Parameters (spec/toploc.md, "Parameters")
PRIME: Final = 65497  # the field GF(PRIME); also the largest modulus a proof may carry
DEFAULT_K: Final = 128  # points per proof
DEFAULT_CHUNK: Final = 32  # generated tokens (rows) per proof
NO_MATCH: Final = float(2**64)  # mantissa statistics of a chunk where no exponent matched

_BF16_MAGNITUDE_MASK: Final = 0x7FFF
_BF16_EXP_MASK: Final = 0x7F80
_BF16_EXP_SHIFT: Final = 7
_BF16_MANT_MASK: Final = 0x007F
_SUPPORTED_DTYPES: Final = (torch.bfloat16, torch.float16, torch.float32)
# Extra top-k candidates fetched so that ties at the boundary can be settled without a full pass.
_TIE_WINDOW: Final = 64
# Activations handled per block, to bound the memory of the selection on long batches.
_BLOCK_ELEMENTS: Final = 1 << 24
# Candidate moduli per vectorised step of the modulus search, once PRIME alone has failed.
_MODULUS_STEP: Final = 16

Array = npt.NDArray[np.int64]


# Errors


class ToplocError(ValueError):
    """Proofs a validator must refuse: always the prover's fault (reject 605 BAD_PROOF, cite the chunk).

    Only proof faults derive from this class, so `except ToplocError` never blames a peer for the
    validator's own rows; those raise `InvalidActivations` instead.
    """


class MalformedProof(ToplocError):
    """A proof's bytes are not the canonical encoding an honest builder emits."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"proof {index}: {reason}")
        self.index = index
        self.reason = reason


class ProofCountMismatch(ToplocError):
    """One proof per chunk is owed, and a different number arrived."""

    def __init__(self, expected: int, got: int) -> None:
        super().__init__(f"expected {expected} proofs, got {got}")
        self.expected = expected
        self.got = got


class InvalidActivations(ValueError):
    """The caller's fault: the rows or parameters cannot be proved or checked at all."""


class NoInjectiveModulus(ValueError):
    """The prover's own rows admit no modulus <= PRIME that keeps the top-k indices distinct."""


# Data types


@dataclass(frozen=True)
class Proof:
    """A decoded proof: the modulus its indices were reduced by and ascending coefficients mod PRIME."""

    modulus: int
    coefficients: tuple[int, ...]

    def to_bytes(self) -> bytes:
        return encode_proof(self.modulus, self.coefficients)


@dataclass(frozen=True)
class ChunkThresholds:
    """Per-chunk acceptance bounds; a statistic equal to its bound passes."""

    max_exp_mismatches: int
    max_mant_err_mean: float
    max_mant_err_median: float


REFERENCE_THRESHOLDS: Final = ChunkThresholds(38, 10.0, 8.0)


@dataclass(frozen=True)
class ChunkCheck:
    """Statistics of one chunk: errors grow with distance from the prover's activations."""

    exp_mismatches: int
    mant_err_mean: float
    mant_err_median: float
    passed: bool


# Encoding


def proof_size(k: int = DEFAULT_K) -> int:
    """Bytes of one proof: a u16 modulus and k u16 coefficients."""
    return 2 + 2 * k


def encode_proof(modulus: int, coefficients: Sequence[int]) -> bytes:
    """`[modulus u16 BE][coefficients u16 BE, ascending degree]`, as the reference writes it."""
    if not 0 < modulus <= PRIME:
        raise ValueError(f"modulus {modulus} outside 1..{PRIME}")
    if any(not 0 <= c < PRIME for c in coefficients):
        raise ValueError(f"coefficients must lie in 0..{PRIME - 1}")
    return modulus.to_bytes(2, "big") + np.asarray(coefficients, dtype=">u2").tobytes()


def _parse(data: object, k: int, index: int) -> tuple[int, npt.NDArray[np.uint16]]:
    """Modulus and coefficients of one proof, refusing anything an honest builder cannot emit."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedProof(index, f"expected bytes, got {type(data).__name__}")
    raw = bytes(data)
    if len(raw) != proof_size(k):
        raise MalformedProof(index, f"length {len(raw)}, expected {proof_size(k)}")
    modulus = int.from_bytes(raw[:2], "big")
    if modulus == 0:
        raise MalformedProof(index, "modulus is zero")
    if modulus > PRIME:
        raise MalformedProof(index, f"modulus {modulus} above {PRIME}")
    coefficients = np.frombuffer(raw, dtype=">u2", offset=2)
    if int(coefficients.max()) >= PRIME:
        raise MalformedProof(index, f"coefficient not reduced mod {PRIME}")
    return modulus, coefficients


def decode_proof(data: bytes, k: int = DEFAULT_K, *, index: int = 0) -> Proof:
    """Parse one proof; `MalformedProof` names `index` so a rejection can cite the chunk."""
    modulus, coefficients = _parse(data, k, index)
    return Proof(modulus, tuple(coefficients.tolist()))


# Activations


def chunk_count(tokens: int, chunk: int = DEFAULT_CHUNK) -> int:
    """Proofs owed for `tokens` generated tokens: one per chunk, the last one possibly short."""
    return -(-tokens // chunk)


def _points_per_chunk(tokens: int, hidden: int, k: int, chunk: int) -> list[int]:
    """n of every chunk: k, or all of a chunk's values when it holds fewer than k."""
    return [min(k, min(chunk, tokens - start) * hidden) for start in range(0, tokens, chunk)]


def _check_params(rows: torch.Tensor, k: int, chunk: int) -> None:
    if not 1 <= k <= PRIME:
        raise InvalidActivations(f"k={k} outside 1..{PRIME}")
    if chunk < 1:
        raise InvalidActivations(f"chunk={chunk} must be positive")
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2:
        raise InvalidActivations("rows must be a 2-D tensor (tokens, hidden)")
    if rows.dtype not in _SUPPORTED_DTYPES:
        raise InvalidActivations(f"rows dtype {rows.dtype} not in {_SUPPORTED_DTYPES}")
    if rows.shape[1] < 1:
        raise InvalidActivations("rows have no hidden dimension")


@dataclass(frozen=True)
class _Points:
    """Top-k points of consecutive chunks with the same n: flat indices (ascending) and bf16 bits."""

    first_chunk: int
    indices: Array  # (chunks, n)
    bits: Array  # (chunks, n), 0..65535


def _bf16_bits(flat: torch.Tensor) -> torch.Tensor:
    """Bit patterns of the bf16 rounding, as int16 (the sign lands in the int16 sign bit)."""
    return flat.detach().to(torch.bfloat16).contiguous().view(torch.int16)


def _select_by_mask(magnitude: torch.Tensor, kth: torch.Tensor, n: int) -> torch.Tensor:
    """Exact top-n by magnitude, lower index first among equals, with full-width masks (slow path)."""
    above = magnitude > kth
    tied = magnitude == kth
    room = n - above.sum(dim=1, keepdim=True)
    take = above | (tied & (tied.cumsum(dim=1) <= room))
    return take.nonzero()[:, 1].view(-1, n)


def _select_top(magnitude: torch.Tensor, n: int) -> torch.Tensor:
    """Indices (ascending) of the n largest magnitudes per row; ties go to the lower index.

    torch.topk alone leaves the order among equal values unspecified. Fetching a few extra candidates
    settles the boundary whenever the tied run ends inside the window; rows where it does not fall
    back to an exact mask over the whole chunk.
    """
    length = magnitude.shape[1]
    width = min(n + _TIE_WINDOW, length)
    cand_mag, cand_idx = magnitude.topk(width, dim=1, sorted=False)
    key = cand_mag.to(torch.int64) * length + (length - 1 - cand_idx)
    best = key.topk(n, dim=1, sorted=False).indices
    chosen = cand_idx.gather(1, best)
    if width < length:
        kth = cand_mag.gather(1, best).amin(dim=1, keepdim=True)
        open_rows = (kth == cand_mag.amin(dim=1, keepdim=True)).squeeze(1).nonzero().squeeze(1)
        if open_rows.numel():
            chosen[open_rows] = _select_by_mask(magnitude[open_rows], kth[open_rows], n)
    return chosen.sort(dim=1).values


def _top_points(rows: torch.Tensor, k: int, chunk: int) -> list[_Points]:
    """Top-k points of every chunk, in chunk order, batched: chunks with the same n share one entry.

    Selection runs in torch on the rows' device, in blocks (bounded memory); only the (chunks, n)
    results move to the CPU, where the field arithmetic runs.
    """
    tokens, hidden = rows.shape
    full = tokens // chunk
    shapes = [(0, full, chunk)] if full else []
    if tokens % chunk:
        shapes.append((full, 1, tokens % chunk))
    blocks: list[_Points] = []
    for first, count, height in shapes:
        length = height * hidden
        per_block = max(1, _BLOCK_ELEMENTS // length)
        for start in range(first, first + count, per_block):
            stop = min(start + per_block, first + count)
            flat = rows[start * chunk : start * chunk + (stop - start) * height].reshape(stop - start, length)
            bits = _bf16_bits(flat)
            indices = _select_top(bits & _BF16_MAGNITUDE_MASK, min(k, length))
            values = bits.gather(1, indices).to(torch.int64) & 0xFFFF
            blocks.append(_Points(start, indices.cpu().numpy(), values.cpu().numpy()))
    merged: list[_Points] = []
    for block in blocks:
        if merged and merged[-1].indices.shape[1] == block.indices.shape[1]:
            last = merged.pop()
            block = _Points(
                last.first_chunk,
                np.concatenate([last.indices, block.indices]),
                np.concatenate([last.bits, block.bits]),
            )
        merged.append(block)
    return merged


# Field arithmetic
#
# The arrays here are small, (chunks, n) with n <= k, and each step of Newton's method depends on the
# last: hundreds of short vectorised steps. They run in numpy int64 on the CPU, which has a lower cost
# per step than torch and never enters a thread pool (on a shared 2-core machine torch's pool stalled
# these loops by up to 10x); the data-parallel part, top-k over all activations, stays in torch.


@functools.cache
def _inverse_table() -> Array:
    """`table[d + PRIME]` = d^-1 mod PRIME for -PRIME < d < PRIME, d != 0 (Fermat: d^(p-2)).

    Doubled so that the difference of two residues indexes it without a reduction.
    """
    base = np.arange(PRIME, dtype=np.int64)
    result = np.ones_like(base)
    exponent = PRIME - 2
    while exponent:
        if exponent & 1:
            result = result * base % PRIME
        base = base * base % PRIME
        exponent >>= 1
    table = np.concatenate([result, result])
    table.flags.writeable = False
    return table


def _find_moduli(indices: Array) -> Array:
    """Per chunk, the largest m <= PRIME with all `indices % m` distinct, searched downwards.

    PRIME itself is tried alone first (it separates most chunks); the rest go on in steps of
    `_MODULUS_STEP` candidates, each step vectorised over the chunks still pending.
    """
    chunks, n = indices.shape
    moduli = np.zeros(chunks, dtype=np.int64)
    pending = np.arange(chunks)
    top, width = PRIME, 1
    while pending.size:
        if top < max(n, 1):
            raise NoInjectiveModulus(f"no modulus in {n}..{PRIME} separates the top-{n} indices")
        candidates = np.arange(top, max(top - width, n - 1), -1, dtype=np.int64)
        residues = np.sort(indices[pending, None, :] % candidates[None, :, None], axis=2)
        injective = (residues[..., 1:] != residues[..., :-1]).all(axis=2)
        found = injective.any(axis=1)
        moduli[pending[found]] = candidates[injective[found].argmax(axis=1)]
        pending = pending[~found]
        top, width = top - width, _MODULUS_STEP
    return moduli


def _interpolate(x: Array, y: Array) -> Array:
    """Ascending coefficients of the polynomial of degree < n through (x, y) mod PRIME, per row.

    Newton divided differences, then the nested form expanded from the innermost factor; one step
    per point, each vectorised over all rows. The x of a row must be distinct residues below PRIME.
    """
    inverse = _inverse_table()
    n = x.shape[1]
    shifted_x = x + PRIME
    dd = y % PRIME
    for j in range(1, n):
        step = dd[:, j:] - dd[:, j - 1 : -1]
        step *= inverse[shifted_x[:, j:] - x[:, :-j]]
        dd[:, j:] = step % PRIME
    # Descending coefficients: multiply by (t - x_i) and add dd_i, from i = n - 2 down to 0.
    descending = np.zeros_like(dd)
    descending[:, 0] = dd[:, n - 1]
    for i in range(n - 2, -1, -1):
        degree = n - 1 - i
        grown = descending[:, 1 : degree + 1]
        grown -= descending[:, :degree] * x[:, i : i + 1]
        grown[:, -1] += dd[:, i]
        grown %= PRIME
    return np.ascontiguousarray(descending[:, ::-1])


def _evaluate(coefficients: Array, x: Array) -> Array:
    """Horner evaluation mod PRIME of each row's polynomial (ascending coefficients) at its points."""
    result = np.repeat(coefficients[:, -1:], x.shape[1], axis=1)
    for i in range(coefficients.shape[1] - 2, -1, -1):
        result *= x
        result += coefficients[:, i : i + 1]
        result %= PRIME
    return result


# Build


def build_proofs(rows: torch.Tensor, k: int = DEFAULT_K, chunk: int = DEFAULT_CHUNK) -> list[bytes]:
    """One `proof_size(k)`-byte proof per `chunk` rows of final hidden states (input of lm_head)."""
    _check_params(rows, k, chunk)
    proofs: list[bytes] = []
    for points in _top_points(rows, k, chunk):
        moduli = _find_moduli(points.indices)
        coefficients = _interpolate(points.indices % moduli[:, None], points.bits)
        encoded = np.zeros((coefficients.shape[0], 1 + k), dtype=">u2")
        encoded[:, 0] = moduli
        encoded[:, 1 : 1 + coefficients.shape[1]] = coefficients
        proofs.extend(row.tobytes() for row in encoded)
    return proofs


# Verify


def _decode_all(proofs: Sequence[bytes], tokens: int, hidden: int, k: int, chunk: int) -> tuple[Array, Array]:
    """Every structural check, for all proofs, before any activation is touched: moduli, coefficients.

    Beyond the encoding: a chunk of n points needs a modulus >= n, and its polynomial has degree < n.
    """
    expected = chunk_count(tokens, chunk)
    if len(proofs) != expected:
        raise ProofCountMismatch(expected, len(proofs))
    moduli = np.zeros(expected, dtype=np.int64)
    coefficients = np.zeros((expected, k), dtype=np.int64)
    for index, (data, n) in enumerate(zip(proofs, _points_per_chunk(tokens, hidden, k, chunk), strict=True)):
        moduli[index], coefficients[index] = _parse(data, k, index)
        if moduli[index] < n:
            raise MalformedProof(index, f"modulus {moduli[index]} cannot separate {n} points")
        if coefficients[index, n:].any():
            raise MalformedProof(index, f"nonzero coefficient above degree {n - 1}")
    return moduli, coefficients


def _chunk_checks(own: Array, claimed: Array, thresholds: ChunkThresholds) -> list[ChunkCheck]:
    """Compare bf16 exponents and mantissas (sign ignored, as in the reference), row by row."""
    mismatch = ((own & _BF16_EXP_MASK) >> _BF16_EXP_SHIFT) != ((claimed & _BF16_EXP_MASK) >> _BF16_EXP_SHIFT)
    error = np.abs((own & _BF16_MANT_MASK) - (claimed & _BF16_MANT_MASK))
    matched = (~mismatch).sum(axis=1)
    totals = np.where(mismatch, 0, error).sum(axis=1)
    ordered = np.sort(np.where(mismatch, _BF16_MANT_MASK + 1, error), axis=1)
    upper_median = np.take_along_axis(ordered, np.minimum(matched // 2, own.shape[1] - 1)[:, None], axis=1)
    checks = []
    for mism, count, total, med in zip(
        mismatch.sum(axis=1).tolist(),
        matched.tolist(),
        totals.tolist(),
        upper_median[:, 0].tolist(),
        strict=True,
    ):
        mean, median = (total / count, float(med)) if count else (NO_MATCH, NO_MATCH)
        passed = (
            mism <= thresholds.max_exp_mismatches
            and mean <= thresholds.max_mant_err_mean
            and median <= thresholds.max_mant_err_median
        )
        checks.append(ChunkCheck(mism, mean, median, passed))
    return checks


def verify_proofs(
    rows: torch.Tensor,
    proofs: Sequence[bytes],
    k: int = DEFAULT_K,
    chunk: int = DEFAULT_CHUNK,
    *,
    thresholds: ChunkThresholds = REFERENCE_THRESHOLDS,
) -> list[ChunkCheck]:
    """Check the prover's proofs against the validator's own rows (teacher-forced prefill).

    Raises `ProofCountMismatch` or `MalformedProof` (the prover's fault) before evaluating anything,
    `InvalidActivations` when the rows themselves are unusable.
    """
    _check_params(rows, k, chunk)
    tokens, hidden = rows.shape
    moduli, coefficients = _decode_all(proofs, tokens, hidden, k, chunk)
    checks: list[ChunkCheck] = []
    for points in _top_points(rows, k, chunk):
        group = slice(points.first_chunk, points.first_chunk + points.indices.shape[0])
        claimed = _evaluate(coefficients[group], points.indices % moduli[group, None])
        checks.extend(_chunk_checks(points.bits, claimed, thresholds))
    return checks


# Submission-level tier


@dataclass(frozen=True)
class ToplocAggregate:
    """A submission's statistics: chunk means of the two statistics, and the chunks failing tier one."""

    mean_exp_mismatches: float
    mean_mant_err: float
    failed_chunks: tuple[int, ...]


def aggregate(checks: Sequence[ChunkCheck]) -> ToplocAggregate:
    """Average over chunks (each chunk weighs the same); an empty submission averages to zero."""
    if not checks:
        return ToplocAggregate(0.0, 0.0, ())
    return ToplocAggregate(
        mean_exp_mismatches=math.fsum(c.exp_mismatches for c in checks) / len(checks),
        mean_mant_err=math.fsum(c.mant_err_mean for c in checks) / len(checks),
        failed_chunks=tuple(i for i, c in enumerate(checks) if not c.passed),
    )


@dataclass(frozen=True)
class CalibratedPolicy:
    """Bounds on a submission's aggregate for one run's model and precision (signed in its descriptor)."""

    max_mean_exp_mismatches: float
    max_mean_mant_err: float

    def __post_init__(self) -> None:
        for name in ("max_mean_exp_mismatches", "max_mean_mant_err"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and non-negative, got {value}")


# Below these, a bound would sit inside float noise: one top-k boundary swap per chunk, and a
# one-unit mantissa disagreement on a quarter of the matched values. Cheats measured on a GPU sit
# far above (int8 weights: about 9 mismatches and 2 units of mantissa error per chunk).
CALIBRATION_FLOOR: Final = CalibratedPolicy(max_mean_exp_mismatches=1.0, max_mean_mant_err=0.25)


class Bound(enum.Enum):
    """The bound a submission broke, so a rejection and a slash can name it."""

    REFERENCE_CHUNKS = "reference_chunks"  # some chunk failed the reference thresholds
    MEAN_EXP_MISMATCHES = "mean_exp_mismatches"
    MEAN_MANT_ERR = "mean_mant_err"


@dataclass(frozen=True)
class BoundExceeded:
    """One broken bound with the figures a peer can be told and a slash can cite."""

    bound: Bound
    observed: float
    limit: float


@dataclass(frozen=True)
class ToplocVerdict:
    """Both tiers' outcome; empty `exceeded` means the submission's proofs are accepted."""

    exceeded: tuple[BoundExceeded, ...]
    failed_chunks: tuple[int, ...]

    @property
    def passed(self) -> bool:
        return not self.exceeded


def judge(summary: ToplocAggregate, policy: CalibratedPolicy) -> ToplocVerdict:
    """Apply tier one (no chunk may fail) and tier two (the calibrated aggregate bounds)."""
    exceeded = []
    if summary.failed_chunks:
        exceeded.append(BoundExceeded(Bound.REFERENCE_CHUNKS, float(len(summary.failed_chunks)), 0.0))
    for bound, observed, limit in (
        (Bound.MEAN_EXP_MISMATCHES, summary.mean_exp_mismatches, policy.max_mean_exp_mismatches),
        (Bound.MEAN_MANT_ERR, summary.mean_mant_err, policy.max_mean_mant_err),
    ):
        if not observed <= limit:  # NaN fails too
            exceeded.append(BoundExceeded(bound, observed, limit))
    return ToplocVerdict(tuple(exceeded), summary.failed_chunks)


def calibrate(
    honest_aggregates: Sequence[ToplocAggregate],
    margin: float,
    *,
    floor: CalibratedPolicy = CALIBRATION_FLOOR,
) -> CalibratedPolicy:
    """Bounds = honest maximum x margin, never below `floor` (an exact fp32 path measures zero)."""
    if not honest_aggregates:
        raise ValueError("calibration needs at least one honest aggregate")
    if not (math.isfinite(margin) and margin >= 1.0):
        raise ValueError(f"margin must be finite and >= 1, got {margin}")
    failing = [i for i, a in enumerate(honest_aggregates) if a.failed_chunks]
    if failing:
        raise ValueError(f"honest aggregates {failing} fail the reference thresholds; refusing to calibrate")
    return CalibratedPolicy(
        max_mean_exp_mismatches=max(
            max(a.mean_exp_mismatches for a in honest_aggregates) * margin, floor.max_mean_exp_mismatches
        ),
        max_mean_mant_err=max(
            max(a.mean_mant_err for a in honest_aggregates) * margin, floor.max_mean_mant_err
        ),
    )

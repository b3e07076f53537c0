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
  and still equal the reference's Newton expansion: Lagrange in matrix form, exact in float64 (a
  product tree, a power basis, BLAS products and FFT convolutions), batched over every chunk of every
  completion (`build_proofs_batch`, `verify_proofs_batch`: one pass for a whole submission). Newton's
  per-point loop is kept as `_interpolate_reference`; tests hold the two equal.
- Verification follows the reference's tensor path: indices are reduced by the proof's modulus even
  when the validator's top-k holds an index the prover did not commit to (the polynomial then yields
  an unrelated value, which almost always counts as an exponent mismatch); the median of the mantissa
  errors is the upper median; a chunk with no matching exponent reports 2**64 for both statistics.
- Decoding is stricter than the reference (which reads any length and a zero modulus): only the
  canonical encoding an honest builder emits is accepted, and all proofs are checked before any
  activation work is done.
- Beyond the reference: a chunk with fewer than k values (a short last chunk of a narrow model) uses
  all of its values as points and zero-pads the coefficients; the reference fails there.

Two tiers of verdicts (spec/toploc.md): `ChunkCheck.passed` applies the reference thresholds per
chunk; `judge` applies a run's `CalibratedPolicy` to the submission's `aggregate`, because a quantised
or noised model stays far below the reference thresholds while sitting 2-3x above honest statistics.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple, cast

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
# Chunks of at most this many values rank by the exact key |x|·length + (length - 1 - index), which fits
# int32 (magnitudes are below 2^15); longer ones use the tie window on the 16-bit magnitudes.
_DIRECT_KEY_LENGTH: Final = 1 << 16
# Activations handled per block, to bound the memory of the selection on long batches.
_BLOCK_ELEMENTS: Final = 1 << 24
# Candidate moduli per vectorised step of the modulus search, once PRIME alone has failed.
_MODULUS_STEP: Final = 16

Array = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


# Errors


class ToplocError(ValueError):
    """Proofs a validator must refuse: always the prover's fault (reject 605 BAD_PROOF, cite the chunk).

    Only proof faults derive from this class, so `except ToplocError` never blames a peer for the
    validator's own rows; those raise `InvalidActivations` instead.
    """


class MalformedProof(ToplocError):
    """A proof's bytes are not the canonical encoding an honest builder emits."""

    def __init__(self, index: int, reason: str, *, completion: int = 0) -> None:
        super().__init__(f"proof {index}: {reason}")
        self.index = index
        self.reason = reason
        self.completion = completion  # which completion of a batch, for `verify_proofs_batch`


class ProofCountMismatch(ToplocError):
    """One proof per chunk is owed, and a different number arrived."""

    def __init__(self, expected: int, got: int, *, completion: int = 0) -> None:
        super().__init__(f"expected {expected} proofs, got {got}")
        self.expected = expected
        self.got = got
        self.completion = completion


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
    """Top-k points of some chunks with the same n: their numbers in the batch's chunk order, flat indices
    (ascending) and bf16 bits."""

    chunks: Array  # (count,)
    indices: Array  # (count, n)
    bits: Array  # (count, n), 0..65535


class _Span(NamedTuple):  # a tuple: one is made per chunk, and a frozen dataclass costs ~1 us each
    """One chunk of one completion: its rows are `rows[completion][start : start + height]`."""

    completion: int
    start: int
    height: int


def _spans(tokens: Sequence[int], chunk: int) -> list[_Span]:
    """Every chunk of every completion, completions in order, then chunks in order."""
    return [
        _Span(c, start, min(chunk, t - start)) for c, t in enumerate(tokens) for start in range(0, t, chunk)
    ]


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
    back to an exact mask over the whole chunk. Padding (magnitude -1, below every value) is never
    chosen while a row holds at least n values, and a window that reaches it holds the whole row.
    """
    length = magnitude.shape[1]
    if length <= _DIRECT_KEY_LENGTH:  # the rule itself as one unique int32 key per value: no ties left
        order = torch.arange(length - 1, -1, -1, dtype=torch.int32, device=magnitude.device)
        key = magnitude.to(torch.int32) * length + order
        return _ascending(key.topk(n, dim=1, sorted=False).indices)
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
    return _ascending(chosen)


def _ascending(indices: torch.Tensor) -> torch.Tensor:
    """Each row sorted ascending: by numpy on the CPU, where torch's sort of short rows is ~10x slower."""
    if indices.device.type == "cpu":
        return torch.from_numpy(np.sort(indices.numpy(), axis=1))
    return indices.sort(dim=1).values


def _rows_of(completion: torch.Tensor, span: _Span) -> torch.Tensor:
    """The rows of `span`; the completion itself when the span covers it (no slice: ~1 us per chunk)."""
    if span.height == completion.shape[0]:
        return completion
    return completion[span.start : span.start + span.height]


def _select_block(
    rows: Sequence[torch.Tensor], spans: Sequence[_Span], height: int, n: int
) -> tuple[Array, Array]:
    """Top-n flat indices and bf16 bits of chunks of at most `height` rows, in one batched selection.

    Shorter chunks are padded at the end with magnitude -1, which keeps every flat index `r·hidden + c`
    what it is in the chunk alone.
    """
    hidden = rows[spans[0].completion].shape[1]
    bits = _bf16_bits(torch.cat([_rows_of(rows[s.completion], s) for s in spans]))
    count, length = len(spans), height * hidden
    if all(s.height == height for s in spans):
        flat = bits.reshape(count, length)
        chosen = _select_top(flat & _BF16_MAGNITUDE_MASK, n)
        values = flat.gather(1, chosen)
    else:
        heights = torch.tensor([s.height for s in spans])
        offsets = torch.cumsum(heights, 0) - heights
        rank = torch.arange(height)
        # (count, height): the stacked row of each padded row, the extra last row for padding
        row_of = torch.where(rank < heights[:, None], offsets[:, None] + rank, bits.shape[0])
        padded = torch.cat([bits & _BF16_MAGNITUDE_MASK, bits.new_full((1, hidden), -1)])
        chosen = _select_top(padded[row_of].reshape(count, length), n)
        stacked = torch.cat([bits, bits.new_zeros((1, hidden))])[row_of].reshape(count, length)
        values = stacked.gather(1, chosen)  # one gather of the padded layout, not two index tensors
    return chosen.to(torch.int64).cpu().numpy(), (values.to(torch.int64) & 0xFFFF).cpu().numpy()


def _top_points(rows: Sequence[torch.Tensor], k: int, chunk: int) -> list[_Points]:
    """Top-k points of every chunk of every completion, batched: chunks with the same n share a selection.

    Selection runs in torch on the rows' device, in blocks (bounded memory); only the (chunks, n)
    results move to the CPU, where the field arithmetic runs.
    """
    spans = _spans([r.shape[0] for r in rows], chunk)
    hidden = rows[0].shape[1] if rows else 1
    by_points: dict[int, list[int]] = {}
    for number, span in enumerate(spans):
        by_points.setdefault(min(k, span.height * hidden), []).append(number)
    result: list[_Points] = []
    for n, members in by_points.items():
        height = max(spans[m].height for m in members)
        per_block = max(1, _BLOCK_ELEMENTS // (height * hidden))
        for start in range(0, len(members), per_block):
            block = members[start : start + per_block]
            indices, bits = _select_block(rows, [spans[m] for m in block], height, n)
            result.append(_Points(np.asarray(block, dtype=np.int64), indices, bits))
    return result


# Field arithmetic
#
# Exact arithmetic mod PRIME in float64: residues are below 2^16, so a product is below 2^32 and a sum of
# up to 2^18 products is still an integer that float64 holds and `_reduce` reduces exactly (k <= PRIME
# keeps every sum below 2^48). That lets the O(n^2) parts run as
# batched matrix products (BLAS) and FFT convolutions instead of n dependent vectorised steps; only
# O(n·sqrt n) values are made elementwise. Measured on the devnet (256 chunks, n = 128, 2 shared cores):
# Newton's n steps over all chunks 25 ms; this path a few ms. Newton stays as `_interpolate_reference`.


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


_INV_PRIME: Final = 1.0 / PRIME
# Convolution results further than this from an integer mean the float path lost exactness (impossible
# within the bounds above; checked because a wrong coefficient would be a wrong proof, not an error).
_ROUNDING_SLACK: Final = 0.25


def _reduce(values: FloatArray) -> FloatArray:
    """values mod PRIME for integer-valued float64 with |values| < 2^50, exactly and without branches.

    With v = q·PRIME + r, (v + 1/2) / PRIME = q + (r + 1/2) / PRIME sits at least 1/(2·PRIME) ≈ 2^-17
    from an integer, while the float error of the scaled value is below (q + 1)·2^-52 < 2^-17.
    """
    quotient = values + 0.5
    quotient *= _INV_PRIME
    np.floor(quotient, out=quotient)
    quotient *= PRIME
    return np.subtract(values, quotient, out=quotient)


def _convolve(a: FloatArray, b: FloatArray) -> FloatArray:
    """Product mod PRIME of the polynomials along the last axis (ascending, residues), batched, via FFT.

    `a` is split into bytes first, so every exact sum stays below 2^24·(terms) and the FFT's rounding
    error far below 1/2; the result is checked to round cleanly anyway. With at most PRIME < 2^16 terms
    the high sums stay below 2^8·2^16·2^16 = 2^40, so `high·256 + low` < 2^49 is reduced in one pass.
    """
    size = a.shape[-1] + b.shape[-1] - 1
    nfft = 1 << (size - 1).bit_length()
    high = np.floor(a * (1 / 256))
    halves = np.stack([a - high * 256, high])
    exact = np.fft.irfft(np.fft.rfft(halves, nfft) * np.fft.rfft(b, nfft), nfft)[..., :size]
    rounded = np.rint(exact)
    if exact.size and float(np.abs(exact - rounded).max()) > _ROUNDING_SLACK:
        raise ArithmeticError("FFT convolution lost exactness")
    return _reduce(rounded[1] * 256 + rounded[0])


# Up to this many coefficients a product is cheaper as shifted multiply-adds than as an FFT (measured:
# 65 x 65 coefficients over 256 chunks 0.7 ms direct, 0.9 ms by FFT; 128 x 128 2.6 ms against 1.0 ms).
# The multiply-adds run as torch's fused `addcmul_` on the same memory: no temporary per shift, 0.5 ms
# at 65 x 65 (every partial sum is an integer below 2^39, so fusion and order cannot change a bit).
_DIRECT_PRODUCT: Final = 65


def _from_roots(x: FloatArray) -> FloatArray:
    """(chunks, n + 1) ascending coefficients of prod_j (t - x_j) mod PRIME: a product tree, one level
    per doubling, each level batched over all chunks and pairs (coefficients on the leading axis)."""
    chunks, n = x.shape
    width = 1 << max(0, (n - 1).bit_length())
    polys = np.zeros((2, width, chunks))  # (coefficient, factor, chunk); padding factors are the constant 1
    polys[0] = 1.0
    polys[0, :n] = _reduce(-x.T)
    polys[1, :n] = 1.0
    while polys.shape[1] > 1:
        left, right = polys[:, 0::2], polys[:, 1::2]
        terms = left.shape[0]
        if terms <= _DIRECT_PRODUCT:
            product = np.zeros((2 * terms - 1, *left.shape[1:]))
            into, factor = torch.from_numpy(product), torch.from_numpy(right)
            for j, coefficient in enumerate(torch.from_numpy(left)):  # fused multiply-adds, no temporaries
                into[j : j + terms].addcmul_(coefficient, factor)
            polys = _reduce(product)
        else:
            product = _convolve(np.moveaxis(left, 0, -1), np.moveaxis(right, 0, -1))
            polys = np.ascontiguousarray(np.moveaxis(product, -1, 0))
    return np.ascontiguousarray(polys[: n + 1, 0].T)


def _powers(x: FloatArray, count: int) -> FloatArray:
    """(chunks, points, count): x^0 .. x^(count-1) mod PRIME, by doubling."""
    out = np.empty((count, *x.shape))
    out[0] = 1.0
    filled, base = 1, x
    while filled < count:
        step = min(filled, count - filled)
        out[filled : filled + step] = _reduce(out[:step] * base)
        base = _reduce(base * base)
        filled += step
    return np.ascontiguousarray(np.moveaxis(out, 0, -1))


# A basis of at most this many columns per point (k <= 256) is read from a table over the whole field
# (`_field_powers`: 24 columns, 12.6 MB at k = 128) instead of being computed for every point: a gather
# costs a fraction of the doublings, and x is a residue below PRIME whatever the model's width.
_TABLE_COLUMNS: Final = 32


@functools.cache
def _field_powers(width: int, blocks: int) -> tuple[FloatArray, FloatArray]:
    """For every residue r: r^j for j < width, and r^(width·b) for b < blocks (read-only, built once)."""
    residues = np.arange(PRIME, dtype=np.float64)[None, :]
    low = _powers(residues, width)
    high = _powers(_reduce(low[..., -1] * residues), blocks)
    tables = (np.ascontiguousarray(low[0]), np.ascontiguousarray(high[0]))
    for table in tables:
        table.flags.writeable = False
    return tables


@dataclass(frozen=True)
class _PowerBasis:
    """x^e = low[..., e % width] · high[..., e // width] for e below a degree bound, per point:
    O(n·sqrt n) values from which a polynomial's value at every point is two small matrix products."""

    low: FloatArray  # (chunks, points, width)
    high: FloatArray  # (chunks, points, ceil(degree / width))

    @classmethod
    def of(cls, x: FloatArray, degree: int) -> _PowerBasis:
        width = 1 << ((max(degree, 1) - 1).bit_length() + 1) // 2
        blocks = -(-degree // width)
        if width + blocks <= _TABLE_COLUMNS:
            low_table, high_table = _field_powers(width, blocks)
            residues = x.astype(np.intp)
            return cls(low_table[residues], high_table[residues])
        low = _powers(x, width)
        return cls(low, _powers(_reduce(low[..., -1] * x), blocks))

    def evaluate(self, coefficients: FloatArray) -> FloatArray:
        """(chunks, points) values mod PRIME of each chunk's polynomial (ascending coefficients)."""
        chunks, degree = coefficients.shape
        width, blocks = self.low.shape[-1], self.high.shape[-1]
        grid = np.zeros((chunks, blocks * width))
        grid[:, :degree] = coefficients
        partial = _reduce(self.low @ grid.reshape(chunks, blocks, width).transpose(0, 2, 1))
        return _reduce(np.einsum("cpb,cpb->cp", partial, self.high))

    def weighted_power_sums(self, weights: FloatArray, count: int) -> FloatArray:
        """(chunks, count): s_e = sum_i weights_i · x_i^e mod PRIME for e < count."""
        weighted = _reduce(self.high * weights[..., None])
        sums = _reduce(weighted.transpose(0, 2, 1) @ self.low)  # (chunks, blocks, width): e = block·width + j
        return sums.reshape(sums.shape[0], -1)[:, :count]


def _interpolate(x: Array, y: Array) -> Array:
    """Ascending coefficients of the polynomial of degree < n through (x, y) mod PRIME, per row.

    Lagrange in matrix form: with M(t) = prod (t - x_i) and z_i = y_i / M'(x_i), the coefficients are
    c_k = sum_{e} M_(k+1+e) · s_e where s_e = sum_i z_i x_i^e — M from a product tree, M'(x_i) and s from
    a power basis, c from one convolution. The interpolant is unique, so this equals the reference's
    Newton expansion (`_interpolate_reference`). The x of a row must be distinct residues below PRIME,
    and y below 2^18 (bf16 bit patterns are below 2^16), so that y times an inverse stays exact.
    """
    chunks, n = x.shape
    if n == 0:
        return np.zeros((chunks, 0), dtype=np.int64)
    xf = x.astype(np.float64)
    roots = _from_roots(xf)
    basis = _PowerBasis.of(xf, n)
    slope = basis.evaluate(_reduce(roots[:, 1:] * np.arange(1, n + 1, dtype=np.float64)))
    weights = _reduce(y.astype(np.float64) * _inverse_table()[slope.astype(np.int64) + PRIME])  # < 2^32
    sums = basis.weighted_power_sums(weights, n)
    coefficients = _convolve(roots[:, 1:], sums[:, ::-1])[:, n - 1 : 2 * n - 1]
    return coefficients.astype(np.int64)


def _evaluate(coefficients: Array, x: Array) -> Array:
    """Each row's polynomial (ascending coefficients mod PRIME) at its points, mod PRIME."""
    xf = x.astype(np.float64)
    basis = _PowerBasis.of(xf, coefficients.shape[1])
    return basis.evaluate(coefficients.astype(np.float64)).astype(np.int64)


def _interpolate_reference(x: Array, y: Array) -> Array:
    """Newton divided differences expanded to the monomial basis, one step per point (spec/toploc.md).

    The reference the fast `_interpolate` is tested against; vectorised over rows only.
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


def _evaluate_reference(coefficients: Array, x: Array) -> Array:
    """Horner's rule mod PRIME, one step per coefficient: the reference for `_evaluate`."""
    result = np.repeat(coefficients[:, -1:], x.shape[1], axis=1)
    for i in range(coefficients.shape[1] - 2, -1, -1):
        result *= x
        result += coefficients[:, i : i + 1]
        result %= PRIME
    return result


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


# Build


def _check_batch(rows: Sequence[torch.Tensor], k: int, chunk: int) -> None:
    for r in rows:
        _check_params(r, k, chunk)
    if len({r.shape[1] for r in rows}) > 1:
        raise InvalidActivations("rows of one batch must share their hidden size")


def build_proofs_batch(
    rows: Sequence[torch.Tensor], k: int = DEFAULT_K, chunk: int = DEFAULT_CHUNK
) -> list[list[bytes]]:
    """`build_proofs` for many completions (a group, a whole submission) in one vectorised pass.

    The selection, the modulus search and the interpolation each run once over all chunks of all
    completions; the bytes are exactly what `build_proofs` gives each completion alone.
    """
    _check_batch(rows, k, chunk)
    counts = [chunk_count(r.shape[0], chunk) for r in rows]
    encoded = np.zeros((sum(counts), 1 + k), dtype=">u2")
    for points in _top_points(rows, k, chunk):
        moduli = _find_moduli(points.indices)
        coefficients = _interpolate(points.indices % moduli[:, None], points.bits)
        encoded[points.chunks, 0] = moduli
        encoded[points.chunks[:, None], 1 + np.arange(coefficients.shape[1])] = coefficients
    raw, size = encoded.tobytes(), proof_size(k)
    proofs = [raw[i : i + size] for i in range(0, len(raw), size)]
    starts = np.cumsum([0, *counts]).tolist()
    return [proofs[a:b] for a, b in zip(starts[:-1], starts[1:], strict=True)]


def build_proofs(rows: torch.Tensor, k: int = DEFAULT_K, chunk: int = DEFAULT_CHUNK) -> list[bytes]:
    """One `proof_size(k)`-byte proof per `chunk` rows of final hidden states (input of lm_head)."""
    return build_proofs_batch([rows], k, chunk)[0]


# Verify


def _decode_batch(
    proofs: Sequence[Sequence[bytes]], tokens: Sequence[int], hidden: int, k: int, chunk: int
) -> tuple[Array, Array]:
    """Every structural check, for all proofs of all completions, before any activation is touched.

    Counts first (every completion), then each proof in order; the first fault found is raised, naming
    its completion and proof. Beyond the encoding: a chunk of n points needs a modulus >= n, and its
    polynomial has degree < n. Returns the moduli and coefficients of every chunk, in batch order.
    """
    for c, (claimed, t) in enumerate(zip(proofs, tokens, strict=True)):
        if len(claimed) != chunk_count(t, chunk):
            raise ProofCountMismatch(chunk_count(t, chunk), len(claimed), completion=c)
    owners = [(c, i) for c, claimed in enumerate(proofs) for i in range(len(claimed))]
    size, raws = proof_size(k), []
    for (c, i), data in zip(owners, (p for claimed in proofs for p in claimed), strict=True):
        if not isinstance(data, bytes | bytearray | memoryview):
            raise MalformedProof(i, f"expected bytes, got {type(data).__name__}", completion=c)
        raw = data if type(data) is bytes else bytes(data)
        if len(raw) != size:
            raise MalformedProof(i, f"length {len(raw)}, expected {size}", completion=c)
        raws.append(raw)
    table = np.frombuffer(b"".join(raws), dtype=">u2").reshape(len(raws), 1 + k).astype(np.int64)
    moduli, coefficients = table[:, 0], table[:, 1:]
    points = np.array([min(k, s.height * hidden) for s in _spans(tokens, chunk)], dtype=np.int64)
    faults: list[tuple[npt.NDArray[np.bool_], Callable[[int], str]]] = [
        (moduli == 0, lambda g: "modulus is zero"),
        (moduli > PRIME, lambda g: f"modulus {moduli[g]} above {PRIME}"),
        (coefficients.max(axis=1, initial=0) >= PRIME, lambda g: f"coefficient not reduced mod {PRIME}"),
        (moduli < points, lambda g: f"modulus {moduli[g]} cannot separate {points[g]} points"),
        (
            cast(npt.NDArray[np.bool_], (coefficients * (np.arange(k) >= points[:, None])).any(axis=1)),
            lambda g: f"nonzero coefficient above degree {points[g] - 1}",
        ),
    ]
    bad = np.zeros(len(raws), dtype=bool)
    for mask, _ in faults:
        bad |= mask
    if bad.any():
        first = int(bad.argmax())
        reason = next(describe(first) for mask, describe in faults if mask[first])
        c, i = owners[first]
        raise MalformedProof(i, reason, completion=c)
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


def verify_proofs_batch(
    rows: Sequence[torch.Tensor],
    proofs: Sequence[Sequence[bytes]],
    k: int = DEFAULT_K,
    chunk: int = DEFAULT_CHUNK,
    *,
    thresholds: ChunkThresholds = REFERENCE_THRESHOLDS,
) -> list[list[ChunkCheck]]:
    """`verify_proofs` for many completions (a whole submission) in one vectorised pass.

    Every proof of every completion is decoded and checked before any activation work; a fault raises
    `ProofCountMismatch` or `MalformedProof` whose `completion` names the completion.
    """
    _check_batch(rows, k, chunk)
    if len(rows) != len(proofs):
        raise InvalidActivations(f"{len(rows)} row tensors for {len(proofs)} proof lists")
    tokens = [r.shape[0] for r in rows]
    moduli, coefficients = _decode_batch(proofs, tokens, rows[0].shape[1] if rows else 1, k, chunk)
    checks: list[ChunkCheck | None] = [None] * len(moduli)
    for points in _top_points(rows, k, chunk):
        n = points.indices.shape[1]
        claimed = _evaluate(coefficients[points.chunks, :n], points.indices % moduli[points.chunks, None])
        for number, check in zip(points.chunks.tolist(), _chunk_checks(points.bits, claimed, thresholds),
                                 strict=True):
            checks[number] = check
    starts = np.cumsum([0, *(len(p) for p in proofs)]).tolist()
    return [cast(list[ChunkCheck], checks[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=True)]


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
    return verify_proofs_batch([rows], [proofs], k, chunk, thresholds=thresholds)[0]


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

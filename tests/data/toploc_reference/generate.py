"""Produce vectors.json from PrimeIntellect's reference `toploc` library (see README.md here).

Run it with a Python that has `toploc` installed, never the project's own environment:

    python tests/data/toploc_reference/generate.py > tests/data/toploc_reference/vectors.json

Inputs are bf16 bit patterns described by a small recipe (a splitmix64 base, explicit "spikes" and an
optional jitter of a few ulps), so the test rebuilds the same rows with integer arithmetic alone and
the JSON stays small. Every chunk is checked to have no tie at the top-k boundary: there the
reference's selection (torch.topk, unspecified tie order on CPU) is unambiguous, so its proof bytes
and statistics are what any correct implementation must reproduce.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

MASK64 = (1 << 64) - 1


def splitmix64(seed: int, count: int) -> np.ndarray:
    """The splitmix64 output for counters seed * 2**32 + i, i < count (uint64, wrapping arithmetic)."""
    z = (np.uint64(seed << 32) + np.arange(count, dtype=np.uint64)) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def rows_bits(tokens: int, hidden: int, recipe: dict[str, Any]) -> np.ndarray:
    """bf16 bit patterns (uint16, shape (tokens, hidden)) for a recipe of this file's vectors.

    base: magnitudes in [2**-27, 1) with random sign; spikes: [flat index, bits] overwrites;
    jitter: each magnitude moved by up to `max_ulp` units of the last place, sign kept.
    """
    n = tokens * hidden
    z = splitmix64(recipe["seed"], n)
    sign = (z >> np.uint64(63)) & np.uint64(1)
    exponent = np.uint64(100) + (z >> np.uint64(32)) % np.uint64(27)
    mantissa = z & np.uint64(0x7F)
    bits = ((sign << np.uint64(15)) | (exponent << np.uint64(7)) | mantissa).astype(np.int64)
    for position, value in recipe.get("spikes", []):
        bits[position] = value
    jitter = recipe.get("jitter")
    if jitter:
        width = 2 * jitter["max_ulp"] + 1
        delta = (splitmix64(jitter["seed"], n) % np.uint64(width)).astype(np.int64) - jitter["max_ulp"]
        magnitude = np.clip((bits & 0x7FFF) + delta, 0, 0x7F7F)
        bits = (bits & 0x8000) | magnitude
    return bits.astype(np.uint16).reshape(tokens, hidden)


def _spikes(rng: np.random.Generator, positions: list[int], count: int) -> list[list[int]]:
    """Spikes of distinct magnitudes 8 ulps apart (so a 2-ulp jitter cannot create ties), largest first."""
    magnitudes = sorted(rng.choice(np.arange(0x3F80, 0x4F80, 8), size=count, replace=False).tolist())[::-1]
    signs = rng.integers(0, 2, size=count).tolist()
    return [[p, m | (s << 15)] for p, m, s in zip(positions, magnitudes, signs, strict=True)]


def _random_positions(
    rng: np.random.Generator, low: int, high: int, count: int, avoid: set[int]
) -> list[int]:
    out: list[int] = []
    while len(out) < count:
        p = int(rng.integers(low, high))
        if p not in avoid and p not in out:
            out.append(p)
    return out


def cases() -> list[dict[str, Any]]:
    rng = np.random.default_rng(20260123)
    out: list[dict[str, Any]] = []

    # tiny: k=4 over chunks of 2 rows x 16, last chunk one row; no spikes.
    out.append(
        {
            "name": "tiny",
            "tokens": 5,
            "hidden": 16,
            "k": 4,
            "chunk": 2,
            "rows": {"seed": 11},
            "checks": {
                "identical": {"seed": 11},
                "jitter_2ulp": {"seed": 11, "jitter": {"seed": 12, "max_ulp": 2}},
                # Even matched counts with unequal middle values: pins the upper median of the
                # tensor path (the reference's list path would average the middle two instead).
                "jitter_3ulp": {"seed": 11, "jitter": {"seed": 100, "max_ulp": 3}},
                "different": {"seed": 13},
            },
        }
    )

    # modulus: 32 x 4096 = 131072 values per full chunk, so the modulus search matters; ten index
    # pairs p, p + (65497 - j) rule out the ten largest candidate moduli in chunk 0.
    pairs: list[int] = []
    for j in range(10):
        base = 1000 * j + 7
        pairs += [base, base + 65497 - j]
    chunk0 = pairs + _random_positions(rng, 0, 32 * 4096, 150, set(pairs))
    chunk1 = _random_positions(rng, 32 * 4096, 40 * 4096, 140, set())
    spikes = _spikes(rng, chunk0, len(chunk0)) + _spikes(rng, chunk1, len(chunk1))
    moved = [[p, 0x3000] for p, _ in spikes[20:30]] + [
        [p, b]
        for p, (_, b) in zip(
            _random_positions(rng, 0, 32 * 4096, 10, set(chunk0)), spikes[20:30], strict=True
        )
    ]
    out.append(
        {
            "name": "modulus",
            "tokens": 40,
            "hidden": 4096,
            "k": 128,
            "chunk": 32,
            "rows": {"seed": 21, "spikes": spikes},
            "checks": {
                "identical": {"seed": 21, "spikes": spikes},
                "jitter_2ulp": {"seed": 21, "spikes": spikes, "jitter": {"seed": 22, "max_ulp": 2}},
                "ten_moved": {"seed": 21, "spikes": spikes + moved},
                "different": {"seed": 23, "spikes": _spikes(rng, chunk1 + chunk0, len(chunk0) + len(chunk1))},
            },
        }
    )

    # wide: 32 x 2560 = 81920 values, then a one-row chunk of 2560.
    chunk0 = _random_positions(rng, 0, 32 * 2560, 200, set())
    chunk1 = _random_positions(rng, 32 * 2560, 33 * 2560, 150, set())
    spikes = _spikes(rng, chunk0, len(chunk0)) + _spikes(rng, chunk1, len(chunk1))
    out.append(
        {
            "name": "wide",
            "tokens": 33,
            "hidden": 2560,
            "k": 128,
            "chunk": 32,
            "rows": {"seed": 31, "spikes": spikes},
            "checks": {
                "identical": {"seed": 31, "spikes": spikes},
                "jitter_2ulp": {"seed": 31, "spikes": spikes, "jitter": {"seed": 32, "max_ulp": 2}},
            },
        }
    )
    return out


def _assert_no_boundary_ties(bits: np.ndarray, k: int, chunk: int) -> None:
    for start in range(0, bits.shape[0], chunk):
        magnitudes = np.sort((bits[start : start + chunk].reshape(-1) & 0x7FFF).astype(np.int64))[::-1]
        if magnitudes.size > k and magnitudes[k - 1] == magnitudes[k]:
            raise SystemExit(f"tie at the top-k boundary in the chunk starting at row {start}")


def main() -> None:
    from importlib.metadata import version

    import torch
    from toploc import verify_proofs_bytes
    from toploc.poly import build_proofs_bytes

    def tensor(bits: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16)

    vectors = []
    for case in cases():
        tokens, hidden, k, chunk = case["tokens"], case["hidden"], case["k"], case["chunk"]
        prover = rows_bits(tokens, hidden, case["rows"])
        _assert_no_boundary_ties(prover, k, chunk)
        proofs = build_proofs_bytes(tensor(prover), decode_batching_size=chunk, topk=k, skip_prefill=True)
        # A foreign proof: the zero polynomial under the largest modulus; no exponent can match.
        foreign = [b"\xff\xd9" + bytes(2 * k)] * len(proofs)
        checks = []
        for name, recipe in case["checks"].items():
            validator = rows_bits(tokens, hidden, recipe)
            _assert_no_boundary_ties(validator, k, chunk)
            for label, given in ((name, proofs), (name + "/foreign_proof", foreign)):
                results = verify_proofs_bytes(
                    tensor(validator), given, decode_batching_size=chunk, topk=k, skip_prefill=True
                )
                checks.append(
                    {
                        "name": label,
                        "rows": recipe,
                        "proofs": None if given is proofs else [p.hex() for p in given],
                        "results": [[r.exp_mismatches, r.mant_err_mean, r.mant_err_median] for r in results],
                    }
                )
        vectors.append({**case, "proofs": [p.hex() for p in proofs], "checks": checks})
    json.dump(
        {
            "library": f"toploc {version('toploc')}",
            "torch": torch.__version__,
            "calls": "build_proofs_bytes / verify_proofs_bytes (tensor rows, skip_prefill=True)",
            "cases": vectors,
        },
        sys.stdout,
        indent=None,
        separators=(",", ":"),
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

"""TOPLOC proof cost against the cheapest thing a prover must do anyway: a plain top-k over the chunks.

Usage: `python benchmarks/bench_toploc.py [--repeats N]`. Progress goes to stderr; the last line on
stdout is one JSON object (snake_case keys, ratios end in `_ratio`). Each section is a function
returning its own keys, so further sections (the lead's tiny-model generation vs proof time) are
appended to `SECTIONS` without touching this one. Times are the minimum over repeats: the machine
is shared, and the minimum is the least disturbed estimate of the same work.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

from crypto.toploc import DEFAULT_CHUNK, DEFAULT_K, build_proofs, verify_proofs

Section = Callable[[argparse.Namespace], dict[str, float | int]]


def _best_seconds(work: Callable[[], object], repeats: int) -> float:
    work()  # warm-up: lazily built tables, allocator
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def _plain_topk(rows: torch.Tensor, k: int, chunk: int) -> None:
    """The baseline: torch.topk by |x| over each flattened chunk, nothing else."""
    tokens = rows.shape[0]
    full = tokens // chunk * chunk
    if full:
        rows[:full].reshape(tokens // chunk, -1).abs().topk(k, dim=1)
    if full < tokens:
        rows[full:].reshape(1, -1).abs().topk(k, dim=1)


def proofs_section(args: argparse.Namespace) -> dict[str, float | int]:
    """Synthetic final hidden states: 1000 tokens x hidden 4096, fp32, standard normal."""
    tokens, hidden, k, chunk = 1000, 4096, DEFAULT_K, DEFAULT_CHUNK
    rows = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(0))
    proofs = build_proofs(rows, k=k, chunk=chunk)
    checks = verify_proofs(rows, proofs, k=k, chunk=chunk)
    if not all(c.passed and c.exp_mismatches == 0 for c in checks):
        raise SystemExit("honest proofs did not verify")
    build_s = _best_seconds(lambda: build_proofs(rows, k=k, chunk=chunk), args.repeats)
    verify_s = _best_seconds(lambda: verify_proofs(rows, proofs, k=k, chunk=chunk), args.repeats)
    topk_s = _best_seconds(lambda: _plain_topk(rows, k, chunk), args.repeats)
    print(
        f"proofs: build {build_s * 1e3:.1f} ms, verify {verify_s * 1e3:.1f} ms, "
        f"plain topk {topk_s * 1e3:.1f} ms over {len(proofs)} chunks",
        file=sys.stderr,
    )
    return {
        "proof_tokens": tokens,
        "proof_hidden": hidden,
        "proof_chunks": len(proofs),
        "proof_build_ms": round(build_s * 1e3, 3),
        "proof_verify_ms": round(verify_s * 1e3, 3),
        "topk_baseline_ms": round(topk_s * 1e3, 3),
        "proof_build_vs_topk_ratio": round(build_s / topk_s, 3),
        "proof_verify_vs_topk_ratio": round(verify_s / topk_s, 3),
        "proof_build_us_per_token": round(build_s / tokens * 1e6, 3),
        "proof_bytes_per_token": round(sum(len(p) for p in proofs) / tokens, 3),
    }


# Later: a tiny-model section (generation time vs proof time) is appended here.
SECTIONS: list[Section] = [proofs_section]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per measurement (minimum kept)")
    args = parser.parse_args()
    result: dict[str, float | int] = {"torch_threads": torch.get_num_threads(), "repeats": args.repeats}
    for section in SECTIONS:
        result.update(section(args))
    print(json.dumps(result, sort_keys=False))


if __name__ == "__main__":
    main()

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
from pathlib import Path

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
def _cheat_engines(base: Path) -> dict[str, object]:
    """Engines a cheating worker might run instead of the claimed checkpoint."""
    from node.rl.engine import TransformersEngine

    noisy = TransformersEngine.from_folder(base)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in noisy.model.parameters():
            p.mul_(1 + 0.01 * torch.randn(p.shape, generator=gen))
    int8 = TransformersEngine.from_folder(base)
    with torch.no_grad():
        for p in int8.model.parameters():
            if p.ndim == 2:  # per-row symmetric int8 of every matrix, as a quantised server would hold it
                scale = p.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
                p.copy_(torch.round(p / scale).clamp(-127, 127) * scale)
    return {"noise_1pct": noisy, "int8_weights": int8}


def tiny_model_section(args: argparse.Namespace) -> dict[str, float | int]:
    """The devnet's model end to end: generation vs proofs vs validator prefill, false positives, detection."""
    from crypto.toploc import CalibratedPolicy, judge
    from node.rl.calibration import submission_aggregate
    from node.rl.engine import TransformersEngine
    from node.rl.rollouts import build_submission, task_prompt_ids
    from node.rl.run import DEVNET_MODEL, devnet_policy, devnet_run

    engine = TransformersEngine.from_folder(DEVNET_MODEL)
    setup = devnet_run(b"\x01" * 20, DEVNET_MODEL, 0, info=engine.info)
    policy = devnet_policy()
    bounds = CalibratedPolicy(policy.max_mean_exp_mismatches, policy.max_mean_mant_err)
    grpo = setup.descriptor.grpo
    prompts = [list(task_prompt_ids(t, engine.tokenizer)) for t in setup.tasks[:8]]
    seeds = list(range(grpo.group_size))
    groups = [engine.generate_group(p, grpo.group_size, seeds, grpo.max_new_tokens, 1.0)
              for p in prompts]
    gen_s = _best_seconds(lambda: [engine.generate_group(p, grpo.group_size, seeds,
                                                         grpo.max_new_tokens, 1.0) for p in prompts], args.repeats)
    rows = [c.hidden_rows for g in groups for c in g]
    proof_s = _best_seconds(lambda: [build_proofs(r) for r in rows], args.repeats)
    pairs = [(p, list(c.tokens)) for p, g in zip(prompts, groups, strict=True) for c in g]
    proofs = [build_proofs(r) for r in rows]

    def validate() -> None:
        for pre, pr in zip(engine.prefill_batch(pairs), proofs, strict=True):
            verify_proofs(pre.hidden_rows, pr)

    validate_s = _best_seconds(validate, args.repeats)
    tokens = sum(len(c.tokens) for g in groups for c in g)

    # Honest false positives over >= 1000 sequences, and each cheat's detection, at the devnet bounds.
    workers = [bytes([w]) * 20 for w in range(1, 1 + args.honest_workers)]
    sequences, honest_failed, honest_subs = 0, 0, 0
    for counter, worker in enumerate(workers):
        sub = build_submission(engine, setup.descriptor, setup.dataset, setup.dataset_ids, worker, 0, b"\0" * 32,
                               counter)
        sequences += sum(len(g.completions) for g in sub.groups)
        honest_subs += 1
        honest_failed += not judge(submission_aggregate(sub, engine, 128, 32), bounds).passed
    detection: dict[str, float | int] = {}
    for name, cheat in _cheat_engines(DEVNET_MODEL).items():
        caught = 0
        for worker in workers[: args.cheat_submissions]:
            sub = build_submission(cheat, setup.descriptor, setup.dataset, setup.dataset_ids, worker, 0,  # type: ignore[arg-type]
                                   b"\0" * 32, 0)
            caught += not judge(submission_aggregate(sub, engine, 128, 32), bounds).passed
        detection[f"{name}_detection_rate"] = caught / args.cheat_submissions
    return {
        "tiny_tokens": tokens,
        "tiny_generation_ms": round(gen_s * 1e3, 3),
        "tiny_proof_build_ms": round(proof_s * 1e3, 3),
        "tiny_validation_ms": round(validate_s * 1e3, 3),
        "tiny_proof_vs_generation_ratio": round(proof_s / gen_s, 4),
        "tiny_validation_vs_generation_ratio": round(validate_s / gen_s, 4),
        "tiny_proof_bytes_per_token": round(sum(len(p) for pr in proofs for p in pr) / tokens, 3),
        "honest_sequences": sequences,
        "honest_submissions": honest_subs,
        "honest_false_positive_rate": honest_failed / honest_subs,
        **detection,
    }


SECTIONS: list[Section] = [proofs_section, tiny_model_section]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per measurement (minimum kept)")
    parser.add_argument("--honest-workers", type=int, default=32,
                        help="honest submissions for the false-positive rate (32 x 4 prompts x 8 = 1024 sequences)")
    parser.add_argument("--cheat-submissions", type=int, default=8, help="submissions per cheat for detection rates")
    args = parser.parse_args()
    result: dict[str, float | int] = {"torch_threads": torch.get_num_threads(), "repeats": args.repeats}
    for section in SECTIONS:
        result.update(section(args))
    print(json.dumps(result, sort_keys=False))


if __name__ == "__main__":
    main()

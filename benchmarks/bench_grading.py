"""What the code sandbox costs: grading throughput of code-task completions in the sandbox against the same
programs run by a bare interpreter in a subprocess (no namespaces, no seccomp, no cgroup, no limits).

Usage: `python benchmarks/bench_grading.py [--rounds N] [--per-round M]`. Progress goes to stderr; the last
line on stdout is one JSON object (snake_case keys, ratios end in `_ratio`). The two are measured in
interleaved rounds (a noisy neighbour slows both), and each figure is the best round's.

The programs are what a devnet's code tasks grade: a short function followed by its assert-based tests,
passing and failing ones alternating, plus one that imports a few stdlib modules.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from swarmnode.node.rl.tasks import Task
from swarmnode.node.rl.tasks.code import extract_code, grade, program_text
from swarmnode.node.sandbox.bwrap import ENVIRONMENT, INTERPRETER_FLAGS
from swarmnode.node.sandbox.run import check_sandbox

TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert add(10**6, 1) == 1000001\n"
COMPLETIONS = (
    "```python\ndef add(a, b):\n    return a + b\n```",
    "```python\ndef add(a, b):\n    return a - b\n```",
    "```python\nimport collections, itertools, math\ndef add(a, b):\n    return math.fsum([a, b])\n```",
)


def sandboxed(task: Task, completions: list[str]) -> float:
    start = time.perf_counter()
    for completion in completions:
        grade(task, completion)
    return time.perf_counter() - start


def bare(task: Task, completions: list[str]) -> float:
    """The baseline: the same program text through the same interpreter flags, nothing around it."""
    env = dict(ENVIRONMENT)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for completion in completions:
            path = Path(tmp) / "main.py"
            path.write_text(program_text(task, extract_code(completion)))
            subprocess.run([sys.executable, *INTERPRETER_FLAGS, str(path)], cwd=tmp, env=env,
                           capture_output=True, timeout=30)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=60, help="gradings per round and side")
    args = parser.parse_args()
    host = check_sandbox()
    task = Task("code", "Write add(a, b).", TESTS)
    completions = [COMPLETIONS[i % len(COMPLETIONS)] for i in range(args.per_round)]
    best = {"sandboxed": float("inf"), "bare": float("inf")}
    for r in range(args.rounds):
        for name, measure in (("sandboxed", sandboxed), ("bare", bare)):
            best[name] = min(best[name], measure(task, completions))
        print(f"round {r + 1}/{args.rounds}: sandboxed {best['sandboxed']:.2f} s, bare {best['bare']:.2f} s "
              f"for {args.per_round}", file=sys.stderr)
    print(json.dumps({
        "gradings_per_round": args.per_round,
        "cgroups": host.cgroups is not None,
        "sandboxed_gradings_per_s": round(args.per_round / best["sandboxed"], 1),
        "bare_gradings_per_s": round(args.per_round / best["bare"], 1),
        "sandboxed_ms_per_grading": round(1000 * best["sandboxed"] / args.per_round, 2),
        "bare_ms_per_grading": round(1000 * best["bare"] / args.per_round, 2),
        "sandbox_cost_ratio": round(best["sandboxed"] / best["bare"], 3),
    }))


if __name__ == "__main__":
    main()

"""A devnet on a model that never solves its tasks stops, saying why and what to do (spec/rollouts.md,
Learning signal), instead of running on silently.

The model is what `swarmnode model init` writes without a warm start (random weights), the tasks three-digit
additions: every group's completions all score 0, so every group is filtered and no step can start. The
devnet must stop once the trainer reports it (`--no-signal-after`), with a message naming the cause and the
fix, and exit non-zero. Slow (about 1.5 minutes on 2 cores).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from swarmnode.node.rl.tasks import Task, write_tasks
from tests.swarm.test_real_models_devnet import swarmnode

pytestmark = pytest.mark.slow

NO_SIGNAL_AFTER_S = 20
STARTUP_BOUND_S = 240  # every node up and a step's worth of groups delivered, on a busy 2-core machine


def unsolvable_tasks(count: int) -> list[Task]:
    rng = random.Random(3)
    seen: dict[tuple[int, int], Task] = {}
    while len(seen) < count:
        a, b = rng.randrange(100, 1000), rng.randrange(100, 1000)
        seen.setdefault((a, b), Task("arithmetic", f"{a}+{b}=", str(a + b)))
    return list(seen.values())


def test_a_devnet_without_learning_signal_stops_and_says_why(tmp_path: Path) -> None:
    write_tasks(unsolvable_tasks(400), tmp_path / "tasks.jsonl")
    model = tmp_path / "model"
    init = swarmnode("model", "init", "--arch", "llama", "--tasks", str(tmp_path / "tasks.jsonl"), str(model),
                     timeout=300)  # fmt: skip
    assert init.returncode == 0, init.stdout[-3000:] + init.stderr[-3000:]
    started = time.monotonic()
    run = swarmnode(
        "devnet", "--no-live", "--steps", "5", "--workers", "2", "--relays", "1",
        "--model", str(model), "--tasks", str(tmp_path / "tasks.jsonl"),
        "--no-signal-after", str(NO_SIGNAL_AFTER_S), "--out", str(tmp_path / "run"), timeout=900,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    output = run.stdout + run.stderr
    assert run.returncode == 1, output[-4000:]
    assert "the run stopped: no learning signal" in output, output[-4000:]
    assert "never solves these tasks" in output and "swarmnode tasks filter" in output, output[-4000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["reason"].startswith("no learning signal")
    assert summary["elapsed_s"] <= STARTUP_BOUND_S + NO_SIGNAL_AFTER_S, summary["elapsed_s"]
    trainer = summary["nodes"]["trainer-1"]["work"]
    assert trainer["step"] == 0 and trainer["signal"]["starved"] and trainer["signal"]["signal_groups"] == 0
    assert elapsed < 900

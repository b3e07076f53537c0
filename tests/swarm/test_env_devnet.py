"""A tool-using devnet (spec/environments.md): `devnet --env calculator` trains the committed calculator model
on two-digit products (the devnet writes them), every completion an episode (a `<calc>` call, the tool's
`<result>`, the boxed answer) that the validator replays, and a worker that fabricates the tool's results
(sampling its later turns honestly on them, so every model check passes) is slashed 611
FABRICATED_ENV_TURN. The held-out reward rises: measured 0.46 -> 0.69 over 20 steps, about 0.54 by step 8.
Slow (about four minutes on 2 cores); `-m slow` runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12


def test_a_calculator_devnet_trains_and_slashes_a_worker_that_fabricates_tool_results(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    run = subprocess.run(
        [sys.executable, "-m", "swarmnode.node.cli.main", "devnet", "--no-live", "--steps", str(STEPS),
         "--workers", "2", "--relays", "1", "--env", "calculator", "--cheat", "fabricated-env-turn",
         "--out", str(tmp_path / "run"), "--summary", str(summary_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    summary = json.loads(summary_path.read_text())
    assert summary["every_cheater_slashed"] is True and summary["honest_slashed"] == []
    by_reason = summary["validators"]["by_reason"]  # slashed below its stake, the cheater is then unstaked
    assert by_reason.get("FABRICATED_ENV_TURN", 0) >= 1
    assert set(by_reason) <= {"FABRICATED_ENV_TURN", "NOT_STAKED"}, by_reason
    nodes = summary["nodes"]
    (liar,) = [node for node in nodes.values() if node.get("cheat") == "fabricated-env-turn"]
    assert liar["rollouts_accepted"] == 0 and liar["rollouts_rejected"] > 0
    for name, node in nodes.items():
        if node["role"] == "worker" and node["honest"]:
            assert node["rollouts_accepted"] > 0 and node["rollouts_rejected"] == 0, name
    assert summary["trainer"]["step"] == STEPS
    # the same 128 held-out products and seeds before and after: about 0.016 of noise each way
    assert summary["final_reward"] > summary["base_reward"] + 0.03, (summary["base_reward"],
                                                                      summary["final_reward"])
    print(json.dumps({k: v for k, v in summary.items() if k != "nodes"})[:2000])

"""A multi-turn devnet (spec/environments.md): `devnet --env guess` trains the committed model on games of
guess-the-number (the devnet writes them), every completion an episode the validator replays, and a worker
that fabricates the game's replies (sampling its later turns honestly on them, so every model check passes)
is slashed 611 FABRICATED_ENV_TURN. Slow (about four minutes on 2 cores); `-m slow` runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from swarmnode.node.devnet.rl import GAMES, GAMES_MAX_LOW, GAMES_MAX_SIZE, unique
from swarmnode.node.rl.environments.game import generate_tasks
from swarmnode.node.rl.tasks import write_tasks

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EVAL_GAMES = 32  # the devnet's own 128 held-out games take two minutes each way: this test checks slashing


def test_a_guess_devnet_trains_and_slashes_a_worker_that_fabricates_environment_turns(tmp_path: Path) -> None:
    games = unique(generate_tasks(GAMES, seed=1, max_low=GAMES_MAX_LOW, max_size=GAMES_MAX_SIZE))
    held_out = unique(generate_tasks(EVAL_GAMES, seed=2, max_low=GAMES_MAX_LOW, max_size=GAMES_MAX_SIZE))
    write_tasks(games, tmp_path / "games.jsonl")
    write_tasks(held_out, tmp_path / "held-out.jsonl")
    summary_path = tmp_path / "summary.json"
    run = subprocess.run(
        [sys.executable, "-m", "swarmnode.node.cli.main", "devnet", "--no-live", "--steps", "6",
         "--workers", "2", "--relays", "1", "--env", "guess", "--cheat", "fabricated-env-turn",
         "--tasks", str(tmp_path / "games.jsonl"), "--eval-tasks", str(tmp_path / "held-out.jsonl"),
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
    assert summary["trainer"]["step"] == 6
    print(json.dumps({k: v for k, v in summary.items() if k != "nodes"})[:2000])

"""The main job end to end, as separate processes: a run whose nodes are killed and restarted one role at
a time (tests/swarm/test_real_models_devnet.py runs `swarmnode devnet` with every cheat, on a signed log
and on a local chain, on user model folders and task files).

Slow (multi-process, about a minute each on 2 cores); `-m slow` runs them.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmnode.node.devnet.network import Devnet
from swarmnode.node.devnet.plan import DevnetPlan
from swarmnode.node.trainer import INBOX_FILE
from swarmnode.node.validator import STORE_FILE

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _devnet_cli(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "swarmnode.node.cli.run", "devnet", "--no-live", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _work(devnet: Devnet, name: str) -> dict:
    status = devnet.nodes[name].status() or {}
    return status.get("work") or {}




def _digests(path: Path, table: str) -> set[bytes]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute(f"SELECT digest FROM {table}")}  # noqa: S608 - our own table name


def test_killing_and_restarting_each_role_loses_no_accepted_rollout(tmp_path: Path) -> None:
    plan = DevnetPlan(trainers=1, relays=2, workers=2, validators=1, steps=6, ledger="signed")
    devnet = Devnet(plan, tmp_path / "run")
    devnet.prepare()
    try:
        devnet.start("bootstrap")
        devnet.wait_ready(["bootstrap"], timeout=60)
        devnet.start_others()

        def step() -> int:
            return int(_work(devnet, "trainer-1").get("step", 0))

        for victim, after_step in (("relay-1", 1), ("worker-1", 2), ("validator-1", 3), ("trainer-1", 4)):
            devnet.wait_until(lambda s=after_step: step() >= s, 240, f"trainer step {after_step}")
            devnet.kill(victim)
            time.sleep(1.0)
            devnet.start(victim)
            devnet.wait_ready([victim], timeout=90)
        devnet.wait_until(lambda: bool(_work(devnet, "trainer-1").get("done")), 300, "the end of training")

        trainer_db = devnet.nodes["trainer-1"].data_dir / INBOX_FILE
        validator_db = devnet.nodes["validator-1"].data_dir / "validator" / STORE_FILE
        devnet.wait_until(
            lambda: _digests(validator_db, "accepted") <= _digests(trainer_db, "rollouts"),
            60,
            "the trainer holding every accepted submission",
        )
        trainer = _work(devnet, "trainer-1")
        assert trainer["step"] == 6 and len(trainer["rewards"]) == 6
        assert all(devnet.nodes[n].exit_code is None for n in ("relay-1", "worker-1", "validator-1"))
    finally:
        codes = devnet.stop_all()
    assert all(code in (0, None) for code in codes.values()), codes

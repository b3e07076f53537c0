"""The devnet with 2-rank FSDP2 trainers: one whose second rank is SIGKILLed mid-run (the group restarts,
resumes from its last sharded save and finishes the run with no accepted rollout lost), and two DiLoCo
trainers that are each a group.

Slow (multi-process, a few minutes on 2 cores); `-m slow` runs it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from swarmnode.node.devnet.network import Devnet
from swarmnode.node.devnet.plan import DevnetPlan
from swarmnode.node.trainer import INBOX_FILE
from swarmnode.node.validator import STORE_FILE
from tests.swarm.test_devnet_run import _devnet_cli, _digests, _work

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 5


def _rank_pid(devnet: Devnet, rank: int) -> int | None:
    path = devnet.nodes["trainer-1"].data_dir / "ranks" / f"rank-{rank}.pid"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _rank_stacks(devnet: Devnet) -> str:
    """Every live rank's Python stacks (the ranks dump them on SIGUSR1), from the trainer's log."""
    for rank in (0, 1):
        pid = _rank_pid(devnet, rank)
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR1)
    time.sleep(2)
    log = devnet.nodes["trainer-1"].data_dir.parent / "stdout.log"
    return log.read_text(errors="replace")[-12000:]


def test_a_killed_rank_restarts_the_group_and_nothing_is_lost(tmp_path: Path) -> None:
    plan = DevnetPlan(
        trainers=1, relays=1, workers=2, validators=1, steps=STEPS, ledger="signed", trainer_nproc=2
    )
    devnet = Devnet(plan, tmp_path / "run")
    devnet.prepare()
    try:
        devnet.start("bootstrap")
        devnet.wait_ready(["bootstrap"], timeout=60)
        devnet.start_others()

        def step() -> int:
            return int(_work(devnet, "trainer-1").get("step", 0))

        devnet.wait_until(lambda: step() >= 2, 300, "trainer step 2")
        victim = _rank_pid(devnet, 1)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        devnet.wait_until(lambda: _rank_pid(devnet, 1) not in (None, victim), 120, "the group's restart")
        try:
            done = lambda: bool(_work(devnet, "trainer-1").get("done"))  # noqa: E731
            devnet.wait_until(done, 400, "the end of training")
        except (TimeoutError, AssertionError) as exc:
            raise AssertionError(f"{exc}\n{_rank_stacks(devnet)}") from None

        trainer_db = devnet.nodes["trainer-1"].data_dir / INBOX_FILE
        validator_db = devnet.nodes["validator-1"].data_dir / "validator" / STORE_FILE
        devnet.wait_until(
            lambda: _digests(validator_db, "accepted") <= _digests(trainer_db, "rollouts"),
            60,
            "the trainer holding every accepted submission",
        )
        trainer = _work(devnet, "trainer-1")
        assert trainer["step"] == STEPS and len(trainer["rewards"]) == STEPS
        state = devnet.nodes["trainer-1"].data_dir / "trainer"
        assert list(state.glob("step-*.dcp")), "the group saves sharded state"
    finally:
        codes = devnet.stop_all()
    assert not {n: c for n, c in codes.items() if c not in (0, None)}, codes


def test_two_diloco_trainers_each_a_two_rank_group_end_on_the_same_weights(tmp_path: Path) -> None:
    """`swarmnode devnet --trainers 2 --trainer-nproc 2`: every DiLoCo round has both groups' contributions,
    computed and applied shard-wise, and both end on the same outer weights."""
    out = tmp_path / "run"
    done = _devnet_cli(
        "--steps", "4", "--trainers", "2", "--inner-steps", "2", "--trainer-nproc", "2", "--workers", "2",
        "--out", str(out), timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "devnet-summary.json").read_text())
    diloco = summary["diloco"]
    assert diloco["same_final_theta"] is True
    for trainer in diloco["trainers"].values():
        assert trainer["rounds"] == 2 and trainer["contributors_per_round"] == [2, 2]
    assert summary["honest_slashed"] in ([], 0, None) and summary["every_cheater_slashed"]
    assert list((out / "trainer-2" / "data" / "ranks").glob("rank-1.pid"))

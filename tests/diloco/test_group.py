"""A trainer group (2 gloo ranks, FSDP2) is one DiLoCo participant of a run over HTTP: it plays every
round with a one-process trainer, both hold the same θ after each outer step, and it resumes from its
outer state on disk."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from swarmnode.protocol.codec import encode
from tests.test_trainer import fixed_groups, grpo_params
from tests.tinymodel import tiny_engine, tiny_folder

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 2


@pytest.mark.slow
def test_a_trainer_group_plays_diloco_rounds_with_a_one_process_trainer(tmp_path):
    batch = tmp_path / "groups.msgpack"
    batch.write_bytes(msgpack.packb([encode(g) for g in fixed_groups(tiny_engine())]))
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(ROOT / "tests/diloco/group_job.py"), "--model", str(tiny_folder()), "--groups", str(batch),
        "--grpo", json.dumps(dataclasses.asdict(grpo_params())), "--rounds", str(ROUNDS),
        "--out", str(tmp_path / "out"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())

    for name in ("a", "b"):
        history = report[name]["history"]
        assert [h["round"] for h in history] == list(range(ROUNDS)), report["events"][name]
        assert all(len(h["contributors"]) == 2 for h in history), history
        assert "refused" not in report["events"][name] and "fork" not in report["events"][name]
    # the same outer step on the same contributions: one θ, whether dealt over ranks or whole
    assert [h["theta"] for h in report["a"]["history"]] == [h["theta"] for h in report["b"]["history"]]
    assert report["a"]["theta"] == report["b"]["theta"]
    assert report["group_theta_equals_whole"] and report["initial_moved"] and report["a_returned"]
    assert report["again"]["round"] == ROUNDS and report["again"]["theta"] == report["a"]["theta"]
    assert report["again"]["history"] == [] and "restored" in report["events"]["again"]
    # a late group adopts the newest outer state a peer offers, dealt over its ranks
    assert report["late"]["round"] == ROUNDS and report["late"]["theta"] == report["b"]["theta"]
    assert report["late"]["history"] == [] and "resync" in report["events"]["late"]

"""The FSDP2 trainer group: two gloo ranks train as one process does, write a loadable model folder
without a full gather, and resume from their sharded state."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from swarmnode.node.dataplane.checkpoint import WeightsFile, plan_model_files
from swarmnode.node.dataplane.origin import model_folder_files
from swarmnode.node.rl.learner import GrpoTrainer, OptimizerParams, TrainerStateMismatch
from swarmnode.node.rl.model import state_dict_of
from swarmnode.node.trainer.group import GROUP_TIMEOUT_ENV
from swarmnode.node.trainer.rank import assign_files, dcp_dir, rank_share
from swarmnode.node.trainer.sharded import newest_sharded_step
from swarmnode.protocol.codec import encode
from tests.test_trainer import fixed_groups, grpo_params
from tests.tinymodel import tiny_engine, tiny_folder

ROOT = Path(__file__).resolve().parents[2]
SHARD_SIZE = 20_000  # several weights files for the tiny model, so both ranks write some
# fp32 rounding of a different reduction order after 3 Adam steps at lr 1e-3: Adam divides by sqrt(v), so a
# coordinate whose gradient is near 0 amplifies it (one element of 16384 moved 1.42e-5 on an AVX-512
# FP16/BF16 Xeon); a wrong shard or a lost gradient moves many by ~lr = 1e-3
TOLERANCE = 3e-5


def run_group(
    tmp: Path, groups, steps: int, *, nproc: int = 2, out: str = "store", idle_s: float = 0.0, env=None
) -> dict:
    """Run tests/rl/sharded_job.py under torch.distributed.run; returns its report."""
    batch = tmp / "groups.msgpack"
    batch.write_bytes(msgpack.packb([encode(g) for g in groups]))
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        str(ROOT / "tests/rl/sharded_job.py"), "--model", str(tiny_folder()), "--groups", str(batch),
        "--grpo", json.dumps(dataclasses.asdict(grpo_params())), "--steps", str(steps),
        "--trainer-dir", str(tmp / "trainer"), "--out", str(tmp / out), "--shard-size", str(SHARD_SIZE),
        "--idle", str(idle_s),
    ]
    env = {**os.environ, **(env or {})}
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((tmp / out / "report.json").read_text())


def reference(groups, steps: int) -> tuple[GrpoTrainer, list]:
    trainer = GrpoTrainer(tiny_engine(), grpo_params(), optim=OptimizerParams())
    return trainer, [trainer.step(groups) for _ in range(steps)]


def folder_state(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path in sorted(folder.glob("*.safetensors")):
        state.update(load_file(path))
    return state


@pytest.mark.slow  # two torch processes: 12 s of the fast set
def test_two_ranks_train_as_one_process_and_write_a_loadable_folder(tmp_path):
    groups = fixed_groups(tiny_engine())
    report = run_group(tmp_path, groups, steps=3)
    ref, ref_stats = reference(groups, 3)
    assert report["step"] == 3
    # the step's figures are the whole batch's, gathered from both ranks
    for ours, theirs in zip(report["stats"], ref_stats, strict=True):
        assert (ours["groups_used"], ours["tokens"]) == (theirs.groups_used, theirs.tokens)
        assert ours["loss"] == pytest.approx(theirs.loss, abs=1e-6)
        assert ours["grad_norm"] == pytest.approx(theirs.grad_norm, rel=1e-5)
        assert ours["clipped_fraction"] == pytest.approx(theirs.clipped_fraction, abs=1e-9)
    expected = state_dict_of(ref.engine.model)
    folder = Path(report["partial_dir"])
    got = folder_state(folder)
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=TOLERANCE, rtol=0)
    # the same files, in the same layout, as one process publishes
    planned = plan_model_files(expected, SHARD_SIZE, model_folder_files(tiny_folder()))
    infos = {name: (size, sha) for name, size, sha in report["infos"]}
    assert sorted(infos) == [p.name for p in planned]
    assert len([n for n in infos if n.endswith(".safetensors")]) > 2
    for name, (size, _) in infos.items():
        assert (folder / name).stat().st_size == size
    # and the folder loads as a model whose weights are the gathered state
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, got[name], atol=0, rtol=0)
    assert not list(folder.glob("*.part"))


@pytest.mark.slow  # waits out a collective timeout on purpose: 18 s
def test_an_idle_group_outlives_its_collective_timeout(tmp_path):
    """Rank 0 waiting for rollouts far longer than one collective may wait: its pings keep the other
    ranks' wait for the next command alive, and the group still steps and writes afterwards."""
    groups = fixed_groups(tiny_engine())
    report = run_group(tmp_path, groups, steps=1, idle_s=8.0, env={GROUP_TIMEOUT_ENV: "3"})
    assert report["step"] == 1 and report["infos"]


@pytest.mark.slow
@pytest.mark.parametrize("late", [0, 1])
def test_a_restarted_group_meets_again_whichever_rank_is_late(tmp_path, late):
    """torchrun's agent keeps its store across restarts: a restarted rank must not read the address its
    dead predecessor published (it did, and connected to it: refused, or a hang once the port was reused)."""
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "--max-restarts=1", "--monitor-interval=1", str(ROOT / "tests/rl/restart_job.py"),
        "--late", str(late), "--out", str(tmp_path),
    ]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    assert [(tmp_path / f"rank-{r}.done").read_text() for r in (0, 1)] == ["2", "2"]


@pytest.mark.slow
def test_the_group_resumes_from_its_sharded_state(tmp_path):
    groups = fixed_groups(tiny_engine())
    first = run_group(tmp_path, groups, steps=2, out="first")
    assert first["started"] == 0 and (tmp_path / "trainer" / "step-000002.dcp").is_dir()
    second = run_group(tmp_path, groups, steps=1, out="second")
    assert second["started"] == 2 and second["step"] == 3
    expected = state_dict_of(reference(groups, 3)[0].engine.model)
    got = folder_state(Path(second["partial_dir"]))
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=TOLERANCE, rtol=0)


@given(st.integers(0, 200), st.integers(1, 9))
def test_rank_shares_partition_the_batch(count, world):
    shares = [rank_share(count, r, world) for r in range(world)]
    assert sorted(i for s in shares for i in s) == list(range(count))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


@given(st.lists(st.integers(1, 10_000), min_size=1, max_size=60), st.integers(1, 8))
def test_files_are_dealt_so_no_rank_writes_much_more_than_its_share(sizes, world):
    files = [WeightsFile(f"f{i}", (f"t{i}",), n) for i, n in enumerate(sizes)]
    owners = assign_files(files, world)
    assert all(0 <= o < world for o in owners)
    load = [sum(f.nbytes for f, o in zip(files, owners, strict=True) if o == r) for r in range(world)]
    assert max(load) - min(load) <= max(sizes)  # greedy largest-first bound
    assert owners == assign_files(files, world)  # every rank computes the same dealing


def test_a_trainer_directory_holds_one_kind_of_state(tmp_path):
    """A group refuses a one-process save and one process refuses a group's: starting over would drop
    the steps (and the rollouts they used) the other kind saved."""
    trainer = GrpoTrainer(tiny_engine(), grpo_params())
    trainer.save(tmp_path / "single")
    with pytest.raises(TrainerStateMismatch, match="one-process"):
        newest_sharded_step(tmp_path / "single")
    group_dir = tmp_path / "group"
    dcp_dir(group_dir, 3).mkdir(parents=True)
    (group_dir / "step-000003.json").write_text(
        json.dumps({"step": 3, "format": "dcp", "state": "step-000003.dcp", "world_size": 2})
    )
    assert newest_sharded_step(group_dir)["step"] == 3
    with pytest.raises(TrainerStateMismatch, match="2-rank"):
        GrpoTrainer.resume(group_dir, tiny_folder(), grpo_params())

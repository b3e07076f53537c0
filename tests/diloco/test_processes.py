"""DiLoCo with trainer processes (slow; `pytest -m slow`): libp2p discovery through the DHT, HTTP data plane.

Trainer 0 is started without bootstrap peers and every other trainer is given only its address: they find
each other as providers of the run's `trainer` role. The final θ every process writes must equal
`reference_diloco` on the same data; a trainer killed mid-round is left out of that round by the others
after the timeout, the run goes on, and the restarted trainer downloads the outer state and takes part
again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from swarmnode.node.diloco.algorithm import content_digest, reference_diloco
from swarmnode.node.diloco.participant import params_of
from swarmnode.node.diloco.plan import build_plan, fresh_model, sign_plan
from swarmnode.node.diloco.pretraining import lm_loss, pretraining_batches
from swarmnode.node.rl.tokenizer import load_tokenizer
from swarmnode.protocol.messages import DilocoRun
from swarmnode.testing.diloco import TrainerSpec, spawn_trainer, trainer_key
from swarmnode.testing.processes import RoleProcess, stop_all
from tests.diloco.helpers import OWNER
from tests.tinymodel import tiny_folder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

BATCHES, BATCH_SIZE, MODEL_SEED = 32, 8, 5


def write_plan(tmp: Path, specs: list[TrainerSpec], **changes: Any) -> tuple[DilocoRun, Path]:
    fields: dict[str, Any] = dict(
        model=tiny_folder(), model_seed=MODEL_SEED, rounds=3, inner_steps=4, compression="fp16"
    )
    fields.update(changes)
    plan = build_plan("diloco-procs", [s.key.address for s in specs], **fields)
    path = tmp / "run.bin"
    path.write_bytes(sign_plan(OWNER, plan))
    return plan, path


def specs_for(tmp: Path, n: int, *extra: str) -> list[TrainerSpec]:
    common = (
        *("--batches", str(BATCHES), "--batch-size", str(BATCH_SIZE)),
        *("--model", str(tiny_folder()), "--model-seed", str(MODEL_SEED)),
    )
    return [
        TrainerSpec(f"trainer-{i}", trainer_key(i), tmp / f"trainer-{i}", 70 + i, (*common, *extra))
        for i in range(n)
    ]


def start_all(specs: list[TrainerSpec], plan: Path) -> list[RoleProcess]:
    """Start every trainer at once (trainer 0 is everyone's bootstrap) and wait until all listen."""
    procs = [spawn_trainer(specs[0], plan, OWNER.address, [], timeout=None)]
    procs += [spawn_trainer(s, plan, OWNER.address, [specs[0].addr], timeout=None) for s in specs[1:]]
    for proc in procs:
        proc.endpoint = proc.wait_event("listening", 120)["endpoint"]
    return procs


def reference(plan: DilocoRun, specs: list[TrainerSpec]) -> dict[str, torch.Tensor]:
    torch.set_num_threads(1)  # as the trainer processes run
    tokenizer, info = load_tokenizer(tiny_folder())
    data = [pretraining_batches(tokenizer, info, s.data_seed, BATCHES, BATCH_SIZE) for s in specs]
    model = lambda: fresh_model(tiny_folder(), MODEL_SEED)  # noqa: E731
    return reference_diloco(model, data, params_of(plan), plan.rounds, lm_loss)


def keep(proc: RoleProcess, kind: str, timeout: float, **match: Any) -> dict[str, Any]:
    """`wait_event`, but the event stays in `seen` for the round bookkeeping below."""
    event = proc.wait_event(kind, timeout, **match)
    proc.seen.append(event)
    return event


def round_records(proc: RoleProcess) -> dict[int, tuple[tuple[str, ...], str]]:
    """round → (contributors, θ digest after it), from the events read so far."""
    return {
        e["round"]: (tuple(e["contributors"]), e["theta"]) for e in proc.seen if e["event"] == "round_done"
    }


def test_three_trainer_processes_compute_what_one_process_computes(tmp_path: Path) -> None:
    specs = specs_for(tmp_path, 3, "--join-wait", "90")
    plan, path = write_plan(tmp_path, specs, collect_timeout_ms=30_000, vote_timeout_ms=30_000)
    procs = start_all(specs, path)
    try:
        finals = [proc.wait_event("final", 120) for proc in procs]
    finally:
        stop_all(procs)
    ref = reference(plan, specs)
    assert {f["theta"] for f in finals} == {content_digest(ref).hex()}, "bit-exact with one process"
    for spec in specs:
        theta = spec.final_theta()
        for name in ref:
            torch.testing.assert_close(theta[name], ref[name], rtol=0, atol=1e-6)
    records = [round_records(p) for p in procs]
    assert records[0] == records[1] == records[2]
    assert all(len(contributors) == 3 for contributors, _ in records[0].values())


def test_a_killed_trainer_is_left_out_the_run_goes_on_and_it_rejoins(tmp_path: Path) -> None:
    specs = specs_for(tmp_path, 3, "--join-wait", "90")
    victim = specs[2]
    plan, path = write_plan(tmp_path, specs, rounds=10, collect_timeout_ms=4000, vote_timeout_ms=4000)
    first_life = TrainerSpec(
        victim.name, victim.key, victim.data_dir, victim.data_seed,
        (*victim.args, "--straggle-round", "2", "--straggle-seconds", "60"), victim.port,
    )  # fmt: skip
    procs = start_all([*specs[:2], first_life], path)
    survivors, doomed = procs[:2], procs[2]
    try:
        doomed.wait_event("round_start", 120, round=2)  # now stuck in its first inner step of round 2
        doomed.kill()
        killed_at = time.time()
        for proc in survivors:
            done = keep(proc, "round_done", 60, round=2)
            assert (
                len(done["contributors"]) == 2 and "0x" + victim.key.address.hex() not in done["contributors"]
            )
            assert done["t"] - killed_at >= plan.collect_timeout_ms / 1000 - 1.0, "left out after the timeout"
        reborn = spawn_trainer(victim, path, OWNER.address, [specs[0].addr], timeout=120)
        procs[2] = reborn
        resync = keep(reborn, "resync", 60)
        assert resync["previous"] == 2 and resync["round"] >= 3
        finals = [proc.wait_event("final", 120) for proc in procs]
    finally:
        stop_all(procs)
    for proc in procs:
        for e in proc.seen:
            if e["event"] in ("round_done", "resync", "restored", "joined", "skipped", "fork", "incomplete"):
                print(
                    proc.name, round(e["t"] - killed_at, 2), e["event"], e.get("round"), e.get("contributors")
                )
    assert len({f["theta"] for f in finals}) == 1, "every trainer ends with the same θ"
    assert all(f["round"] == plan.rounds for f in finals)
    survivor_rounds = round_records(survivors[0])
    assert survivor_rounds == round_records(survivors[1]) and sorted(survivor_rounds) == list(
        range(plan.rounds)
    )
    rejoined = round_records(procs[2])
    assert rejoined and all(survivor_rounds[r] == rejoined[r] for r in rejoined)
    victim_hex = "0x" + victim.key.address.hex()
    assert any(victim_hex in survivor_rounds[r][0] for r in rejoined), "it contributes again after the rejoin"

"""No party profits from abusing its role (issue 31, "Done when"): a forging validator outside the run and a
greedy worker beside a devnet cost honest workers at most a stated factor of their throughput, and the
forger is ignored.

Two devnets of the same plan, one after the other: a baseline (the honest workers alone), then the same
with two abusers beside them:
- the forger, a staked validator the run's owner did not name (`tests.hostile.attacker`, attack `forge`):
  VerdictBatches of accepting verdicts for made-up workers, gossiped straight to every node. Verdicts are
  run-scoped (spec/gossip.md, Authority): every node must refuse them and deliver none, so the honest
  workers' pacers (`protocol.pacing.active_workers`) never count the made-up workers;
- a greedy worker (`[work] cheat = "greedy"`, swarmnode.testing.cheats): honest rollouts, but no pacing: every
  counter up to the run's `max_submissions_per_version`, as fast as it builds. Fair judging
  (node.validator.fairness, round-robin per worker) must keep honest submissions judged.

Honest throughput is honest submissions accepted per trainer step (the validators' per-worker tallies
when the trainer finished): a 2-core machine runs both devnets at whatever speed its load allows, and a
step is the unit of the run's progress whatever the wall clock does (per second is reported too).

Slow (two devnets, about 1.5 minutes on 2 cores); `-m slow` runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from swarmnode.node.devnet.network import Devnet
from swarmnode.node.devnet.plan import DevnetNode, DevnetPlan
from tests.hostile.attacker import enroll_forger

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 10
HONEST_WORKERS = 2
GREEDY = "greedy"
# Honest throughput under attack must stay at least 1/FACTOR of the baseline's. The greedy worker is a
# worker like any other to pacing and to judging: the swarm's supply target per version is shared among
# the workers seen accepted (3/N: N goes from 2 to 3, so each honest share falls to 2/3), and the judge
# serves workers in turn (each honest worker gets at least a third of the judgements instead of a half).
# Both bound the loss near a factor of 1.5; 2 leaves room for a busy machine's noise. A forger that was
# counted would swell N to thousands and cut honest shares far below 1/2.
FACTOR = 2.0
FORGE_BATCHES = 16
FORGE_VERDICTS = 256
FORGE_RATE = 2.0  # batches per second: the forgery falls within a short run
READY_TIMEOUT_S = 120.0
TRAIN_TIMEOUT_S = 240.0


@dataclass
class Measured:
    """What one devnet showed, read from the nodes' status files and delivery logs."""

    steps: int = 0
    done: bool = False
    train_s: float = 0.0  # from the trainer's first step to its last
    honest_accepted: dict[str, int] = field(default_factory=dict)  # validators' tallies per honest worker
    greedy_accepted: int = 0
    honest_submitted: dict[str, int] = field(default_factory=dict)  # by the end (the nodes' own counts)
    greedy_submitted: int = 0
    pacer_workers_max: dict[str, int] = field(default_factory=dict)  # the largest count each honest pacer had
    forged_refused: dict[str, int] = field(default_factory=dict)  # forged batches each node refused
    forged_delivered: dict[str, int] = field(default_factory=dict)  # forged messages each node delivered
    # forged batches each honest worker had refused when the trainer finished: the forgery overlapped the run
    forged_refused_in_training: dict[str, int] = field(default_factory=dict)
    outcome: str = ""

    @property
    def per_step(self) -> float:
        return sum(self.honest_accepted.values()) / max(self.steps, 1)

    @property
    def per_second(self) -> float:
        return sum(self.honest_accepted.values()) / max(self.train_s, 1e-9)


def _work(devnet: Devnet, name: str) -> dict[str, Any]:
    return (devnet.nodes[name].status() or {}).get("work") or {}


def _accepted_by_worker(devnet: Devnet) -> dict[str, int]:
    """0x address (lowercase) -> submissions accepted, summed over the validators' tallies."""
    totals: dict[str, int] = {}
    for node in devnet.nodes.values():
        if node.role == "validator":
            for address, tally in (_work(devnet, node.name).get("per_worker") or {}).items():
                totals[address.lower()] = totals.get(address.lower(), 0) + int(tally.get("accepted", 0))
    return totals


def _refused_verdicts(status: dict[str, Any]) -> int:
    """Verdict messages a node refused for authority (Ignore 205 while its view may lag, else Reject 502)."""
    stats = (status.get("gossip") or {}).get("verdicts") or {}
    return int((stats.get("ignored") or {}).get("NOT_FOR_US", 0)) + int(
        (stats.get("rejected") or {}).get("UNAUTHORISED", 0)
    )


def _delivered_from(devnet: Devnet, name: str, sender: str) -> int:
    path = devnet.nodes[name].data_dir / "deliveries.jsonl"
    if not path.exists():
        return 0
    count = 0
    for line in path.read_text().splitlines():
        try:
            count += json.loads(line).get("sender", "").lower() == sender
        except ValueError:
            continue  # a line cut by the node's stop
    return count


def run_devnet(folder: Path, *, abusers: bool) -> tuple[Measured, dict[str, Any]]:
    """One devnet of STEPS steps, with the forger and the greedy worker beside it if `abusers`."""
    plan = DevnetPlan(
        trainers=1, relays=1, workers=HONEST_WORKERS, validators=1, steps=STEPS, ledger="signed",
        cheaters=(GREEDY,) if abusers else (), record_deliveries=True,
    )  # fmt: skip
    devnet = Devnet(plan, folder / "run")
    devnet.prepare()
    assert devnet.ledger is not None
    forger = enroll_forger(devnet.ledger, devnet.folder) if abusers else None
    honest = [n for n in devnet.nodes.values() if n.role == "worker" and not n.cheat]
    measured = Measured(pacer_workers_max={n.name: 0 for n in honest})
    report: dict[str, Any] = {}
    attacker: subprocess.Popen[bytes] | None = None
    report_path = folder / "forge.json"
    try:
        if forger is not None:  # it starts with the swarm and forges as soon as every node is up
            with (folder / "attacker.log").open("wb") as log:
                attacker = subprocess.Popen(
                    [sys.executable, "-m", "tests.hostile.attacker", "--devnet", str(devnet.folder),
                     "--attacks", "forge", "--target", honest[0].name, "--report", str(report_path),
                     "--forge-batches", str(FORGE_BATCHES), "--forge-verdicts", str(FORGE_VERDICTS),
                     "--forge-rate", str(FORGE_RATE)],
                    cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log,
                    stderr=subprocess.STDOUT,
                )  # fmt: skip
        devnet.start("bootstrap")
        devnet.wait_ready(["bootstrap"], timeout=60)
        devnet.start_others()
        devnet.wait_ready([n for n in devnet.nodes if n != "bootstrap"], timeout=READY_TIMEOUT_S)
        first_step_at: float | None = None
        deadline = time.monotonic() + TRAIN_TIMEOUT_S
        measured.outcome = "timeout"
        while time.monotonic() < deadline:
            crashed = {n: c for n, node in devnet.nodes.items() if (c := node.exit_code) not in (None, 0)}
            if crashed:
                measured.outcome = f"crashed: {crashed}"
                break
            for node in honest:
                workers = int((_work(devnet, node.name).get("pace") or {}).get("workers") or 0)
                measured.pacer_workers_max[node.name] = max(measured.pacer_workers_max[node.name], workers)
            trainer = _work(devnet, "trainer-1")
            step = int(trainer.get("step", 0))
            if step >= 1 and first_step_at is None:
                first_step_at = time.monotonic()
            if trainer.get("done") and not measured.done:
                # the run's figures are taken when the trainer finishes; the forger may still be at it
                measured.done, measured.steps = True, step
                _take_throughput(devnet, measured, honest, first_step_at)
            if measured.done and (attacker is None or attacker.poll() is not None):
                measured.outcome = "trained"
                break
            time.sleep(0.5)
        if not measured.done:  # crashed or out of time: the figures so far, for the message
            measured.steps = int(_work(devnet, "trainer-1").get("step", 0))
            _take_throughput(devnet, measured, honest, first_step_at)
        if attacker is not None:
            try:
                attacker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                attacker.terminate()  # it writes its report on SIGTERM
                attacker.wait(timeout=15)
        statuses = devnet.statuses()
    finally:
        if attacker is not None and attacker.poll() is None:
            attacker.kill()
            attacker.wait()
        devnet.close()
    submitted = {name: int(((s or {}).get("work") or {}).get("submitted", 0)) for name, s in statuses.items()}
    measured.honest_submitted = {n.name: submitted[n.name] for n in honest}
    measured.greedy_submitted = sum(submitted[n.name] for n in devnet.nodes.values() if n.cheat == GREEDY)
    sender = "0x" + forger.address.hex() if forger is not None else ""
    for name, status in statuses.items():
        measured.forged_refused[name] = _refused_verdicts(status or {})
        measured.forged_delivered[name] = _delivered_from(devnet, name, sender) if sender else 0
    if report_path.exists():
        report = json.loads(report_path.read_text())
    return measured, report


def _take_throughput(
    devnet: Devnet, measured: Measured, honest: list[DevnetNode], first_step_at: float | None
) -> None:
    """The run's figures as the trainer finished: honest acceptances, training time, forgeries refused."""
    accepted = _accepted_by_worker(devnet)
    measured.honest_accepted = {n.name: accepted.get(n.address.lower(), 0) for n in honest}
    greedy = next((n for n in devnet.nodes.values() if n.cheat == GREEDY), None)
    measured.greedy_accepted = accepted.get(greedy.address.lower(), 0) if greedy is not None else 0
    measured.train_s = time.monotonic() - first_step_at if first_step_at is not None else 0.0
    measured.forged_refused_in_training = {n.name: _refused_verdicts(n.status() or {}) for n in honest}


def test_a_forging_validator_and_a_greedy_worker_do_not_starve_honest_workers(tmp_path: Path) -> None:
    started = time.monotonic()
    baseline, _ = run_devnet(tmp_path / "baseline", abusers=False)
    attacked, report = run_devnet(tmp_path / "attacked", abusers=True)
    summary = {
        "baseline": baseline.__dict__ | {"per_step": baseline.per_step, "per_second": baseline.per_second},
        "attacked": attacked.__dict__ | {"per_step": attacked.per_step, "per_second": attacked.per_second},
        "forge": report.get("counts", {}).get("forge", {}),
        "forge_facts": report.get("facts", {}).get("forge", {}),
        "attacker_errors": report.get("errors", []),
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    (tmp_path / "role-abuse-summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(json.dumps(summary, default=str))
    where = f"(details in {tmp_path})"

    for name, run in (("baseline", baseline), ("attacked", attacked)):
        assert run.done and run.steps >= STEPS, f"{name}: the run did not train: {run.outcome} {where}"
        assert all(run.honest_accepted.values()), f"{name}: an honest worker got nothing accepted {where}"
    # the abuse happened, or the checks below prove nothing
    forge = summary["forge"]
    assert forge.get("batches_published") == FORGE_BATCHES, f"the forger did not publish {summary} {where}"
    assert set(summary["forge_facts"].get("subscribed", [])) >= set(baseline.pacer_workers_max), where
    greedy, most_honest = attacked.greedy_submitted, max(attacked.honest_submitted.values())
    assert greedy > most_honest, f"not greedy {summary} {where}"
    # the forger is ignored: refused by every honest worker it reached, delivered by no node
    assert not any(attacked.forged_delivered.values()), f"forged verdicts delivered {summary} {where}"
    for name in attacked.pacer_workers_max:
        assert attacked.forged_refused[name] >= FORGE_BATCHES, f"{name} did not refuse the forgeries {where}"
    in_training = attacked.forged_refused_in_training
    assert all(in_training.values()), f"the forgery came after the run {summary} {where}"
    # pacers count the real workers only: the honest ones and the greedy one (never the made-up thousands)
    assert max(baseline.pacer_workers_max.values()) <= HONEST_WORKERS, where
    assert max(attacked.pacer_workers_max.values()) <= HONEST_WORKERS + 1, f"{summary} {where}"
    # honest throughput within FACTOR of the baseline
    assert attacked.per_step * FACTOR >= baseline.per_step, (
        f"honest accepted per step {attacked.per_step:.2f} under attack, {baseline.per_step:.2f} without "
        f"(factor {FACTOR}) {where}"
    )

"""A hostile peer beside a working devnet (issue 14, "Done when"): the devnet still trains, credits each
honest assignment exactly once, slashes the poisoner, and keeps its victims' memory and disk in bounds.

The attacker is a separate process (`tests.hostile.attacker`, every attack at once: container-bomb and
near-cap unstaked SUBMIT frames, slow SUBMIT/ACCEPTED streams, a libp2p and HTTP connection flood,
forged-signer gossip, poison submissions and replayed cached rollouts from staked keys). The victims are
measured from outside (`tests.hostile.measure`: /proc VmRSS/VmHWM, data-dir blocks). Every expectation is
checked and the broken ones are listed together, so one run shows every failure at once.

Slow (multi-process, about 3-4 minutes on 2 cores); `-m slow` runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from swarmnode.node.devnet.network import Devnet
from swarmnode.node.devnet.plan import DevnetPlan
from swarmnode.protocol.types import MIB
from tests.hostile.attacker import enroll_attackers
from tests.hostile.measure import Sampler

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
STEPS = 10
ATTACK_S = 75.0  # slow streams, floods and gossip last this long; the staked attacks run to their end
TRAIN_TIMEOUT_S = 300.0
# Two validators: the replayer seals one assignment twice and sends one envelope to each (one validator
# alone sees the second as the same assignment; two must not credit it twice between them).
VALIDATORS = 2
VICTIMS = ("validator-1", "trainer-1", "relay-1")
# Bounds on what the attack may cost a victim, above its own figures when it became ready:
# 4 SUBMIT slots x an 18 MiB frame x a small multiple (4) of its size, plus 96 MiB of slack.
RSS_GROWTH_BOUND = 4 * 18 * MIB * 4 + 96 * MIB  # 384 MiB
# The trainer's peak also holds its own work, which the attack does not cause: GRPO steps, a checkpoint's
# state dict serialised beside the live weights, the held-out evaluation. A step trains its whole batch in
# one forward and backward, and a trainer that fell behind takes up to its batch limit (4 x its need plus
# less than one submission: spec/rollouts.md, `max_batch_groups`), so this work grows with the batch. Under
# the attack the peak growth measured 241, 358 and 390 MiB in runs whose steps took 1-2 submissions, and
# 612 MiB in one whose early steps took 4 and 5 (160 groups, 1,280 completions: the limit), so the
# trainer gets 384 MiB for its own work on top.
TRAINER_OWN_WORK = 384 * MIB
# The validator's data dir over the whole run: an honest run of STEPS steps adds about 5 MiB
# (accepted log, checkpoints it serves); unstaked near-cap submissions must not be kept.
DISK_GROWTH_BOUND = 64 * MIB
# An honest HTTP client (127.0.0.1) during the flood from 127.0.0.2: this share of fetches must succeed.
PROBE_SUCCESS_FLOOR = 0.9


def _wait_training(devnet: Devnet, attacker: subprocess.Popen[bytes], timeout: float) -> str:
    """Until the trainer is done and the attacker finished, a node crashed, or the time ran out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crashed = {n: node.exit_code for n, node in devnet.nodes.items() if node.exit_code not in (None, 0)}
        if crashed:
            return f"crashed: {crashed}"
        if devnet.trainer_done() and attacker.poll() is not None:
            return "trained"
        time.sleep(1.0)
    return "timeout"


def _ledger_facts(devnet: Devnet) -> tuple[Counter[tuple[bytes, int]], list[Any]]:
    assert devnet.ledger is not None
    ledger = devnet.ledger.open()
    try:
        credits = Counter((c.worker, c.step) for c in ledger.contributions())
        slashes = list(ledger.slashes())
    finally:
        ledger.close()
    return credits, slashes


def violations(
    *,
    outcome: str,
    trainer_status: dict[str, Any],
    credits: Counter[tuple[bytes, int]],
    slashes: list[Any],
    honest: dict[str, bytes],
    attackers: dict[str, bytes],
    report: dict[str, Any],
    meters: dict[str, dict[str, Any]],
) -> list[str]:
    """Every broken expectation, in words (empty: the devnet withstood the attack)."""
    broken: list[str] = []
    work = trainer_status.get("work") or {}
    if outcome != "trained" or not work.get("done") or int(work.get("step", 0)) < STEPS:
        broken.append(f"the devnet did not train: {outcome}, trainer at step {work.get('step')} of {STEPS}")
    for who, address in {**honest, **attackers}.items():
        repeated = {step: n for (worker, step), n in credits.items() if worker == address and n > 1}
        if repeated:
            broken.append(f"{who}: assignments credited more than once {repeated}")
    for who, address in honest.items():
        if not any(worker == address for worker, _ in credits):
            broken.append(f"{who}: honest worker never credited")
    facts = report.get("facts", {})
    counts = report.get("counts", {})
    replayer = attackers["replayer"]
    cached = set(facts.get("replay", {}).get("cached_steps", []))
    sold = sorted(step for (worker, step) in credits if worker == replayer and step in cached)
    if sold:
        broken.append(f"replayer: credited for cached assignments it never generated: steps {sold}")
    if not any(s.worker == attackers["poisoner"] for s in slashes):
        broken.append("poisoner: never slashed")
    for name, meter in meters.items():
        if meter["gone"]:
            broken.append(f"{name}: process gone during the attack")
        bound = RSS_GROWTH_BOUND + (TRAINER_OWN_WORK if name.startswith("trainer") else 0)
        if meter["rss_growth"] > bound:
            broken.append(f"{name}: RSS grew {meter['rss_growth'] / MIB:.0f} MiB (bound {bound // MIB})")
    growth = meters["validator-1"]["disk_growth"]
    if growth > DISK_GROWTH_BOUND:
        broken.append(f"validator-1: data dir grew {growth / MIB:.0f} MiB (bound {DISK_GROWTH_BOUND // MIB})")
    probes = Counter({k: v for k, v in counts.get("probe", {}).items()})
    total = sum(probes.values())
    ok = sum(n for key, n in probes.items() if key.endswith("_200"))
    if total and ok / total < PROBE_SUCCESS_FLOOR:
        broken.append(f"HTTP: {ok} of {total} honest fetches succeeded during the flood ({dict(probes)})")
    forwarded = {k: v for k, v in counts.get("gossip", {}).items() if k.endswith("_reached_observer")}
    if forwarded:
        broken.append(f"gossip: forged messages forwarded past the target {forwarded} "
                      f"by {counts.get('gossip_forwarders', {})}")
    # the attacks must have happened, or the checks above prove nothing
    exercised = {
        "bomb": counts.get("bomb", {}).get("frames_sent", 0),
        "bloat": counts.get("bloat", {}).get("bytes_sent", 0),
        "slow": counts.get("slow", {}).get("submit_opened", 0),
        "flood": counts.get("flood", {}).get("http_silent_opened", 0),
        "gossip": counts.get("gossip", {}).get("checkpoints_published", 0)
        and facts.get("gossip", {}).get("target_subscribed"),
        "poison": sum(
            n for k, n in counts.get("poison", {}).items() if "_ack_" in k and not k.endswith("_203")
        ),
        "replay cached": cached and sum(
            n for k, n in counts.get("replay", {}).items() if k.startswith("cached_ack")
        ),
        "replay twice": sum(n for k, n in counts.get("replay", {}).items() if k.startswith("twice_ack")),
    }
    missing = sorted(name for name, done in exercised.items() if not done)
    if missing:
        skipped = facts.get("replay", {}).get("cached_skipped", "")
        broken.append(f"attacker: not exercised {missing} {skipped}")
    if counts.get("failed"):
        errors = report.get("errors", [])[:5]
        broken.append(f"attacker: attacks that failed to run {counts['failed']} {errors}")
    return broken


def test_a_hostile_peer_cannot_stop_starve_or_bloat_the_devnet(tmp_path: Path) -> None:
    # Two submissions' worth of signal groups per step (the default is one): the run's first versions, the
    # replayer's window, last long enough for an attacker that starts with the swarm.
    plan = DevnetPlan(
        trainers=1, relays=1, workers=2, validators=VALIDATORS, steps=STEPS, ledger="signed",
        min_batch_groups=48,
    )
    devnet = Devnet(plan, tmp_path / "run")
    devnet.prepare()
    assert devnet.ledger is not None
    keys = enroll_attackers(devnet.ledger, devnet.folder)
    report_path = tmp_path / "attack.json"
    attacker_cmd = [sys.executable, "-m", "tests.hostile.attacker", "--devnet", str(devnet.folder)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # offline, as a real replayer would: its cache of every task on the public base weights
    subprocess.run([*attacker_cmd, "--prepare"], cwd=ROOT, env=env, check=True, timeout=300)
    attacker: subprocess.Popen[bytes] | None = None
    sampler: Sampler | None = None
    meters: dict[str, dict[str, Any]] = {}
    try:
        # the attacker starts with the swarm (it waits for its target itself): the replay window is the
        # first versions of the run
        with (tmp_path / "attacker.log").open("wb") as log:
            attacker = subprocess.Popen(
                [*attacker_cmd, "--target", "validator-1", "--duration", str(ATTACK_S),
                 "--report", str(report_path)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        attack_started = time.monotonic()
        devnet.start("bootstrap")
        devnet.wait_ready(["bootstrap"], timeout=60)
        devnet.start_others()
        devnet.wait_ready(list(VICTIMS), timeout=120)
        sampler = Sampler.of(
            {name: (devnet.nodes[name].process.pid, devnet.nodes[name].data_dir) for name in VICTIMS}  # type: ignore[union-attr]
        ).start()
        outcome = _wait_training(devnet, attacker, TRAIN_TIMEOUT_S)
        # its own deadline is ATTACK_S + 120 s; once a victim crashed, only the window's counts matter
        patience = ATTACK_S + 150 if outcome == "trained" else ATTACK_S + 30
        try:
            attacker.wait(timeout=max(1.0, patience - (time.monotonic() - attack_started)))
        except subprocess.TimeoutExpired:
            attacker.terminate()  # it writes its report on SIGTERM
        trainer_status = devnet.nodes["trainer-1"].status() or {}
    finally:
        if attacker is not None and attacker.poll() is None:
            attacker.terminate()
            try:
                attacker.wait(timeout=15)
            except subprocess.TimeoutExpired:
                attacker.kill()
                attacker.wait()
        if sampler is not None:
            meters = sampler.stop()
        codes = devnet.stop_all()
    credits, slashes = _ledger_facts(devnet)
    report = json.loads(report_path.read_text()) if report_path.exists() else {"errors": ["no report"]}
    honest = {
        n.name: bytes.fromhex(n.address[2:]) for n in devnet.nodes.values() if n.name.startswith("worker-")
    }
    attackers = {name: key.address for name, key in keys.items()}
    broken = violations(
        outcome=outcome,
        trainer_status=trainer_status,
        credits=credits,
        slashes=slashes,
        honest=honest,
        attackers=attackers,
        report=report,
        meters=meters,
    )
    (tmp_path / "hostile-summary.json").write_text(
        json.dumps({"outcome": outcome, "exit_codes": codes, "meters": meters, "report": report,
                    "broken": broken}, indent=1, default=str)
    )  # fmt: skip
    assert not broken, "\n".join(broken) + f"\n(details in {tmp_path})"
    assert all(code in (0, None) for code in codes.values()), codes

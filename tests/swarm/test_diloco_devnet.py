"""A devnet RL run with two trainers (DiLoCo rounds around GRPO steps) whose co-trainer is SIGKILLed
mid-run and restarted, as separate processes: the lead goes on alone, the co-trainer catches up from the
lead's outer state, both end on the same weights, and no accepted rollout is trained on by both.

Slow (multi-process, 65 to 100 s on 2 cores); `-m slow` runs it.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from swarmnode.node.dataplane.store import ShardStore
from swarmnode.node.devnet.network import Devnet
from swarmnode.node.devnet.plan import DevnetPlan
from swarmnode.node.diloco.holdings import MESSAGES_DIR
from swarmnode.node.diloco.rl import DILOCO_DIR
from swarmnode.node.trainer import CHECKPOINTS_DIR, INBOX_FILE
from swarmnode.protocol.codec import decode
from swarmnode.protocol.diloco import rollout_owner
from swarmnode.protocol.envelope import Envelope
from swarmnode.protocol.messages import CheckpointManifest, DilocoOuterState

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LEAD, CO = "trainer-1", "trainer-2"
# Short enough that a round without the dead co-trainer ends within seconds (the lead waits this long
# for the missing contribution), long enough that two live trainers at their own pace still meet.
ROUND_TIMEOUT_MS = 6_000


def _diloco(devnet: Devnet, name: str) -> dict[str, Any]:
    status = devnet.nodes[name].status() or {}
    return (status.get("work") or {}).get("diloco") or {}




def _inbox(path: Path) -> tuple[set[bytes], set[bytes], set[int]]:
    """(every digest, the digests of rows a step consumed, those steps) of a trainer's inbox, read-only."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = [(bytes(d), used) for d, used in db.execute("SELECT digest, consumed_step FROM rollouts")]
    used = [(d, step) for d, step in rows if step is not None]
    return {d for d, _ in rows}, {d for d, _ in used}, {step for _, step in used}


def _counted_rounds(devnet: Devnet, address: bytes) -> set[int]:
    """Rounds whose averaged contributions include `address`, read from the lead's signed outer states
    (outer state r + 1 names the contributors of round r; the lead keeps every one it signed)."""
    messages = devnet.nodes[LEAD].data_dir / DILOCO_DIR / MESSAGES_DIR
    counted = set()
    for path in messages.glob("outer-*.msgpack"):
        state = decode(DilocoOuterState, decode(Envelope, path.read_bytes()).body)
        if any(entry.trainer == address for entry in state.contributors):
            counted.add(state.round - 1)
    return counted


def _final_root(devnet: Devnet, name: str, version: int) -> bytes:
    store = ShardStore(devnet.nodes[name].data_dir / CHECKPOINTS_DIR, devnet.plan.run)
    envelope = store.load_manifest(version)
    assert envelope is not None, f"{name} holds no manifest of version {version}"
    return decode(CheckpointManifest, decode(Envelope, envelope).body).merkle_root


def _signed_rounds(devnet: Devnet, name: str) -> set[int]:
    """Rounds `name` signed a contribution for (its own messages, kept on disk across restarts)."""
    messages = devnet.nodes[name].data_dir / DILOCO_DIR / MESSAGES_DIR
    return {int(p.stem.removeprefix("contribution-")) for p in messages.glob("contribution-*.msgpack")}


def _done_theta(events: list[dict[str, Any]]) -> str:
    done = [e for e in events if e["event"] == "done"]
    assert done, events
    return str(done[-1]["theta"])


def test_a_killed_co_trainer_rejoins_and_both_trainers_end_on_the_same_weights(tmp_path: Path) -> None:
    plan = DevnetPlan(
        trainers=2,
        relays=1,
        workers=2,
        validators=1,
        steps=12,
        inner_steps=2,
        ledger="signed",
        round_timeout_ms=ROUND_TIMEOUT_MS,
    )
    assert plan.rounds == 6
    devnet = Devnet(plan, tmp_path / "run")
    devnet.prepare()
    lead_hex = "0x" + devnet.identities[LEAD].address.hex()
    try:
        devnet.start("bootstrap")
        devnet.wait_ready(["bootstrap"], timeout=60)
        devnet.start_others()

        def lead_round() -> int:
            return int(_diloco(devnet, LEAD).get("round", 0))

        devnet.wait_until(lambda: lead_round() >= 1, 240, "the lead's first round")
        devnet.kill(CO)
        signed = _signed_rounds(devnet, CO)  # what the dead co-trainer contributed: final until it restarts
        killed_at = lead_round()

        def rounds_alone() -> list[int]:
            """Rounds the lead finished since the kill for which the co-trainer signed no contribution."""
            return [r for r in range(killed_at, lead_round()) if r not in signed]

        alone_a_round = "a round of the lead without the co-trainer"
        devnet.wait_until(lambda: bool(rounds_alone()), 180, alone_a_round, down={CO})
        alone = rounds_alone()
        assert alone[-1] < plan.rounds - 1, f"the co-trainer came back for no round: {alone}"
        devnet.start(CO)
        devnet.wait_ready([CO], timeout=90)
        devnet.wait_until(devnet.trainer_done, 240, "the end of training on both trainers")

        lead, co = _diloco(devnet, LEAD), _diloco(devnet, CO)
        assert lead["lead"] is True and co["lead"] is False
        assert lead["round"] == co["round"] == plan.rounds
        history = {h["round"]: h for h in lead["history"]}
        co_history = {h["round"]: h for h in co["history"]}
        # No round of the run is skipped. Under load the restarted co-trainer may finish a round first: the
        # lead is then overtaken and resyncs from it (its log says so), so that round is in the co-trainer's
        # history, not the lead's.
        assert max(history) == plan.rounds - 1
        assert set(range(min(history), plan.rounds)) <= set(history) | set(co_history), (history, co_history)
        for r in alone:
            assert history[r]["contributors"] == [lead_hex] and history[r]["voters"] == [], history[r]
        assert _done_theta(lead["events"]) == _done_theta(co["events"])
        assert _final_root(devnet, LEAD, plan.rounds) == _final_root(devnet, CO, plan.rounds)

        trainers = (devnet.identities[LEAD].address, devnet.identities[CO].address)
        inboxes = {name: _inbox(devnet.nodes[name].data_dir / INBOX_FILE) for name in (LEAD, CO)}
        (lead_all, lead_used, _), (co_all, co_used, _) = inboxes[LEAD], inboxes[CO]
        assert lead_used and co_used
        assert not lead_used & co_used
        assert not lead_all & co_all  # each keeps only its share
        assert all(rollout_owner(d, trainers) == trainers[0] for d in lead_all)
        assert all(rollout_owner(d, trainers) == trainers[1] for d in co_all)
        # Rows stay used only by rounds the run averaged this trainer's contribution into; the rest
        # (the round the co-trainer died in, a contribution left out) went back to the pool.
        for name, address in zip((LEAD, CO), trainers, strict=True):
            used_rounds = {step // plan.inner_steps for step in inboxes[name][2]}
            assert used_rounds <= _counted_rounds(devnet, address), (name, used_rounds)
        assert all(devnet.nodes[n].exit_code is None for n in devnet.nodes)
    finally:
        codes = devnet.stop_all()
    assert all(code in (0, None) for code in codes.values()), codes

    ledger = f"signed:{devnet.folder / 'ledger.db'}"
    verify = subprocess.run(
        [sys.executable, "-m", "swarmnode.node.cli.main", "ledger", "verify", "--ledger", ledger],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr

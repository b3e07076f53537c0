"""`swarmnode status` and the devnet's table: a node's status document as lines a person reads."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from swarmnode.node.cli.main import main
from swarmnode.node.status_view import STALE_AFTER_S, WaitReport, describe, waiting_for, waiting_line

NOW = 1_800_000_000.0


def document(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "role": "worker", "run": "r1", "peer_id": "16Uiu2X", "address": "0xAb", "pid": 41, "ready": True,
        "uptime_s": 12.0, "updated": NOW - 1, "needs": ["trainer", "validator"],
        "providers_found": {"trainer": ["16Uiu2T"]}, "connected_peers": ["a", "b"],
        "listen_addrs": ["/ip4/127.0.0.1/tcp/4001"], "work": {"version": 3, "submitted": 5, "accepted": 4},
    }  # fmt: skip
    return base | changes


def test_a_running_node_says_what_it_waits_for() -> None:
    lines = describe(document(), NOW)
    assert lines[0] == "worker of run r1: ready, up 12s"
    assert "  2 peers connected; waiting for a validator of run r1 (looked up in the DHT)" in lines
    assert lines[-1] == "  work: v3 sent 5 ok 4 rej 0"
    assert waiting_for(document(providers_found={"trainer": ["x"], "validator": ["y"]})) == []


def test_a_node_alone_is_told_to_check_its_bootstrap_address() -> None:
    lines = describe(document(connected_peers=[]), NOW)
    alone_line = next(line for line in lines if "waiting for a first peer" in line)
    assert "check the --bootstrap address" in alone_line
    why = {"/ip4/10.0.0.1/tcp/4001/p2p/16Uiu2B": "nothing accepts connections at /ip4/10.0.0.1/tcp/4001: ..."}
    alone = waiting_line(document(connected_peers=[], bootstrap_unreachable=why))
    assert alone == "a first peer: nothing accepts connections at /ip4/10.0.0.1/tcp/4001: ..."


def test_the_first_missing_input_is_named_in_the_order_a_node_gets_going() -> None:
    found = {"trainer": ["t"], "validator": ["v"], "relay": ["r"]}
    assert waiting_line(document()) == "a validator of run r1 (looked up in the DHT)"
    assert waiting_line(document(providers_found=found, run_record=False)).startswith("the run's descriptor")
    unloaded = {"version": None, "newest_known": 4}
    no_checkpoint = document(providers_found=found, run_record=True, work=unloaded)
    assert waiting_line(no_checkpoint) == "the first checkpoint (version 4 is announced)"
    assert waiting_line(document(providers_found=found, run_record=True)) is None
    needs = ["relay", "validator"]
    idle_trainer = document(role="trainer", needs=needs, providers_found=found, work={"step": 0})
    assert waiting_line(idle_trainer) == "the first rollouts from workers (through the validators)"
    assert waiting_line(idle_trainer | {"work": {"step": 0, "submissions_received": 2}}) is None


def test_ready_means_started_and_connected() -> None:
    alone = describe(document(ready=False, started=True, connected_peers=[]), NOW)[0]
    assert alone == "worker of run r1: started, no peer yet, up 12s"
    assert describe(document(ready=False, started=False), NOW)[0] == "worker of run r1: starting, up 12s"


def test_a_status_not_rewritten_reads_as_stopped_hung_or_killed() -> None:
    stale = describe(document(updated=NOW - STALE_AFTER_S - 5), NOW)[0]
    assert "not updated for 15s" in stale and "pid 41" in stale
    assert describe(document(stopped=True, updated=NOW - 900), NOW)[0] == "worker of run r1: stopped"


def test_a_starved_trainer_shows_why() -> None:
    work = {"step": 0, "version": 0, "signal": {"starved": True, "message": "no learning signal: ..."}}
    lines = describe(document(role="trainer", work=work), NOW)
    assert "no learning signal" in lines[-2] and lines[-1] == "  no learning signal: ..."


def test_the_command_reads_a_data_directory_and_says_when_there_is_none(tmp_path: Path) -> None:
    (tmp_path / "status.json").write_text(json.dumps(document(updated=0, stopped=True)))
    shown = CliRunner().invoke(main, ["status", str(tmp_path)])
    assert shown.exit_code == 0 and shown.output.startswith("worker of run r1: stopped")
    as_json = CliRunner().invoke(main, ["status", "--json", str(tmp_path)])
    assert json.loads(as_json.output)["peer_id"] == "16Uiu2X"
    missing = CliRunner().invoke(main, ["status", str(tmp_path / "..")])
    assert missing.exit_code == 1 and "no node has run with this data directory" in missing.output


def test_a_wait_is_reported_every_interval_with_how_long_it_lasted() -> None:
    report = WaitReport(every_s=15)
    seen = [report.observe(what, t) for what, t in [
        ("a first peer", 0), ("a first peer", 10), ("a first peer", 15), ("a first peer", 20),
        ("a first peer", 30), ("a validator", 31), ("a validator", 46), (None, 47), (None, 90),
    ]]  # fmt: skip
    assert seen == [None, None, ("a first peer", 15), None, ("a first peer", 30), None, ("a validator", 15),
                    None, None]

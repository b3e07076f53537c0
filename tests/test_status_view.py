"""`swarmnode status` and the devnet's table: a node's status document as lines a person reads."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from swarmnode.node.cli.main import main
from swarmnode.node.status_view import STALE_AFTER_S, describe, waiting_for

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
    assert "  2 peers connected; waiting for a validator" in lines
    assert lines[-1] == "  work: v3 sent 5 ok 4 rej 0"
    assert waiting_for(document(providers_found={"trainer": ["x"], "validator": ["y"]})) == []


def test_a_node_alone_is_told_to_check_its_bootstrap_address() -> None:
    lines = describe(document(connected_peers=[]), NOW)
    assert any("check the --bootstrap address" in line for line in lines)


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

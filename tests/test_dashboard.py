"""The dashboard's figures come from the status document alone, and the page, the JSON routes and
`swarmnode status` all show the same ones (node.dashboard, node.metrics, node.cli.status)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from click.testing import CliRunner

from swarmnode.node.cli.main import main
from swarmnode.node.dashboard import LABELS, PAGE, figure_text, figures, figures_document
from swarmnode.node.metrics import make_registry, serve_metrics
from swarmnode.node.status_view import figure_lines

NOW = 1_800_000_000.0
WORKER_A, WORKER_B = "0x" + "aa" * 20, "0x" + "bb" * 20


def document(role: str, work: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A status document as node.runtime writes it (the parts the metrics collector reads included)."""
    base: dict[str, Any] = {
        "role": role, "run": "r1", "peer_id": "16Uiu2X", "address": "0xAb", "pid": 41, "ready": True,
        "started": True, "uptime_s": 12.0, "updated": NOW, "needs": [], "metrics_port": 9100,
        "connected_peers": ["a", "b", "c"], "providers_found": {}, "reqresp": {}, "gossip": {},
        "dht": {"routing_table_size": 3, "provider_records": 0, "lookup_p50_s": 0.0},
        "guard": {"banned_peers": 0, "bans_total": 0},
        "authority": {"trainer": None, "ledger_reads": 4, "ledger_read_errors": 0, "validators": 1,
                      "registered": 5, "former": 0},
        "work": work,
    }  # fmt: skip
    return base | changes


TRAINER_WORK = {
    "step": 3, "version": 3, "submissions_received": 9, "submissions_used": 7, "stale_dropped": 2,
    "rewards": [0.25, 0.5, 0.4375],
    "verdicts": {WORKER_A: {"accepted": 5}, WORKER_B: {"accepted": 1, "rejected": 2}},
}  # fmt: skip
VALIDATOR_WORK = {
    "queued": 1, "accepted": 8, "rejected": 2, "ignored": 1, "by_reason": {"BAD_PROOF": 2, "STALE": 1},
    "slashes": 2, "slashes_finalized": 1, "versions_held": [2, 3],
    "credits": {"queued": 3, "committed": 5, "batches": 2, "dropped": {}, "blocked": ""},
}  # fmt: skip


def test_a_trainer_shows_its_rewards_its_rollouts_and_what_went_stale() -> None:
    shown = figures(document("trainer", TRAINER_WORK))
    assert list(shown) == [key for key in LABELS if key in shown]  # the page's order
    assert shown == {
        "role": "trainer", "run": "r1", "peer_id": "16Uiu2X", "state": "ready", "peers": 3, "version": 3,
        "step": 3, "rewards": [0.25, 0.5, 0.4375], "rollouts_received": 9, "rollouts_used": 7,
        "rollouts_accepted": 6, "rollouts_rejected": 2, "stale_dropped": 2, "registered_nodes": 5,
        "eligible_validators": 1,
    }  # fmt: skip
    assert figure_text("rewards", shown["rewards"]) == "0.438 at step 3, first 0.250"


def test_a_validator_shows_its_verdicts_by_reason_and_its_ledger_counts() -> None:
    shown = figures(document("validator", VALIDATOR_WORK))
    assert shown["verdicts_by_reason"] == {"BAD_PROOF": 2, "STALE": 1}
    assert (shown["version"], shown["versions_held"]) == (3, [2, 3])
    assert (shown["rollouts_accepted"], shown["rollouts_rejected"], shown["rollouts_ignored"]) == (8, 2, 1)
    ledger = {key: value for key, value in shown.items() if LABELS[key][0] == "ledger"}
    assert ledger == {
        "credits_committed": 5, "credit_batches": 2, "credits_queued": 3, "slashes_filed": 2,
        "slashes_finalized": 1, "registered_nodes": 5, "eligible_validators": 1,
    }  # fmt: skip
    assert figure_text("verdicts_by_reason", shown["verdicts_by_reason"]) == "BAD_PROOF 2, STALE 1"


def test_a_worker_shows_how_far_behind_its_weights_are() -> None:
    work = {"version": 4, "newest_known": 6, "submitted": 7, "accepted": 5, "rejected": 1, "undelivered": 1,
            "by_reason": {"BAD_REWARD": 1}}  # fmt: skip
    shown = figures(document("worker", work))
    assert (shown["version"], shown["newest_known"], shown["versions_behind"]) == (4, 6, 2)
    assert (shown["rollouts_submitted"], shown["rollouts_undelivered"]) == (7, 1)
    unloaded = figures(document("worker", {"version": None, "newest_known": 2}))
    assert unloaded["versions_behind"] is None and figure_text("version", unloaded["version"]) == "-"


def test_a_node_without_work_or_ledger_shows_who_it_is_and_its_peers() -> None:
    alone = document("bootstrap", {}, ready=False, connected_peers=[], authority={"validators": None})
    assert figures(alone) == {
        "role": "bootstrap", "run": "r1", "peer_id": "16Uiu2X", "state": "started, no peer yet", "peers": 0,
    }  # fmt: skip
    assert figures(alone | {"stopped": True})["state"] == "stopped"
    relay = figures(document("relay", {"versions_held": [], "bytes_served": 51_529_704}))
    assert (relay["version"], relay["versions_held"], relay["mb_served"]) == (None, [], 51.5)
    assert figure_text("versions_held", []) == "none" and figure_text("rewards", []) == "none yet"


def test_the_status_command_prints_the_figures_the_page_shows(tmp_path: Path) -> None:
    status = document("validator", VALIDATOR_WORK)
    (tmp_path / "status.json").write_text(json.dumps(status))
    shown = CliRunner().invoke(main, ["status", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    printed = shown.output.splitlines()
    lines = figure_lines(status)
    assert lines[0] == "  figures (live at http://127.0.0.1:9100/):"
    assert printed[-len(lines) :] == lines
    assert "    verdicts by reason: BAD_PROOF 2, STALE 1" in lines
    page_texts = {f"    {f['label']}: {f['text']}" for f in figures_document(status)["figures"]}
    assert page_texts == set(lines[1:])  # the same labels and wording as the page
    as_figures = CliRunner().invoke(main, ["status", "--figures", str(tmp_path)])
    assert json.loads(as_figures.output) == figures(status)


def test_the_page_is_self_contained_and_renders_values_as_text_only() -> None:
    assert "<link" not in PAGE and " src=" not in PAGE and "@import" not in PAGE
    assert PAGE.replace("http://www.w3.org/2000/svg", "").count("http") == 0  # nothing fetched from afar
    assert "innerHTML" not in PAGE and "textContent" in PAGE  # values from peers never become markup
    assert 'fetch("/figures.json"' in PAGE and "const REFRESH_MS = 2000;" in PAGE


async def http_get(port: int, request: bytes) -> tuple[str, dict[str, str], bytes]:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *fields = head.decode().split("\r\n")
    headers = dict(field.split(": ", 1) for field in fields)
    return status, headers, body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode()


def test_the_metrics_port_serves_the_page_its_figures_and_the_status() -> None:
    status = document("trainer", TRAINER_WORK)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_metrics, make_registry(lambda: status), 0)
            answers = {
                path: await http_get(port, get(path))
                for path in ("/", "/figures.json?t=1", "/status.json", "/metrics", "/nope")
            }
            posted = await http_get(port, b"POST /figures.json HTTP/1.0\r\n\r\n")
            nursery.cancel_scope.cancel()
        page_status, page_headers, page = answers["/"]
        assert page_status.endswith("200 OK") and page_headers["Content-Type"].startswith("text/html")
        assert page.decode() == PAGE
        figures_status, figures_headers, body = answers["/figures.json?t=1"]
        assert figures_headers["Content-Type"] == "application/json"
        assert figures_headers["Cache-Control"] == "no-store"  # refreshed live, never from a cache
        assert json.loads(body) == figures_document(status)
        assert json.loads(answers["/status.json"][2]) == status
        assert b'swarmnode_peers_connected{role="trainer",run="r1"} 3.0' in answers["/metrics"][2]
        assert answers["/nope"][0].endswith("404 Not Found") and posted[0].endswith("404 Not Found")

    trio.run(main)


def test_a_status_that_cannot_be_read_fails_one_request_not_the_node() -> None:
    def broken_snapshot() -> dict[str, Any]:
        raise KeyError("work")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_metrics, make_registry(broken_snapshot), 0)
            failed = await http_get(port, get("/figures.json"))
            page = await http_get(port, get("/"))
            nursery.cancel_scope.cancel()
        assert failed[0].endswith("500 Internal Server Error") and page[0].endswith("200 OK")

    trio.run(main)

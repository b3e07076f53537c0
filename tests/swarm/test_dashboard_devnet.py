"""The dashboard in a real browser against a live devnet: headless Chromium (Debian's `chromium`) loads the
page each node serves on its metrics port, and the figures it renders are the ones `swarmnode status`
prints from the node's status file read just before and just after (node.dashboard).

The smallest training run (one node of each role, two steps) runs until the trainer has a reward; then the
trainer's, the worker's and the validator's pages are loaded, dumped and screenshotted. Figures that only
grow (counters, the reward list) must lie between the two readings of the status file; the node's identity
must match exactly. Slow (about a minute on 2 cores); skipped where Chromium is not installed
(scripts/install.sh installs it as root).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from swarmnode.node.cli.main import main
from swarmnode.node.dashboard import LABELS, figure_text
from swarmnode.node.devnet.network import Devnet
from swarmnode.node.devnet.plan import DevnetNode, DevnetPlan

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DASHBOARDS = ("trainer-1", "worker-1", "validator-1")
FIRST_REWARD_S = 240  # every node up and a first step trained, on a busy 2-core machine
IDENTITY = {"role", "run", "peer_id"}  # never change while a node runs
GROWING = {  # counters and versions: a later reading is never smaller
    "version", "newest_known", "step", "rollouts_submitted", "rollouts_received", "rollouts_used",
    "rollouts_accepted", "rollouts_rejected", "rollouts_ignored", "stale_dropped", "rollouts_undelivered",
    "credits_committed", "credit_batches", "slashes_filed", "slashes_finalized", "mb_served",
}  # fmt: skip
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class FigureCells(HTMLParser):
    """The figures a dumped page shows: key -> (value from data-value, the text the cell reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[str, tuple[Any, str]] = {}
        self._open: tuple[str, Any] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        fields = dict(attrs)
        if tag == "td" and fields.get("data-figure"):
            self._open = (str(fields["data-figure"]), json.loads(fields["data-value"] or "null"))
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._open is not None:
            key, value = self._open
            self.cells[key] = (value, "".join(self._text).strip())
            self._open = None


def rendered_figures(dom: str) -> dict[str, tuple[Any, str]]:
    parser = FigureCells()
    parser.feed(dom)
    return parser.cells


def status_figures(node: DevnetNode) -> dict[str, Any]:
    """What `swarmnode status --figures` prints for the node, from its status file as it is now."""
    shown = CliRunner().invoke(main, ["status", "--figures", str(node.data_dir)])
    assert shown.exit_code == 0, shown.output
    return json.loads(shown.output)


def figures_written_after(moment: float, node: DevnetNode, devnet: Devnet) -> dict[str, Any]:
    """The node's figures from a status file it wrote after `moment` (it rewrites it every second)."""
    devnet.wait_until(lambda: float((node.status() or {}).get("updated", 0)) > moment, 10, "a new status")
    return status_figures(node)




def browse(url: str, screenshot: Path, profile: Path) -> str:
    """The page's DOM after its script ran (5 s of virtual time: two refreshes), and a screenshot of it."""
    assert CHROMIUM is not None
    shown = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
         "--virtual-time-budget=5000", "--window-size=1200,900", f"--screenshot={screenshot}",
         "--dump-dom", url],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-3000:]
    return shown.stdout


def check_between(key: str, earlier: Any, shown: Any, later: Any) -> None:
    """The page's value of a figure, read between two readings of the status file, agrees with both."""
    if key in IDENTITY:
        assert earlier == shown == later, key
    elif key == "rewards":  # one mean per step, appended
        assert shown[: len(earlier)] == earlier and later[: len(shown)] == shown, (earlier, shown, later)
    elif key == "verdicts_by_reason":
        for reason in set(earlier) | set(shown) | set(later):
            assert earlier.get(reason, 0) <= shown.get(reason, 0) <= later.get(reason, 0), (key, reason)
    elif key in GROWING and shown is not None:
        assert (earlier if earlier is not None else shown) <= shown <= later, (key, earlier, shown, later)
    else:  # may go either way (peers, queues, versions held): one of the two readings
        assert shown in (earlier, later), (key, earlier, shown, later)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium: `apt-get install chromium` (scripts/install.sh)")
def test_the_dashboard_in_chromium_shows_what_swarmnode_status_prints(tmp_path: Path) -> None:
    plan = DevnetPlan(trainers=1, relays=1, workers=1, validators=1, steps=2, ledger="signed")
    devnet = Devnet(plan, tmp_path / "run")
    devnet.prepare()
    ports = {name: devnet.nodes[name].metrics_port for name in DASHBOARDS}  # the devnet gives each node one
    assert all(ports.values()), ports
    pages: dict[str, dict[str, tuple[Any, str]]] = {}
    try:
        devnet.start("bootstrap")
        devnet.wait_ready(["bootstrap"], timeout=60)
        devnet.start_others()
        trainer = devnet.nodes["trainer-1"]
        rewards = lambda: ((trainer.status() or {}).get("work") or {}).get("rewards")  # noqa: E731
        devnet.wait_until(lambda: bool(rewards()), FIRST_REWARD_S, "a first reward")
        for name in DASHBOARDS:
            node = devnet.nodes[name]
            status = node.status() or {}
            assert status.get("metrics_port") == ports[name]  # the port the status file names
            earlier = status_figures(node)
            screenshot = tmp_path / f"{name}.png"
            dom = browse(f"http://127.0.0.1:{ports[name]}/", screenshot, tmp_path / "chromium")
            later = figures_written_after(time.time(), node, devnet)
            printed = CliRunner().invoke(main, ["status", str(node.data_dir)]).output.splitlines()

            shown = rendered_figures(dom)
            assert set(shown) == set(earlier) == set(later), (name, set(shown) ^ set(later))
            for key, (value, text) in shown.items():
                check_between(key, earlier[key], value, later[key])
                assert text == figure_text(key, value), (key, text)  # the page reads as the command does
                assert any(line.startswith(f"    {LABELS[key][1]}: ") for line in printed), (key, printed)
            for key in IDENTITY:
                assert f"    {LABELS[key][1]}: {shown[key][1]}" in printed
            assert screenshot.read_bytes().startswith(PNG_MAGIC) and screenshot.stat().st_size > 10_000
            pages[name] = shown
        assert pages["trainer-1"]["rewards"][0], "the trainer's page shows its reward per step"
        assert {"rollouts_accepted", "versions_behind", "verdicts_by_reason"} <= set(pages["worker-1"])
        assert {"verdicts_by_reason", "credits_committed", "slashes_filed"} <= set(pages["validator-1"])
    finally:
        codes = devnet.stop_all()
    assert all(code in (0, None) for code in codes.values()), codes

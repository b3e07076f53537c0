"""A training devnet run from the command line, as an operator runs it, and what its summary must show when
one worker cheats: the slow devnet tests of task kinds and environments share these."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Collection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
AFTER_A_SLASH = {"NOT_STAKED", "STALE"}  # slashed below its stake, a cheater is unstaked; late ones are stale


def swarmnode(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`swarmnode ARGS` in a new process from the repository root."""
    return subprocess.run([sys.executable, "-m", "swarmnode.node.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def devnet_summary(folder: Path, *args: str, timeout: float = 1500) -> dict[str, Any]:
    """Run `swarmnode devnet --no-live ARGS` into `folder`/run; its `--summary` (the run must succeed, and
    every node, the cheater too, must stop on SIGTERM within the grace: a long generation or judgement in
    flight is abandoned, not waited for)."""
    path = folder / "summary.json"
    run = swarmnode("devnet", "--no-live", *args, "--out", str(folder / "run"), "--summary", str(path),
                    timeout=timeout)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    summary: dict[str, Any] = json.loads(path.read_text())
    print(json.dumps({k: v for k, v in summary.items() if k != "nodes"})[:2000])
    # the run's own record (the devnet folder's summary.json) has each node's exit code; the report does not
    codes = json.loads((folder / "run" / "summary.json").read_text())["exit_codes"]
    unclean = {name: code for name, code in codes.items() if code != 0}
    assert not unclean, f"nodes that did not exit cleanly on SIGTERM within the devnet's grace: {unclean}"
    return summary


def assert_only_the_cheater_caught(summary: dict[str, Any], cheat: str,
                                   reasons: Collection[str] = ()) -> None:
    """The worker cheating `cheat` was slashed with nothing accepted, no honest node was slashed and every
    honest worker had work accepted and none rejected; `reasons`: the rejections the cheat must earn (and,
    besides those a slash leads to, the only ones)."""
    assert summary["every_cheater_slashed"] is True and summary["honest_slashed"] == []
    by_reason = summary["validators"]["by_reason"]
    for reason in reasons:
        assert by_reason.get(reason, 0) >= 1, by_reason
    if reasons:
        assert set(by_reason) <= set(reasons) | AFTER_A_SLASH, by_reason
    nodes = summary["nodes"]
    (cheater,) = [node for node in nodes.values() if node.get("cheat") == cheat]
    assert cheater["rollouts_accepted"] == 0 and cheater["rollouts_rejected"] > 0
    for name, node in nodes.items():
        if node["role"] == "worker" and node["honest"]:
            assert node["rollouts_accepted"] > 0 and node["rollouts_rejected"] == 0, name

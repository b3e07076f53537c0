"""Where the sandbox cannot run, code is refused, never run without it: a typed error naming the fix, and
the CLI's one-line error before any model loads or node starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from swarmnode.node.rl.tasks import Task, write_tasks
from swarmnode.node.sandbox import SandboxUnavailable
from swarmnode.node.sandbox.host import host_sandbox

ROOT = Path(__file__).resolve().parents[2]
NO_BWRAP_PATH = str(Path(sys.executable).parent)  # the venv's scripts, not /usr/bin where bwrap lives


def test_a_machine_without_bubblewrap_refuses(monkeypatch):
    monkeypatch.setenv("PATH", NO_BWRAP_PATH)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        host_sandbox.__wrapped__()


def test_a_root_node_never_runs_code_as_root(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("a root node's rule")
    monkeypatch.setenv("SWARMNODE_SANDBOX_UID", "0")
    with pytest.raises(SandboxUnavailable, match="unprivileged"):
        host_sandbox.__wrapped__()


COMMANDS = [["tasks", "filter", "--out", "kept.jsonl"], ["train", "--sync", "--steps", "1"]]


@pytest.mark.parametrize("command", COMMANDS)
def test_the_cli_says_what_to_install_before_any_work(tmp_path, command):
    write_tasks([Task("code", "Write add(a, b).", "assert add(1, 2) == 3")], tmp_path / "code.jsonl")
    args = [*command, "--tasks", str(tmp_path / "code.jsonl")]
    if command[0] == "tasks":
        args += ["--model", str(ROOT / "node" / "rl" / "assets" / "devnet-model")]
    result = subprocess.run(
        [sys.executable, "-m", "swarmnode.node.cli.main", *args],
        cwd=tmp_path, env={**os.environ, "PATH": NO_BWRAP_PATH}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith("Error: code tasks need the sandbox: bubblewrap (bwrap) is not installed")
    assert "Traceback" not in result.stderr and not (tmp_path / "kept.jsonl").exists()


def test_a_family_file_without_the_sandbox_is_one_line_naming_the_fix(tmp_path):
    (tmp_path / "families.toml").write_text('seed = 1\n[[family]]\nname = "chain_sum"\ncount = 2\n')
    result = subprocess.run(
        [sys.executable, "-m", "swarmnode.node.cli.main", "tasks", "show", "families.toml"],
        cwd=tmp_path, env={**os.environ, "PATH": NO_BWRAP_PATH}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith(
        "Error: families.toml: family tasks are generated in the sandbox: bubblewrap (bwrap) is not installed"
    ), result.stderr
    assert "Traceback" not in result.stderr

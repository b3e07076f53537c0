"""The networked CLI commands: wiring, config errors, and (slow) a whole devnet from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from swarmnode.node.cli.run import register_commands


@pytest.fixture
def cli() -> click.Group:
    @click.group()
    def group() -> None:
        pass

    register_commands(group)
    return group


def test_commands_are_registered(cli: click.Group) -> None:
    assert set(cli.commands) == {"run", "devnet", "probe"}
    runner = CliRunner()
    for name in ("run", "devnet", "probe"):
        result = runner.invoke(cli, [name, "--help"])
        assert result.exit_code == 0, result.output
    assert "trainer|relay|worker|validator|bootstrap" in runner.invoke(cli, ["run", "--help"]).output


def test_run_reports_config_errors(cli: click.Group, tmp_path: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text("[node]\nrun = 'r'\nrole = 'relay'\nidentity = 'k'\ndata_dir = 'd'\nlisten_port = 1\n")
    result = CliRunner().invoke(cli, ["run", "--config", str(config)])
    assert result.exit_code != 0 and "unknown key(s): listen_port" in result.output
    config.write_text("[node]\nrun = 'r'\nrole = 'relay'\nidentity = 'missing.key'\ndata_dir = 'd'\n")
    result = CliRunner().invoke(cli, ["run", "--config", str(config)], env={"SWARMNODE_PASSWORD": "x"})
    assert result.exit_code != 0 and "no keystore" in result.output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_devnet_command_until_discovered(tmp_path: Path) -> None:
    out = tmp_path / "devnet"
    argv = [
        sys.executable,
        "-m",
        "swarmnode.node.cli.run",
        "devnet",
        "--relays",
        "1",
        "--workers",
        "1",
        "--out",
        str(out),
        "--until-discovered",
        "--no-live",
        "--duration",
        "240",
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reason"] == "discovered" and summary["discovered"]
    assert set(summary["exit_codes"].values()) == {0}  # every node stopped cleanly on SIGTERM
    for name in ("bootstrap", "trainer-1", "relay-1", "worker-1", "validator-1"):
        assert (out / name / "data" / "node.log").stat().st_size > 0
        assert json.loads((out / name / "data" / "status.json").read_text())["stopped"]
    assert str(out) in result.stdout
    # `swarmnode status` reads what each node wrote, from its data directory or its config file
    for name, role in (("trainer-1", "trainer"), ("worker-1", "worker")):
        for target in (out / name / "data", out / name / "node.toml"):
            shown = subprocess.run([sys.executable, "-m", "swarmnode.node.cli.main", "status", str(target)],
                                   capture_output=True, text=True, timeout=60)  # fmt: skip
            assert shown.returncode == 0, shown.stderr
            assert shown.stdout.startswith(f"{role} of run devnet: stopped"), shown.stdout
            assert "peers connected" in shown.stdout

"""The CLI as an operator uses it: a real `swarmnode` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.peer.id import ID

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.keystore import PASSWORD_ENV, load_keystore, save_keystore
from swarmnode.node.cli.password import key_password, password_for_children


def swarmnode(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "swarmnode.node.cli.main", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env,
                          timeout=600)


def test_keys_new_then_show_gives_matching_address_and_peer_id(tmp_path):
    key = tmp_path / "node.key"
    env = {**os.environ, "SWARMNODE_PASSWORD": "correct horse", "SWARMNODE_KEY": str(key)}
    created = swarmnode("keys", "new", env=env)
    assert created.returncode == 0, created.stderr
    shown = swarmnode("keys", "show", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    private_key = load_keystore(key, "correct horse").private_key
    assert info["peer_id"] == ID.from_pubkey(create_new_key_pair(private_key).public_key).to_base58()
    from eth_utils import is_checksum_address

    assert is_checksum_address(info["address"])
    again = swarmnode("keys", "new", env=env)
    assert again.returncode != 0 and "refusing to overwrite" in again.stderr
    wrong = swarmnode("keys", "show", env={**env, "SWARMNODE_PASSWORD": "wrong"})
    assert wrong.returncode != 0 and "wrong password" in wrong.stderr


SECRET = "correct-horse-7f3a-for-no-child"
# what a process the node starts sees: its environment, and its parent's (the node's) /proc environ
CHILD = (
    "import os; print(os.environ.get('SWARMNODE_PASSWORD'));"
    "print(open(f'/proc/{os.getppid()}/environ', 'rb').read().hex())"
)


@pytest.mark.parametrize(
    "entry", ["swarmnode.node.cli.main:main", "swarmnode.node.cli.run:standalone"]  # swarmnode; nodes, ranks
)
def test_a_command_opens_the_key_twice_and_no_process_it_starts_sees_the_password(tmp_path, entry):
    """A real node process, given the password in its environment as an operator, a devnet or torchrun
    gives it: the command opens the key twice (the second read finds the environment empty), then starts
    a child, which finds the password neither in its environment nor in the node's /proc/<pid>/environ."""
    key = tmp_path / "node.key"
    save_keystore(NodeIdentity(b"\x07" * 32), key, SECRET, kdf_iterations=2)
    module, group = entry.split(":")
    node = f"""
import os, subprocess, sys
from pathlib import Path
import click
from swarmnode.crypto.keystore import load_keystore
from swarmnode.node.cli.password import key_password, password_for_children
from {module} import {group} as group

@group.command("open-twice-then-spawn")
def command():
    first = load_keystore(Path({str(key)!r}), key_password())
    second = load_keystore(Path({str(key)!r}), key_password())
    assert first.address == second.address and "SWARMNODE_PASSWORD" not in os.environ
    click.echo(subprocess.run([sys.executable, "-c", {CHILD!r}], capture_output=True, text=True,
                              check=True).stdout, nl=False)

group(["open-twice-then-spawn"])
"""
    env = {**os.environ, PASSWORD_ENV: SECRET}
    argv = [sys.executable, "-c", node]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    child_env, node_proc = result.stdout.splitlines()[-2:]
    assert child_env == "None"
    node_environ = bytes.fromhex(node_proc)
    assert SECRET.encode() not in node_environ and PASSWORD_ENV.encode() not in node_environ


def test_the_password_is_read_once_per_command_and_asked_for_once(monkeypatch):
    @click.command()
    def twice() -> None:
        click.echo(f"{key_password()} {key_password()} {os.environ.get(PASSWORD_ENV)}")

    @click.command()
    def ledger_like() -> None:  # the ledger commands: a prompt may read a pipe
        click.echo(f"{key_password(prompt='password for k', tty_only=False)} {key_password()}")

    runner = CliRunner()
    assert runner.invoke(twice, env={PASSWORD_ENV: "a"}).output == "a a None\n"
    assert runner.invoke(twice, env={PASSWORD_ENV: "b"}).output == "b b None\n"  # each command reads its own
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    no_tty = runner.invoke(twice)
    assert no_tty.exit_code == 2 and f"set {PASSWORD_ENV}" in no_tty.output
    piped = runner.invoke(ledger_like, input="c\n")
    assert piped.exit_code == 0 and piped.output.count("password for k") == 1
    assert piped.output.endswith("c c\n")
    with password_for_children("d"):  # the trainer group's launcher, for its ranks only
        assert os.environ[PASSWORD_ENV] == "d"
    assert PASSWORD_ENV not in os.environ


def test_a_trainer_group_checks_the_key_then_hands_the_password_to_its_ranks_only(tmp_path, monkeypatch):
    """`run --nproc 2` opens the key (a wrong password fails before any rank starts), then puts the password
    back in the environment only while torchrun's agent starts the ranks, the node's own processes."""
    from swarmnode.node.cli.run import register_commands
    from swarmnode.node.trainer import launch

    save_keystore(NodeIdentity(b"\x08" * 32), tmp_path / "node.key", SECRET, kdf_iterations=2)
    config = tmp_path / "node.toml"
    config.write_text("[node]\nrun = 'r'\nrole = 'trainer'\nidentity = 'node.key'\ndata_dir = 'd'\n")
    ranks: list[str] = []

    def fake_launch(argv: object, nproc: int, max_restarts: int) -> None:  # torchrun: ranks from os.environ
        rank = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
        ranks.append(rank.stdout.splitlines()[0])

    monkeypatch.setattr(launch, "launch_group", fake_launch)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)

    @click.group()
    def cli() -> None:
        pass

    register_commands(cli)
    runner = CliRunner()
    argv = ["run", "--config", str(config), "--nproc", "2"]
    wrong = runner.invoke(cli, argv, env={PASSWORD_ENV: "wrong"})
    assert wrong.exit_code != 0 and "wrong password" in wrong.output and ranks == []
    result = runner.invoke(cli, argv, env={PASSWORD_ENV: SECRET})
    assert result.exit_code == 0, result.output
    assert ranks == [SECRET]


def test_conformance_command_passes_and_fails_on_a_corrupted_vector(tmp_path):
    env = dict(os.environ)
    ok = swarmnode("conformance", env=env)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    from tests.conformance.test_vectors import VECTORS

    document = json.loads((VECTORS / "envelope.json").read_text())
    case = next(c for c in document["cases"] if c["name"] == "envelope/valid/verdict")
    data = bytearray(bytes.fromhex(case["input"]["envelope"][2:]))
    data[40] ^= 0xFF
    case["input"]["envelope"] = "0x" + data.hex()
    (tmp_path / "envelope.json").write_text(json.dumps({"suite": "envelope", "cases": [case]}))
    bad = swarmnode("conformance", "--vectors", str(tmp_path), env=env)
    assert bad.returncode != 0
    assert "FAIL" in bad.stdout and "envelope/valid/verdict" in bad.stdout


def test_help_teaches():
    out = swarmnode("--help", env=dict(os.environ))
    assert out.returncode == 0 and "keys new" in out.stdout


@pytest.mark.slow  # two held-out evaluations (128 tasks x 8 samples) and a 256-completion step
def test_train_sync_reports_held_out_reward_before_and_after(tmp_path):
    args = ("train", "--sync", "--steps", "1", "--json", "--out", str(tmp_path / "out"))
    result = swarmnode(*args, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert lines[0]["step"] == 1 and "mean_reward" in lines[0]
    final = lines[-1]
    assert 0 < final["base_eval_reward"] < 1 and 0 < final["final_eval_reward"] < 1
    assert any((tmp_path / "out").iterdir())


def test_calibrate_prints_bounds_for_the_engine_pair_and_refuses_an_engine_it_cannot_run():
    env = dict(os.environ)
    result = swarmnode("calibrate", "--workers", "1", "--submissions", "1", "--json", env=env)
    assert result.returncode == 0, result.stderr
    bounds = json.loads(result.stdout.strip().splitlines()[-1])
    assert bounds["honest_submissions"] == 1
    assert bounds["max_mean_exp_mismatches"] >= bounds["honest_max_mean_exp_mismatches"] >= 0
    import torch

    from swarmnode.node.rl.engines import vllm_installed

    if not (torch.cuda.is_available() and vllm_installed()):  # a clear refusal, never a silent fallback
        refused = swarmnode("calibrate", "--worker-engine", "vllm", env=env)
        assert refused.returncode != 0 and "vllm" in (refused.stdout + refused.stderr).lower()

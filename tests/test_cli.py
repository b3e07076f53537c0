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


@pytest.mark.slow  # generates with two engines: 13 s of the fast set
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


# --- issue #32: start-up under a second, and train --sync's prompts per step checked before any work ---

HEAVY = ("torch", "transformers", "libp2p", "trio", "web3", "eth_account", "pyarrow")
IMPORTS_OF = """
import json, sys
from swarmnode.node.cli.main import main
try:
    main({argv!r}, standalone_mode=False)
finally:
    print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


@pytest.mark.parametrize("argv", [["version"], ["--help"], ["keys", "show"], ["keys", "--help"]])
def test_commands_that_load_no_model_import_no_heavy_library(tmp_path, argv):
    """`swarmnode version`, `--help` and `keys show` start in a fraction of a second: none of them imports
    torch, libp2p, trio, web3 or eth_account (`benchmarks/bench_cli.py` times them)."""
    key = tmp_path / "node.key"
    save_keystore(NodeIdentity(b"\x09" * 32), key, SECRET, kdf_iterations=2)
    env = {**os.environ, PASSWORD_ENV: SECRET, "SWARMNODE_KEY": str(key)}
    code = IMPORTS_OF.format(argv=argv, heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_the_lazy_commands_help_lines_are_their_own_and_every_command_loads():
    """`swarmnode --help` lists the commands of other modules by a help line kept in main.py: each equals the
    line click makes from the command's own help, at any width, and each name loads the command it names."""
    from swarmnode.node.cli.main import LAZY_COMMANDS, load_lazy_command

    for name, (target, line) in LAZY_COMMANDS.items():
        command = load_lazy_command(name, target)
        stand_in = click.Command(name, help=line)
        for limit in (30, 45, 80, 97, 1000):
            assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit), (name, limit)
    listed = CliRunner().invoke(main_group(), ["--help"]).output
    assert all(f"  {name} " in listed for name in LAZY_COMMANDS)


def main_group() -> click.Group:
    from swarmnode.node.cli.main import main

    return main


def test_bench_cli_runs_and_ends_with_its_json_line():
    bench = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_cli.py")
    argv = [sys.executable, bench, "--repeats", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    keys = {"version_s", "keys_show_s", "python_startup_s", "version_vs_python_ratio", "goal_s", "met"}
    assert keys <= set(result)
    assert result["version_s"] > 0 and isinstance(result["met"], bool)


def _tasks_file(tmp_path, count):
    from swarmnode.node.rl.run import devnet_dataset
    from swarmnode.node.rl.tasks import write_tasks

    return write_tasks(devnet_dataset()[:count], tmp_path / "tasks.jsonl")


@pytest.fixture
def no_model_loads(monkeypatch):
    """A command that got past its input checks would load the model: that fails the test."""
    from swarmnode.node.rl import engine, engines

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(engine.TransformersEngine, "from_folder", refuse)
    monkeypatch.setattr(engines, "open_engine", refuse)


def test_train_sync_with_fewer_tasks_than_prompts_per_step_stops_with_one_line_before_any_work(
    tmp_path, no_model_loads
):
    tasks = _tasks_file(tmp_path, 25)
    out = tmp_path / "out"
    argv = ["train", "--sync", "--steps", "1", "--tasks", str(tasks), "--out", str(out)]
    refused = CliRunner().invoke(main_group(), argv)
    assert refused.exit_code == 1 and not out.exists()
    assert refused.output.splitlines() == [
        f"Error: {tasks} has 25 tasks; --prompts-per-step 32 needs at least 32 distinct tasks: "
        "lower --prompts-per-step or add tasks"
    ]
    fewer = CliRunner().invoke(main_group(), [*argv, "--prompts-per-step", "26"])
    assert fewer.exit_code == 1 and "--prompts-per-step 26 needs at least 26" in fewer.output
    with pytest.raises(AssertionError, match="a model was loaded"):  # 25 prompts fit: on to the model
        CliRunner().invoke(main_group(), [*argv, "--prompts-per-step", "25", "--group-size", "4"],
                           catch_exceptions=False)
    one = CliRunner().invoke(main_group(), [*argv, "--group-size", "1"])
    assert one.exit_code == 2 and "--group-size" in one.output
    helped = CliRunner().invoke(main_group(), ["train", "--help"]).output
    assert "--prompts-per-step" in helped and "--group-size" in helped and "default: 32" in helped


def test_devnet_and_calibrate_refuse_too_few_tasks_for_the_runs_prompts_per_step(tmp_path, no_model_loads):
    tasks = _tasks_file(tmp_path, 3)
    expected = (f"Error: {tasks} has 3 tasks; the run takes 32 prompts per step and needs at least 32 "
                "distinct tasks: add tasks")
    for argv in (["devnet", "--steps", "1", "--tasks", str(tasks), "--out", str(tmp_path / "devnet")],
                 ["calibrate", "--tasks", str(tasks)]):
        refused = CliRunner().invoke(main_group(), argv)
        assert refused.exit_code == 1 and refused.output.splitlines() == [expected], refused.output
    assert not (tmp_path / "devnet").exists()


def test_a_broken_model_folder_is_one_line_before_any_node_starts(tmp_path, no_model_loads):
    """A devnet on a folder without tokenizer files used to set up every node's folder and then print a
    traceback from the run's registration (issue #31: inputs checked before any node starts)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    tasks = _tasks_file(tmp_path, 40)
    out = tmp_path / "devnet"
    for argv in (["devnet", "--steps", "1", "--model", str(folder), "--tasks", str(tasks), "--out", str(out)],
                 ["train", "--sync", "--model", str(folder), "--tasks", str(tasks)]):
        refused = CliRunner().invoke(main_group(), argv)
        assert refused.exit_code == 1, refused.output
        assert refused.output.splitlines() == [
            f"Error: {folder}: no tokenizer.json (nor tokenizer.model or vocab.json): see "
            "`swarmnode model show`, `swarmnode model init`"
        ]
    assert not out.exists()


def test_the_cli_defaults_are_the_devnet_recipe():
    """inputs.py copies devnet_grpo's prompts per step and group size so that `--help` imports no torch."""
    from swarmnode.node.cli.inputs import DEFAULT_GROUP_SIZE, DEFAULT_MAX_NEW_TOKENS, DEFAULT_PROMPTS_PER_STEP
    from swarmnode.node.rl.run import DEVNET_MAX_NEW_TOKENS, DEVNET_MODEL, devnet_grpo
    from swarmnode.node.rl.tokenizer import load_tokenizer

    grpo = devnet_grpo(load_tokenizer(DEVNET_MODEL)[1])
    assert (grpo.prompts_per_step, grpo.group_size) == (DEFAULT_PROMPTS_PER_STEP, DEFAULT_GROUP_SIZE)
    assert DEFAULT_MAX_NEW_TOKENS == DEVNET_MAX_NEW_TOKENS

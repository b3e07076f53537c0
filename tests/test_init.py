"""`swarmnode init`: a node's folder to start from (node/cli/init.py), and the committed examples/."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from swarmnode.crypto.keystore import load_keystore
from swarmnode.node.cli.init import example_plan, render_node_toml
from swarmnode.node.cli.main import main
from swarmnode.node.config import ROLE_NAMES, load_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
PASSWORD = "correct horse"


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_the_committed_example_is_what_init_writes_and_loads(role: str, tmp_path: Path) -> None:
    committed = (EXAMPLES / f"{role}.toml").read_text()
    assert committed == render_node_toml(example_plan(role)), "regenerate examples/ from example_plan"
    (tmp_path / "models" / "my-model").mkdir(parents=True)
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "train.jsonl").write_text("")
    (tmp_path / "node").mkdir()
    shutil.copy(EXAMPLES / f"{role}.toml", tmp_path / "node" / "node.toml")
    config = load_config(tmp_path / "node" / "node.toml")
    assert config.role == role and config.run == "my-run" and config.data_dir == tmp_path / "node" / "data"
    if role in ("trainer", "worker", "validator"):
        assert config.work.model == str(tmp_path / "models" / "my-model")


def init(*args: str) -> Result:
    return CliRunner().invoke(main, ["init", *args], env={"SWARMNODE_PASSWORD": PASSWORD})


def test_init_writes_a_loadable_config_a_key_and_the_next_commands(tmp_path: Path) -> None:
    folder = tmp_path / "w"
    result = init("worker", str(folder), "--run", "r1", "--bootstrap", "/ip4/10.0.0.1/tcp/4001/p2p/16Uiu2X",
                  "--ledger", "signed:shared/ledger.db")  # fmt: skip
    assert result.exit_code == 0, result.output
    config = load_config(folder / "node.toml")
    identity = load_keystore(folder / "node.key", PASSWORD)
    assert config.role == "worker" and config.identity == folder / "node.key"
    assert config.ledger_url.startswith("signed:/") and config.ledger_url.endswith("shared/ledger.db")
    ports = {int(config.listen.rsplit("/", 1)[1]), config.http_port, config.metrics_port}
    assert len(ports) == 3 and 0 not in ports
    output = result.output
    assert identity.peer_id in output and "swarmnode register --role worker" in output
    assert f"swarmnode run --config {folder / 'node.toml'}" in output
    again = init("worker", str(folder), "--run", "r1")
    assert again.exit_code == 1 and "pass --force" in again.output
    forced = init("worker", str(folder), "--run", "r2", "--force")
    assert forced.exit_code == 0 and load_config(folder / "node.toml").run == "r2"
    assert load_keystore(folder / "node.key", PASSWORD).address == identity.address  # the key is kept


def test_a_bootstrap_prints_the_address_the_others_need(tmp_path: Path) -> None:
    result = init("bootstrap", str(tmp_path / "b"), "--run", "r1", "--announce-host", "203.0.113.7")
    peer_id = load_keystore(tmp_path / "b" / "node.key", PASSWORD).peer_id
    port = load_config(tmp_path / "b" / "node.toml").listen.rsplit("/", 1)[1]
    assert f"/ip4/203.0.113.7/tcp/{port}/p2p/{peer_id}" in result.output
    assert "register" not in result.output


def test_options_the_node_would_refuse_write_no_config(tmp_path: Path) -> None:
    result = init("trainer", str(tmp_path / "t"), "--run", "Bad Run!")
    assert result.exit_code == 1 and "config the node refuses" in result.output
    assert not (tmp_path / "t" / "node.toml").exists() and not (tmp_path / "t" / "node.key").exists()
    bad = init("trainer", str(tmp_path / "t"), "--run", "r1", "--run-validator", "0x12")
    assert bad.exit_code == 1 and not (tmp_path / "t" / "node.toml").exists()

"""`swarmnode init`: a node's folder to start from (node/cli/init.py), and the committed examples/."""

from __future__ import annotations

import shutil
from pathlib import Path

import multiaddr  # type: ignore[import-untyped]
import pytest
from click.testing import CliRunner, Result

from swarmnode.crypto.keystore import load_keystore
from swarmnode.node.cli.init import example_plan, render_node_toml
from swarmnode.node.cli.main import main
from swarmnode.node.config import ROLE_NAMES, load_config
from swarmnode.node.p2p.host import announced_addrs, parse_announce

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


CONTRACT = "0x8223818D5a51c3236958758Fb716b3573898E3E1"


def test_a_chain_ledger_carries_its_contract_into_the_config_and_the_next_commands(tmp_path: Path) -> None:
    """The node reads `evm:URL#CONTRACT`; register and stake take `--ledger evm:URL --contract CONTRACT`."""
    result = init("relay", str(tmp_path / "r"), "--run", "r1", "--ledger", "evm:http://10.0.0.1:8545",
                  "--contract", CONTRACT)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert load_config(tmp_path / "r" / "node.toml").ledger_url == f"evm:http://10.0.0.1:8545#{CONTRACT}"
    assert f"--ledger evm:http://10.0.0.1:8545 --contract {CONTRACT} --key" in result.output
    env = {"SWARMNODE_PASSWORD": PASSWORD, "SWARMNODE_LEDGER": "evm:http://h:8545",
           "SWARMNODE_CONTRACT": CONTRACT}  # fmt: skip
    from_env = CliRunner().invoke(main, ["init", "relay", str(tmp_path / "e"), "--run", "r1"], env=env)
    assert from_env.exit_code == 0, from_env.output  # the variables every other ledger command reads
    assert load_config(tmp_path / "e" / "node.toml").ledger_url == f"evm:http://h:8545#{CONTRACT}"
    bare = init("relay", str(tmp_path / "b"), "--run", "r1", "--ledger", "evm:http://10.0.0.1:8545")
    assert bare.exit_code == 2 and "needs its contract" in bare.output and not (tmp_path / "b").exists()


def _announced(config_path: Path) -> list[str]:
    config = load_config(config_path)
    listen, announce = multiaddr.Multiaddr(config.listen), parse_announce(config.announce)
    announced = announced_addrs([listen], announce=announce, dialable=True)
    return [str(a) for a in announced]


def test_a_node_announces_the_address_other_hosts_dial(tmp_path: Path) -> None:
    """Listening on 0.0.0.0 announces nothing: a node on another host names its --announce-host, and a node
    reached on loopback only listens there (else peers that find it in the DHT cannot dial it)."""
    remote = init("worker", str(tmp_path / "w"), "--run", "r1", "--announce-host", "10.0.0.3")
    assert remote.exit_code == 0, remote.output
    port = load_config(tmp_path / "w" / "node.toml").listen.rsplit("/", 1)[1]
    assert load_config(tmp_path / "w" / "node.toml").listen == f"/ip4/0.0.0.0/tcp/{port}"
    assert _announced(tmp_path / "w" / "node.toml") == [f"/ip4/10.0.0.3/tcp/{port}"]
    local = init("worker", str(tmp_path / "l"), "--run", "r1")
    assert local.exit_code == 0, local.output
    assert _announced(tmp_path / "l" / "node.toml") == [load_config(tmp_path / "l" / "node.toml").listen]
    assert _announced(tmp_path / "l" / "node.toml")[0].startswith("/ip4/127.0.0.1/tcp/")
    bad = init("worker", str(tmp_path / "x"), "--run", "r1", "--announce-host", "my-host")
    assert bad.exit_code == 2 and "not an IPv4 address" in bad.output

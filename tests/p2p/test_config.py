from __future__ import annotations

from pathlib import Path

import pytest

from swarmnode.node.config import ConfigError, load_config, render_config

TOML = """
[node]
identity = "keys/node.key"
listen = "/ip4/127.0.0.1/tcp/4001"
bootstrap = ["/ip4/127.0.0.1/tcp/4000/p2p/16Uiu2HAmMzhXFfZvscvA3Zui6tY4BCagzoNSQ26H8YjyEtmwSxgS"]
run = "run-1"
role = "worker"
data_dir = "data"
http_port = 8081
metrics_port = 9100
trainer = "0x00000000000000000000000000000000000000aa"

[discovery]
reprovide_interval = 60.0
early_refresh = [1.0, 2.0]

[gossip]
degree = 8

[liveness]
max_strikes = 5

[scoring]
ban_seconds = 60.0
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return path


def test_full_config(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, TOML))
    assert config.identity == tmp_path / "keys" / "node.key"
    assert config.data_dir == tmp_path / "data"
    assert config.role == "worker" and config.run == "run-1" and config.bootstrap[0].startswith("/ip4/")
    assert config.discovery.reprovide_interval == 60.0 and config.discovery.early_refresh == (1.0, 2.0)
    assert (
        config.gossip.degree == 8 and config.liveness.max_strikes == 5 and config.scoring.ban_seconds == 60.0
    )
    assert config.trainer == bytes(19) + b"\xaa"
    assert config.discovery_settings().bootstrap == config.bootstrap
    assert config.http_endpoint == "http://127.0.0.1:8081"


def test_work_files_are_relative_to_the_config_file_like_the_node_s(tmp_path: Path) -> None:
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    tasks = tmp_path / "elsewhere" / "tasks.jsonl"
    tasks.write_text("")
    work = f'\n[work]\nmodel = "models/m"\ntasks = "{tasks}"\n'
    config = load_config(write(tmp_path, TOML + work))
    assert config.work.model == str(tmp_path / "models" / "m") and config.work.tasks == str(tasks)
    assert config.work.diloco_plan == ""  # unset stays unset


def test_flags_override_the_file(tmp_path: Path) -> None:
    config = load_config(
        write(tmp_path, TOML), {"role": "relay", "http_port": 9999, "listen": None, "bootstrap": ()}
    )
    assert config.role == "relay" and config.http_port == 9999
    assert config.listen == "/ip4/127.0.0.1/tcp/4001" and len(config.bootstrap) == 1


def test_flags_alone(tmp_path: Path) -> None:
    config = load_config(
        None, {"identity": tmp_path / "k", "run": "r", "role": "trainer", "data_dir": tmp_path}
    )
    assert config.bootstrap == () and config.metrics_port == 0


@pytest.mark.parametrize(
    "text, message",
    [
        ("[node]\nidentty = 'x'\n", "unknown key"),
        ("[nod]\n", "unknown section"),
        ("[node]\nrun='r'\nrole='chef'\nidentity='k'\ndata_dir='d'\n", "role must be one of"),
        ("[node]\nrun='R!'\nrole='relay'\nidentity='k'\ndata_dir='d'\n", "does not match"),
        ("[node]\nrun='r'\nrole='relay'\n", "missing required"),
        ("[node]\nhttp_port = 70000\n", "port number"),
        ("[node]\nbootstrap = 'x'\n", "list of multiaddr"),
        ("[node]\ntrainer = '0x12'\n", "address"),
        ("[gossip]\nheartbeat = 1\n", "unknown key"),
        ("[gossip]\ndegree = 'six'\n", "must be a int"),
        ("[liveness]\ninterval = true\n", "must be a float"),
        ("[discovery]\nearly_refresh = 3\n", "must be a list"),
        ("not toml = = \n", "cannot read"),
        ("[work]\nrun_validators = ['0x12']\n", "run_validators must be 0x addresses"),
        ("[work]\nrun_validators = '0x12'\n", "must be a list"),
        ("[work]\nchallenge_window_epochs = -1\n", "challenge_window_epochs must be >= 0"),
        ("[work]\ncredit_interval_s = 0\n", "credit_interval_s and slash_check_s > 0"),
    ],
)
def test_invalid_configs(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text))


def test_render_roundtrip(tmp_path: Path) -> None:
    import tomli_w

    config = load_config(write(tmp_path, TOML))
    (tmp_path / "again.toml").write_text(tomli_w.dumps(render_config(config, tmp_path)))
    again = load_config(tmp_path / "again.toml")
    assert again.identity == config.identity and again.bootstrap == config.bootstrap
    assert again.trainer == config.trainer and again.data_dir == config.data_dir


def test_the_runs_validators_are_read_as_addresses(tmp_path: Path) -> None:
    from swarmnode.node.config import run_validator_addresses

    address = "0x" + "ab" * 20
    config = load_config(write(tmp_path, TOML + f"\n[work]\nrun_validators = ['{address}']\n"))
    assert run_validator_addresses(config.work) == (bytes.fromhex("ab" * 20),)

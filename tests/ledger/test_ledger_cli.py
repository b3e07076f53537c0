"""The ledger CLI on a signed log, in-process through click's runner."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from crypto.identity import format_address
from crypto.keystore import save_keystore
from ledger import testing as T
from ledger.signedlog import SignedLog
from node.cli_ledger import parse_amount, register_commands

VAL, W1 = T.identity("cli-val"), T.identity("cli-w1")


@click.group()
def main() -> None:
    """Stand-in for the node's main group."""


register_commands(main)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    save_keystore(VAL, tmp_path / "val.json", "pw", kdf_iterations=2)
    save_keystore(W1, tmp_path / "w1.json", "pw", kdf_iterations=2)
    return {"SWARMNODE_PASSWORD": "pw", "SWARMNODE_LEDGER": f"signed:{tmp_path / 'ledger.db'}"}


def run(env: dict[str, str], *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), env=env)
    assert result.exit_code == code, result.output
    return result.output


def setup_ledger(env: dict[str, str], tmp_path: Path) -> None:
    run(
        env,
        "ledger",
        "deploy",
        "--min-stake-per-unit",
        "1000",
        "--slash-amount",
        "400",
        "--unbonding-delay",
        "2",
    )
    run(
        env,
        "register",
        "--role",
        "validator",
        "--accelerator",
        "cpu",
        "--count",
        "1",
        "--memory-gb",
        "8",
        "--key",
        str(tmp_path / "val.json"),
    )
    run(
        env,
        "register",
        "--role",
        "worker",
        "--accelerator",
        "h100",
        "--count",
        "2",
        "--memory-gb",
        "80",
        "--benchmark-gflops",
        "900000",
        "--key",
        str(tmp_path / "w1.json"),
    )
    run(env, "stake", "deposit", "1000", "--key", str(tmp_path / "val.json"))
    run(env, "stake", "deposit", "0.0000025eth", "--key", str(tmp_path / "w1.json"))


def test_operator_flow_and_queries(env: dict[str, str], tmp_path: Path) -> None:
    setup_ledger(env, tmp_path)
    with SignedLog.open(tmp_path / "ledger.db") as log:  # the validator role records work
        log.record_contribution(VAL, T.contribution(VAL, W1, nonce=0, run="run-a", tokens=10))
        log.record_contribution(VAL, T.contribution(VAL, W1, nonce=1, run="run-b", tokens=20))
        log.slash(VAL, T.slash(W1, 400, nonce=2, run="run-a"))

    nodes = json.loads(run(env, "ledger", "nodes", "--json"))["nodes"]
    assert [(n["address"], n["role"]) for n in nodes] == [
        (VAL.checksum_address, "validator"),
        (W1.checksum_address, "worker"),
    ]
    assert nodes[1]["compute"] == {
        "accelerator": "h100",
        "count": 2,
        "memory_gb": 80,
        "benchmark_gflops": 900000,
    }
    stakes = json.loads(run(env, "ledger", "stakes", "--json"))["stakes"]
    assert [s["bonded_gwei"] for s in stakes] == [1000, 2100]
    only_b = json.loads(run(env, "ledger", "contributions", "--run", "run-b", "--json"))
    assert only_b["total_tokens"] == 20 and len(only_b["contributions"]) == 1
    mine = json.loads(run(env, "ledger", "contributions", "--node", W1.checksum_address, "--json"))
    assert len(mine["contributions"]) == 2
    slashes = json.loads(run(env, "ledger", "slashes", "--json"))["slashes"]
    assert slashes[0]["worker"] == W1.checksum_address and slashes[0]["failing_chunks"] == [1, 3]
    status = json.loads(run(env, "stake", "status", "--key", str(tmp_path / "w1.json"), "--json"))
    assert status["stake"] == {
        "address": W1.checksum_address,
        "bonded_gwei": 2100,
        "unbonding_gwei": 0,
        "release_epoch": 0,
        "required_gwei": 2000,
        "eligible": True,
    }

    for query in (
        ["ledger", "nodes"],
        ["ledger", "stakes"],
        ["ledger", "contributions"],
        ["ledger", "slashes"],
        ["stake", "status", "--node", format_address(VAL.address)],
    ):
        assert "0x" in run(env, *query)  # rich tables name the nodes

    run(env, "stake", "unbond", "100", "--key", str(tmp_path / "w1.json"))
    out = run(env, "stake", "withdraw", "--key", str(tmp_path / "w1.json"), code=1)
    assert "StillUnbonding (707)" in out and "slashable until epoch 2" in out
    verified = json.loads(run(env, "ledger", "verify", "--json"))
    assert verified["ok"] and verified["entries"] == 8


def test_refusals_exit_1_with_the_typed_error(env: dict[str, str], tmp_path: Path) -> None:
    setup_ledger(env, tmp_path)
    stranger = tmp_path / "stranger.json"
    save_keystore(T.identity("cli-stranger"), stranger, "pw", kdf_iterations=2)
    assert "UnknownNode (701)" in run(env, "stake", "deposit", "5", "--key", str(stranger), code=1)
    assert "InsufficientStake (705)" in run(
        env, "stake", "unbond", "1eth", "--key", str(tmp_path / "w1.json"), code=1
    )
    assert "AlreadyRegistered" in run(
        env,
        "register",
        "--role",
        "relay",
        "--accelerator",
        "cpu",
        "--count",
        "1",
        "--memory-gb",
        "1",
        "--key",
        str(tmp_path / "w1.json"),
        code=1,
    )
    assert "--key" in run(env, "stake", "withdraw", code=2)
    assert "wrong password" in run(
        {**env, "SWARMNODE_PASSWORD": "nope"}, "stake", "withdraw", "--key", str(tmp_path / "w1.json"), code=1
    )
    assert "already exists" in run(env, "ledger", "deploy", code=1)
    assert "signed:PATH or evm:URL" in run({**env, "SWARMNODE_LEDGER": "sqlite:x"}, "ledger", "nodes", code=1)
    missing = {**env, "SWARMNODE_LEDGER": f"signed:{tmp_path / 'missing.db'}"}
    assert "ledger deploy" in run(missing, "ledger", "nodes", code=1)


def test_verify_names_the_first_bad_entry(env: dict[str, str], tmp_path: Path) -> None:
    setup_ledger(env, tmp_path)
    with sqlite3.connect(tmp_path / "ledger.db") as conn:
        conn.execute("UPDATE entries SET epoch = epoch, data = data || x'00' WHERE idx = 2")
    out = run(env, "ledger", "verify", code=1)
    assert "entry 2" in out
    report = json.loads(
        CliRunner().invoke(main, ["ledger", "verify", "--json"], env=env).output.splitlines()[0]
    )
    assert report["first_bad_entry"] == 2 and not report["ok"]


def test_verify_reports_a_deleted_last_entry_as_truncation(env: dict[str, str], tmp_path: Path) -> None:
    setup_ledger(env, tmp_path)
    ok = json.loads(run(env, "ledger", "verify", "--json"))
    assert ok["ok"] and ok["signed_head"] == {
        "entries": 4,
        "head": ok["head"],
        "signer": W1.checksum_address,  # the last entry is W1's deposit
    }
    assert f"head signed by {W1.checksum_address}" in run(env, "ledger", "verify")
    with sqlite3.connect(tmp_path / "ledger.db") as conn:
        conn.execute("DELETE FROM entries WHERE idx = 3")
    out = run(env, "ledger", "verify", code=1)
    assert "log is truncated" in out and "entries 3..3 are missing" in out
    report = json.loads(
        CliRunner().invoke(main, ["ledger", "verify", "--json"], env=env).output.splitlines()[0]
    )
    assert report["truncated"] and report["first_bad_entry"] == 3 and report["entries"] == 3


@pytest.mark.parametrize(
    ("text", "gwei"),
    [
        ("1500", 1500),
        ("1500gwei", 1500),
        ("0.5eth", 500_000_000),
        ("2 ether", 2_000_000_000),
        ("0.000000001ETH", 1),
    ],
)
def test_amounts(text: str, gwei: int) -> None:
    assert parse_amount(text) == gwei


@pytest.mark.parametrize("text", ["0", "1.5", "0.0000000001eth", "-3", "abc", "5 wei"])
def test_bad_amounts(text: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_amount(text)

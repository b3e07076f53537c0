"""Multi-process tests on a real anvil node: CLI processes deploy, register and stake concurrently; a
validator process records contributions; anvil restarts from its --state file and the ledger is intact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crypto.identity import NodeIdentity
from crypto.keystore import save_keystore
from ledger import testing as T
from ledger.testing import AnvilProcess

pytestmark = pytest.mark.slow

PROJECT = Path(__file__).resolve().parents[2]
# anvil's first pre-funded development account (public, from its default mnemonic)
ANVIL_KEY_0 = bytes.fromhex("ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80")

VALIDATOR_SCRIPT = """
import sys
from ledger.evm import EvmLedger
from ledger import testing as T
ledger = EvmLedger.connect(sys.argv[1], sys.argv[2])
val, worker = T.identity("anvil-val"), T.identity("anvil-w")
for nonce in range(int(sys.argv[3])):
    ledger.record_contribution(val, T.contribution(val, worker, nonce=nonce, run="run-a"))
print(len(ledger.contributions(run="run-a")))
"""


def cli(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "node.cli_ledger", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT,
        timeout=120,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def spawn(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "node.cli_ledger", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=PROJECT,
    )


def test_processes_share_an_anvil_ledger_that_survives_a_restart(anvil_binary: str, tmp_path: Path) -> None:
    from web3 import Web3

    keys = {"deployer": NodeIdentity(ANVIL_KEY_0), "val": T.identity("anvil-val"), "w": T.identity("anvil-w")}
    for name, identity in keys.items():
        save_keystore(identity, tmp_path / f"{name}.json", "pw", kdf_iterations=2)
    state = tmp_path / "anvil-state.json"
    base_env = {**os.environ, "PYTHONPATH": str(PROJECT), "SWARMNODE_PASSWORD": "pw"}

    with AnvilProcess(anvil_binary, state=state) as node:
        w3 = Web3(Web3.HTTPProvider(node.url))
        for identity in (keys["val"], keys["w"]):
            w3.eth.wait_for_transaction_receipt(
                w3.eth.send_transaction(
                    {"from": w3.eth.accounts[0], "to": identity.checksum_address, "value": 10**19}
                )
            )
        env = {**base_env, "SWARMNODE_LEDGER": f"evm:{node.url}"}
        deployed = json.loads(
            cli(
                "ledger",
                "deploy",
                "--min-stake-per-unit",
                "0.01eth",
                "--slash-amount",
                "0.005eth",
                "--key",
                str(tmp_path / "deployer.json"),
                "--json",
                env=env,
            ).stdout
        )
        env["SWARMNODE_CONTRACT"] = deployed["contract"]
        assert json.loads(cli("ledger", "verify", "--json", env=env).stdout)["ok"]

        # two operators at once, each in its own process
        procs = [
            spawn(
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
                env=env,
            ),
            spawn(
                "register",
                "--role",
                "worker",
                "--accelerator",
                "h100",
                "--count",
                "2",
                "--memory-gb",
                "80",
                "--key",
                str(tmp_path / "w.json"),
                env=env,
            ),
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
        procs = [
            spawn("stake", "deposit", "0.01eth", "--key", str(tmp_path / "val.json"), env=env),
            spawn("stake", "deposit", "0.02eth", "--key", str(tmp_path / "w.json"), env=env),
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err

        refused = cli("stake", "withdraw", "--key", str(tmp_path / "w.json"), env=env, check=False)
        assert refused.returncode == 1 and "NothingToWithdraw" in refused.stderr

        validator = subprocess.run(
            [sys.executable, "-c", VALIDATOR_SCRIPT, node.url, deployed["contract"], "5"],
            capture_output=True,
            text=True,
            env=base_env,
            cwd=PROJECT,
            timeout=120,
        )
        assert validator.returncode == 0, validator.stderr
        assert validator.stdout.strip() == "5"
        before = {
            q: json.loads(cli("ledger", q, "--json", env=env).stdout)
            for q in ("nodes", "stakes", "contributions", "slashes")
        }

    assert state.exists(), "anvil did not write its --state file on shutdown"
    with AnvilProcess(anvil_binary, state=state) as node:  # a fresh process, loading the saved chain
        env = {**base_env, "SWARMNODE_LEDGER": f"evm:{node.url}", "SWARMNODE_CONTRACT": deployed["contract"]}
        after = {
            q: json.loads(cli("ledger", q, "--json", env=env).stdout)
            for q in ("nodes", "stakes", "contributions", "slashes")
        }
        assert after["nodes"] == before["nodes"]
        assert after["contributions"] == before["contributions"]
        # the two operators registered concurrently, so list order is whichever mined first: match by address
        bonded = {s["address"]: s["bonded_gwei"] for s in after["stakes"]["stakes"]}
        assert bonded == {keys["val"].checksum_address: 10_000_000, keys["w"].checksum_address: 20_000_000}
        assert after["contributions"]["total_tokens"] == 500
        status = json.loads(
            cli("stake", "status", "--key", str(tmp_path / "w.json"), "--json", env=env).stdout
        )
        assert status["stake"]["eligible"] is True

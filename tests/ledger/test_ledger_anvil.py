"""Tests on a real anvil node. Multi-process: CLI processes deploy, register and stake concurrently; a
validator process commits batches of credits; anvil restarts from its --state file and the ledger is
intact. Real time: a batch and a slash's challenge window run on anvil's own block timestamps.

The conformance vectors on anvil (both backends in lockstep) are `test_backends_agree_on_anvil` in
test_ledger_conformance.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.crypto.keystore import save_keystore
from swarmnode.ledger import errors as E
from swarmnode.ledger.batches import credit_leaf, credits_root
from swarmnode.ledger.state import worker_totals
from swarmnode.ledger.types import Params
from swarmnode.testing import ledger as T
from swarmnode.testing.ledger import AnvilProcess

pytestmark = pytest.mark.slow

PROJECT = Path(__file__).resolve().parents[2]
# anvil's first pre-funded development account (public, from its default mnemonic)
ANVIL_KEY_0 = bytes.fromhex("ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80")

VALIDATOR_SCRIPT = """
import sys
from swarmnode.ledger.evm import EvmLedger
from swarmnode.testing import ledger as T
ledger = EvmLedger.connect(sys.argv[1], sys.argv[2])
trainer, val, worker = T.identity("anvil-tr"), T.identity("anvil-val"), T.identity("anvil-w")
ledger.register(trainer, "trainer", T.compute())
ledger.deposit(trainer, 10_000_000)  # a run's owner is a staked trainer
ledger.register_run(trainer, T.register_run("run-a", (val,)))
count = int(sys.argv[3])
for first in range(0, count, 2):  # batches of two credits, the last maybe of one
    batch = T.batch("run-a", *(T.credit(worker, nonce=n) for n in range(first, min(first + 2, count))))
    ledger.commit_credits(val, batch)
print(len(ledger.contributions(run="run-a")), len(ledger.batches("run-a")))
"""


def cli(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "swarmnode.node.cli.ledger", *args],
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
        [sys.executable, "-m", "swarmnode.node.cli.ledger", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=PROJECT,
    )


def test_processes_share_an_anvil_ledger_that_survives_a_restart(anvil_binary: str, tmp_path: Path) -> None:
    from web3 import Web3

    keys = {"deployer": NodeIdentity(ANVIL_KEY_0), "val": T.identity("anvil-val"), "w": T.identity("anvil-w")}
    trainer = T.identity("anvil-tr")
    for name, identity in keys.items():
        save_keystore(identity, tmp_path / f"{name}.json", "pw", kdf_iterations=2)
    state = tmp_path / "anvil-state.json"
    base_env = {**os.environ, "PYTHONPATH": str(PROJECT), "SWARMNODE_PASSWORD": "pw"}

    with AnvilProcess(anvil_binary, state=state) as node:
        w3 = Web3(Web3.HTTPProvider(node.url))
        for identity in (keys["val"], keys["w"], trainer):
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
        assert validator.stdout.split() == ["5", "3"]
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
        assert bonded == {
            keys["val"].checksum_address: 10_000_000,
            keys["w"].checksum_address: 20_000_000,
            trainer.checksum_address: 10_000_000,
        }
        assert after["contributions"]["total_tokens"] == 500
        status = json.loads(
            cli("stake", "status", "--key", str(tmp_path / "w.json"), "--json", env=env).stdout
        )
        assert status["stake"]["eligible"] is True


def test_a_batch_and_a_challenge_window_on_anvils_clock(anvil_binary: str) -> None:
    """A fresh anvil, so block timestamps are its wall clock (the shared one was moved by the vectors):
    one transaction credits a batch; a slash is final only once its window has passed in block time."""
    params = Params(
        min_stake_per_unit_gwei=1_000,
        unbonding_delay_epochs=2,
        slash_gwei=400,
        ejection_threshold=3,
        epoch_seconds=8,  # room for a few blocks: anvil stamps blocks mined within a second a second apart
    )
    trainer, val, worker = T.identity("clock-tr"), T.identity("clock-val"), T.identity("clock-w")
    with AnvilProcess(anvil_binary) as node:
        harness = T.EvmHarness.anvil(node.url, params)
        ledger = harness.ledger
        harness.fund(trainer, val, worker)
        for who, role in ((trainer, "trainer"), (val, "validator"), (worker, "worker")):
            ledger.register(who, role, T.compute())
            ledger.deposit(who, 1_000)
        ledger.register_run(trainer, T.register_run("run-t", (val,), window=1))

        credits = [T.credit(worker, nonce=n, tokens=10 + n) for n in range(5)]
        receipt = ledger.commit_credits(val, T.batch("run-t", *credits))
        (batch,) = ledger.batches("run-t")
        assert (batch.count, batch.epoch, batch.root) == (
            5,
            receipt.epoch,
            credits_root([credit_leaf(c) for c in credits]),
        )
        assert ledger.totals("run-t") == worker_totals(ledger.contributions(run="run-t"))
        for record in ledger.contributions(run="run-t"):
            proof = ledger.prove_credit(record.index)
            assert ledger.check_credit_proof(proof) and ledger.is_credited(
                "run-t", worker.address, record.step
            )

        def wait_for_epoch_start(epoch: int) -> None:
            """Sleep until `epoch` has begun by the wall clock, then mine an empty block as a live chain would
            (anvil mines only on a transaction, and calls run against the latest block's timestamp). A block
            is stamped with the wall clock, or a second after its parent when blocks came faster."""
            start = ledger.genesis_time + epoch * params.epoch_seconds + 0.5
            time.sleep(max(0.0, start - time.time()))
            harness.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]
            assert ledger.current_epoch() == epoch

        wait_for_epoch_start(ledger.current_epoch() + 1)  # the epoch after the latest block's
        filed = ledger.slash(val, T.slash(worker, 300, nonce=1, run="run-t"))
        (record,) = ledger.slashes()
        assert (record.status, record.epoch, record.final_epoch) == ("pending", filed.epoch, filed.epoch + 1)
        with pytest.raises(E.ChallengeWindowOpen):  # the same epoch: a block stamped within the window
            ledger.finalize_slash(worker, 0)
        ledger.slash(val, T.slash(worker, 100, nonce=2, run="run-t"))
        ledger.void_slash(trainer, 1)  # within the window: the owner voids, at no one's cost
        wait_for_epoch_start(record.final_epoch)
        with pytest.raises(E.ChallengeWindowClosed):
            ledger.void_slash(trainer, 0)
        finalized = ledger.finalize_slash(worker, 0)
        assert finalized.epoch == record.final_epoch
        final, voided = ledger.slashes()
        assert (final.status, final.taken_gwei, voided.status, voided.penalty_gwei) == (
            "final",
            300,
            "voided",
            0,
        )
        assert ledger.stake(worker.address).bonded_gwei == 700
        assert ledger.stake(val.address).bonded_gwei == 1000


def test_an_idle_devnet_chain_keeps_its_epochs_moving(anvil_binary: str, tmp_path: Path) -> None:
    """The devnet's anvil mines only on a transaction: with none, the contract's epoch stood still and a
    slash's challenge window never passed. `keep_time` (the devnet loop calls it twice a second) mines an
    empty block once the newest is a second old, so the epochs follow the wall clock."""
    from swarmnode.node.devnet.rl import DEVNET_PARAMS, DevnetLedger

    ledger = DevnetLedger("evm", tmp_path)
    ledger.create()
    try:
        chain = ledger.harness.ledger
        start = chain.current_epoch()
        deadline = time.monotonic() + 3 * DEVNET_PARAMS.epoch_seconds + 10
        while chain.current_epoch() < start + 2:
            assert time.monotonic() < deadline, "the idle chain's epoch did not advance"
            ledger.keep_time()
            time.sleep(0.5)  # the devnet loop's period
        idle = chain.current_epoch()
        time.sleep(2 * DEVNET_PARAMS.epoch_seconds)  # without keep_time, nothing mines: the epoch stands
        assert chain.current_epoch() == idle
    finally:
        ledger.stop()

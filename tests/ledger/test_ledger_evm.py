"""EvmLedger on web3's in-process EthereumTesterProvider: the artifact, real money, replays, events."""

from __future__ import annotations

import json

import pytest

from crypto.hashing import sha256
from ledger import errors as E
from ledger import testing as T
from ledger.artifact import ARTIFACT, COMPILER_VERSION, EVM_VERSION, SOURCE, compile_contract, load_artifact
from ledger.evm import assignment_key
from ledger.types import WEI_PER_GWEI, Params

PARAMS = Params(
    min_stake_per_unit_gwei=1_000,
    unbonding_delay_epochs=2,
    slash_gwei=400,
    ejection_threshold=2,
    epoch_seconds=1_000,
)
VAL, W1 = T.identity("val"), T.identity("w1")


@pytest.fixture(scope="module")
def harness():
    """One deployment for the module; tests only add to it."""
    h = T.EvmHarness.tester(PARAMS)
    h.fund(VAL, W1)
    h.ledger.register(VAL, "validator", T.compute())
    h.ledger.register(W1, "worker", T.compute(2))
    h.ledger.deposit(VAL, 1_000)
    h.ledger.deposit(W1, 2_500)
    return h


def test_recompiling_the_contract_gives_the_committed_artifact() -> None:
    committed = json.loads(ARTIFACT.read_text())
    rebuilt = compile_contract()
    assert rebuilt["bytecode"] == committed["bytecode"]
    assert rebuilt["bytecode_runtime"] == committed["bytecode_runtime"]
    assert rebuilt["abi"] == committed["abi"]
    assert committed["source_sha256"] == sha256(SOURCE.read_bytes()).hex()
    assert (committed["compiler_version"], committed["evm_version"]) == (COMPILER_VERSION, EVM_VERSION)
    assert f"# pragma evm-version {EVM_VERSION}" in SOURCE.read_text()


def test_deployed_code_is_the_artifact(harness) -> None:
    code = bytes(harness.w3.eth.get_code(harness.ledger.address))
    runtime = bytes.fromhex(load_artifact()["bytecode_runtime"].removeprefix("0x"))
    assert code.startswith(runtime)  # Vyper appends the immutables (the parameters) after the code
    assert harness.ledger.params == PARAMS


def test_stake_is_real_native_currency(harness) -> None:
    w3, ledger = harness.w3, harness.ledger
    assert w3.eth.get_balance(ledger.address) == 3_500 * WEI_PER_GWEI
    ledger.unbond(W1, 500)
    harness.advance_to(ledger.current_epoch() + PARAMS.unbonding_delay_epochs)
    before = w3.eth.get_balance(W1.checksum_address)
    receipt = ledger.withdraw(W1)
    tx = w3.eth.get_transaction_receipt(receipt.ref)
    fee = tx["gasUsed"] * tx["effectiveGasPrice"]
    assert w3.eth.get_balance(W1.checksum_address) == before + 500 * WEI_PER_GWEI - fee
    assert w3.eth.get_balance(ledger.address) == 3_000 * WEI_PER_GWEI
    ledger.deposit(W1, 500)


def test_deposits_must_be_whole_gwei(harness) -> None:
    """The contract itself refuses dust, whatever client sends it."""
    call = harness.ledger.contract.functions.deposit()
    with pytest.raises(Exception, match="invalid_amount"):
        call.call({"from": W1.checksum_address, "value": WEI_PER_GWEI + 1})


def test_a_replayed_transaction_is_refused(harness) -> None:
    ledger = harness.ledger
    raw = ledger.sign_transaction(W1, ledger.contract.functions.unbond(1), what="stake_unbond")
    ledger.send_raw_transaction(raw, what="stake_unbond", sender=W1.address)
    before = harness.fingerprint()
    with pytest.raises(E.ReplayedOperation):
        ledger.send_raw_transaction(raw, what="stake_unbond", sender=W1.address)
    assert harness.fingerprint() == before
    ledger.deposit(W1, 1)


def test_events_are_in_the_receipts(harness) -> None:
    ledger = harness.ledger
    op = T.contribution(VAL, W1, nonce=900, tokens=77)
    receipt = ledger.record_contribution(VAL, op)
    tx = harness.w3.eth.get_transaction_receipt(receipt.ref)
    (event,) = ledger.contract.events.ContributionRecorded().process_receipt(tx)
    assert event["args"]["rollout_digest"] == op.rollout_digest
    assert event["args"]["worker"] == W1.checksum_address
    record = ledger.contributions()[event["args"]["index"]]
    assert (record.tokens, record.verdict_digest) == (77, sha256(op.verdict))


def test_refusal_messages_name_the_rule(harness) -> None:
    with pytest.raises(E.InsufficientStake, match=r"insufficient_stake \(its stake: \d+ gwei bonded"):
        harness.ledger.unbond(W1, 10**6)
    nobody = T.identity("nobody")
    with pytest.raises(E.BackendError, match="insufficient funds"):
        harness.ledger.withdraw(nobody)  # py-evm checks gas money even in eth_call
    harness.fund(nobody)
    with pytest.raises(E.UnknownNode, match="unknown_node"):
        harness.ledger.withdraw(nobody)


def test_the_contract_trusts_the_validator_for_evidence(harness) -> None:
    """Documented trust boundary (spec/ledger.md, Trust): the contract stores the digest a staked
    validator names; the client refuses bad evidence, a hand-made transaction would not be refused."""
    ledger = harness.ledger
    op = T.slash(W1, 400, nonce=901)
    bogus = T.slash(T.identity("someone-else"), 400, nonce=901)
    with pytest.raises(E.InvalidEvidence):
        ledger.slash(VAL, type(op)(**{**op.__dict__, "evidence": bogus.evidence}))
    call = ledger.contract.functions.slash(op.run, W1.checksum_address, 1, sha256(b"anything"), [0], 605)
    call.call({"from": VAL.checksum_address})  # would be accepted: the validator is accountable for it
    with pytest.raises(Exception, match="wrong_role"):
        call.call({"from": W1.checksum_address})


def test_the_contract_pays_an_assignment_once(harness) -> None:
    """On chain, not only in the client: a hand-made transaction for a credited assignment reverts."""
    ledger = harness.ledger
    step = T.assignment_step(3, 9)
    first = T.contribution(VAL, W1, nonce=700, step=step)
    resealed = T.contribution(VAL, W1, nonce=701, step=step)  # the same assignment, another digest
    assert first.rollout_digest != resealed.rollout_digest
    assert not ledger.contract.functions.assignments(assignment_key(first)).call()
    ledger.record_contribution(VAL, first)
    assert ledger.contract.functions.assignments(assignment_key(first)).call()
    assert assignment_key(resealed) == assignment_key(first)
    with pytest.raises(E.DuplicateContribution, match=r"assignment \(run 'run-1', .*version 3, counter 9\)"):
        ledger.record_contribution(VAL, resealed)
    call = ledger.contract.functions.record_contribution(
        resealed.run,
        resealed.step,
        W1.checksum_address,
        resealed.tokens,
        resealed.flops,
        resealed.rollout_digest,
        sha256(resealed.verdict),
    )
    with pytest.raises(Exception, match="duplicate_assignment"):
        call.call({"from": VAL.checksum_address})

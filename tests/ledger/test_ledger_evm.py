"""EvmLedger on web3's in-process EthereumTesterProvider: the artifact, real money, replays, and what the
contract itself refuses when a hand-made transaction bypasses the client (peer ids, slash signatures,
credit order), batch proofs checked by the contract's view, the assignment bitmap, gas per credit."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from eth_account import Account
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.crypto.hashing import keccak256, sha256
from swarmnode.crypto.identity import format_address
from swarmnode.ledger import errors as E
from swarmnode.ledger.artifact import (
    ARTIFACT,
    COMPILER_VERSION,
    EVM_VERSION,
    SOURCE,
    compile_contract,
    load_artifact,
)
from swarmnode.ledger.batches import credit_leaf, credit_path, credit_slot, credits_root, root_from_path
from swarmnode.ledger.evidence import cite_submission
from swarmnode.ledger.evm import commit_gas, public_key_64
from swarmnode.ledger.types import WEI_PER_GWEI, Params
from swarmnode.protocol.runs import assignment_step
from swarmnode.testing import ledger as T

PARAMS = Params(
    min_stake_per_unit_gwei=1_000,
    unbonding_delay_epochs=2,
    slash_gwei=400,
    ejection_threshold=2,
    epoch_seconds=1_000,
)
RUN = "run-1"
OWNER, VAL, VAL2, W1, W2 = (T.identity(n) for n in ("owner", "val", "val2", "w1", "w2"))
STRANGER = T.identity("stranger")


@pytest.fixture(scope="module")
def harness():
    """One deployment for the module, with a run validated by VAL and VAL2; tests only add to it."""
    h = T.EvmHarness.tester(PARAMS)
    h.fund(OWNER, VAL, VAL2, W1, W2, STRANGER)
    for who, role, units in ((OWNER, "trainer", 1), (VAL, "validator", 1), (VAL2, "validator", 1)):
        h.ledger.register(who, role, T.compute(units))
        h.ledger.deposit(who, 1_000)
    h.ledger.register(W1, "worker", T.compute(2))
    h.ledger.deposit(W1, 2_500)
    h.ledger.register(W2, "worker", T.compute())
    h.ledger.deposit(W2, 1_000)
    h.ledger.register_run(OWNER, T.register_run(RUN, (VAL, VAL2), window=2, max_tokens=1_000))
    return h


def send_raw(harness, identity, call, gas: int = 2_000_000) -> int:
    """Sign and send a transaction straight to the chain, no client preflight; returns its status."""
    w3 = harness.w3
    tx = call.build_transaction(
        {
            "from": identity.checksum_address,
            "gas": gas,
            "gasPrice": w3.eth.gas_price,
            "nonce": w3.eth.get_transaction_count(identity.checksum_address),
            "chainId": w3.eth.chain_id,
        }
    )
    raw = Account.sign_transaction(tx, identity.private_key).raw_transaction
    return int(w3.eth.wait_for_transaction_receipt(w3.eth.send_raw_transaction(raw))["status"])


def credit_tuples(op) -> list[tuple]:
    return [(format_address(c.worker), c.step, c.tokens, c.flops, c.rollout_digest) for c in op.credits]


def test_recompiling_the_contract_gives_the_committed_artifact() -> None:
    committed = json.loads(ARTIFACT.read_text())
    rebuilt = compile_contract()
    assert rebuilt["bytecode"] == committed["bytecode"]
    assert rebuilt["bytecode_runtime"] == committed["bytecode_runtime"]
    assert rebuilt["abi"] == committed["abi"]
    assert committed["source_sha256"] == sha256(SOURCE.read_bytes()).hex()
    assert (committed["compiler_version"], committed["evm_version"]) == (COMPILER_VERSION, EVM_VERSION)
    assert f"# pragma evm-version {EVM_VERSION}" in SOURCE.read_text()
    runtime = bytes.fromhex(committed["bytecode_runtime"].removeprefix("0x"))
    immutables = 32 * SOURCE.read_text().count("immutable(")  # appended to the code at deployment
    # EIP-170: deployed code above 24,576 bytes cannot be deployed (the deployment runs out of gas)
    assert len(runtime) + immutables <= 24_576, f"{len(runtime) + immutables} bytes deployed"


def test_deployed_code_is_the_artifact(harness) -> None:
    code = bytes(harness.w3.eth.get_code(harness.ledger.address))
    runtime = bytes.fromhex(load_artifact()["bytecode_runtime"].removeprefix("0x"))
    assert code.startswith(runtime)  # Vyper appends the immutables (the parameters) after the code
    assert harness.ledger.params == PARAMS


def test_stake_is_real_native_currency(harness) -> None:
    w3, ledger = harness.w3, harness.ledger
    start = w3.eth.get_balance(ledger.address)
    ledger.unbond(W1, 500)
    harness.advance_to(ledger.current_epoch() + PARAMS.unbonding_delay_epochs)
    before = w3.eth.get_balance(W1.checksum_address)
    receipt = ledger.withdraw(W1)
    tx = w3.eth.get_transaction_receipt(receipt.ref)
    fee = tx["gasUsed"] * tx["effectiveGasPrice"]
    assert w3.eth.get_balance(W1.checksum_address) == before + 500 * WEI_PER_GWEI - fee
    assert w3.eth.get_balance(ledger.address) == start - 500 * WEI_PER_GWEI
    ledger.deposit(W1, 500)
    money = ledger.money()
    assert money["balance_wei"] == (money["deposited_gwei"] - money["withdrawn_gwei"]) * WEI_PER_GWEI
    assert money["withdrawn_gwei"] >= 500


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


def test_refusal_messages_name_the_rule(harness) -> None:
    with pytest.raises(E.InsufficientStake, match=r"insufficient_stake \(its stake: \d+ gwei bonded"):
        harness.ledger.unbond(W1, 10**6)
    nobody = T.identity("nobody")
    with pytest.raises(E.BackendError, match="insufficient funds"):
        harness.ledger.withdraw(nobody)  # py-evm checks gas money even in eth_call
    harness.fund(nobody)
    with pytest.raises(E.UnknownNode, match="unknown_node"):
        harness.ledger.withdraw(nobody)


def test_the_contract_binds_the_peer_id_to_the_sender(harness) -> None:
    """A raw registration presenting another node's public key reverts on chain; the stored peer id is
    the one derived from the sender's own key, in libp2p's text form."""
    ledger = harness.ledger
    theirs = ledger.contract.functions.register(3, "cpu", 1, 16, 0, public_key_64(W1))
    with pytest.raises(Exception, match="peer_id_mismatch"):
        theirs.call({"from": STRANGER.checksum_address})
    assert send_raw(harness, STRANGER, theirs) == 0
    assert ledger.node(STRANGER.address) is None
    with pytest.raises(E.PeerIdMismatch):
        ledger.register(STRANGER, "worker", T.compute(), peer_id=W1.peer_id)
    assert ledger.node(W1.address).peer_id == W1.peer_id
    with pytest.raises(E.AlreadyRegistered):  # the state machine's order: registered before peer id
        ledger.register(W1, "worker", T.compute(), peer_id=W2.peer_id)


def _raw_slash_call(harness, op, **citation):
    cited = replace(cite_submission(op), **citation)
    return harness.ledger.contract.functions.slash(
        op.run,
        format_address(op.worker),
        op.amount_gwei,
        list(op.failing_chunks),
        op.reason_code,
        cited.seq,
        cited.ts,
        cited.body_hash,
        cited.sig,
    )


def test_the_contract_checks_the_workers_signature(harness) -> None:
    """Sent raw, a slash citing a forged signature, another worker's submission or another body reverts
    `invalid_evidence` on chain; the genuine citation passes the same call."""
    ledger = harness.ledger
    op = T.slash(W1, 400, nonce=901)
    genuine = cite_submission(op)
    forged = T.identity("forger").sign(genuine.digest)
    others = T.slash(W2, 400, nonce=901)
    high_s = bytearray(genuine.sig)  # the malleable twin: s -> n - s, v flipped
    n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141
    high_s[32:64] = (n - int.from_bytes(genuine.sig[32:64], "big")).to_bytes(32, "big")
    high_s[64] = 55 - genuine.sig[64]
    bad_calls = {
        "forged signature": _raw_slash_call(harness, op, sig=forged),
        "another worker's submission": _raw_slash_call(harness, replace(others, worker=W1.address)),
        "another body": _raw_slash_call(harness, op, body_hash=keccak256(b"another body")),
        "another seq": _raw_slash_call(harness, op, seq=genuine.seq + 1),
        "high s": _raw_slash_call(harness, op, sig=bytes(high_s)),
        "short signature": _raw_slash_call(harness, op, sig=genuine.sig[:64]),
    }
    for name, call in bad_calls.items():
        with pytest.raises(Exception, match="invalid_evidence"):
            call.call({"from": VAL.checksum_address})
        assert send_raw(harness, VAL, call) == 0, name
    _raw_slash_call(harness, op).call({"from": VAL.checksum_address})
    with pytest.raises(Exception, match="wrong_role"):
        _raw_slash_call(harness, op).call({"from": OWNER.checksum_address})
    assert all(s.submission_digest != genuine.digest for s in ledger.slashes())


def test_a_slash_cites_its_evidence_in_its_event(harness) -> None:
    """The citation is read back from the Slashed event; a pending slash holds both parties' stake."""
    ledger = harness.ledger
    ledger.unbond(W2, 1)
    harness.advance_to(ledger.current_epoch() + PARAMS.unbonding_delay_epochs)
    op = T.slash(W2, 100, nonce=902, failing_chunks=(0, 5))
    ledger.slash(VAL, op)
    (record,) = [s for s in ledger.slashes() if s.worker == W2.address]
    assert ledger.slash_citation(record.index) == cite_submission(op)
    assert (record.status, record.final_epoch) == ("pending", record.epoch + 2)
    with pytest.raises(E.SlashPending, match="party to 1 pending slashes"):
        ledger.withdraw(W2)
    ledger.void_slash(OWNER, record.index)
    voided = ledger.slashes()[record.index]
    assert (voided.status, voided.penalty_gwei, voided.votes) == ("voided", 0, 0)  # the owner's: free
    ledger.withdraw(W2)
    ledger.deposit(W2, 1)
    money = ledger.money()
    assert money["deposited_gwei"] - money["withdrawn_gwei"] == money["held_gwei"] + money["burned_gwei"]
    assert money["burned_gwei"] == 0


def test_credit_proofs_are_checked_by_the_contract(harness) -> None:
    """`verify_credit` accepts every leaf of a batch with its path and refuses a tampered leaf or path."""
    ledger = harness.ledger
    op = T.batch(RUN, *(T.credit(w, nonce=300 + i, tokens=10 + i) for w in (W1, W2) for i in range(5)))
    ledger.commit_credits(VAL, op)
    (batch,) = [b for b in ledger.batches(RUN) if b.count == 10]
    assert ledger.batch_credits(batch.index) == op.credits
    leaves = [credit_leaf(c) for c in op.credits]
    assert batch.root == credits_root(leaves)
    verify = ledger.contract.functions.verify_credit
    for i, credit in enumerate(op.credits):
        proof = ledger.prove_credit(batch.first_contribution + i)
        assert (proof.credit, proof.leaf_index, proof.path) == (credit, i, credit_path(leaves, i))
        assert ledger.check_credit_proof(proof)
        assert not ledger.check_credit_proof(replace(proof, credit=replace(credit, tokens=credit.tokens + 1)))
        assert not ledger.check_credit_proof(replace(proof, leaf_index=(i + 1) % 10))
        assert not ledger.check_credit_proof(replace(proof, path=proof.path[:-1]))
        assert not ledger.check_credit_proof(replace(proof, path=(*proof.path, bytes(32))))
        assert not ledger.check_credit_proof(replace(proof, validator=VAL2.address))
        bent = (keccak256(proof.path[0]), *proof.path[1:])
        args = (
            format_address(credit.worker),
            credit.step,
            credit.tokens,
            credit.flops,
            credit.rollout_digest,
        )
        assert not verify(batch.index, *args, i, list(bent)).call()
        assert not verify(batch.index + 1, *args, i, list(proof.path)).call()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    version=st.integers(0, 2**32 - 1),
    counter=st.one_of(st.integers(0, 63), st.integers(64, 2**32 - 1)),
    worker=st.sampled_from([W1.address, W2.address, bytes(20), b"\xff" * 20]),
)
def test_the_assignment_bitmap_is_credit_slot(harness, version, counter, worker) -> None:
    """The contract's `is_credited` and its bitmap slot and bit are `ledger.batches.credit_slot`."""
    step = assignment_step(version, counter)
    f = harness.ledger.contract.functions
    key, bit = credit_slot(RUN, worker, step)
    stored = f.credited(key).call()
    assert f.is_credited(RUN, format_address(worker), step).call() == bool(stored >> bit & 1)


def test_credited_assignments_set_exactly_their_bits(harness) -> None:
    ledger = harness.ledger
    steps = [assignment_step(7, 3), assignment_step(6, 63), assignment_step(7, 64), assignment_step(7, 300)]
    op = T.batch(RUN, *(T.credit(W1, step=s) for s in steps))
    ledger.commit_credits(VAL, op)
    f = ledger.contract.functions
    for s in steps:
        key, bit = credit_slot(RUN, W1.address, s)
        assert f.credited(key).call() >> bit & 1 == 1
        assert ledger.is_credited(RUN, W1.address, s)
    assert not ledger.is_credited(RUN, W1.address, assignment_step(7, 4))
    assert not ledger.is_credited(RUN, W2.address, steps[0])
    with pytest.raises(E.DuplicateContribution, match=r"version 7, counter 300"):
        ledger.commit_credits(VAL2, T.batch(RUN, T.credit(W1, step=steps[3], digest=bytes(32))))


def test_the_contract_orders_a_batchs_refusals_as_the_state_machine(harness) -> None:
    """Out-of-order credits outrank any credit's own failure, before or after it; the first failing
    credit names the error; an unknown run outranks both. Checked on raw calls, no client."""
    f = harness.ledger.contract.functions
    unknown = T.credit(STRANGER, nonce=1)
    good = [T.credit(W1, nonce=400), T.credit(W2, nonce=400)]
    ordered = T.batch(RUN, unknown, *good)
    disordered = list(reversed(credit_tuples(ordered)))
    who = {"from": VAL.checksum_address}
    with pytest.raises(Exception, match="malformed"):
        f.commit_credits(RUN, disordered).call(who)
    with pytest.raises(Exception, match="unknown_node"):
        f.commit_credits(RUN, credit_tuples(ordered)).call(who)
    with pytest.raises(Exception, match="unknown_run"):
        f.commit_credits("no-such-run", disordered).call(who)
    over = T.batch(RUN, T.credit(W1, nonce=401, tokens=1_001), T.credit(W2, nonce=401))
    with pytest.raises(Exception, match="exceeds_run_bounds"):
        f.commit_credits(RUN, credit_tuples(over)).call(who)
    outsider = T.identity("outsider")  # a staked validator the run's owner did not name
    harness.fund(outsider)
    harness.ledger.register(outsider, "validator", T.compute())
    harness.ledger.deposit(outsider, 1_000)
    with pytest.raises(Exception, match="not_run_validator"):
        f.commit_credits(RUN, credit_tuples(T.batch(RUN, *good))).call({"from": outsider.checksum_address})
    with pytest.raises(E.NotRunValidator):
        harness.ledger.commit_credits(outsider, T.batch(RUN, *good))
    assert send_raw(harness, VAL, f.commit_credits(RUN, disordered)) == 0


def test_a_batch_is_read_back_from_its_calldata(harness) -> None:
    ledger = harness.ledger
    op = T.batch(RUN, T.credit(W2, nonce=500, tokens=7, flops=70), T.credit(W1, nonce=500))
    receipt = ledger.commit_credits(VAL2, op)
    tx = harness.w3.eth.get_transaction_receipt(receipt.ref)
    (event,) = ledger.contract.events.CreditsCommitted().process_receipt(tx)
    index = event["args"]["index"]
    assert ledger.batch_credits(index) == op.credits
    records = [r for r in ledger.contributions(run=RUN) if r.batch == index]
    assert [(r.worker, r.step, r.tokens, r.validator) for r in records] == [
        (c.worker, c.step, c.tokens, VAL2.address) for c in op.credits
    ]
    totals = {t.worker: t for t in ledger.totals(RUN)}
    credited = [r for r in ledger.contributions(run=RUN) if r.worker == W2.address]
    assert (totals[W2.address].credits, totals[W2.address].tokens) == (
        len(credited),
        sum(r.tokens for r in credited),
    )


WORKLOAD_WORKERS, VERSIONS, COUNTERS = 32, 4, 4


def test_gas_per_credit_with_batching() -> None:
    """The issue's workload: 32 workers x 16 credits (4 versions x 4 counters) per batch, fresh versions
    every batch, so a worker's bitmap slot (8 versions) is fresh every other batch. Prints the figures;
    the steady mean over a fresh and a reused slot is the issue's goal (py-evm charges as mainnet does)."""
    h = T.EvmHarness.tester(PARAMS)
    owner, validator = T.identity("gas-owner"), T.identity("gas-validator")
    workers = [T.identity(f"gas-worker-{i}") for i in range(WORKLOAD_WORKERS)]
    h.fund(owner, validator, *workers)
    for who, role in [(owner, "trainer"), (validator, "validator")] + [(w, "worker") for w in workers]:
        h.ledger.register(who, role, T.compute())
        h.ledger.deposit(who, PARAMS.min_stake_per_unit_gwei)
    h.ledger.register_run(owner, T.register_run(RUN, (validator,)))
    used = []
    for index in range(5):
        versions = range(index * VERSIONS, (index + 1) * VERSIONS)
        op = T.batch(
            RUN,
            *(
                T.credit(w, step=assignment_step(v, c), tokens=100 + c)
                for w in workers
                for v in versions
                for c in range(COUNTERS)
            ),
        )
        receipt = h.ledger.commit_credits(validator, op)
        gas = h.w3.eth.get_transaction_receipt(receipt.ref)["gasUsed"]
        assert gas <= commit_gas(op)
        used.append(gas / len(op.credits))
    steady = sum(used[1:]) / len(used[1:])
    later = [round(u) for u in used[1:]]
    print(f"gas per credit: first batch {used[0]:.0f}, then {later}, mean {steady:.0f}")
    assert used[1] == pytest.approx(used[3], rel=0.01) and used[2] == pytest.approx(used[4], rel=0.01)
    assert steady <= 5_000
    assert len(h.ledger.contributions()) == 5 * WORKLOAD_WORKERS * VERSIONS * COUNTERS


def test_root_from_path_is_the_contracts_rule() -> None:
    """Sanity of the reference the contract follows: every leaf of odd and even batches proves."""
    for count in (1, 2, 3, 5, 8, 13):
        leaves = [keccak256(bytes([i])) for i in range(count)]
        root = credits_root(leaves)
        for i in range(count):
            assert root_from_path(leaves[i], i, count, credit_path(leaves, i)) == root


def test_a_transaction_the_chain_reverts_after_its_preflight_keeps_its_typed_error() -> None:
    """The preflight runs on the latest block; the window can close before the transaction is mined.
    The client then replays it at its block for the reason: ChallengeWindowClosed, not BackendError."""
    h = T.EvmHarness.tester(PARAMS)
    owner, validator, worker = T.identity("late-owner"), T.identity("late-val"), T.identity("late-w")
    h.fund(owner, validator, worker)
    for who, role in ((owner, "trainer"), (validator, "validator"), (worker, "worker")):
        h.ledger.register(who, role, T.compute())
        h.ledger.deposit(who, 1_000)
    h.ledger.register_run(owner, T.register_run(RUN, (validator,), window=1))
    h.ledger.slash(validator, T.slash(worker, 300, nonce=1))
    raw = h.ledger.sign_transaction(owner, h.ledger.contract.functions.void_slash(0), what="void_slash")
    h.advance_to(1)  # the window closes between the preflight and the block that mines the void
    with pytest.raises(E.ChallengeWindowClosed, match="challenge_window_closed"):
        h.ledger.send_raw_transaction(raw, what="void_slash", sender=owner.address)
    assert h.ledger.slashes()[0].status == "pending"

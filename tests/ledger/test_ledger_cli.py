"""The ledger CLI on a signed log, in-process through click's runner; the credit-proof documents; the EVM
chain audit's checks over honest and tampered records, and the whole audit on an in-process chain and on
anvil."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.crypto.identity import format_address
from swarmnode.crypto.keystore import save_keystore
from swarmnode.ledger.batches import CreditProof, credit_leaf, credit_path, credits_root
from swarmnode.ledger.errors import NotRunValidator
from swarmnode.ledger.evidence import cite_submission
from swarmnode.ledger.evm_audit import (
    ChainRecords,
    audit_chain,
    audit_records,
    check_batch,
    check_code,
    check_membership,
    fetch_records,
    sets_in_force,
)
from swarmnode.ledger.proofs import (
    PROOF_FORMAT,
    ProofFormatError,
    dump_proof,
    load_proof,
    proof_from_json,
    proof_to_json,
)
from swarmnode.ledger.signedlog import SignedLog
from swarmnode.ledger.types import WEI_PER_GWEI, BatchRecord, Params, RunInfo
from swarmnode.node.cli.ledger import register_commands
from swarmnode.node.cli.ledger_common import parse_amount
from swarmnode.protocol.envelope import signing_digest_of_body_hash
from swarmnode.protocol.ledger_messages import RUN_LIMIT_MAX, Credit, SetRunValidators
from swarmnode.testing import ledger as T

VAL, W1 = T.identity("cli-val"), T.identity("cli-w1")
TR, V2 = T.identity("cli-trainer"), T.identity("cli-v2")


@click.group()
def main() -> None:
    """Stand-in for the node's main group."""


register_commands(main)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    for name, who in (("val", VAL), ("w1", W1), ("tr", TR), ("v2", V2)):
        save_keystore(who, tmp_path / f"{name}.json", "pw", kdf_iterations=2)
    return {"SWARMNODE_PASSWORD": "pw", "SWARMNODE_LEDGER": f"signed:{tmp_path / 'ledger.db'}"}


def run(env: dict[str, str], *args: str, code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), env=env)
    assert result.exit_code == code, result.output
    return result.output


def stdout_of(env: dict[str, str], *args: str, code: int = 0) -> str:
    """Only what the command wrote to stdout (the runner mixes stderr into `output`)."""
    result = CliRunner().invoke(main, list(args), env=env)
    assert result.exit_code == code, result.output
    return result.stdout


def register(env: dict[str, str], tmp_path: Path, name: str, role: str, *extra: str, code: int = 0) -> str:
    return run(
        env,
        "register",
        "--role",
        role,
        "--accelerator",
        "cpu",
        "--count",
        "1",
        "--memory-gb",
        "8",
        *extra,
        "--key",
        str(tmp_path / f"{name}.json"),
        code=code,
    )


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
    register(env, tmp_path, "val", "validator")
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


def setup_runs(env: dict[str, str], tmp_path: Path) -> None:
    """A trainer and a second validator; run-a (VAL, no challenge window), run-b (VAL and V2, 5 epochs)."""
    register(env, tmp_path, "tr", "trainer")
    run(env, "stake", "deposit", "2000", "--key", str(tmp_path / "tr.json"))  # a stake per run it owns
    register(env, tmp_path, "v2", "validator")
    run(env, "stake", "deposit", "1000", "--key", str(tmp_path / "v2.json"))
    bounds = ("--max-tokens", "1000", "--max-flops-per-token", "10000")
    tr_key = ("--key", str(tmp_path / "tr.json"))
    run(
        env,
        "ledger",
        "run",
        "register",
        "run-a",
        "--validator",
        VAL.checksum_address,
        "--challenge-window",
        "0",
        *bounds,
        *tr_key,
    )
    run(
        env,
        "ledger",
        "run",
        "register",
        "run-b",
        "--validator",
        V2.checksum_address,
        "--validator",
        VAL.checksum_address,
        "--challenge-window",
        "5",
        *bounds,
        *tr_key,
    )


def record_work(tmp_path: Path) -> None:
    """What the validator roles do as they validate: commit credit batches and file slashes."""
    with SignedLog.open(tmp_path / "ledger.db") as log:
        log.commit_credits(
            VAL,
            T.batch(
                "run-a",
                T.credit(W1, nonce=0, tokens=10, flops=1000),
                T.credit(W1, nonce=1, tokens=5, flops=500),
            ),
        )
        log.commit_credits(VAL, T.batch("run-b", T.credit(W1, nonce=0, tokens=20, flops=2000)))
        log.slash(VAL, T.slash(W1, 400, nonce=2, run="run-a"))
        log.slash(VAL, T.slash(W1, 100, nonce=3, run="run-b"))


def test_operator_flow_and_queries(env: dict[str, str], tmp_path: Path) -> None:
    setup_ledger(env, tmp_path)
    setup_runs(env, tmp_path)
    record_work(tmp_path)

    nodes = json.loads(run(env, "ledger", "nodes", "--json"))["nodes"]
    assert [(n["address"], n["role"]) for n in nodes] == [
        (VAL.checksum_address, "validator"),
        (W1.checksum_address, "worker"),
        (TR.checksum_address, "trainer"),
        (V2.checksum_address, "validator"),
    ]
    assert nodes[1]["peer_id"] == W1.peer_id
    assert nodes[1]["compute"] == {
        "accelerator": "h100",
        "count": 2,
        "memory_gb": 80,
        "benchmark_gflops": 900000,
    }
    stakes = json.loads(run(env, "ledger", "stakes", "--json"))["stakes"]
    assert [s["bonded_gwei"] for s in stakes] == [
        1000,
        2500,
        2000,
        1000,
    ]  # slashes are pending: nothing taken yet (the trainer's 2000 backs its two runs)

    runs = json.loads(run(env, "ledger", "run", "show", "--json"))["runs"]
    assert [(r["run"], r["owner"], r["challenge_window_epochs"]) for r in runs] == [
        ("run-a", TR.checksum_address, 0),
        ("run-b", TR.checksum_address, 5),
    ]
    assert runs[1]["validators"] == [format_address(a) for a in sorted((VAL.address, V2.address))]
    only_b = json.loads(run(env, "ledger", "run", "show", "run-b", "--json"))["runs"]
    assert only_b == runs[1:]

    contributions = json.loads(run(env, "ledger", "contributions", "--json"))["contributions"]
    assert [(c["index"], c["batch"], c["run"], c["tokens"]) for c in contributions] == [
        (0, 0, "run-a", 10),
        (1, 0, "run-a", 5),
        (2, 1, "run-b", 20),
    ]
    only_b_work = json.loads(run(env, "ledger", "contributions", "--run", "run-b", "--json"))
    assert only_b_work["total_tokens"] == 20 and len(only_b_work["contributions"]) == 1
    batches = json.loads(run(env, "ledger", "batches", "--json"))["batches"]
    assert [(b["index"], b["run"], b["count"], b["first_contribution"]) for b in batches] == [
        (0, "run-a", 2, 0),
        (1, "run-b", 1, 2),
    ]
    assert json.loads(run(env, "ledger", "batches", "--run", "run-b", "--json"))["batches"] == batches[1:]
    totals = json.loads(run(env, "ledger", "totals", "--run", "run-a", "--json"))["totals"]
    assert totals == [
        {"run": "run-a", "worker": W1.checksum_address, "credits": 2, "tokens": 15, "flops": 1500}
    ]
    assert len(json.loads(run(env, "ledger", "totals", "--json"))["totals"]) == 2

    pending = json.loads(run(env, "ledger", "slashes", "--pending", "--json"))["slashes"]
    assert [(s["index"], s["status"], s["failing_chunks"]) for s in pending] == [
        (0, "pending", [1, 3]),
        (1, "pending", [1, 3]),
    ]
    # run-a has no challenge window: anyone finalizes slash 0 at once; run-b's owner voids slash 1
    final = json.loads(
        run(env, "ledger", "slash", "finalize", "0", "--key", str(tmp_path / "tr.json"), "--json")
    )
    assert final["slash"]["status"] == "final" and final["slash"]["taken_gwei"] == 400
    assert "voided by the run's owner: the worker keeps its stake; it costs no one" in run(
        env, "ledger", "slash", "void", "1", "--key", str(tmp_path / "tr.json")
    )
    assert json.loads(run(env, "ledger", "slashes", "--pending", "--json"))["slashes"] == []
    by_run = json.loads(run(env, "ledger", "slashes", "--run", "run-b", "--json"))["slashes"]
    assert [(s["status"], s["penalty_gwei"]) for s in by_run] == [("voided", 0)]  # an owner's void is free

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
        ["ledger", "batches"],
        ["ledger", "totals"],
        ["ledger", "slashes"],
        ["ledger", "run", "show"],
        ["stake", "status", "--node", format_address(VAL.address)],
    ):
        assert "0x" in run(env, *query)  # rich tables name the nodes
    steps = [(c["step"] >> 32, c["step"] & 0xFFFFFFFF) for c in contributions]
    table = run({**env, "COLUMNS": "200"}, "ledger", "contributions")
    assert "version/n" in table and all(f"{v}/{n}" in table for v, n in steps)  # not the packed step

    run(env, "stake", "unbond", "100", "--key", str(tmp_path / "w1.json"))
    out = run(env, "stake", "withdraw", "--key", str(tmp_path / "w1.json"), code=1)
    assert "StillUnbonding (707)" in out and "slashable until epoch 2" in out
    verified = json.loads(run(env, "ledger", "verify", "--json"))
    assert verified["ok"] and verified["entries"] == 17


def test_set_validators_and_void_by_vote(env: dict[str, str], tmp_path: Path) -> None:
    setup_ledger(env, tmp_path)
    setup_runs(env, tmp_path)
    record_work(tmp_path)
    tr_key, v2_key = ("--key", str(tmp_path / "tr.json")), ("--key", str(tmp_path / "v2.json"))
    # V2 is run-b's only validator besides the slasher VAL: its vote is the majority and voids slash 1
    assert "slash 1 is voided" in run(env, "ledger", "slash", "void", "1", *v2_key)
    voided = json.loads(run(env, "ledger", "slashes", "--run", "run-b", "--json"))["slashes"][0]
    assert (voided["status"], voided["votes"], voided["penalty_gwei"]) == ("voided", 1, 100)
    run(env, "stake", "deposit", "100", "--key", str(tmp_path / "val.json"))  # VAL tops up what it paid
    run(env, "ledger", "run", "set-validators", "run-a", "--validator", V2.checksum_address, *tr_key)
    assert json.loads(run(env, "ledger", "run", "show", "run-a", "--json"))["runs"][0]["validators"] == [
        V2.checksum_address
    ]
    with SignedLog.open(tmp_path / "ledger.db") as log:  # the set decides who credits in run-a now
        log.commit_credits(V2, T.batch("run-a", T.credit(W1, nonce=7, tokens=1, flops=0)))
        with pytest.raises(NotRunValidator):
            log.commit_credits(VAL, T.batch("run-a", T.credit(W1, nonce=8, tokens=1, flops=0)))


def test_run_and_slash_refusals(env: dict[str, str], tmp_path: Path) -> None:
    setup_ledger(env, tmp_path)
    setup_runs(env, tmp_path)
    record_work(tmp_path)
    tr_key, v2_key = ("--key", str(tmp_path / "tr.json")), ("--key", str(tmp_path / "v2.json"))
    w1_key, val_key = ("--key", str(tmp_path / "w1.json")), ("--key", str(tmp_path / "val.json"))
    bounds = ("--challenge-window", "1", "--max-tokens", "10", "--max-flops-per-token", "1")
    validator = ("--validator", VAL.checksum_address)
    assert "WrongRole (704)" in run(
        env, "ledger", "run", "register", "run-c", *validator, *bounds, *w1_key, code=1
    )
    assert "RunExists (718)" in run(
        env, "ledger", "run", "register", "run-a", *validator, *bounds, *tr_key, code=1
    )
    assert "NotRunOwner (719)" in run(
        env, "ledger", "run", "set-validators", "run-a", *validator, *v2_key, code=1
    )
    assert "UnknownRun (717)" in run(
        env, "ledger", "run", "set-validators", "run-z", *validator, *tr_key, code=1
    )
    assert "not registered" in run(env, "ledger", "run", "show", "run-z", code=1)
    # malformed input never reaches the ledger: usage errors, exit 2
    assert "run id" in run(env, "ledger", "run", "show", "Run_A", code=2)
    assert "named twice" in run(
        env, "ledger", "run", "register", "run-c", *validator, *validator, *bounds, *tr_key, code=2
    )
    many = [arg for i in range(17) for arg in ("--validator", T.identity(f"v{i}").checksum_address)]
    assert "1..16 validators" in run(
        env, "ledger", "run", "register", "run-c", *many, *bounds, *tr_key, code=2
    )
    assert "checksum" in run(
        env,
        "ledger",
        "run",
        "register",
        "run-c",
        "--validator",
        "0x" + VAL.checksum_address[2:].swapcase(),
        *bounds,
        *tr_key,
        code=2,
    )
    assert "Missing option '--validator'" in run(
        env, "ledger", "run", "register", "run-c", *bounds, *tr_key, code=2
    )
    assert "x<=4294967295" in run(
        env,
        "ledger",
        "run",
        "register",
        "run-c",
        *validator,
        "--challenge-window",
        "1",
        "--max-tokens",
        str(2**32),
        "--max-flops-per-token",
        "1",
        *tr_key,
        code=2,
    )
    assert len(json.loads(run(env, "ledger", "run", "show", "--json"))["runs"]) == 2  # nothing changed

    assert "ChallengeWindowOpen (725)" in run(env, "ledger", "slash", "finalize", "1", *tr_key, code=1)
    assert "ChallengeWindowClosed (726)" in run(env, "ledger", "slash", "void", "0", *tr_key, code=1)
    slasher_votes = run(env, "ledger", "slash", "void", "1", *val_key, code=1)
    assert "NotRunValidator (721)" in slasher_votes and "only the others vote" in slasher_votes
    assert "SlashNotPending (724)" in run(env, "ledger", "slash", "void", "9", *tr_key, code=1)
    run(env, "ledger", "slash", "finalize", "0", *tr_key)
    assert "SlashNotPending (724)" in run(env, "ledger", "slash", "finalize", "0", *tr_key, code=1)
    assert "x>=0" in run(env, "ledger", "slash", "void", *tr_key, "--", "-1", code=2)
    # the peer id is the key's: there is nothing to pass
    assert "No such option '--peer-id'" in register(env, tmp_path, "w1", "worker", "--peer-id", "x", code=2)


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


def test_register_binds_the_peer_id_to_the_key(env: dict[str, str], tmp_path: Path) -> None:
    run(env, "ledger", "deploy")
    out = json.loads(register(env, tmp_path, "tr", "trainer", "--json"))
    assert out["peer_id"] == TR.peer_id and out["operation"] == "register_node"
    assert f"peer id {V2.peer_id}" in register(env, tmp_path, "v2", "validator")


# --- prove ---------------------------------------------------------------------------------------


def test_prove_round_trip_and_tampered_proofs_refused(env: dict[str, str], tmp_path: Path) -> None:
    setup_ledger(env, tmp_path)
    setup_runs(env, tmp_path)
    record_work(tmp_path)
    saved = tmp_path / "proof.json"
    assert "is leaf 1 of batch 0" in run(env, "ledger", "prove", "--contribution", "1", "--out", str(saved))
    printed = stdout_of(env, "ledger", "prove", "--contribution", "1")
    assert json.loads(printed) == json.loads(saved.read_text())  # stdout is the proof alone
    with SignedLog.open(tmp_path / "ledger.db") as log:
        assert load_proof(printed) == log.prove_credit(1)
    checked = json.loads(run(env, "ledger", "prove", "--check", str(saved), "--json"))
    assert checked["ok"] and checked["on_ledger"] and checked["path_leads_to_root"]
    assert "ok: contribution 1 is leaf 1 of batch 0" in run(env, "ledger", "prove", "--check", str(saved))
    assert json.loads(run(env, "ledger", "prove", "--contribution", "2", "--json"))["proof"]["count"] == 1

    document = json.loads(saved.read_text())
    tampered = tmp_path / "tampered.json"
    more_tokens = {**document, "credit": {**document["credit"], "tokens": 5000}}
    tampered.write_text(json.dumps(more_tokens))
    assert "does not lead to its root" in run(env, "ledger", "prove", "--check", str(tampered), code=1)
    report = json.loads(stdout_of(env, "ledger", "prove", "--check", str(tampered), "--json", code=1))
    assert not report["ok"] and not report["path_leads_to_root"]

    # a self-consistent proof of a credit no validator committed: its own one-leaf "batch"
    forged_credit = Credit(W1.address, 7, 999, 0, bytes(32))
    forged = dataclasses.replace(
        load_proof(saved.read_text()),
        credit=forged_credit,
        leaf_index=0,
        count=1,
        path=(),
        root=credit_leaf(forged_credit),
    )
    assert forged.verify()
    tampered.write_text(dump_proof(forged))
    assert "holds no batch 0 with root" in run(env, "ledger", "prove", "--check", str(tampered), code=1)

    tampered.write_text(json.dumps({**document, "extra": 1}))
    assert "not a credit proof: the proof has unknown fields extra" in run(
        env, "ledger", "prove", "--check", str(tampered), code=1
    )
    assert "exactly one of" in run(env, "ledger", "prove", code=2)
    assert "exactly one of" in run(
        env, "ledger", "prove", "--contribution", "0", "--check", str(saved), code=2
    )
    assert "--out writes" in run(
        env, "ledger", "prove", "--check", str(saved), "--out", str(tampered), code=2
    )
    assert "no contribution 3; the ledger holds 3" in run(
        env, "ledger", "prove", "--contribution", "3", code=1
    )


# --- proof documents -----------------------------------------------------------------------------

addresses = st.binary(min_size=20, max_size=20)
digests = st.binary(min_size=32, max_size=32)
u64 = st.integers(0, 2**64 - 1)
credits = st.builds(Credit, addresses, u64, st.integers(1, 2**64 - 1), u64, digests)


@st.composite
def proofs(draw: st.DrawFn) -> CreditProof:
    """A real proof of a random leaf of a random batch."""
    batch = draw(st.lists(credits, min_size=1, max_size=40))
    leaves = [credit_leaf(c) for c in batch]
    index = draw(st.integers(0, len(batch) - 1))
    return CreditProof(
        contribution=draw(u64),
        batch=draw(u64),
        run=draw(st.from_regex(r"[a-z0-9][a-z0-9._-]{0,63}", fullmatch=True)),
        validator=draw(addresses),
        leaf_index=index,
        count=len(batch),
        credit=batch[index],
        path=credit_path(leaves, index),
        root=credits_root(leaves),
    )


@settings(max_examples=60, deadline=None)
@given(proofs())
def test_a_proof_document_round_trips(proof: CreditProof) -> None:
    assert proof.verify()
    assert load_proof(dump_proof(proof)) == proof


def _paths(document: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if not isinstance(document, dict):
        return [prefix]
    return [p for key, value in document.items() for p in _paths(value, (*prefix, key))]


def _with(document: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    head, *rest = path
    return {**document, head: _with(document[head], tuple(rest), value) if rest else value}


def _without(document: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    head, *rest = path
    if not rest:
        return {k: v for k, v in document.items() if k != head}
    return {**document, head: _without(document[head], tuple(rest))}


BAD_VALUES = [None, True, -1, 2**64, "0X", "0x" + "zz" * 32, 1.5, [], {}, "run id with spaces"]


@settings(max_examples=150, deadline=None)
@given(proofs(), st.data())
def test_a_malformed_proof_document_is_refused(proof: CreditProof, data: st.DataObject) -> None:
    document = proof_to_json(proof)
    path = data.draw(st.sampled_from(_paths(document)))
    bad = data.draw(st.sampled_from(BAD_VALUES))
    mutated = _with(document, path, bad)
    if path == ("path",) and bad == []:
        return  # an empty path is well formed (a one-leaf batch); whether it verifies is another matter
    with pytest.raises(ProofFormatError):
        proof_from_json(mutated)
    with pytest.raises(ProofFormatError, match="lacks"):
        proof_from_json(_without(document, path))
    with pytest.raises(ProofFormatError, match="unknown fields"):
        proof_from_json(_with(document, (*path[:-1], "surplus"), 0))


def test_proof_documents_refuse_what_json_allows() -> None:
    document = proof_to_json(_honest_proof())
    assert document["format"] == PROOF_FORMAT
    text = dump_proof(_honest_proof())
    with pytest.raises(ProofFormatError, match="appears twice"):
        load_proof(text.replace('"batch":', '"batch": 1, "batch":', 1))
    with pytest.raises(ProofFormatError, match="not JSON"):
        load_proof(text[:-3])
    with pytest.raises(ProofFormatError, match="format must be"):
        proof_from_json({**document, "format": "swarmnode/credit_proof/v2"})
    with pytest.raises(ProofFormatError, match="leaf_index = 1 is outside 0..0"):
        proof_from_json({**document, "leaf_index": 1, "count": 1})
    with pytest.raises(ProofFormatError, match="at most 16"):
        proof_from_json({**document, "path": ["0x" + "00" * 32] * 17})
    with pytest.raises(ProofFormatError, match="checksum"):
        proof_from_json({**document, "validator": "0x" + document["validator"][2:].swapcase()})
    with pytest.raises(ProofFormatError, match="must be a JSON object"):
        proof_from_json([document])


def _honest_proof() -> CreditProof:
    batch = [T.credit(W1, nonce=n) for n in range(3)]
    leaves = [credit_leaf(c) for c in batch]
    return CreditProof(
        0, 0, "run-a", VAL.address, 2, 3, batch[2], credit_path(leaves, 2), credits_root(leaves)
    )


# --- the chain audit's checks --------------------------------------------------------------------

PARAMS = Params(
    min_stake_per_unit_gwei=1000,
    unbonding_delay_epochs=1,
    slash_gwei=400,
    ejection_threshold=3,
    epoch_seconds=1000,
)
A_TR, A_V1, A_V2, A_V3, A_W1, A_W2 = (T.identity(f"audit-{n}") for n in ("tr", "v1", "v2", "v3", "w1", "w2"))
DEPOSIT = 1500
TOP_UP = 500  # the trainer's second deposit: one minimum stake per run it holds (two runs)


AUDIT_SLASHES = (T.slash(A_W1, 300, nonce=3), T.slash(A_W2, 300, nonce=4), T.slash(A_W1, 100, nonce=5))


def busy_ledger(h: T.SignedHarness | T.EvmHarness) -> None:
    """Three batches, a voided, a final and a pending slash, a changed validator set, a withdrawal."""
    log = h.ledger
    identities = (
        (A_TR, "trainer"),
        (A_V1, "validator"),
        (A_V2, "validator"),
        (A_V3, "validator"),
        (A_W1, "worker"),
        (A_W2, "worker"),
    )
    h.fund(*(who for who, _ in identities))
    for who, role in identities:
        log.register(who, role, T.compute())
        log.deposit(who, DEPOSIT)
    log.deposit(A_TR, TOP_UP)
    log.register_run(A_TR, T.register_run("run-1", (A_V1, A_V2, A_V3), window=2, max_tokens=500))
    log.register_run(A_TR, T.register_run("run-2", (A_V2,), window=0, max_tokens=50, max_flops_per_token=3))
    log.commit_credits(
        A_V1, T.batch("run-1", T.credit(A_W1, nonce=0), T.credit(A_W1, nonce=1), T.credit(A_W2, nonce=0))
    )
    log.commit_credits(A_V2, T.batch("run-2", T.credit(A_W1, nonce=0, tokens=50, flops=150)))
    log.slash(A_V1, AUDIT_SLASHES[0])
    log.void_slash(A_V2, 0)
    log.void_slash(A_V3, 0)
    log.slash(A_V2, AUDIT_SLASHES[1])
    h.advance_to(2)
    log.finalize_slash(A_W1, 1)
    log.unbond(A_TR, 500)
    h.advance_to(3)
    log.withdraw(A_TR)
    log.set_run_validators(A_TR, SetRunValidators("run-1", tuple(sorted((A_V2.address, A_V3.address)))))
    log.commit_credits(
        A_V3, T.batch("run-1", T.credit(A_W2, nonce=1), T.credit(A_W2, nonce=2, tokens=7, flops=700))
    )
    log.slash(A_V3, AUDIT_SLASHES[2])


@pytest.fixture
def honest(tmp_path: Path) -> ChainRecords:
    """The records of a busy signed log as an EVM client would fetch them."""
    h = T.SignedHarness.create(tmp_path, PARAMS)
    busy_ledger(h)
    log = h.ledger
    contributions = log.contributions()
    records = ChainRecords(
        params=PARAMS,
        runs=tuple(log.runs()),
        history=None,
        batches=tuple(log.batches()),
        credits={
            b.index: tuple(
                Credit(r.worker, r.step, r.tokens, r.flops, r.rollout_digest)
                for r in contributions[b.first_contribution : b.first_contribution + b.count]
            )
            for b in log.batches()
        },
        totals=tuple(log.totals()),
        slashes=tuple(log.slashes()),
        citations={i: cite_submission(op) for i, op in enumerate(AUDIT_SLASHES)},
        stakes=tuple(log.stakes()),
        money={
            "deposited_gwei": 6 * DEPOSIT + TOP_UP,
            "withdrawn_gwei": 500,
            "held_gwei": sum(s.bonded_gwei + s.unbonding_gwei for s in log.stakes()),
            "burned_gwei": 600,
            "balance_wei": (6 * DEPOSIT + TOP_UP - 500) * WEI_PER_GWEI,
        },
    )
    h.close()
    return records


def first_failure(records: ChainRecords) -> str:
    failures, _ = audit_records(records)
    assert failures, "the audit passed tampered records"
    return failures[0]


def test_honest_records_pass_with_a_note_for_the_removed_validator(honest: ChainRecords) -> None:
    assert [s.status for s in honest.slashes] == ["voided", "final", "pending"]
    failures, notes = audit_records(honest)
    assert failures == []
    # V1 credited batch 0 while in run-1's set; it was removed since, and no history says when
    assert len(notes) == 2 and all("no set history" in n for n in notes)
    assert notes[0].startswith("batch 0: validator") and notes[1].startswith("slash 0: validator")
    history = {
        "run-1": [(0, (A_V1.address, A_V2.address, A_V3.address)), (3, (A_V2.address, A_V3.address))],
        "run-2": [(0, (A_V2.address,))],
    }
    assert audit_records(dataclasses.replace(honest, history=history)) == ([], [])


def _replace_at(items: tuple[Any, ...], index: int, **changes: Any) -> tuple[Any, ...]:
    return (*items[:index], dataclasses.replace(items[index], **changes), *items[index + 1 :])


def test_batches_whose_records_and_calldata_disagree_fail(honest: ChainRecords) -> None:
    batches, credits = honest.batches, honest.credits
    assert "batch 0 stores root" in first_failure(
        dataclasses.replace(honest, batches=_replace_at(batches, 0, root=bytes(32)))
    )
    failures, _ = audit_records(dataclasses.replace(honest, batches=_replace_at(batches, 0, count=4)))
    assert failures == [
        "batch 1 starts at contribution 3, expected 4",  # the sequence is checked first
        "batch 0 stores count 4 but its transaction has 3 credits",
    ]
    assert "batch 1 starts at contribution 4, expected 3" == first_failure(
        dataclasses.replace(honest, batches=_replace_at(batches, 1, first_contribution=4))
    )
    dropped = {**credits, 0: credits[0][:2]}
    assert "its transaction has 2 credits" in first_failure(dataclasses.replace(honest, credits=dropped))
    reordered = {**credits, 0: (credits[0][1], credits[0][0], credits[0][2])}
    assert "not strictly ascending" in first_failure(dataclasses.replace(honest, credits=reordered))
    assert "is not registered" in first_failure(dataclasses.replace(honest, runs=honest.runs[1:]))
    unreadable = dataclasses.replace(honest, unreadable=("batch 2's credits cannot be read",))
    assert first_failure(unreadable) == "batch 2's credits cannot be read"


def test_credits_beyond_their_runs_bounds_fail_even_with_a_matching_root(honest: ChainRecords) -> None:
    """A contract that skipped the bounds check would store the root of what it was told: the audit
    still reads the credits themselves."""
    run_2 = honest.runs[1]
    for bad, message in (
        (Credit(A_W1.address, 9, 51, 0, bytes(32)), "51 tokens, outside run 'run-2''s 1..50"),
        (
            Credit(A_W1.address, 9, 10, 31, bytes(32)),
            "31 flops for 10 tokens, above run 'run-2''s 3 flops per token",
        ),
    ):
        batch = dataclasses.replace(honest.batches[1], root=credit_leaf(bad))
        assert check_batch(batch, (bad,), run_2) == [
            f"batch 1 leaf 0 (worker {A_W1.checksum_address}, step 9): {message}"
        ]


def test_an_assignment_credited_twice_fails(honest: ChainRecords) -> None:
    again = honest.credits[0][:1]
    batch = dataclasses.replace(
        honest.batches[0], index=3, first_contribution=6, count=1, root=credits_root([credit_leaf(again[0])])
    )
    twice = dataclasses.replace(
        honest, batches=(*honest.batches, batch), credits={**honest.credits, 3: again}
    )
    failures, _ = audit_records(twice)
    assert any("is credited in batch 0 and again in batch 3" in f for f in failures)


def test_totals_that_are_not_the_credits_sums_fail(honest: ChainRecords) -> None:
    inflated = _replace_at(honest.totals, 0, tokens=honest.totals[0].tokens + 1)
    assert "stored totals (credits, tokens, flops)" in first_failure(
        dataclasses.replace(honest, totals=inflated)
    )
    assert "stored totals" in first_failure(dataclasses.replace(honest, totals=honest.totals[1:]))


def test_slash_citations_that_do_not_hold_fail(honest: ChainRecords) -> None:
    cited = honest.citations
    other = cite_submission(T.slash(A_W2, 300, nonce=3))  # A_W2's genuine signature, cited against A_W1
    other_body = signing_digest_of_body_hash("rollout_submission", "run-1", A_W1.address, 3, 0, bytes(32))
    cases = {
        "recovers to": dataclasses.replace(cited[0], sig=other.sig),
        "it recomputes to": dataclasses.replace(cited[0], digest=bytes(32)),
        "records digest": dataclasses.replace(cited[0], body_hash=bytes(32), digest=other_body),
        "signature is invalid": dataclasses.replace(cited[0], sig=cited[0].sig[:64] + b"\x05"),
    }
    for message, citation in cases.items():
        assert message in first_failure(dataclasses.replace(honest, citations={**cited, 0: citation}))
    forged = _replace_at(honest.slashes, 2, submission_digest=honest.slashes[0].submission_digest)
    failures, _ = audit_records(dataclasses.replace(honest, slashes=forged))
    assert any("already slashed by slash 0" in f for f in failures)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"final_epoch": 4}, "is final at epoch 4, not epoch 3 + run 'run-1''s window of 2"),
        ({"requested_gwei": 401}, "requests 401 gwei, outside 1..400"),
        ({"reason_code": 1}, "not a recomputable, slashable rejection"),
        ({"failing_chunks": (3, 1)}, "strictly ascending"),
        ({"taken_gwei": 1}, "is pending with 1 gwei taken"),
        ({"penalty_gwei": 1}, "is pending with 0 gwei taken, 1 gwei penalty"),
        ({"ejected": True}, "ejected=True"),
        ({"status": "slashed"}, "unknown status 'slashed'"),
        ({"run": "run-9"}, "run 'run-9', which is not registered"),
    ],
)
def test_slash_records_out_of_form_fail(honest: ChainRecords, changes: dict[str, Any], message: str) -> None:
    slashes = _replace_at(honest.slashes, 2, **changes)
    citations = honest.citations
    if "run" in changes:  # the citation is recomputed with the record's run: it no longer recovers
        citations = {k: v for k, v in citations.items() if k != 2}
    failures, _ = audit_records(dataclasses.replace(honest, slashes=slashes, citations=citations))
    assert any(message in f for f in failures), failures


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"withdrawn_gwei": 400}, "deposited - withdrawn = 9100 gwei, but held + burned"),
        ({"held_gwei": 8000, "burned_gwei": 500}, "its nodes' stakes sum to"),
        ({"burned_gwei": 700, "withdrawn_gwei": 600}, "its slash records account for 600"),
        ({"balance_wei": 9000 * WEI_PER_GWEI - 1}, "below deposited - withdrawn"),
    ],
)
def test_money_that_does_not_add_up_fails(
    honest: ChainRecords, changes: dict[str, int], message: str
) -> None:
    failures, _ = audit_records(dataclasses.replace(honest, money={**honest.money, **changes}))
    assert any(message in f for f in failures), failures


def test_ether_forced_into_the_contract_is_a_note(honest: ChainRecords) -> None:
    forced = {**honest.money, "balance_wei": honest.money["balance_wei"] + 7}
    failures, notes = audit_records(dataclasses.replace(honest, money=forced))
    assert failures == [] and "exceeds deposited - withdrawn by 7 wei" in notes[-1]


def test_a_validator_outside_its_runs_set_fails_where_the_history_shows_it(honest: ChainRecords) -> None:
    run_1 = honest.runs[0]
    history = [(0, (A_V1.address,)), (3, (A_V2.address,)), (3, (A_V3.address,)), (5, (A_V2.address,))]
    assert check_membership("batch 9", run_1, A_V1.address, 2, history) == ([], [])
    assert check_membership("batch 9", run_1, A_V1.address, 3, history) == ([], [])  # in force as 3 began
    assert check_membership("batch 9", run_1, A_V3.address, 3, history) == ([], [])  # set during 3
    assert check_membership("batch 9", run_1, A_V3.address, 5, history) == ([], [])  # until replaced in 5
    failures, notes = check_membership("batch 9", run_1, A_V3.address, 6, history)
    assert notes == [] and failures == [
        f"batch 9: validator {A_V3.checksum_address} was not in run 'run-1''s set at epoch 6"
    ]
    assert check_membership("batch 9", run_1, A_V1.address, 0, [])[0]  # before any set: nobody
    failures, notes = check_membership("slash 9", run_1, A_V1.address, 1, None)
    assert failures == [] and "cannot be checked" in notes[0]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 20), st.frozensets(addresses, min_size=1, max_size=4)), max_size=8),
    st.integers(0, 22),
)
def test_sets_in_force_holds_the_set_in_force_when_the_epoch_began_and_every_set_made_during_it(
    changes: list[tuple[int, frozenset[bytes]]], epoch: int
) -> None:
    history = sorted(((e, tuple(sorted(s))) for e, s in changes), key=lambda c: c[0])
    members = sets_in_force(history, epoch)
    earlier = [s for e, s in history if e < epoch]
    expected = set(earlier[-1]) if earlier else set()
    expected.update(v for e, s in history if e == epoch for v in s)
    assert members == expected
    assert all(set(s) <= members for e, s in history if e == epoch)


UNBOUNDED_RUN = RunInfo("run-x", TR.address, (VAL.address,), 0, RUN_LIMIT_MAX, RUN_LIMIT_MAX, 0)
bounded_credits = st.builds(
    Credit, addresses, u64, st.integers(1, RUN_LIMIT_MAX), st.integers(0, RUN_LIMIT_MAX), digests
)


@settings(max_examples=60, deadline=None)
@given(st.lists(bounded_credits, min_size=1, max_size=30, unique_by=lambda c: (c.worker, c.step)), st.data())
def test_any_change_to_a_committed_credit_breaks_its_batch(batch: list[Credit], data: st.DataObject) -> None:
    batch = sorted(batch, key=lambda c: (c.worker, c.step))
    record = BatchRecord(
        0, "run-x", VAL.address, credits_root([credit_leaf(c) for c in batch]), len(batch), 0, 0
    )
    assert check_batch(record, batch, UNBOUNDED_RUN) == []
    index = data.draw(st.integers(0, len(batch) - 1))
    field = data.draw(st.sampled_from(["worker", "step", "tokens", "flops", "rollout_digest"]))
    values = {"worker": addresses, "rollout_digest": digests}.get(field, st.integers(1, 2**64 - 1))
    original = getattr(batch[index], field)
    changed = data.draw(values.filter(lambda v: v != original))
    tampered = [*batch[:index], dataclasses.replace(batch[index], **{field: changed}), *batch[index + 1 :]]
    assert check_batch(record, tampered, UNBOUNDED_RUN) != []


def test_check_code_wants_the_committed_runtime_as_a_prefix() -> None:
    runtime = bytes.fromhex("6000600055")
    assert check_code(runtime + bytes(64), runtime) == []  # immutables appended
    assert check_code(b"", runtime) == ["there is no contract code at this address"]
    assert "is not the committed SwarmLedger runtime" in check_code(b"\x60\x01" + runtime, runtime)[0]


# --- the whole audit on a chain ------------------------------------------------------------------


def test_the_audit_passes_an_honest_in_process_chain() -> None:
    h = T.EvmHarness.tester(PARAMS)
    busy_ledger(h)
    report = audit_chain(h.ledger)
    assert report.failures == () and report.ok and report.first_failure is None
    assert report.notes == ()  # the contract's RunValidatorsSet events give the set history
    assert (report.runs, report.batches, report.credits, report.slashes) == (2, 3, 6, 3)
    assert report.money["deposited_gwei"] - report.money["withdrawn_gwei"] == 6 * DEPOSIT + TOP_UP - 500
    assert report.money["burned_gwei"] == 600
    records = fetch_records(h.ledger)
    assert records.history is not None and [v for _, v in records.history["run-1"]] == [
        tuple(sorted((A_V1.address, A_V2.address, A_V3.address))),
        tuple(sorted((A_V2.address, A_V3.address))),
    ]
    # the same records with the history hidden: V1's batch and slash become notes, never passes
    failures, notes = audit_records(dataclasses.replace(records, history=None))
    assert failures == [] and len(notes) == 2
    h.close()


@pytest.mark.slow
def test_verify_audits_a_chain_on_anvil(anvil_url: str, env: dict[str, str]) -> None:
    h = T.EvmHarness.anvil(anvil_url, PARAMS)
    busy_ledger(h)
    chain = {**env, "SWARMNODE_LEDGER": f"evm:{anvil_url}", "SWARMNODE_CONTRACT": h.ledger.address}
    report = json.loads(stdout_of(chain, "ledger", "verify", "--json"))
    assert report["ok"] and report["failures"] == [] and report["first_failure"] is None
    assert (report["batches"], report["credits"], report["slashes"]) == (3, 6, 3)
    assert "3 batches (6 credits), 3 slashes; the money checks out" in run(chain, "ledger", "verify")
    # the queries and the proofs read the chain too
    assert len(json.loads(run(chain, "ledger", "totals", "--run", "run-1", "--json"))["totals"]) == 2
    proof = json.loads(run(chain, "ledger", "prove", "--contribution", "4", "--json"))
    assert proof["ok"] and proof["on_ledger"] and proof["proof"]["batch"] == 2
    not_ours = {**chain, "SWARMNODE_CONTRACT": format_address(A_W1.address)}
    assert "no contract at" in run(not_ours, "ledger", "verify", code=1)
    h.close()


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

"""SignedLog: authentication, replay, durability across reopen, audit, Merkle checkpoints and proofs."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from swarmnode.crypto.hashing import sha256
from swarmnode.crypto.merkle import is_included, merkle_root
from swarmnode.ledger import errors as E
from swarmnode.ledger.accumulator import MerkleAccumulator
from swarmnode.ledger.log import apply_entry, new_log_state, seal_entry, sign_head
from swarmnode.ledger.signedlog import SignedLog, verify_log
from swarmnode.ledger.types import Params
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.envelope import Envelope, seal
from swarmnode.protocol.ledger_messages import LedgerEntry, SetRunValidators, StakeDeposit
from swarmnode.testing import ledger as T

PARAMS = Params(
    min_stake_per_unit_gwei=1_000,
    unbonding_delay_epochs=2,
    slash_gwei=400,
    ejection_threshold=2,
    epoch_seconds=1_000,
)
TR, VAL, W1, W2 = T.identity("tr"), T.identity("val"), T.identity("w1"), T.identity("w2")
SETUP_ENTRIES = 9  # four registrations, four deposits, the run


@pytest.fixture
def harness(tmp_path: Path):
    h = T.SignedHarness.create(tmp_path, PARAMS)
    yield h
    h.close()


def populate(h: T.SignedHarness, *, epochs: int = 3, per_epoch: int = 4) -> None:
    """A log spread over several epochs: registrations, stakes, a run, batches of credits, a slash."""
    log = h.ledger
    log.register(TR, "trainer", T.compute())
    log.register(VAL, "validator", T.compute())
    log.register(W1, "worker", T.compute(2))
    log.register(W2, "worker", T.compute())
    log.deposit(TR, 1_000)
    log.deposit(VAL, 1_000)
    log.deposit(W1, 2_500)
    log.deposit(W2, 1_000)
    log.register_run(TR, T.register_run("run-1", (VAL,)))
    nonce = 0
    for epoch in range(epochs):
        h.advance_to(epoch)
        for _ in range(per_epoch):
            log.commit_credits(VAL, T.batch("run-1", T.credit(W1, nonce=nonce), T.credit(W2, nonce=nonce)))
            nonce += 1
    log.slash(VAL, T.slash(W2, 400, nonce=1000))


def row_count(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]


# --- authentication and replay ---------------------------------------------------------------------


def test_forged_signature_is_refused_and_changes_nothing(harness) -> None:
    populate(harness)
    envelope = decode(Envelope, harness.ledger.sign(W1, StakeDeposit(5)))
    sig = bytearray(envelope.sig)
    sig[5] ^= 0xFF
    forged = encode(replace(envelope, sig=bytes(sig)))
    before = harness.fingerprint()
    with pytest.raises(E.BadSignature):
        harness.ledger.append_envelope(forged, W1)
    assert harness.fingerprint() == before


def test_operation_claiming_another_sender_is_refused(harness) -> None:
    """W2 signs a deposit but names W1 as sender: the signature does not recover to W1."""
    populate(harness)
    mine = decode(Envelope, harness.ledger.sign(W2, StakeDeposit(5)))
    claimed = encode(replace(mine, sender=W1.address))
    before = harness.fingerprint()
    with pytest.raises(E.BadSignature, match="signed by another key"):
        harness.ledger.append_envelope(claimed, W2)
    assert harness.fingerprint() == before


def test_replayed_operation_is_refused(harness) -> None:
    populate(harness)
    first = harness.ledger.sign(W1, StakeDeposit(5))
    harness.ledger.append_envelope(first, W1)
    before = harness.fingerprint()
    with pytest.raises(E.ReplayedOperation):
        harness.ledger.append_envelope(first, W1)
    stale = seal(W1, StakeDeposit(6), run=harness.ledger.ledger_id, seq=0, ts=0)  # nonce 0 long used
    with pytest.raises(E.ReplayedOperation):
        harness.ledger.append_envelope(stale, W1)
    assert harness.fingerprint() == before


def test_operation_for_another_ledger_or_not_an_operation(harness) -> None:
    populate(harness)
    before = harness.fingerprint()
    with pytest.raises(E.WrongLedger):
        harness.ledger.append_envelope(seal(W1, StakeDeposit(5), run="other-ledger", seq=99, ts=0), W1)
    submission = T.submission_envelope(W1, run=harness.ledger.ledger_id, nonce=99)
    with pytest.raises(E.MalformedOperation, match="not a ledger operation"):
        harness.ledger.append_envelope(submission, W1)
    with pytest.raises(E.MalformedOperation):
        harness.ledger.append_envelope(b"\x93\x01\x02", W1)
    assert harness.fingerprint() == before


def test_gaps_in_nonces_are_allowed_but_order_is_not(harness) -> None:
    """Nonces only have to increase, so an author's gossiped operations need not arrive contiguously."""
    populate(harness)
    nonce = harness.ledger.nonce_of(W1.address)
    later = seal(W1, StakeDeposit(7), run=harness.ledger.ledger_id, seq=nonce + 5, ts=0)
    earlier = seal(W1, StakeDeposit(8), run=harness.ledger.ledger_id, seq=nonce + 2, ts=0)
    harness.ledger.append_envelope(later, W1)
    with pytest.raises(E.ReplayedOperation):
        harness.ledger.append_envelope(earlier, W1)


def test_entry_epoch_never_goes_back(harness, tmp_path: Path) -> None:
    populate(harness)
    harness.clock.epoch = 0  # a host clock that jumped backwards
    receipt = harness.ledger.deposit(W1, 1)
    assert receipt.epoch == 2
    log = new_log_state(harness.ledger.genesis)
    for data in harness.ledger.iter_entries():
        apply_entry(log, data)
    entry = LedgerEntry(
        index=log.size, prev_hash=log.head, epoch=1, op=harness.ledger.sign(W1, StakeDeposit(3))
    )
    with pytest.raises(E.EpochRegression):
        apply_entry(log, encode(entry))


# --- durability and replay ---------------------------------------------------------------------------


def test_reopen_derives_the_same_state(harness, tmp_path: Path) -> None:
    populate(harness)
    expected = (
        harness.ledger.snapshot(),
        harness.ledger.head(),
        harness.ledger.merkle_root(),
        harness.ledger.checkpoints(),
    )
    harness.ledger.close()
    for audit in (False, True):
        reopened = SignedLog.open(tmp_path / "ledger.db", audit=audit, epochs=harness.clock)
        assert (
            reopened.snapshot(),
            reopened.head(),
            reopened.merkle_root(),
            reopened.checkpoints(),
        ) == expected
        reopened.close()
    harness.ledger = SignedLog.open(tmp_path / "ledger.db", epochs=harness.clock)


def test_two_handles_on_one_file_interleave(tmp_path: Path) -> None:
    """Appenders in several processes share one file: each catches up before it appends."""
    clock = T.ManualEpochs()
    a = SignedLog.create(tmp_path / "shared.db", PARAMS, epochs=clock, now_ms=lambda: 0)
    b = SignedLog.open(tmp_path / "shared.db", epochs=clock, now_ms=lambda: 0)
    a.register(TR, "trainer", T.compute())
    a.register(VAL, "validator", T.compute())
    b.register(W1, "worker", T.compute())
    a.deposit(VAL, 1_000)
    a.deposit(TR, 1_000)
    b.deposit(W1, 1_000)
    b.register_run(TR, T.register_run("run-1", (VAL,)))  # b learns TR's nonce by catching up
    b.commit_credits(VAL, T.batch("run-1", T.credit(W1, nonce=0)))
    a.commit_credits(VAL, T.batch("run-1", T.credit(W1, nonce=1)))
    assert a.size() == 9 and b.size() == 8  # b has not seen a's last entry yet
    b.refresh()
    assert (b.size(), b.head()) == (a.size(), a.head())
    assert a.snapshot() == b.snapshot() and a.merkle_root() == b.merkle_root()
    a.close()
    b.close()
    assert verify_log(tmp_path / "shared.db").ok


def test_refusal_writes_nothing_to_disk(harness, tmp_path: Path) -> None:
    populate(harness)
    rows = row_count(tmp_path / "ledger.db")
    with pytest.raises(E.InsufficientStake):
        harness.ledger.unbond(W2, 10**9)
    with pytest.raises(E.UnknownNode):
        harness.ledger.deposit(T.identity("nobody"), 1)
    assert row_count(tmp_path / "ledger.db") == rows
    assert harness.ledger.nonce_of(W2.address) == 2  # a refused operation does not burn a nonce


# --- audit -------------------------------------------------------------------------------------------


def tamper(path: Path, sql: str, *args: object) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(sql, args)


def test_verify_accepts_an_honest_log(harness, tmp_path: Path) -> None:
    populate(harness)
    report = verify_log(tmp_path / "ledger.db")
    assert report.ok and report.first_bad is None
    assert (report.entries, report.head, report.root) == (
        harness.ledger.size(),
        harness.ledger.head(),
        harness.ledger.merkle_root(),
    )
    assert report.checkpoints == 2


def _flip_byte(data: bytes, offset: int) -> bytes:
    out = bytearray(data)
    out[offset] ^= 0x01
    return bytes(out)


@pytest.mark.parametrize("index", [0, 7, 13])
def test_verify_names_the_first_bad_entry(harness, tmp_path: Path, index: int) -> None:
    populate(harness)
    path = tmp_path / "ledger.db"
    data = harness.ledger.entry(index)
    harness.ledger.close()
    tamper(path, "UPDATE entries SET data = ? WHERE idx = ?", _flip_byte(data, len(data) - 40), index)
    report = verify_log(path)
    assert not report.ok and report.first_bad == index, report.error


def test_verify_catches_deleted_reordered_and_rewritten_entries(harness, tmp_path: Path) -> None:
    populate(harness)
    path = tmp_path / "ledger.db"
    harness.ledger.close()
    copy = tmp_path / "copy.db"

    def fresh() -> Path:
        copy.unlink(missing_ok=True)
        with sqlite3.connect(path) as src, sqlite3.connect(copy) as dst:
            src.backup(dst)
        return copy

    tamper(fresh(), "DELETE FROM entries WHERE idx = 5")
    assert verify_log(copy).first_bad == 5
    tamper(fresh(), "UPDATE entries SET idx = -idx WHERE idx IN (8, 9)")
    tamper(copy, "UPDATE entries SET idx = 9 WHERE idx = -8")
    tamper(copy, "UPDATE entries SET idx = 8 WHERE idx = -9")
    assert verify_log(copy).first_bad == 8
    tamper(fresh(), "UPDATE entries SET hash = ? WHERE idx = 3", bytes(32))
    assert verify_log(copy).first_bad == 3
    tamper(fresh(), "UPDATE checkpoints SET root = ? WHERE epoch = 1", bytes(32))
    report = verify_log(copy)
    assert not report.ok and "checkpoints" in str(report.error)


def test_verify_catches_changed_parameters(harness, tmp_path: Path) -> None:
    """The genesis record (ledger id, parameters) is chained into entry 0."""
    populate(harness)
    path = tmp_path / "ledger.db"
    harness.ledger.close()
    from swarmnode.ledger.log import make_genesis

    easier = make_genesis("test", replace(PARAMS, min_stake_per_unit_gwei=1), 0)
    tamper(path, "UPDATE meta SET value = ? WHERE key = 'genesis'", encode(easier))
    report = verify_log(path)
    assert report.first_bad == 0


def test_verify_catches_a_well_chained_but_invalid_operation(harness, tmp_path: Path) -> None:
    """A host that re-chains a forged history still cannot make the operations valid."""
    populate(harness, epochs=1, per_epoch=1)
    path = tmp_path / "ledger.db"
    log = new_log_state(harness.ledger.genesis)
    for data in harness.ledger.iter_entries():
        apply_entry(log, data)
    bad_op = harness.ledger.sign(W2, StakeDeposit(5))
    bad_op = encode(replace(decode(Envelope, bad_op), sender=W1.address))  # claims W1
    entry = encode(LedgerEntry(index=log.size, prev_hash=log.head, epoch=0, op=bad_op))
    harness.ledger.close()
    sealed = seal_entry(W2, "test", log.size, sha256(entry))
    tamper(path, "INSERT INTO entries VALUES (?, ?, ?, ?, ?)", log.size, sha256(entry), 0, sealed, entry)
    report = verify_log(path)
    assert report.first_bad == log.size and "BadSignature" in str(report.error)
    with pytest.raises(E.CorruptLog):
        SignedLog.open(path, audit=True)


def test_verify_rechecks_the_evidence_of_every_slash(harness, tmp_path: Path) -> None:
    """A validator that appends a slash past its own checks (replay without signatures) cannot make
    the forged evidence pass an audit: verify names the entry, an audited open refuses the file."""
    populate(harness, epochs=1, per_epoch=1)
    path = tmp_path / "ledger.db"
    log = new_log_state(harness.ledger.genesis)
    for data in harness.ledger.iter_entries():
        apply_entry(log, data)
    honest = T.slash(W1, 100, nonce=77)
    evidence = bytearray(honest.evidence)
    evidence[-10] ^= 0x01  # inside the worker's signature
    op = harness.ledger.sign(VAL, replace(honest, evidence=bytes(evidence)))
    entry = encode(LedgerEntry(index=log.size, prev_hash=log.head, epoch=0, op=op))
    sealed = seal_entry(VAL, "test", log.size, sha256(entry))
    index = log.size
    apply_entry(log, entry, seal=sealed, check_signatures=False)  # the state machine alone accepts it
    harness.ledger.close()
    tamper(path, "INSERT INTO entries VALUES (?, ?, ?, ?, ?)", index, sha256(entry), 0, sealed, entry)
    tamper(
        path,
        "UPDATE meta SET value = ? WHERE key = 'head'",
        encode(sign_head(VAL, "test", log.size, log.head)),
    )
    report = verify_log(path)
    assert report.first_bad == index and "InvalidEvidence" in str(report.error), report.error
    with pytest.raises(E.CorruptLog):
        SignedLog.open(path, audit=True)
    harness.ledger = SignedLog.create(tmp_path / "other.db", PARAMS)


def test_open_refuses_a_file_that_is_not_a_log(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    sqlite3.connect(path).execute("CREATE TABLE meta (key TEXT, value BLOB)").connection.close()
    with pytest.raises(E.CorruptLog):
        SignedLog.open(path)
    assert verify_log(path).first_bad is None and not verify_log(path).ok


# --- Merkle checkpoints and proofs ----------------------------------------------------------------------


def test_every_entry_has_an_inclusion_proof(harness) -> None:
    populate(harness)
    log = harness.ledger
    for index in range(log.size()):
        proof = log.prove(index)
        assert proof.root == log.merkle_root() and proof.verify()
    bad = log.prove(3)
    assert not replace(bad, entry_hash=sha256(b"x")).verify()
    assert not replace(bad, index=4).verify()


def test_checkpoints_close_each_epoch(harness) -> None:
    populate(harness, epochs=3, per_epoch=4)
    log = harness.ledger
    checkpoints = log.checkpoints()
    assert [c.epoch for c in checkpoints] == [0, 1]
    assert [c.size for c in checkpoints] == [SETUP_ENTRIES + 4, SETUP_ENTRIES + 8]  # 4 batches per epoch
    hashes = [sha256(log.entry(i)) for i in range(log.size())]
    for checkpoint in checkpoints:
        assert checkpoint.root == merkle_root(hashes[: checkpoint.size])
        proof = log.prove(2, checkpoint.size)
        assert proof.root == checkpoint.root
        assert is_included(hashes[2], 2, checkpoint.size, list(proof.path), checkpoint.root)
    assert log.checkpoint(0) == checkpoints[0]
    assert log.checkpoint(2).size == log.size()  # the open epoch: the current head
    assert log.checkpoint(7).root == log.merkle_root()


def test_every_credit_has_a_proof_the_log_accepts(harness) -> None:
    populate(harness, epochs=2, per_epoch=3)
    log = harness.ledger
    contributions = log.contributions()
    assert len(contributions) == 12 and [b.count for b in log.batches()] == [2] * 6
    for record in contributions:
        proof = log.prove_credit(record.index)
        assert proof.verify() and log.check_credit_proof(proof)
        assert (proof.batch, proof.run, proof.validator) == (record.batch, "run-1", VAL.address)
        assert log.is_credited(record.run, record.worker, record.step)
    proof = log.prove_credit(5)
    other = log.batches()[proof.batch + 1]
    forged = [
        replace(proof, batch=other.index),  # a real batch, not the one the path leads to
        replace(proof, batch=99),
        replace(proof, root=other.root),
        replace(proof, count=proof.count + 1),
        replace(proof, run="run-2"),
        replace(proof, validator=W1.address),
        replace(proof, leaf_index=1 - proof.leaf_index),
        replace(proof, credit=replace(proof.credit, tokens=proof.credit.tokens + 1)),
        replace(proof, path=proof.path[:-1]),
    ]
    assert not any(log.check_credit_proof(p) for p in forged)
    with pytest.raises(IndexError):
        log.prove_credit(len(contributions))
    assert not log.is_credited("run-1", W1.address, T.assignment_step(1, 99))
    assert not log.is_credited("run-2", W1.address, T.assignment_step(1, 0))


def test_reopen_replays_runs_batches_votes_and_slash_outcomes(harness, tmp_path: Path) -> None:
    """Everything the new operations derive (runs, totals, pending votes, voids, finals) comes back from the
    entries alone, with and without the audit."""
    populate(harness, epochs=1, per_epoch=2)
    log = harness.ledger
    val2, val3 = T.identity("val2"), T.identity("val3")
    for who in (val2, val3):
        log.register(who, "validator", T.compute())
        log.deposit(who, 2_000)  # val2 pays for its voided slash and stays eligible
    log.set_run_validators(TR, SetRunValidators("run-1", tuple(sorted(v.address for v in (VAL, val2, val3)))))
    harness.advance_to(2)
    log.finalize_slash(W1, 0)  # slash 0 (populate's): final
    log.slash(VAL, T.slash(W1, 100, nonce=1001))  # slash 1: one vote, still pending
    log.void_slash(val2, 1)
    log.slash(val2, T.slash(W1, 50, nonce=1002))  # slash 2: voided by the owner
    log.void_slash(TR, 2)
    log.commit_credits(val3, T.batch("run-1", T.credit(W1, nonce=50)))
    expected = (log.snapshot(), log.head(), log.merkle_root())
    assert [s.status for s in expected[0].slashes] == ["final", "pending", "voided"]
    assert expected[0].slashes[1].votes == 1
    log.close()
    for audit in (False, True):
        reopened = SignedLog.open(tmp_path / "ledger.db", audit=audit, epochs=harness.clock)
        assert (reopened.snapshot(), reopened.head(), reopened.merkle_root()) == expected
        with pytest.raises(E.AlreadyVoted):  # the vote itself is replayed, not only its count
            reopened.void_slash(val2, 1)
        reopened.close()
    assert verify_log(tmp_path / "ledger.db").ok
    harness.ledger = SignedLog.open(tmp_path / "ledger.db", epochs=harness.clock)


def test_accumulator_matches_rfc6962_at_every_size() -> None:
    leaves = [sha256(bytes([i])) for i in range(70)]
    acc = MerkleAccumulator()
    assert acc.root() == merkle_root([])
    for i, leaf in enumerate(leaves):
        acc.append(leaf)
        assert acc.root() == merkle_root(leaves[: i + 1])


def test_verify_reports_garbage_files_instead_of_crashing(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"definitely not sqlite" * 100)
    report = verify_log(junk)
    assert not report.ok and report.first_bad is None
    with pytest.raises(E.CorruptLog):
        SignedLog.open(junk)
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()
    assert not verify_log(empty).ok


# --- audit: truncation, edited entries, reorders (the seal and the signed head) ------------------------


def copy_of(path: Path, name: str) -> Path:
    """A fresh byte-for-byte copy of a closed log to tamper with."""
    target = path.with_name(name)
    target.unlink(missing_ok=True)
    with sqlite3.connect(path) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    return target


def stored_entries(path: Path) -> list[LedgerEntry]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT data FROM entries ORDER BY idx")
        return [decode(LedgerEntry, bytes(d)) for (d,) in rows]


def rewrite(path: Path, entries: list[LedgerEntry], start: int) -> None:
    """What a host that edits history does: re-chain every entry from `start` (index, parent, hash and
    epoch columns all consistent), keeping each stored seal since it cannot forge its authors' keys."""
    head = sha256(encode(entries[start - 1])) if start else None
    with sqlite3.connect(path) as conn:
        if head is None:
            genesis = conn.execute("SELECT value FROM meta WHERE key = 'genesis'").fetchone()[0]
            head = sha256(bytes(genesis))
        for index in range(start, len(entries)):
            entry = replace(entries[index], index=index, prev_hash=head)
            data = encode(entry)
            conn.execute(
                "UPDATE entries SET data = ?, hash = ?, epoch = ? WHERE idx = ?",
                (data, sha256(data), entry.epoch, index),
            )
            head = sha256(data)


@pytest.mark.parametrize("k", [1, 3])
def test_verify_reports_truncation_naming_the_first_missing_entry(harness, tmp_path: Path, k: int) -> None:
    populate(harness)
    size = harness.ledger.size()
    harness.ledger.close()
    path = tmp_path / "ledger.db"
    tamper(path, "DELETE FROM entries WHERE idx >= ?", size - k)
    report = verify_log(path)
    assert report.truncated and isinstance(report.error, E.TruncatedLog)
    assert report.first_bad == size - k, report.error
    assert f"counts {size} entries, {size - k} remain" in str(report.error)
    with pytest.raises(E.TruncatedLog):  # and the node will not append over the loss
        SignedLog.open(path, epochs=harness.clock)
    harness.ledger = SignedLog.create(tmp_path / "other.db", PARAMS)  # for the fixture's close


def test_verify_refuses_a_head_it_cannot_attribute(harness, tmp_path: Path) -> None:
    """Truncating and re-signing the head with another key, or dropping the head, is caught."""
    populate(harness)
    size, ledger_id = harness.ledger.size(), harness.ledger.ledger_id
    harness.ledger.close()
    path = tmp_path / "ledger.db"
    cut = copy_of(path, "cut.db")
    tamper(cut, "DELETE FROM entries WHERE idx = ?", size - 1)
    entries = stored_entries(cut)
    forged = sign_head(W2, ledger_id, size - 1, sha256(encode(entries[-1])))  # W2 wrote no entry there
    tamper(cut, "UPDATE meta SET value = ? WHERE key = 'head'", encode(forged))
    report = verify_log(cut)
    assert report.first_bad == size - 2 and "not by entry" in str(report.error)
    headless = copy_of(path, "headless.db")
    tamper(headless, "DELETE FROM meta WHERE key = 'head'")
    report = verify_log(headless)
    assert not report.ok and report.first_bad is None and "no signed head" in str(report.error)
    harness.ledger = SignedLog.open(path, epochs=harness.clock)


@pytest.mark.parametrize("index", [0, 7, 13, -1])
def test_an_edited_epoch_is_blamed_on_its_own_entry(harness, tmp_path: Path, index: int) -> None:
    """Re-stamping an entry's epoch and re-chaining everything after it: the entry's seal breaks."""
    populate(harness)
    harness.ledger.close()
    path = tmp_path / "ledger.db"
    entries = stored_entries(path)
    index %= len(entries)
    later = entries[index].epoch + 1 if index == len(entries) - 1 else entries[index + 1].epoch
    edited = [*entries[:index], replace(entries[index], epoch=later), *entries[index + 1 :]]
    if edited[index] == entries[index]:  # the next entry shares its epoch: move both forward
        edited = [*entries[:index], *(replace(e, epoch=e.epoch + 1) for e in entries[index:])]
    rewrite(path, edited, index)
    report = verify_log(path)
    assert report.first_bad == index, report.error
    assert f"entry {index} (epoch {edited[index].epoch}) is not sealed by its author" in str(report.error)
    harness.ledger = SignedLog.create(tmp_path / "other.db", PARAMS)


def test_the_epoch_column_must_agree_with_the_entry(harness, tmp_path: Path) -> None:
    populate(harness)
    harness.ledger.close()
    path = tmp_path / "ledger.db"
    tamper(path, "UPDATE entries SET epoch = epoch + 5 WHERE idx = 9")
    report = verify_log(path)
    assert report.first_bad == 9 and "epoch column" in str(report.error)
    harness.ledger = SignedLog.create(tmp_path / "other.db", PARAMS)


def test_reordered_and_rechained_entries_are_blamed_on_the_first_moved(harness, tmp_path: Path) -> None:
    populate(harness)
    harness.ledger.close()
    path = tmp_path / "ledger.db"
    entries = stored_entries(path)
    with sqlite3.connect(path) as conn:  # move each seal with its entry, as a careful forger would
        seals = [bytes(s) for (s,) in conn.execute("SELECT seal FROM entries ORDER BY idx")]
        conn.execute("UPDATE entries SET seal = ? WHERE idx = 8", (seals[9],))
        conn.execute("UPDATE entries SET seal = ? WHERE idx = 9", (seals[8],))
    rewrite(path, [*entries[:8], entries[9], entries[8], *entries[10:]], 8)
    report = verify_log(path)
    assert report.first_bad == 8 and "not sealed by its author" in str(report.error)
    harness.ledger = SignedLog.create(tmp_path / "other.db", PARAMS)


def test_only_the_author_can_append_its_operation(harness) -> None:
    populate(harness)
    envelope = harness.ledger.sign(W1, StakeDeposit(5))
    before = harness.fingerprint()
    with pytest.raises(E.BadSignature, match="not sealed by its author"):
        harness.ledger.append_envelope(envelope, W2)
    assert harness.fingerprint() == before
    harness.ledger.append_envelope(envelope, W1)
    assert harness.ledger.stake(W1.address).bonded_gwei == 2_505


TAMPERS = st.one_of(
    st.tuples(st.just("truncate"), st.integers(1, 5)),
    st.tuples(st.just("edit"), st.integers(0, 24)),
    st.tuples(st.just("swap"), st.integers(0, 23)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tampering=TAMPERS)
def test_verify_names_the_tampered_entry(pristine: Path, tampering) -> None:
    """Whatever a host cuts, re-stamps or reorders (re-chaining all the rest), verify names that entry."""
    kind, at = tampering
    path = copy_of(pristine, "tampered.db")
    entries = stored_entries(path)
    size = len(entries)
    if kind == "truncate":
        tamper(path, "DELETE FROM entries WHERE idx >= ?", size - at)
        expected = size - at
    elif kind == "edit":
        rewrite(path, [*entries[:at], *(replace(e, epoch=e.epoch + 1) for e in entries[at:])], at)
        expected = at
    else:
        rewrite(path, [*entries[:at], entries[at + 1], entries[at], *entries[at + 2 :]], at)
        expected = at
    report = verify_log(path)
    assert report.first_bad == expected, (tampering, report.error)
    assert report.truncated == (kind == "truncate")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One honest 25-entry log over three epochs, copied before each tampering."""
    directory = tmp_path_factory.mktemp("pristine")
    h = T.SignedHarness.create(directory, PARAMS)
    populate(h, epochs=3, per_epoch=5)
    assert h.ledger.size() == 25
    h.close()
    return directory / "ledger.db"

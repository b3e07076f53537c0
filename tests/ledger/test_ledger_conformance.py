"""The conformance suite of spec/ledger.md, run on every backend in lockstep.

Each vector is a sequence of operations; some must be refused with a named error. For every backend the
driver checks each outcome, checks that a refusal left the fingerprint (the full query snapshot, plus
the log's size, head and Merkle root, or the chain height) unchanged, and then the backends' snapshots
are compared after every step: the same operations must give the same query results everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from crypto.hashing import sha256
from ledger import errors as E
from ledger import testing as T
from ledger.interface import Ledger
from ledger.types import Params
from protocol.errors import Reason

PARAMS = Params(
    min_stake_per_unit_gwei=1_000,
    unbonding_delay_epochs=2,
    slash_gwei=400,
    ejection_threshold=2,
    epoch_seconds=1_000,
)
NAMES = ("val", "val2", "w1", "w2", "relay", "stranger")
ASSIGNMENT = T.assignment_step(1, 7)
ID = {name: T.identity(name) for name in NAMES}


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[object], object]
    expect: type[E.LedgerError] | None = None


def register(who: str, role: str, units: int = 1, expect: type[E.LedgerError] | None = None) -> Step:
    return Step(
        f"register {who} as {role}", lambda h: h.ledger.register(ID[who], role, T.compute(units)), expect
    )


def deposit(who: str, amount: int, expect: type[E.LedgerError] | None = None) -> Step:
    return Step(f"{who} deposits {amount}", lambda h: h.ledger.deposit(ID[who], amount), expect)


def unbond(who: str, amount: int, expect: type[E.LedgerError] | None = None) -> Step:
    return Step(f"{who} unbonds {amount}", lambda h: h.ledger.unbond(ID[who], amount), expect)


def withdraw(who: str, expect: type[E.LedgerError] | None = None) -> Step:
    return Step(f"{who} withdraws", lambda h: h.ledger.withdraw(ID[who]), expect)


def advance(epoch: int) -> Step:
    return Step(f"advance to epoch {epoch}", lambda h: h.advance_to(epoch))


def contribute(
    validator: str, worker: str, nonce: int, expect: type[E.LedgerError] | None = None, **kw
) -> Step:
    op = T.contribution(ID[validator], ID[worker], nonce=nonce, **kw)
    return Step(
        f"{validator} credits {worker}#{nonce}",
        lambda h: h.ledger.record_contribution(ID[validator], op),
        expect,
    )


def contribute_op(validator: str, op, name: str, expect: type[E.LedgerError] | None = None) -> Step:
    return Step(
        f"{validator} credits {name}", lambda h: h.ledger.record_contribution(ID[validator], op), expect
    )


def slash(validator: str, worker: str, nonce: int, amount: int = 400, expect=None, **kw) -> Step:
    op = T.slash(ID[worker], amount, nonce=nonce, **kw)
    return Step(f"{validator} slashes {worker}#{nonce}", lambda h: h.ledger.slash(ID[validator], op), expect)


def slash_op(validator: str, op, name: str, expect: type[E.LedgerError] | None = None) -> Step:
    return Step(f"{validator} slashes {name}", lambda h: h.ledger.slash(ID[validator], op), expect)


SETUP = [
    register("val", "validator"),
    register("w1", "worker", units=2),
    register("w2", "worker"),
    deposit("val", 1_000),
    deposit("w1", 2_500),
    deposit("w2", 1_000),
]


def _forged_verdict_contribution():
    """A contribution whose verdict was signed by another validator than the one recording it."""
    honest = T.contribution(ID["val"], ID["w1"], nonce=50)
    submission = T.submission_envelope(ID["w1"], nonce=50)
    other = T.verdict_envelope(ID["val2"], submission, ID["w1"].address)
    return replace(honest, verdict=other)


def _rejected_verdict_contribution():
    submission = T.submission_envelope(ID["w1"], nonce=51)
    verdict = T.verdict_envelope(ID["val"], submission, ID["w1"].address, accepted=False)
    return replace(T.contribution(ID["val"], ID["w1"], nonce=51), verdict=verdict)


def _evidence_from_other_worker():
    """Evidence signed by w2 presented against w1: no signed submission of the slashed node."""
    op = T.slash(ID["w2"], 400, nonce=60)
    return replace(op, worker=ID["w1"].address)


def _evidence_wrong_digest():
    op = T.slash(ID["w1"], 400, nonce=61)
    return replace(op, submission_digest=sha256(b"some other submission"))


def _evidence_tampered_signature():
    op = T.slash(ID["w1"], 400, nonce=62)
    evidence = bytearray(op.evidence)
    evidence[-10] ^= 0x01  # inside the 65-byte signature at the end of the envelope
    evidence = bytes(evidence)
    return replace(op, evidence=evidence, submission_digest=sha256(evidence))


VECTORS: dict[str, list[Step]] = {
    "lifecycle": [
        *SETUP,
        contribute("val", "w1", 0),
        contribute("val", "w1", 1, tokens=250),
        contribute("val", "w2", 2, run="run-2", step=7),
        advance(1),
        unbond("w2", 400),
        contribute("val", "w2", 3, expect=E.InsufficientStake),  # below minimum: gets no work
        withdraw("w2", expect=E.StillUnbonding),
        advance(2),
        withdraw("w2", expect=E.StillUnbonding),
        advance(3),
        withdraw("w2"),
        withdraw("w2", expect=E.NothingToWithdraw),
        deposit("w2", 400),
        contribute("val", "w2", 3),
    ],
    "unknown_and_roles": [
        *SETUP,
        deposit("stranger", 100, expect=E.UnknownNode),
        unbond("stranger", 1, expect=E.UnknownNode),
        withdraw("stranger", expect=E.UnknownNode),
        register("val", "worker", expect=E.AlreadyRegistered),
        contribute("w2", "w1", 0, expect=E.WrongRole),
        contribute("val", "stranger", 0, expect=E.UnknownNode),
        register("relay", "relay"),
        deposit("relay", 1_000),
        contribute("relay", "w1", 0, expect=E.WrongRole),
        contribute("val", "val", 0, expect=E.WrongRole),
        slash("w2", "w1", 0, expect=E.WrongRole),
        slash("val", "stranger", 0, expect=E.UnknownNode),
        Step(
            "register with a malformed accelerator",
            lambda h: h.ledger.register(ID["w2"], "worker", replace(T.compute(), accelerator="GPU!")),
            E.MalformedOperation,
        ),
    ],
    "stake_rules": [
        *SETUP,
        unbond("w1", 2_501, expect=E.InsufficientStake),
        unbond("w1", 500),  # w1 now holds 2000 bonded: exactly its requirement
        contribute("val", "w1", 0),
        unbond("w1", 1),
        contribute("val", "w1", 1, expect=E.InsufficientStake),
        register("val2", "validator", units=2),
        deposit("val2", 1_999),
        contribute("val2", "w2", 2, expect=E.InsufficientStake),  # under-staked validator cannot vouch
        deposit("val2", 1),
        contribute("val2", "w2", 2),
        withdraw("w1", expect=E.StillUnbonding),
        advance(2),
        unbond("w1", 10),  # restarts the delay for the whole bucket
        withdraw("w1", expect=E.StillUnbonding),
        advance(4),
        withdraw("w1"),
    ],
    "contribution_evidence": [
        *SETUP,
        register("val2", "validator"),
        deposit("val2", 1_000),
        contribute("val", "w1", 0),
        contribute("val", "w1", 0, expect=E.DuplicateContribution),
        contribute("val2", "w1", 0, expect=E.DuplicateContribution),  # same submission, other validator
        contribute_op("val", _forged_verdict_contribution(), "with val2's verdict", E.InvalidEvidence),
        contribute_op("val", _rejected_verdict_contribution(), "with a rejecting verdict", E.InvalidEvidence),
        contribute_op(
            "val",
            replace(T.contribution(ID["val"], ID["w1"], nonce=52), tokens=999),
            "claiming more tokens than its verdict",
            E.InvalidEvidence,
        ),
        contribute_op(
            "val",
            replace(T.contribution(ID["val"], ID["w1"], nonce=53), worker=ID["w2"].address),
            "crediting another worker",
            E.InvalidEvidence,
        ),
        contribute_op(
            "val",
            replace(T.contribution(ID["val"], ID["w1"], nonce=54), verdict=b"\x80"),
            "with garbage for a verdict",
            E.InvalidEvidence,
        ),
        contribute("val", "w1", 55),
    ],
    "assignment_paid_once": [
        *SETUP,
        register("val2", "validator"),
        deposit("val2", 1_000),
        contribute("val", "w1", 10, step=ASSIGNMENT),
        # the same assignment sealed a second time (another digest), sent to another validator
        contribute("val2", "w1", 11, step=ASSIGNMENT, expect=E.DuplicateContribution),
        # ... or to the same validator
        contribute("val", "w1", 12, step=ASSIGNMENT, expect=E.DuplicateContribution),
        contribute("val", "w1", 13, step=ASSIGNMENT + 1),  # the worker's next counter
        contribute("val2", "w1", 14, step=T.assignment_step(2, 0)),  # counter 0 of the next version
        contribute("val2", "w1", 15, step=T.assignment_step(2, 0), expect=E.DuplicateContribution),
        contribute("val", "w2", 16, step=ASSIGNMENT),  # another worker's assignment
        contribute("val", "w1", 17, step=ASSIGNMENT, run="run-2"),  # the same step in another run
    ],
    "slash_evidence": [
        *SETUP,
        slash("val", "w1", 0, amount=401, expect=E.InvalidAmount),
        slash_op("val", _evidence_from_other_worker(), "w1 with w2's submission", E.InvalidEvidence),
        slash_op("val", _evidence_wrong_digest(), "naming another digest", E.InvalidEvidence),
        slash_op("val", _evidence_tampered_signature(), "with a tampered signature", E.InvalidEvidence),
        slash("val", "w1", 1, failing_chunks=(3, 1), expect=E.InvalidEvidence),
        slash("val", "w1", 1, failing_chunks=(), expect=E.InvalidEvidence),
        slash("val", "w1", 1, failing_chunks=(8,), expect=E.InvalidEvidence),  # 8 chunks: 0..7
        slash("val", "w1", 1, reason=Reason.BAD_SIGNATURE, expect=E.InvalidEvidence),
        slash_op(
            "val",
            replace(T.slash(ID["w1"], 400, nonce=2, run="run-1"), run="run-9"),
            "citing another run",
            E.InvalidEvidence,
        ),
        slash("val", "w1", 1, amount=150),
        slash("val", "w1", 1, expect=E.DuplicateSlash),
        slash("val", "w1", 3, failing_chunks=(), reason=Reason.BAD_SAMPLING, amount=1),
        slash("val", "w1", 4, failing_chunks=(), reason=Reason.MALFORMED_ROLLOUT, amount=1),
        # 607 and 610 (between and beside the slashable codes) are not slashable on either backend
        slash("val", "w1", 5, reason=Reason.UNKNOWN_CHECKPOINT, expect=E.InvalidEvidence),
        slash("val", "w1", 5, reason=Reason.ASSIGNMENT_REUSED, expect=E.InvalidEvidence),
    ],
    "slash_unbonding_and_eject": [
        *SETUP,
        contribute("val", "w1", 0),
        unbond("w1", 2_300),  # 200 bonded, 2300 unbonding: still slashable
        slash("val", "w1", 1),  # takes 200 bonded then 200 unbonding
        advance(1),
        slash("val", "w1", 2),  # second slash: ejected
        deposit("w1", 5_000, expect=E.NodeEjected),
        register("w1", "worker", expect=E.NodeEjected),
        contribute("val", "w1", 3, expect=E.NodeEjected),
        withdraw("w1", expect=E.StillUnbonding),
        slash("val", "w1", 4),  # an ejected node's remaining stake is still slashable
        advance(3),
        withdraw("w1"),
        slash("val", "w1", 5),  # nothing left: recorded, takes 0
        slash("val", "w2", 6),
        contribute("val", "w2", 7, expect=E.InsufficientStake),
    ],
    "validator_stake_and_ejection": [
        *SETUP,
        unbond("val", 1),
        slash("val", "w1", 0, expect=E.InsufficientStake),
        deposit("val", 1),
        slash("val", "w1", 0),
        slash("val", "w1", 1),
        contribute("val", "w1", 2, expect=E.NodeEjected),
        contribute("val", "w2", 3),
    ],
}


def run_vector(harness, steps: list[Step]) -> Iterator[tuple[str, str, object]]:
    """Apply steps; yield (step name, outcome, snapshot). Refusals must match and change nothing.

    The fingerprint (snapshot first) taken after one step is the "before" of the next.
    """
    harness.fund(*ID.values())
    before = harness.fingerprint()
    for step in steps:
        try:
            step.run(harness)
        except E.LedgerError as exc:
            assert step.expect is not None, f"{harness.name}: {step.name} was refused: {exc}"
            assert type(exc) is step.expect, f"{harness.name}: {step.name}: {type(exc).__name__} ({exc})"
            assert exc.detail, "a refusal must say why"
            outcome = type(exc).__name__
            after = harness.fingerprint()
            assert after == before, f"{harness.name}: refused {step.name} changed the ledger"
        else:
            assert step.expect is None, (
                f"{harness.name}: {step.name} should be refused ({step.expect.__name__})"
            )
            outcome = "ok"
            after = harness.fingerprint()
        yield step.name, outcome, after[0]
        before = after


def assert_lockstep(harnesses, steps: list[Step]) -> None:
    runs = [run_vector(h, steps) for h in harnesses]
    for results in zip(*runs, strict=True):
        first = results[0]
        for other, harness in zip(results[1:], harnesses[1:], strict=True):
            assert other[1] == first[1], f"{first[0]}: {harness.name} gave {other[1]}, signed gave {first[1]}"
            assert other[2] == first[2], f"after {first[0]}: {harness.name} shows another state"


def test_both_backends_implement_the_interface(tmp_path: Path) -> None:
    signed = T.SignedHarness.create(tmp_path, PARAMS)
    evm = T.EvmHarness.tester(PARAMS)
    assert isinstance(signed.ledger, Ledger) and isinstance(evm.ledger, Ledger)
    assert signed.ledger.params == evm.ledger.params == PARAMS
    signed.close()


@pytest.mark.parametrize("vector", sorted(VECTORS))
def test_backends_agree(vector: str, tmp_path: Path) -> None:
    signed = T.SignedHarness.create(tmp_path, PARAMS)
    evm = T.EvmHarness.tester(PARAMS)
    try:
        assert_lockstep([signed, evm], VECTORS[vector])
    finally:
        signed.close()


@pytest.mark.slow
@pytest.mark.parametrize("vector", sorted(VECTORS))
def test_backends_agree_on_anvil(vector: str, tmp_path: Path, anvil_url: str) -> None:
    signed = T.SignedHarness.create(tmp_path, PARAMS)
    evm = T.EvmHarness.anvil(anvil_url, PARAMS)
    try:
        assert_lockstep([signed, evm], VECTORS[vector])
    finally:
        signed.close()


def test_final_state_of_lifecycle(tmp_path: Path) -> None:
    """Spot-check the figures the lifecycle vector must end with (not only agreement)."""
    harness = T.SignedHarness.create(tmp_path, PARAMS)
    list(run_vector(harness, VECTORS["slash_unbonding_and_eject"]))
    w1 = harness.ledger.stake(ID["w1"].address)
    assert w1 is not None and (w1.bonded_gwei, w1.unbonding_gwei, w1.eligible) == (0, 0, False)
    node = harness.ledger.node(ID["w1"].address)
    assert node is not None and node.ejected and node.slash_count == 4
    takes = [s.taken_gwei for s in harness.ledger.slashes(ID["w1"].address)]
    assert takes == [400, 400, 400, 0]
    assert [s.ejected for s in harness.ledger.slashes(ID["w1"].address)] == [False, True, False, False]
    harness.close()

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

from swarmnode.crypto.hashing import sha256
from swarmnode.ledger import errors as E
from swarmnode.ledger.interface import Ledger
from swarmnode.ledger.types import SLASH_FINAL, SLASH_PENDING, SLASH_VOIDED, Params
from swarmnode.protocol.codec import decode
from swarmnode.protocol.envelope import Envelope, signing_digest
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.ledger_messages import (
    MAX_VERSIONS_PER_EPOCH,
    CommitCredits,
    Credit,
    RegisterRun,
    SetRunValidators,
)
from swarmnode.testing import ledger as T

PARAMS = Params(
    min_stake_per_unit_gwei=1_000,
    unbonding_delay_epochs=2,
    slash_gwei=400,
    ejection_threshold=2,
    epoch_seconds=1_000,
)
NAMES = ("tr", "tr2", "val", "val2", "val3", "out", "w1", "w2", "relay", "stranger")
ID = {name: T.identity(name) for name in NAMES}
ASSIGNMENT = T.assignment_step(1, 7)
MAX_STEP_NOW = T.assignment_step(MAX_VERSIONS_PER_EPOCH, 0)  # a run registered this epoch: its newest version

Expect = type[E.LedgerError] | None


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[object], object]
    expect: Expect = None


# --- step builders ---------------------------------------------------------------------------------


def register(who: str, role: str, units: int = 1, expect: Expect = None, peer_id: str | None = None) -> Step:
    return Step(
        f"register {who} as {role}" + ("" if peer_id is None else f" with peer id {peer_id[:12]!r}"),
        lambda h: h.ledger.register(ID[who], role, T.compute(units), peer_id),
        expect,
    )


def deposit(who: str, amount: int, expect: Expect = None) -> Step:
    return Step(f"{who} deposits {amount}", lambda h: h.ledger.deposit(ID[who], amount), expect)


def unbond(who: str, amount: int, expect: Expect = None) -> Step:
    return Step(f"{who} unbonds {amount}", lambda h: h.ledger.unbond(ID[who], amount), expect)


def withdraw(who: str, expect: Expect = None) -> Step:
    return Step(f"{who} withdraws", lambda h: h.ledger.withdraw(ID[who]), expect)


def advance(epoch: int) -> Step:
    return Step(f"advance to epoch {epoch}", lambda h: h.advance_to(epoch))


def new_run(
    owner: str, run: str, validators: tuple[str, ...], expect: Expect = None, *, window: int = 2, **kw
) -> Step:
    op = T.register_run(run, tuple(ID[v] for v in validators), window=window, **kw)
    return run_op(owner, op, f"{run} with validators {validators}, window {window} {kw or ''}", expect)


def run_op(owner: str, op: RegisterRun, name: str, expect: Expect = None) -> Step:
    return Step(f"{owner} registers {name}", lambda h: h.ledger.register_run(ID[owner], op), expect)


def set_validators(owner: str, run: str, validators: tuple[str, ...], expect: Expect = None) -> Step:
    op = SetRunValidators(run, tuple(sorted(ID[v].address for v in validators)))
    return set_op(owner, op, f"{run} validators to {validators}", expect)


def set_op(owner: str, op: SetRunValidators, name: str, expect: Expect = None) -> Step:
    return Step(f"{owner} sets {name}", lambda h: h.ledger.set_run_validators(ID[owner], op), expect)


def cr(worker: str, nonce: int = 0, **kw) -> Credit:
    """A credit for `worker`'s `nonce`-th submission (version 1, counter `nonce` unless `step` is given)."""
    return T.credit(ID[worker], nonce=nonce, **kw)


def commit(validator: str, run: str, *credits: Credit, expect: Expect = None, name: str = "") -> Step:
    """A CommitCredits of `credits` in canonical order (T.batch sorts them)."""
    return commit_op(validator, T.batch(run, *credits), name or describe(credits), expect)


def commit_op(validator: str, op: CommitCredits, name: str, expect: Expect = None) -> Step:
    return Step(
        f"{validator} commits to {op.run}: {name}",
        lambda h: h.ledger.commit_credits(ID[validator], op),
        expect,
    )


def describe(credits: tuple[Credit, ...]) -> str:
    names = {ID[n].address: n for n in NAMES}
    return ", ".join(f"{names[c.worker]}@{c.step:#x}/{c.tokens}t/{c.flops}f" for c in credits)


def slash(
    validator: str,
    worker: str,
    nonce: int,
    amount: int = 400,
    expect: Expect = None,
    run: str = "run-1",
    **kw,
) -> Step:
    op = T.slash(ID[worker], amount, nonce=nonce, run=run, **kw)
    return slash_op(validator, op, f"{worker}#{nonce} in {run} for {amount} {kw or ''}", expect)


def slash_op(validator: str, op, name: str, expect: Expect = None) -> Step:
    return Step(f"{validator} slashes {name}", lambda h: h.ledger.slash(ID[validator], op), expect)


def void(who: str, index: int, expect: Expect = None) -> Step:
    return Step(f"{who} voids slash {index}", lambda h: h.ledger.void_slash(ID[who], index), expect)


def finalize(who: str, index: int, expect: Expect = None) -> Step:
    return Step(f"{who} finalizes slash {index}", lambda h: h.ledger.finalize_slash(ID[who], index), expect)


SETUP = [
    register("tr", "trainer"),
    deposit("tr", 8_000),  # one minimum stake per run it holds: up to eight runs
    register("val", "validator"),
    register("val2", "validator"),
    register("w1", "worker", units=2),
    register("w2", "worker"),
    deposit("val", 1_000),
    deposit("val2", 1_000),
    deposit("w1", 2_500),
    deposit("w2", 1_000),
]
VAL3 = [register("val3", "validator"), deposit("val3", 1_000)]
OUTSIDER = [register("out", "validator"), deposit("out", 1_000)]  # staked, but in no run's set


# --- hostile operations (signed, well-formed, wrong) ----------------------------------------------


def evidence_from_other_worker():
    """Evidence signed by w2 presented against w1: no signed submission of the slashed node."""
    return replace(T.slash(ID["w2"], 400, nonce=60), worker=ID["w1"].address)


def evidence_tampered_signature():
    op = T.slash(ID["w1"], 400, nonce=62)
    evidence = bytearray(op.evidence)
    evidence[-10] ^= 0x01  # inside the 65-byte signature at the end of the envelope
    return replace(op, evidence=bytes(evidence))


def evidence_from_another_run():
    """w1 really signed it, but in run-2: cited in run-1, the recomputed digest recovers nobody's key."""
    return replace(T.slash(ID["w1"], 400, nonce=63, run="run-2"), run="run-1")


def unsorted_batch() -> CommitCredits:
    ordered = T.batch("run-1", cr("w1", 1), cr("w1", 2))
    return replace(ordered, credits=ordered.credits[::-1])


def duplicate_batch(step: int) -> CommitCredits:
    """Two credits for one assignment (two digests) in one batch: keys not strictly ascending."""
    return CommitCredits(
        "run-1", (cr("w1", step=step, digest=sha256(b"a")), cr("w1", step=step, digest=sha256(b"b")))
    )


def unsorted_run(run: str) -> RegisterRun:
    ordered = T.register_run(run, (ID["val"], ID["val2"]))
    return replace(ordered, validators=ordered.validators[::-1])


VECTORS: dict[str, list[Step]] = {
    # ledger.md §4.5: each run id costs its owner a minimum stake; an id with no records lapses once its
    # owner's stake has gone (squatting: one stake once claimed 201 ids and kept them after withdrawing)
    "run_ids_cost_stake": [
        *SETUP,
        register("tr2", "trainer"),
        deposit("tr2", 1_000),
        new_run("tr2", "run-a", ("val2",)),
        new_run("tr2", "run-b", ("val",), expect=E.InsufficientStake),  # one stake holds one run
        new_run("tr", "run-a", ("val",), expect=E.RunExists),
        unbond("tr2", 1_000),
        new_run("tr", "run-a", ("val",), expect=E.RunExists),  # still unbonding: still its own
        advance(2),
        withdraw("tr2"),
        commit("val2", "run-a", cr("w1", 0)),  # the set still stands until the id passes on
        new_run("tr", "run-b", ("val",)),
        deposit("tr2", 2_000),
        new_run("tr2", "run-c", ("val",)),
        unbond("tr2", 2_000),
        advance(4),
        withdraw("tr2"),
        new_run("tr", "run-a", ("val",), expect=E.RunExists),  # credits were recorded in it: it stays
        new_run("tr", "run-c", ("val2",)),  # nothing recorded, no stake behind it: it lapsed
        commit("val", "run-c", cr("w1", 1), expect=E.NotRunValidator),  # the old owner's set is gone
        commit("val2", "run-c", cr("w1", 1)),
        new_run("tr2", "run-d", ("val",), expect=E.InsufficientStake),
    ],
    "lifecycle": [
        *SETUP,
        new_run("tr", "run-1", ("val",)),
        commit("val", "run-1", cr("w1", 0), cr("w1", 1, tokens=250)),
        new_run("tr", "run-2", ("val",)),
        commit("val", "run-2", cr("w2", step=7)),
        advance(1),
        unbond("w2", 400),
        commit("val", "run-1", cr("w2", 3), expect=E.InsufficientStake),  # below minimum: gets no work
        withdraw("w2", expect=E.StillUnbonding),
        advance(2),
        withdraw("w2", expect=E.StillUnbonding),
        advance(3),
        withdraw("w2"),
        withdraw("w2", expect=E.NothingToWithdraw),
        deposit("w2", 400),
        commit("val", "run-1", cr("w2", 3)),
    ],
    "unknown_and_roles": [
        *SETUP,
        new_run("tr", "run-1", ("tr", "val", "relay", "stranger")),
        deposit("stranger", 100, expect=E.UnknownNode),
        unbond("stranger", 1, expect=E.UnknownNode),
        withdraw("stranger", expect=E.UnknownNode),
        register("val", "worker", expect=E.AlreadyRegistered),
        commit("w2", "run-1", cr("w1"), expect=E.WrongRole),
        commit("tr", "run-1", cr("w1"), expect=E.WrongRole),  # the owner is in its set, but no validator
        commit("val", "run-1", cr("stranger"), expect=E.UnknownNode),
        commit("stranger", "run-1", cr("w1"), expect=E.UnknownNode),  # named in the set, never registered
        register("relay", "relay"),
        deposit("relay", 1_000),
        commit("relay", "run-1", cr("w1"), expect=E.WrongRole),
        commit("val", "run-1", cr("val"), expect=E.WrongRole),
        commit("val", "run-1", cr("relay"), expect=E.WrongRole),
        slash("w2", "w1", 0, expect=E.WrongRole),
        slash("val", "stranger", 0, expect=E.UnknownNode),
        new_run("val", "run-v", ("val",), expect=E.WrongRole),
        new_run("relay", "run-r", ("val",), expect=E.WrongRole),
        new_run("stranger", "run-s", ("val",), expect=E.UnknownNode),
        set_validators("tr", "run-9", ("val",), expect=E.UnknownRun),
        void("tr", 0, expect=E.SlashNotPending),
        finalize("w1", 0, expect=E.SlashNotPending),
        Step(
            "register with a malformed accelerator",
            lambda h: h.ledger.register(ID["w2"], "worker", replace(T.compute(), accelerator="GPU!")),
            E.MalformedOperation,
        ),
        register("stranger", "validator"),
        deposit("stranger", 1_000),
        commit("stranger", "run-1", cr("w1")),  # registered now: the set named it before it existed
    ],
    "stake_rules": [
        *SETUP,
        new_run("tr", "run-1", ("val", "val3")),
        unbond("w1", 2_501, expect=E.InsufficientStake),
        unbond("w1", 500),  # w1 now holds 2000 bonded: exactly its requirement
        commit("val", "run-1", cr("w1", 0)),
        unbond("w1", 1),
        commit("val", "run-1", cr("w1", 1), expect=E.InsufficientStake),
        register("val3", "validator", units=2),
        deposit("val3", 1_999),
        commit("val3", "run-1", cr("w2", 2), expect=E.InsufficientStake),  # under-staked: cannot vouch
        slash("val3", "w2", 2, expect=E.InsufficientStake),
        deposit("val3", 1),
        commit("val3", "run-1", cr("w2", 2)),
        deposit("w1", 0, expect=E.MalformedOperation),
        unbond("w1", 0, expect=E.MalformedOperation),
        withdraw("w1", expect=E.StillUnbonding),
        advance(2),
        unbond("w1", 10),  # restarts the delay for the whole bucket
        withdraw("w1", expect=E.StillUnbonding),
        advance(4),
        withdraw("w1"),
    ],
    "peer_id_binding": [
        *SETUP,
        register("stranger", "worker", peer_id=ID["w1"].peer_id, expect=E.PeerIdMismatch),
        register("stranger", "worker", peer_id="peer", expect=E.PeerIdMismatch),
        register("stranger", "worker", peer_id="", expect=E.PeerIdMismatch),
        register("stranger", "worker", peer_id="1" * 128, expect=E.PeerIdMismatch),  # too long to decode
        register("stranger", "worker", peer_id="1" * 129, expect=E.MalformedOperation),  # above MaxLen
        register("stranger", "worker", peer_id=ID["stranger"].peer_id),
    ],
    "run_scoped_validators": [
        *SETUP,
        *OUTSIDER,
        register("tr2", "trainer"),
        new_run("tr2", "run-1", ("val",), expect=E.InsufficientStake),  # run ids go to staked trainers
        deposit("tr2", 1_000),
        new_run("val", "run-1", ("val",), expect=E.WrongRole),  # a validator does not own runs
        new_run("tr", "run-1", (), expect=E.MalformedOperation),
        run_op("tr", unsorted_run("run-1"), "run-1 with unsorted validators", E.MalformedOperation),
        run_op(
            "tr",
            replace(T.register_run("run-1", (ID["val"],)), validators=(ID["val"].address,) * 2),
            "run-1 naming one validator twice",
            E.MalformedOperation,
        ),
        run_op(
            "tr",
            replace(
                T.register_run("run-1"),
                validators=tuple(sorted(T.identity(f"v{i}").address for i in range(17))),
            ),
            "run-1 with 17 validators",
            E.MalformedOperation,
        ),
        # a window is how long one pending slash freezes stake: bounded for every run (ledger.md §2.2)
        run_op("tr", replace(T.register_run("run-1", (ID["val"],)), challenge_window_epochs=721),
               "run-1 with a window of 721 epochs", E.MalformedOperation),
        run_op("tr", replace(T.register_run("run-1", (ID["val"],)), challenge_window_epochs=2**32 - 1),
               "run-1 with a window of 2^32 - 1 epochs", E.MalformedOperation),
        new_run("tr", "run-w", ("val",), window=720),  # the bound itself is allowed
        new_run("tr", "run-1", ("val", "val2")),
        new_run("tr2", "run-1", ("out",), expect=E.RunExists),
        new_run("tr", "run-1", ("val",), expect=E.RunExists),
        commit("out", "run-1", cr("w1", 0), expect=E.NotRunValidator),  # staked, not in the set
        slash("out", "w1", 0, expect=E.NotRunValidator),
        commit("val", "run-9", cr("w1", 0), expect=E.UnknownRun),
        slash("val", "w1", 0, run="run-9", expect=E.UnknownRun),
        commit("val", "run-1", cr("w1", 0)),
        commit("val2", "run-1", cr("w1", 1)),
        set_validators("tr2", "run-1", ("out",), expect=E.NotRunOwner),
        set_validators("val", "run-1", ("val", "out"), expect=E.NotRunOwner),
        set_validators("tr", "run-1", (), expect=E.MalformedOperation),
        set_op(
            "tr",
            SetRunValidators("run-1", unsorted_run("run-1").validators),
            "run-1 validators unsorted",
            E.MalformedOperation,
        ),
        set_validators("tr", "run-9", ("val",), expect=E.UnknownRun),
        set_validators("tr", "run-1", ("val2", "out")),
        commit("val", "run-1", cr("w1", 2), expect=E.NotRunValidator),  # removed from the set
        slash("val", "w1", 2, expect=E.NotRunValidator),
        commit("out", "run-1", cr("w1", 2)),  # added to the set
        slash("out", "w1", 2, amount=10),
        new_run("tr2", "run-2", ("val",)),  # val still validates another owner's run
        commit("val", "run-2", cr("w1", 2)),
        commit("val2", "run-2", cr("w2", 0), expect=E.NotRunValidator),
        set_validators("tr", "run-1", ("val", "val2", "out")),
        commit("val", "run-1", cr("w2", 0)),
    ],
    "bounded_credits": [
        *SETUP,
        new_run("tr", "run-1", ("val",), max_tokens=500, max_flops_per_token=1_000),
        new_run("tr", "run-z", ("val",), max_tokens=1, max_flops_per_token=0),
        commit("val", "run-1", cr("w1", 0, tokens=501), expect=E.ExceedsRunBounds),
        commit("val", "run-1", cr("w1", 0, tokens=100, flops=100_001), expect=E.ExceedsRunBounds),
        commit("val", "run-1", cr("w1", 0, tokens=500, flops=500_000)),  # exactly at both bounds
        # a bad credit after good ones refuses the whole batch: the good ones are not recorded either
        commit("val", "run-1", cr("w1", 1), cr("w1", 2), cr("w1", 3, tokens=501), expect=E.ExceedsRunBounds),
        commit("val", "run-1", cr("w1", 1), cr("w1", 2), cr("w1", 3, flops=10**9), expect=E.ExceedsRunBounds),
        commit("val", "run-1", cr("w1", 1), cr("w2", 1), cr("w1", 0), expect=E.DuplicateContribution),
        commit("val", "run-1", cr("w1", 1), cr("w1", 2)),  # the refused batches recorded nothing
        commit_op("val", unsorted_batch(), "credits in descending order", E.MalformedOperation),
        commit_op("val", duplicate_batch(ASSIGNMENT), "one assignment twice", E.MalformedOperation),
        commit_op("val", CommitCredits("run-1", ()), "no credit", E.MalformedOperation),
        commit_op(
            "val",
            T.batch("run-1", *(cr("w1", i) for i in range(100, 613))),
            "513 credits",
            E.MalformedOperation,
        ),
        commit("val", "run-1", cr("w1", 9, tokens=0), expect=E.MalformedOperation),
        commit("val", "run-1", cr("w1", step=2**64, digest=sha256(b"x")), expect=E.MalformedOperation),
        commit("val", "run-z", cr("w1", 0, tokens=1, flops=1), expect=E.ExceedsRunBounds),
        commit("val", "run-z", cr("w1", 0, tokens=1, flops=0)),
        commit("val", "run-z", cr("w1", 1, tokens=2, flops=0), expect=E.ExceedsRunBounds),
        new_run("tr", "run-a", ("val",), max_tokens=0, expect=E.MalformedOperation),
        new_run("tr", "run-a", ("val",), max_tokens=2**32, expect=E.MalformedOperation),
        new_run("tr", "run-a", ("val",), max_flops_per_token=2**40, expect=E.MalformedOperation),
        new_run("tr", "run-a", ("val",), max_tokens=2**32 - 1, max_flops_per_token=2**32 - 1),
        commit("val", "run-a", cr("w2", 0, tokens=2**32 - 1, flops=(2**32 - 1) ** 2)),
        commit(
            "val",
            "run-a",
            cr("w2", 1, tokens=2**32 - 1, flops=(2**32 - 1) ** 2 + 1),
            expect=E.ExceedsRunBounds,
        ),
        new_run("tr", "run-b", ("val",), max_tokens=2**32 - 1, max_flops_per_token=2**40 - 1),
        commit("val", "run-b", cr("w2", 0, tokens=2**32 - 1, flops=2**64 - 1)),  # the largest credit
        commit("val", "run-b", cr("w2", 1, tokens=2**32 - 1, flops=2**64), expect=E.MalformedOperation),
        commit("val", "run-1", *(cr("w2", i) for i in range(512))),  # the largest batch
        # only assignments that can exist (issue #31: version 10^9, counters past the bound, step 2^64-1)
        new_run("tr", "run-c", ("val",), per_version=4),
        commit("val", "run-c", cr("w1", step=T.assignment_step(1, 3))),  # the last counter of a version
        commit("val", "run-c", cr("w1", step=T.assignment_step(1, 4)), expect=E.ExceedsRunBounds),
        commit("val", "run-c", cr("w1", step=T.assignment_step(3600, 0))),  # the newest version at epoch 0
        commit("val", "run-c", cr("w1", step=T.assignment_step(3601, 0)), expect=E.ExceedsRunBounds),
        commit("val", "run-c", cr("w1", step=T.assignment_step(10**9, 0)), expect=E.ExceedsRunBounds),
        commit("val", "run-c", cr("w1", step=2**64 - 1), expect=E.ExceedsRunBounds),
        advance(1),
        commit("val", "run-c", cr("w1", step=T.assignment_step(7200, 0))),  # one epoch older: 3,600 more
        new_run("tr", "run-d", ("val",), per_version=0, expect=E.MalformedOperation),
        new_run("tr", "run-d", ("val",), per_version=2**16 + 1, expect=E.MalformedOperation),
    ],
    "assignment_paid_once": [
        *SETUP,
        new_run("tr", "run-1", ("val", "val2")),
        new_run("tr", "run-2", ("val",)),
        commit("val", "run-1", cr("w1", step=ASSIGNMENT)),
        # the same assignment sealed a second time (another digest), to the same validator ...
        commit(
            "val", "run-1", cr("w1", step=ASSIGNMENT, digest=sha256(b"again")), expect=E.DuplicateContribution
        ),
        # ... or to another of the run's validators
        commit(
            "val2",
            "run-1",
            cr("w1", step=ASSIGNMENT, digest=sha256(b"again")),
            expect=E.DuplicateContribution,
        ),
        commit_op(
            "val", duplicate_batch(ASSIGNMENT + 1), "one assignment twice in a batch", E.MalformedOperation
        ),
        commit("val", "run-1", cr("w1", step=ASSIGNMENT + 1)),  # the worker's next counter
        commit(
            "val2",
            "run-1",
            cr("w2", step=ASSIGNMENT),
            cr("w1", step=ASSIGNMENT),
            expect=E.DuplicateContribution,
        ),
        commit("val2", "run-1", cr("w2", step=ASSIGNMENT)),  # another worker's assignment, refused above
        commit("val", "run-2", cr("w1", step=ASSIGNMENT)),  # the same step in another run
        # counters and versions that share or split the contract's bitmap slots
        commit("val2", "run-1", cr("w1", step=T.assignment_step(2, 7))),  # same slot, next version
        commit("val", "run-1", cr("w1", step=T.assignment_step(2, 7)), expect=E.DuplicateContribution),
        commit("val", "run-1", cr("w1", step=T.assignment_step(9, 7))),  # the next group of eight versions
        commit("val2", "run-1", cr("w1", step=T.assignment_step(9, 7)), expect=E.DuplicateContribution),
        commit(
            "val", "run-1", cr("w1", step=T.assignment_step(1, 31)), cr("w1", step=T.assignment_step(1, 32))
        ),
        commit("val2", "run-1", cr("w1", step=T.assignment_step(1, 32)), expect=E.DuplicateContribution),
        commit(
            "val", "run-1", cr("w1", step=T.assignment_step(1, 63)), cr("w1", step=T.assignment_step(1, 64))
        ),
        commit("val2", "run-1", cr("w1", step=T.assignment_step(1, 64)), expect=E.DuplicateContribution),
        commit("val", "run-1", cr("w1", step=T.assignment_step(1, 300))),
        commit("val2", "run-1", cr("w1", step=T.assignment_step(1, 300)), expect=E.DuplicateContribution),
        commit(
            "val",
            "run-1",
            cr("w1", step=T.assignment_step(1, 300 + 256)),
            cr("w1", step=T.assignment_step(2, 300)),
        ),
        # the largest counter and version the run allows now (2^16 per version; 3,600 versions per epoch)
        commit("val", "run-1", cr("w1", step=T.assignment_step(1, 2**16 - 1)), cr("w1", step=MAX_STEP_NOW)),
        commit(
            "val2", "run-1", cr("w1", step=MAX_STEP_NOW, digest=sha256(b"x")), expect=E.DuplicateContribution
        ),
        commit("val", "run-1", cr("w2", step=0)),
        commit("val", "run-1", cr("w2", step=0), expect=E.DuplicateContribution),
    ],
    "slash_evidence": [
        *SETUP,
        new_run("tr", "run-1", ("val",)),
        slash("val", "w1", 0, amount=401, expect=E.InvalidAmount),
        slash_op("val", evidence_from_other_worker(), "w1 with w2's submission", E.InvalidEvidence),
        slash_op("val", evidence_tampered_signature(), "with a tampered signature", E.InvalidEvidence),
        slash_op("val", evidence_from_another_run(), "w1 with its submission of run-2", E.InvalidEvidence),
        slash_op(
            "val",
            replace(T.slash(ID["w1"], 400), evidence=b"\x80"),
            "with garbage evidence",
            E.InvalidEvidence,
        ),
        slash("val", "w1", 1, failing_chunks=(3, 1), expect=E.InvalidEvidence),
        slash("val", "w1", 1, failing_chunks=(3, 3), expect=E.InvalidEvidence),
        slash("val", "w1", 1, failing_chunks=(), expect=E.InvalidEvidence),
        slash("val", "w1", 1, failing_chunks=(8,), expect=E.InvalidEvidence),  # 8 chunks: 0..7
        slash("val", "w1", 1, reason=Reason.BAD_SIGNATURE, expect=E.InvalidEvidence),
        slash("val", "w1", 1, amount=150),
        slash("val", "w1", 1, expect=E.DuplicateSlash),
        slash("val", "w1", 3, failing_chunks=(), reason=Reason.BAD_SAMPLING, amount=1),
        slash("val", "w1", 4, failing_chunks=(), reason=Reason.MALFORMED_ROLLOUT, amount=1),
        slash("val", "w1", 5, failing_chunks=(7,)),  # the last chunk
        # 607 and 610 (between and beside the slashable codes) are not slashable on either backend
        slash("val", "w1", 6, reason=Reason.UNKNOWN_CHECKPOINT, expect=E.InvalidEvidence),
        slash("val", "w1", 6, reason=Reason.ASSIGNMENT_REUSED, expect=E.InvalidEvidence),
    ],
    "accountable_slash": [
        *SETUP,
        new_run("tr", "run-1", ("val", "val2"), window=2),
        unbond("w1", 500),  # 2000 bonded (its requirement), 500 unbonding, released at epoch 2
        deposit("val", 500),
        unbond("val", 500),
        advance(2),
        slash("val", "w1", 1, amount=300),  # slash 0: pending until epoch 4
        slash("val", "w1", 1, amount=200, expect=E.DuplicateSlash),
        slash("val2", "w1", 1, expect=E.DuplicateSlash),  # one submission, one slash, whoever files it
        commit("val", "run-1", cr("w1", 0)),  # nothing was taken: w1 is still eligible
        finalize("w2", 0, expect=E.ChallengeWindowOpen),
        withdraw("w1", expect=E.SlashPending),  # the slashed worker
        withdraw("val", expect=E.SlashPending),  # and the slasher, who answers for a void
        withdraw("val2", expect=E.NothingToWithdraw),  # not a party
        advance(3),
        finalize("tr", 0, expect=E.ChallengeWindowOpen),
        slash("val2", "w2", 2, amount=100),  # slash 1: pending until epoch 5
        advance(4),
        void("tr", 0, expect=E.ChallengeWindowClosed),
        void("val2", 0, expect=E.ChallengeWindowClosed),
        finalize("stranger", 0),  # anyone may, even a key the ledger never saw: 300 taken from bonded
        finalize("w1", 0, expect=E.SlashNotPending),
        void("tr", 0, expect=E.SlashNotPending),
        finalize("w1", 2, expect=E.SlashNotPending),  # no such slash
        withdraw("w1"),
        withdraw("val"),
        commit("val", "run-1", cr("w1", 3), expect=E.InsufficientStake),  # 1700 of 2000 bonded
        advance(5),
        finalize("val", 1),
        withdraw("w2", expect=E.NothingToWithdraw),
    ],
    "voided_slash": [
        *SETUP,
        *VAL3,
        *OUTSIDER,
        new_run("tr", "run-1", ("val", "val2", "val3"), window=3),
        slash("val", "w1", 1, amount=300),  # slash 0
        void("val2", 0),
        void("val3", 0),  # the quorum (2 of the others): w1 keeps it all, val pays 300 and counts a slash
        void("tr", 0, expect=E.SlashNotPending),
        finalize("w1", 0, expect=E.SlashNotPending),
        commit("val", "run-1", cr("w1", 0), expect=E.InsufficientStake),  # 700 of 1000 bonded
        slash("val", "w1", 2, expect=E.InsufficientStake),
        deposit("val", 300),
        slash("val", "w1", 1, expect=E.DuplicateSlash),  # a voided submission stays cited
        commit("val", "run-1", cr("w1", 0)),
        slash("val", "w1", 2, amount=200),  # slash 1: quorum of val2, val3 is 2
        slash("val", "w2", 3, amount=100),  # slash 2: left to finalize after val is ejected
        void("val", 1, expect=E.NotRunValidator),  # the slasher does not vote on its own slash
        void("out", 1, expect=E.NotRunValidator),
        void("w2", 1, expect=E.WrongRole),
        void("stranger", 1, expect=E.UnknownNode),
        void("val2", 1),  # one vote: still pending
        void("val2", 1, expect=E.AlreadyVoted),
        finalize("w1", 1, expect=E.ChallengeWindowOpen),
        withdraw("val", expect=E.NothingToWithdraw),
        void("val3", 1),  # the quorum: voided, val pays 200, second slash count: ejected
        void("val3", 1, expect=E.SlashNotPending),
        commit("val", "run-1", cr("w1", 5), expect=E.NodeEjected),
        slash("val", "w1", 5, expect=E.NodeEjected),
        deposit("val", 1_000, expect=E.NodeEjected),
        withdraw("val", expect=E.StillUnbonding),  # what is left unbonds, slashable for the delay
        advance(3),
        finalize("w2", 2),  # the ejected slasher's slash still finalizes
        withdraw("val"),
        new_run("tr", "run-2", ("val2",), window=1),  # a set of one: only its owner can void
        slash("val2", "w2", 4, amount=50, run="run-2"),  # slash 3
        void("val3", 3, expect=E.NotRunValidator),
        void("val2", 3, expect=E.NotRunValidator),
        void("tr", 3),  # the owner's void: w2 keeps its stake, and it costs val2 nothing
        commit("val2", "run-1", cr("w1", 7)),  # val2 whole: 1000 bonded, no slash counted
        new_run("tr", "run-3", ("val2", "val3"), window=1),  # a set of two: one other vote voids
        slash("val2", "w2", 5, amount=50, run="run-3"),  # slash 4
        void("val3", 4),  # val2 pays 50, its first slash count: 950 of 1000, not ejected
        commit("val2", "run-1", cr("w1", 8), expect=E.InsufficientStake),
    ],
    "ejected_owner": [
        *SETUP,
        new_run("tr", "run-1", ("val", "val2"), window=0),
        new_run("tr", "run-2", ("val",), window=5),
        slash("val", "w1", 1, run="run-2"),  # slash 0: pending, for the owner to void
        slash("val", "tr", 1),  # a trainer's own signed submission is evidence too
        finalize("w1", 1),
        slash("val", "tr", 2),
        finalize("w1", 2),  # the owner's second final slash: ejected
        set_validators("tr", "run-1", ("val",), expect=E.NodeEjected),  # it loses its powers over the runs
        void("tr", 0, expect=E.NodeEjected),
        new_run("tr", "run-3", ("val",), expect=E.NodeEjected),
        set_validators("val", "run-1", ("val",), expect=E.NotRunOwner),  # and nobody inherits them
        void("val2", 0, expect=E.NotRunValidator),  # run-2's validators: val only, who slashed
        commit("val2", "run-1", cr("w2", 0)),  # the runs' records and validators carry on
        advance(5),
        finalize("w2", 0),
    ],
    "slash_unbonding_and_eject": [
        *SETUP,
        new_run("tr", "run-1", ("val",), window=0),  # window 0: final at once, never voidable
        commit("val", "run-1", cr("w1", 0)),
        unbond("w1", 2_300),  # 200 bonded, 2300 unbonding: still slashable
        slash("val", "w1", 1),
        void("tr", 0, expect=E.ChallengeWindowClosed),
        finalize("w2", 0),  # takes 200 bonded then 200 unbonding
        advance(1),
        slash("val", "w1", 2),
        finalize("w2", 1),  # second slash: ejected
        deposit("w1", 5_000, expect=E.NodeEjected),
        register("w1", "worker", expect=E.NodeEjected),
        commit("val", "run-1", cr("w1", 3), expect=E.NodeEjected),
        withdraw("w1", expect=E.StillUnbonding),
        slash("val", "w1", 4),  # an ejected node's remaining stake is still slashable
        finalize("val", 2),
        advance(3),
        withdraw("w1"),
        slash("val", "w1", 5),  # nothing left: recorded, takes 0
        finalize("val", 3),
        slash("val", "w2", 6),
        finalize("val", 4),
        commit("val", "run-1", cr("w2", 7), expect=E.InsufficientStake),
    ],
    "validator_stake_and_ejection": [
        *SETUP,
        new_run("tr", "run-1", ("val",), window=0),
        unbond("val", 1),
        slash("val", "w1", 0, expect=E.InsufficientStake),
        deposit("val", 1),
        slash("val", "w1", 0),
        slash("val", "w1", 1),
        finalize("w2", 1),
        commit("val", "run-1", cr("w1", 2)),  # one final slash: still eligible with 2100 bonded
        finalize("w2", 0),  # the second final slash ejects
        commit("val", "run-1", cr("w1", 2), expect=E.NodeEjected),
        commit("val", "run-1", cr("w2", 3)),
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


# --- figures the vectors must end with (not only agreement) ---------------------------------------


def final(tmp_path: Path, vector: str) -> T.SignedHarness:
    harness = T.SignedHarness.create(tmp_path, PARAMS)
    list(run_vector(harness, VECTORS[vector]))
    return harness


def test_final_state_of_slash_unbonding_and_eject(tmp_path: Path) -> None:
    harness = final(tmp_path, "slash_unbonding_and_eject")
    w1 = harness.ledger.stake(ID["w1"].address)
    assert w1 is not None and (w1.bonded_gwei, w1.unbonding_gwei, w1.eligible) == (0, 0, False)
    node = harness.ledger.node(ID["w1"].address)
    assert node is not None and node.ejected and node.slash_count == 4
    slashes = harness.ledger.slashes(ID["w1"].address)
    assert [s.taken_gwei for s in slashes] == [400, 400, 400, 0]
    assert [s.ejected for s in slashes] == [False, True, False, False]
    assert {s.status for s in slashes} == {SLASH_FINAL}
    harness.close()


def test_final_state_of_accountable_slash(tmp_path: Path) -> None:
    harness = final(tmp_path, "accountable_slash")
    first, second = harness.ledger.slashes()
    assert (first.status, first.taken_gwei, first.final_epoch, first.penalty_gwei) == (SLASH_FINAL, 300, 4, 0)
    assert (second.status, second.taken_gwei, second.final_epoch) == (SLASH_FINAL, 100, 5)
    w1 = harness.ledger.stake(ID["w1"].address)
    assert w1 is not None and (w1.bonded_gwei, w1.unbonding_gwei) == (1_700, 0)  # 2500 - 500 out - 300
    val = harness.ledger.stake(ID["val"].address)
    assert val is not None and (val.bonded_gwei, val.unbonding_gwei, val.eligible) == (1_000, 0, True)
    assert harness.ledger.node(ID["val"].address).slash_count == 0
    harness.close()


def test_final_state_of_voided_slash(tmp_path: Path) -> None:
    harness = final(tmp_path, "voided_slash")
    ledger = harness.ledger
    slashes = ledger.slashes()
    assert [s.status for s in slashes] == [
        SLASH_VOIDED,
        SLASH_VOIDED,
        SLASH_FINAL,
        SLASH_VOIDED,
        SLASH_VOIDED,
    ]
    assert [s.penalty_gwei for s in slashes] == [300, 200, 0, 0, 50]  # slash 3: the owner's void, free
    assert [s.taken_gwei for s in slashes] == [0, 0, 100, 0, 0]
    assert [s.votes for s in slashes] == [2, 2, 0, 0, 1]
    assert [s.ejected for s in slashes] == [False, True, False, False, False]
    w1 = ledger.stake(ID["w1"].address)
    assert w1 is not None and (w1.bonded_gwei, w1.eligible) == (2_500, True)  # two voided slashes: all kept
    val = ledger.node(ID["val"].address)
    assert val is not None and val.ejected and val.slash_count == 2
    assert ledger.stake(ID["val"].address).bonded_gwei == ledger.stake(ID["val"].address).unbonding_gwei == 0
    val2 = ledger.node(ID["val2"].address)
    assert val2 is not None and not val2.ejected and val2.slash_count == 1  # the owner's void counted none
    harness.close()


def test_a_pending_slash_takes_nothing(tmp_path: Path) -> None:
    """Part way through accountable_slash: slash 0 filed, nothing taken, the worker still eligible."""
    harness = T.SignedHarness.create(tmp_path, PARAMS)
    steps = VECTORS["accountable_slash"]
    filed = next(i for i, step in enumerate(steps) if step.name.startswith("val slashes w1#1"))
    list(run_vector(harness, steps[: filed + 1]))
    (record,) = harness.ledger.slashes()
    assert (record.status, record.taken_gwei, record.epoch, record.final_epoch) == (SLASH_PENDING, 0, 2, 4)
    envelope = decode(Envelope, T.slash(ID["w1"], 300, nonce=1).evidence)
    signed = signing_digest(
        envelope.type, envelope.run, envelope.sender, envelope.seq, envelope.ts, envelope.body
    )
    assert record.submission_digest == signed  # the digest the worker signed, recovered to it
    assert harness.ledger.is_eligible(ID["w1"].address)
    assert harness.ledger.stake(ID["w1"].address).bonded_gwei == 2_000
    harness.close()


def test_the_credited_figures_of_bounded_credits(tmp_path: Path) -> None:
    harness = final(tmp_path, "bounded_credits")
    totals = {(t.run, t.worker): (t.credits, t.tokens, t.flops) for t in harness.ledger.totals()}
    w1, w2 = ID["w1"].address, ID["w2"].address
    assert totals[("run-1", w1)] == (3, 700, 500_000 + 2 * 10**5)
    assert totals[("run-z", w1)] == (1, 1, 0)
    assert totals[("run-a", w2)] == (1, 2**32 - 1, (2**32 - 1) ** 2)
    assert totals[("run-b", w2)] == (1, 2**32 - 1, 2**64 - 1)
    assert totals[("run-1", w2)] == (512, 512 * 100, 512 * 10**5)
    assert totals[("run-c", w1)] == (3, 300, 3 * 10**5)
    assert [b.count for b in harness.ledger.batches()] == [1, 2, 1, 1, 1, 512, 1, 1, 1]
    harness.close()

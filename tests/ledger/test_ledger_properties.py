"""Random sequences of signed, well-formed operations on the signed log keep the ledger's invariants.

Hypothesis draws from a small pool of keys and runs, so the operations collide: registrations, stakes,
runs and their validator sets, batches of credits (resealed, duplicated, out of bounds, unsorted),
slashes with honest and hostile evidence, void votes, finalizations and epoch advances. After every
step: a refusal changed nothing (snapshot, size, head, tree root); totals are the sums of the
contributions; no assignment is paid twice; an accepted batch came from a validator in the run's set
then and stayed within the run's bounds; stake is conserved. At the end the file replays (audited) to
the same snapshot and `verify_log` passes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from swarmnode.crypto.hashing import sha256
from swarmnode.ledger import errors as E
from swarmnode.ledger.batches import credit_leaf, credits_root
from swarmnode.ledger.signedlog import SignedLog, verify_log
from swarmnode.ledger.state import worker_totals
from swarmnode.ledger.types import SLASH_FINAL, SLASH_PENDING, SLASH_VOIDED, Params, Snapshot
from swarmnode.protocol.ledger_messages import CommitCredits, Credit, SetRunValidators, Slash
from swarmnode.testing import ledger as T

PARAMS = Params(
    min_stake_per_unit_gwei=100,
    unbonding_delay_epochs=2,
    slash_gwei=150,
    ejection_threshold=2,
    epoch_seconds=10,
)
ROLE = {
    "tr": "trainer",
    "tr2": "trainer",
    "v1": "validator",
    "v2": "validator",
    "v3": "validator",
    "w1": "worker",
    "w2": "worker",
    "r": "relay",
}
ID = {n: T.identity(f"prop-{n}") for n in ROLE}
NAME = {i.address: n for n, i in ID.items()}
RUNS = ("run-a", "run-b")
VALIDATORS = ("v1", "v2", "v3")
PRELUDE_STAKE = 1_000  # ten times the requirement: unbonds rarely take a node out of play


@cache
def slash_op(worker: str, nonce: int, amount: int, run: str, hostile: str) -> Slash:
    """`hostile`: "" an honest slash; "other": another worker signed it; "run": signed in another run."""
    if hostile == "other":
        other = "w2" if worker == "w1" else "w1"
        return replace(T.slash(ID[other], amount, nonce=nonce, run=run), worker=ID[worker].address)
    if hostile == "run":
        return replace(T.slash(ID[worker], amount, nonce=nonce, run="run-elsewhere"), run=run)
    return T.slash(ID[worker], amount, nonce=nonce, run=run)


def credit_of(spec: tuple[str, int, int, int, int, bool]) -> Credit:
    worker, version, counter, tokens, flops, resealed = spec
    step = T.assignment_step(version, counter)
    digest = sha256(b"resealed" + bytes([version, counter % 256])) if resealed else None
    return T.credit(ID[worker], step=step, tokens=tokens, flops=flops, digest=digest)


def validator_set(names: frozenset[str]) -> tuple[bytes, ...]:
    return tuple(sorted(ID[n].address for n in names))


names = st.sampled_from(sorted(ROLE))
runs = st.sampled_from(RUNS)
credit_specs = st.tuples(
    st.sampled_from(("w1", "w2") * 4 + ("r",)),
    st.integers(0, 1),
    st.sampled_from((0, 1, 64, 300)),  # both halves of the contract's bitmap
    st.sampled_from((1, 50, 51, 500) * 3 + (501,)),
    st.sampled_from((0, 100, 5_000) * 3 + (10**6,)),
    st.booleans(),
)
COMMITS = st.tuples(
    st.just("commit"),
    st.sampled_from((*VALIDATORS, *VALIDATORS, "w1", "tr")),
    st.tuples(
        st.sampled_from(("run-a", "run-a", "run-b")),
        st.lists(credit_specs, min_size=1, max_size=4),
        st.sampled_from((False, False, False, True)),  # True: in drawn order, maybe unsorted
    ),
)
SLASHES = st.tuples(
    st.just("slash"),
    st.sampled_from(VALIDATORS),
    st.tuples(
        st.sampled_from(("w1", "w2")),
        st.integers(0, 3),
        st.sampled_from((1, 60, 150, 151)),
        st.sampled_from(("run-a", "run-a", "run-b")),
        st.sampled_from(("", "", "", "other", "run")),
    ),
)
BY_KIND = {
    "register": st.tuples(st.just("register"), names, st.integers(1, 2)),
    "deposit": st.tuples(st.just("deposit"), names, st.integers(1, 400)),
    "unbond": st.tuples(st.just("unbond"), names, st.integers(1, 400)),
    "withdraw": st.tuples(st.just("withdraw"), names, st.none()),
    "register_run": st.tuples(
        st.just("register_run"),
        st.sampled_from(("tr", "tr2", "v1")),
        st.tuples(
            runs,
            st.frozensets(st.sampled_from(VALIDATORS), max_size=3),
            st.integers(0, 3),
            st.sampled_from((50, 500)),
            st.sampled_from((0, 10, 1_000)),
        ),
    ),
    "set_validators": st.tuples(
        st.just("set_validators"),
        st.sampled_from(("tr", "tr2")),
        st.tuples(runs, st.frozensets(st.sampled_from(VALIDATORS), max_size=3)),
    ),
    "commit": COMMITS,
    "slash": SLASHES,
    "void": st.tuples(st.just("void"), st.sampled_from(("tr", "tr2", *VALIDATORS, "w1")), st.integers(0, 2)),
    "finalize": st.tuples(st.just("finalize"), names, st.integers(0, 2)),
    "advance": st.tuples(st.just("advance"), names, st.integers(1, 3)),
}
WEIGHTS = {"commit": 6, "slash": 3, "void": 3, "finalize": 2, "advance": 2}  # the rest: 1
OPERATIONS = st.sampled_from([k for k in BY_KIND for _ in range(WEIGHTS.get(k, 1))]).flatmap(BY_KIND.get)


def action(log: SignedLog, kind: str, who: str, arg) -> Callable[[], object]:
    """The ledger call one drawn operation makes (built before the call, so building never refuses)."""
    me = ID[who]
    if kind == "register":
        return lambda: log.register(me, ROLE[who], T.compute(arg))
    if kind == "deposit":
        return lambda: log.deposit(me, arg)
    if kind == "unbond":
        return lambda: log.unbond(me, arg)
    if kind == "withdraw":
        return lambda: log.withdraw(me)
    if kind == "register_run":
        run, members, window, max_tokens, max_fpt = arg
        op = T.register_run(
            run,
            tuple(ID[n] for n in members),
            window=window,
            max_tokens=max_tokens,
            max_flops_per_token=max_fpt,
        )
        return lambda: log.register_run(me, op)
    if kind == "set_validators":
        run, members = arg
        return lambda: log.set_run_validators(me, SetRunValidators(run, validator_set(members)))
    if kind == "commit":
        run, specs, raw = arg
        credits = [credit_of(s) for s in specs]
        op = CommitCredits(run, tuple(credits)) if raw else T.batch(run, *credits)  # raw: maybe unsorted
        return lambda: log.commit_credits(me, op)
    if kind == "slash":
        return lambda: log.slash(me, slash_op(*arg))
    if kind in ("void", "finalize"):  # arg counts back from the latest slash: 0 is the latest
        index = max(len(log.slashes()) - 1 - arg, 0)
        if kind == "void":
            return lambda: log.void_slash(me, index)
        return lambda: log.finalize_slash(me, index)
    raise AssertionError(kind)


@dataclass
class Books:
    """What the test counts itself, to hold the ledger's figures to."""

    deposited: int = 0
    withdrawn: int = 0


def fingerprint(log: SignedLog) -> tuple[object, ...]:
    return (log.snapshot(), log.size(), log.head(), log.merkle_root())


def check_invariants(snap: Snapshot, books: Books) -> None:
    assert list(snap.totals) == worker_totals(list(snap.contributions))
    paid = [(c.run, c.worker, c.step) for c in snap.contributions]
    assert len(paid) == len(set(paid)), "an assignment was credited twice"
    held = sum(s.bonded_gwei + s.unbonding_gwei for s in snap.stakes)
    taken = sum(s.taken_gwei + s.penalty_gwei for s in snap.slashes)
    assert books.deposited - books.withdrawn == held + taken, "stake is not conserved"
    for slash in snap.slashes:
        if slash.status == SLASH_PENDING:
            assert slash.taken_gwei == slash.penalty_gwei == 0
        elif slash.status == SLASH_FINAL:
            assert slash.penalty_gwei == 0 and slash.taken_gwei <= slash.requested_gwei
        else:
            assert slash.status == SLASH_VOIDED and slash.taken_gwei == 0
    for node, stake in zip(snap.nodes, snap.stakes, strict=True):
        assert stake.bonded_gwei >= 0 and stake.unbonding_gwei >= 0
        if node.ejected:
            assert stake.bonded_gwei == 0 and not stake.eligible
            assert node.slash_count >= PARAMS.ejection_threshold


def check_accepted_commit(before: Snapshot, after: Snapshot, author: bytes) -> None:
    """The new batch: from a validator in the run's set at that time, every credit within the run's bounds
    and paid to a worker that was eligible, its root the root of its credits."""
    batch = after.batches[-1]
    assert len(after.batches) == len(before.batches) + 1 and batch.validator == author
    run = next(r for r in before.runs if r.run == batch.run)
    assert author in run.validators
    eligible = {s.address for s in before.stakes if s.eligible}
    assert author in eligible
    new = after.contributions[batch.first_contribution : batch.first_contribution + batch.count]
    assert batch.first_contribution == len(before.contributions) and len(new) == batch.count
    for record in new:
        assert record.tokens <= run.max_tokens_per_credit
        assert record.flops <= record.tokens * run.max_flops_per_token
        assert record.worker in eligible and record.batch == batch.index
    leaves = [credit_leaf(Credit(r.worker, r.step, r.tokens, r.flops, r.rollout_digest)) for r in new]
    assert batch.root == credits_root(leaves)


def check_resolution(before: Snapshot, after: Snapshot, author: bytes) -> None:
    """A void or finalize by `author` that resolved a slash took what the rules say from whom they say:
    finalize takes up to the request from the worker; a void takes nothing from it, and a quorum's void up
    to the request from the slasher, the run owner's void nothing (spec/ledger.md §4.9; it adds no vote,
    whatever votes came before it)."""
    owners = {run.run: run.owner for run in before.runs}
    for old, new in zip(before.slashes, after.slashes, strict=True):
        if old == new or new.status == SLASH_PENDING:
            continue
        held = {s.address: s.bonded_gwei + s.unbonding_gwei for s in before.stakes}
        held_after = {s.address: s.bonded_gwei + s.unbonding_gwei for s in after.stakes}
        payer = new.worker if new.status == SLASH_FINAL else new.validator
        paid = new.taken_gwei if new.status == SLASH_FINAL else new.penalty_gwei
        owners_void = new.status == SLASH_VOIDED and author == owners[new.run]
        if owners_void:
            assert new.votes == old.votes
        owed = 0 if owners_void else new.requested_gwei
        assert paid == min(owed, held[payer])
        assert held_after[payer] == held[payer] - paid
        if new.validator != new.worker:
            other = new.validator if payer == new.worker else new.worker
            assert held_after[other] == held[other]


def prelude(h: T.SignedHarness, books: Books) -> None:
    """Most of the pool registered and staked, and run-a on the ledger: so most draws reach deep rules."""
    for who in ("tr", "v1", "v2", "v3", "w1", "w2"):
        h.ledger.register(ID[who], ROLE[who], T.compute())
        h.ledger.deposit(ID[who], PRELUDE_STAKE)
        books.deposited += PRELUDE_STAKE
    h.ledger.register_run(ID["tr"], T.register_run("run-a", (ID["v1"], ID["v2"]), window=3, max_tokens=500))


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(OPERATIONS, min_size=15, max_size=40))
@example([("register", "r", 1)] * 11 + [  # found by the search: the owner voids after one validator's vote
    ("set_validators", "tr", ("run-a", frozenset(["v1", "v2", "v3"]))),
    ("slash", "v2", ("w1", 0, 1, "run-a", "")),
    ("void", "v1", 0),
    ("void", "tr", 0),
])
def test_random_operations_keep_the_ledgers_invariants(ops) -> None:
    with tempfile.TemporaryDirectory() as directory:
        h = T.SignedHarness.create(Path(directory), PARAMS)
        books = Books()
        try:
            prelude(h, books)
            before = fingerprint(h.ledger)
            for kind, who, arg in ops:
                if kind == "advance":
                    h.advance_to(h.clock.epoch + arg)
                    before = fingerprint(h.ledger)
                    continue
                call = action(h.ledger, kind, who, arg)
                unbonding = h.ledger.stake(ID[who].address)
                try:
                    call()
                except E.LedgerError as exc:
                    assert exc.detail
                    assert fingerprint(h.ledger) == before, f"refused {kind} by {who} changed the ledger"
                    event(f"refused {kind}: {type(exc).__name__}")
                    continue
                event(f"accepted {kind}")
                after = fingerprint(h.ledger)
                if kind == "deposit":
                    books.deposited += arg
                elif kind == "withdraw":
                    assert unbonding is not None
                    books.withdrawn += unbonding.unbonding_gwei
                elif kind == "commit":
                    check_accepted_commit(before[0], after[0], ID[who].address)
                elif kind in ("void", "finalize"):
                    check_resolution(before[0], after[0], ID[who].address)
                check_invariants(after[0], books)
                before = after
            expected = (h.ledger.snapshot(), h.ledger.head(), h.ledger.merkle_root())
            h.ledger.close()
            reopened = SignedLog.open(Path(directory) / "ledger.db", audit=True, epochs=h.clock)
            h.ledger = reopened
            assert (reopened.snapshot(), reopened.head(), reopened.merkle_root()) == expected
            assert verify_log(Path(directory) / "ledger.db").ok
        finally:
            h.close()

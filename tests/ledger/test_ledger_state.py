"""The pure state machine: random operation sequences keep its invariants; refusals never mutate."""

from __future__ import annotations

import re
from functools import cache

import pytest

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ledger import errors as E
from ledger import testing as T
from ledger.evidence import SLASHABLE_REASONS, check_slash_form
from ledger.state import LedgerState, is_eligible, process_operation, required_stake
from ledger.types import Params
from protocol.errors import Reason
from protocol.ledger_messages import RegisterNode, StakeDeposit, StakeUnbond, StakeWithdraw

PARAMS = Params(
    min_stake_per_unit_gwei=100,
    unbonding_delay_epochs=2,
    slash_gwei=150,
    ejection_threshold=2,
    epoch_seconds=10,
)
NAMES = ("v1", "v2", "w1", "w2", "w3")
ID = {n: T.identity(n) for n in NAMES}
ROLE = {"v1": "validator", "v2": "validator", "w1": "worker", "w2": "worker", "w3": "relay"}


@cache
def contribution(validator: str, worker: str, nonce: int, counter: int | None = None):
    """`counter` None: the nonce's own assignment; else the worker's assignment (1, counter), so two
    nonces with one counter are one assignment sealed twice."""
    step = None if counter is None else T.assignment_step(1, counter)
    return T.contribution(ID[validator], ID[worker], nonce=nonce, step=step)


@cache
def slash(worker: str, nonce: int, amount: int):
    return T.slash(ID[worker], amount, nonce=nonce)


names = st.sampled_from(NAMES)
validators = st.sampled_from(NAMES[:3])  # mostly validators, sometimes a worker trying its luck
operations = st.one_of(
    st.tuples(st.just("register"), names, st.integers(1, 3)),
    st.tuples(st.just("deposit"), names, st.integers(1, 400)),
    st.tuples(st.just("unbond"), names, st.integers(1, 400)),
    st.tuples(st.just("withdraw"), names, st.just(0)),
    st.tuples(
        st.just("contribute"), validators, st.tuples(names, st.integers(0, 5), st.integers(0, 2))
    ),
    st.tuples(st.just("slash"), validators, st.tuples(names, st.integers(0, 5), st.integers(1, 200))),
    st.tuples(st.just("tick"), names, st.integers(0, 3)),
    st.tuples(st.just("withdraw"), names, st.just(0)),
)


def build(kind: str, who: str, arg):
    if kind == "register":
        return RegisterNode(ROLE[who], T.compute(arg), "peer")
    if kind == "deposit":
        return StakeDeposit(arg)
    if kind == "unbond":
        return StakeUnbond(arg)
    if kind == "withdraw":
        return StakeWithdraw()
    if kind == "contribute":
        return contribution(who, *arg)
    worker, nonce, amount = arg
    return slash(worker, nonce, amount)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operations, max_size=40))
def test_invariants_hold_and_refusals_change_nothing(ops) -> None:
    state = LedgerState(PARAMS)
    epoch = 0
    deposited = withdrawn = 0
    prelude = [("register", n, 1) for n in NAMES[:-1]] + [("deposit", n, 200) for n in NAMES[:-1]]
    for kind, who, arg in prelude + ops:  # w3 starts unregistered, so registration stays in play
        if kind == "tick":
            epoch += arg
            continue
        op = build(kind, who, arg)
        before = state.copy()
        try:
            result = process_operation(state, ID[who].address, op, epoch)
        except E.LedgerError as exc:
            assert state == before, f"refused {kind} mutated the state: {exc}"
            assert exc.detail
            continue
        event(f"accepted {kind}")
        if kind == "deposit":
            deposited += arg
        if kind == "withdraw":
            withdrawn += result
    taken = sum(s.taken_gwei for s in state.slashes)
    held = sum(n.bonded_gwei + n.unbonding_gwei for n in state.nodes.values())
    assert held == deposited - withdrawn - taken  # stake is conserved
    for node in state.nodes.values():
        assert node.bonded_gwei >= 0 and node.unbonding_gwei >= 0
        if node.info.ejected:
            assert node.bonded_gwei == 0 and not is_eligible(PARAMS, node)
            assert node.info.slash_count >= PARAMS.ejection_threshold
        if is_eligible(PARAMS, node):
            assert node.bonded_gwei >= required_stake(PARAMS, node)
    digests = [c.rollout_digest for c in state.contributions]
    assert len(digests) == len(set(digests))  # never credited twice
    assignments = [(c.run, c.worker, c.step) for c in state.contributions]
    assert len(assignments) == len(set(assignments))  # each assignment paid once
    for record in state.contributions:
        assert state.nodes[record.validator].info.role == "validator"
        assert state.nodes[record.worker].info.role == "worker"


def test_the_state_machine_reads_no_clock() -> None:
    """Same operations, same epochs → the same state, whenever it runs (replayability)."""

    def run() -> LedgerState:
        state = LedgerState(PARAMS)
        for who in ("v1", "w1"):
            process_operation(state, ID[who].address, RegisterNode(ROLE[who], T.compute(), "p"), 0)
        for who in ("v1", "w1"):
            process_operation(state, ID[who].address, StakeDeposit(300), 1)
        process_operation(state, ID["v1"].address, contribution("v1", "w1", 0), 2)
        process_operation(state, ID["v1"].address, slash("w1", 0, 100), 3)
        return state

    assert run() == run()


def test_ejection_moves_remaining_stake_to_unbonding() -> None:
    state = LedgerState(PARAMS)
    for who, units in (("v1", 1), ("w1", 1)):
        process_operation(state, ID[who].address, RegisterNode(ROLE[who], T.compute(units), "p"), 0)
        process_operation(state, ID[who].address, StakeDeposit(400), 0)
    process_operation(state, ID["v1"].address, slash("w1", 0, 150), 1)
    record = process_operation(state, ID["v1"].address, slash("w1", 1, 150), 5)
    node = state.nodes[ID["w1"].address]
    assert record.ejected and node.info.ejected
    assert (node.bonded_gwei, node.unbonding_gwei, node.release_epoch) == (
        0,
        100,
        5 + PARAMS.unbonding_delay_epochs,
    )


def staked_state() -> LedgerState:
    state = LedgerState(PARAMS)
    for who in ("v1", "v2", "w1", "w2"):
        process_operation(state, ID[who].address, RegisterNode(ROLE[who], T.compute(), "p"), 0)
        process_operation(state, ID[who].address, StakeDeposit(400), 0)
    return state


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(("v1", "v2")), st.sampled_from(("w1", "w2")), st.integers(0, 9),
                  st.integers(0, 3)),
        max_size=12,
    )
)
def test_an_assignment_is_credited_exactly_once(submissions) -> None:
    """Any validators, any resealings: the first submission of each (run, worker, step) is paid, no other."""
    state = staked_state()
    paid: set[tuple[str, int]] = set()
    for validator, worker, nonce, counter in submissions:
        op = contribution(validator, worker, nonce, counter)
        before = state.copy()
        try:
            process_operation(state, ID[validator].address, op, 1)
        except E.DuplicateContribution as exc:
            assert (worker, counter) in paid and state == before
            assert "already credited" in exc.detail
            continue
        assert (worker, counter) not in paid
        paid.add((worker, counter))
    assert len(state.contributions) == len(paid)


def test_a_resealed_assignment_is_refused_naming_it() -> None:
    state = staked_state()
    step = T.assignment_step(4, 2)
    process_operation(state, ID["v1"].address, T.contribution(ID["v1"], ID["w1"], nonce=1, step=step), 1)
    again = T.contribution(ID["v2"], ID["w1"], nonce=2, step=step)
    named = f"run 'run-1', worker 0x{ID['w1'].address.hex()}, step {step} (version 4, counter 2)"
    with pytest.raises(E.DuplicateContribution, match=re.escape(named)):
        process_operation(state, ID["v2"].address, again, 1)


def test_a_malformed_rollout_is_slashable() -> None:
    """609 is recomputable from the signed submission and the run descriptor: it may be slashed."""
    assert Reason.MALFORMED_ROLLOUT in SLASHABLE_REASONS
    op = T.slash(ID["w1"], 100, nonce=3, failing_chunks=(), reason=Reason.MALFORMED_ROLLOUT)
    check_slash_form(op)
    state = staked_state()
    record = process_operation(state, ID["v1"].address, op, 1)
    assert record.reason_code == 609 and record.taken_gwei == 100

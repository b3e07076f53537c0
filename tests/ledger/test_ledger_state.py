"""The pure state machine and ledger.batches: refusals never mutate, derived figures equal their definitions.

Random sequences of signed operations through the signed log are tests/ledger/test_ledger_properties.py;
here each rule is exercised on a `LedgerState` directly (no log, no clock) and the Merkle helpers against
their definitions and an independent ABI encoder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import eth_abi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.crypto.hashing import keccak256
from swarmnode.ledger import errors as E
from swarmnode.ledger.batches import (
    LOW_COUNTERS,
    MAX_PROOF_DEPTH,
    VERSIONS_PER_SLOT,
    CreditProof,
    credit_leaf,
    credit_path,
    credit_slot,
    credits_root,
    root_from_path,
    run_key,
)
from swarmnode.ledger.evidence import SLASHABLE_REASONS, check_slash_form
from swarmnode.ledger.state import (
    LedgerState,
    Operation,
    process_operation,
    void_quorum,
    worker_totals,
)
from swarmnode.ledger.types import SLASH_FINAL, SLASH_PENDING, SLASH_VOIDED, Params, RunInfo
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.ledger_messages import (
    CommitCredits,
    Credit,
    FinalizeSlash,
    RegisterNode,
    RegisterRun,
    SetRunValidators,
    StakeDeposit,
    StakeUnbond,
    StakeWithdraw,
    VoidSlash,
)
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
    "v1": "validator",
    "v2": "validator",
    "v3": "validator",
    "out": "validator",
    "w1": "worker",
    "w2": "worker",
    "r": "relay",
}
ID = {n: T.identity(n) for n in (*ROLE, "nobody")}
A = {n: i.address for n, i in ID.items()}


def apply(state: LedgerState, who: str, op: Operation, epoch: int = 0) -> object:
    return process_operation(state, A[who], op, epoch)


def register_op(who: str, units: int = 1) -> RegisterNode:
    return RegisterNode(ROLE[who], T.compute(units), ID[who].peer_id)


def staked_state(window: int = 2) -> LedgerState:
    """Everyone registered and fully staked; run-1 owned by tr with validators v1, v2, v3."""
    state = LedgerState(PARAMS)
    for who in ROLE:
        apply(state, who, register_op(who))
        apply(state, who, StakeDeposit(400))
    apply(state, "tr", T.register_run("run-1", (ID["v1"], ID["v2"], ID["v3"]), window=window, max_tokens=500))
    return state


def busy_state() -> LedgerState:
    """staked_state plus a credited batch, a pending slash with one void vote, and unbonding stake."""
    state = staked_state()
    apply(state, "v1", T.batch("run-1", T.credit(ID["w1"], nonce=0), T.credit(ID["w2"], nonce=0)))
    apply(state, "v1", T.slash(ID["w1"], 100, nonce=5))
    apply(state, "v2", VoidSlash(0))
    apply(state, "w2", StakeUnbond(50))
    return state


def test_the_state_machine_reads_no_clock() -> None:
    """Same operations, same epochs: the same state, whenever it runs (replayability)."""
    assert busy_state() == busy_state()


# --- every refusal leaves the state exactly as it was ----------------------------------------------


@dataclass(frozen=True)
class Refusal:
    name: str
    author: str
    op: Operation
    error: type[E.LedgerError]
    epoch: int = 1


def credits(*nonces: int, worker: str = "w1", **kw) -> tuple[Credit, ...]:
    return tuple(T.credit(ID[worker], nonce=n, **kw) for n in nonces)


REFUSALS = [
    Refusal("epoch regression", "w1", StakeDeposit(1), E.EpochRegression, epoch=-1),
    Refusal("register twice", "w1", register_op("w1"), E.AlreadyRegistered),
    Refusal(
        "someone else's peer id",
        "nobody",
        RegisterNode("worker", T.compute(), ID["w1"].peer_id),
        E.PeerIdMismatch,
    ),
    Refusal("deposit unregistered", "nobody", StakeDeposit(5), E.UnknownNode),
    Refusal("unbond above bonded", "w1", StakeUnbond(401), E.InsufficientStake),
    Refusal("withdraw nothing", "w1", StakeWithdraw(), E.NothingToWithdraw),
    Refusal("withdraw early", "w2", StakeWithdraw(), E.StillUnbonding),
    Refusal("run by a validator", "v1", T.register_run("run-2", (ID["v1"],)), E.WrongRole),
    Refusal("run twice", "tr", T.register_run("run-1", (ID["v1"],)), E.RunExists),
    Refusal("run with no validator", "tr", T.register_run("run-2", ()), E.MalformedOperation),
    Refusal("validators by another", "v1", SetRunValidators("run-1", (A["v1"],)), E.NotRunOwner),
    Refusal("validators of no run", "tr", SetRunValidators("run-9", (A["v1"],)), E.UnknownRun),
    Refusal(
        "validators unsorted",
        "tr",
        SetRunValidators("run-1", tuple(sorted((A["v1"], A["v2"]))[::-1])),
        E.MalformedOperation,
    ),
    Refusal("commit to no run", "v1", T.batch("run-9", *credits(1)), E.UnknownRun),
    Refusal("commit by an outsider", "out", T.batch("run-1", *credits(1)), E.NotRunValidator),
    Refusal("commit by a worker", "w1", T.batch("run-1", *credits(1)), E.WrongRole),
    Refusal("commit nothing", "v1", CommitCredits("run-1", ()), E.MalformedOperation),
    Refusal("commit unsorted", "v1", CommitCredits("run-1", credits(2, 1)), E.MalformedOperation),
    Refusal(
        "last credit above bounds",
        "v1",
        T.batch("run-1", *credits(1, 2), *credits(3, tokens=501)),
        E.ExceedsRunBounds,
    ),
    Refusal(
        "last credit too many flops",
        "v1",
        T.batch("run-1", *credits(1, 2), *credits(3, flops=10**9)),
        E.ExceedsRunBounds,
    ),
    Refusal(
        "one credit paid already",
        "v2",
        T.batch("run-1", *credits(1, 2), *credits(0, worker="w2")),
        E.DuplicateContribution,
    ),
    Refusal("credit a relay", "v1", T.batch("run-1", *credits(1), *credits(1, worker="r")), E.WrongRole),
    Refusal("slash by an outsider", "out", T.slash(ID["w1"], 100, nonce=6), E.NotRunValidator),
    Refusal("slash above the parameter", "v1", T.slash(ID["w1"], 151, nonce=6), E.InvalidAmount),
    Refusal("slash twice", "v2", T.slash(ID["w1"], 100, nonce=5), E.DuplicateSlash),
    Refusal(
        "slash another worker's evidence",
        "v1",
        replace(T.slash(ID["w2"], 100, nonce=6), worker=A["w1"]),
        E.InvalidEvidence,
    ),
    Refusal("void twice", "v2", VoidSlash(0), E.AlreadyVoted),
    Refusal("void own slash", "v1", VoidSlash(0), E.NotRunValidator),
    Refusal("void by an outsider", "out", VoidSlash(0), E.NotRunValidator),
    Refusal("void no slash", "tr", VoidSlash(1), E.SlashNotPending),
    Refusal("void after the window", "tr", VoidSlash(0), E.ChallengeWindowClosed, epoch=2),
    Refusal("run ids are first come", "tr", T.register_run("run-1", (ID["v2"],)), E.RunExists),
    Refusal("finalize in the window", "w2", FinalizeSlash(0), E.ChallengeWindowOpen),
    Refusal("finalize no slash", "w2", FinalizeSlash(7), E.SlashNotPending, epoch=5),
]


@pytest.mark.parametrize("refusal", REFUSALS, ids=[r.name for r in REFUSALS])
def test_a_refusal_changes_nothing(refusal: Refusal) -> None:
    state = busy_state()
    before = state.copy()
    with pytest.raises(refusal.error) as caught:
        apply(state, refusal.author, refusal.op, refusal.epoch)
    assert type(caught.value) is refusal.error and caught.value.detail
    assert state == before


def test_withdraw_waits_for_every_slash_the_node_is_party_to() -> None:
    state = staked_state(window=3)
    apply(state, "w1", StakeUnbond(10))
    apply(state, "v1", StakeDeposit(10))
    apply(state, "v1", StakeUnbond(10))
    apply(state, "v1", T.slash(ID["w1"], 100, nonce=1), epoch=2)
    for who in ("w1", "v1"):
        before = state.copy()
        with pytest.raises(E.SlashPending):
            apply(state, who, StakeWithdraw(), 2)
        assert state == before
    apply(state, "nobody", FinalizeSlash(0), 5)  # anyone may finalize: even a key that never registered
    assert [apply(state, who, StakeWithdraw(), 5) for who in ("w1", "v1")] == [10, 10]
    assert all(node.pending_slashes == 0 for node in state.nodes.values())


# --- credits: totals, roots, proofs ----------------------------------------------------------------


def credited_state() -> LedgerState:
    state = staked_state()
    apply(state, "v1", T.batch("run-1", *credits(0, 1, 2), *credits(0, 1, worker="w2", tokens=7, flops=700)))
    apply(state, "tr", T.register_run("run-2", (ID["v2"],)))
    apply(state, "v2", T.batch("run-2", *credits(0, tokens=3, flops=0)))
    apply(state, "v3", T.batch("run-1", *credits(*range(3, 40), worker="w1", tokens=11, flops=110)), 1)
    return state


def test_totals_are_the_sums_of_the_contributions() -> None:
    state = credited_state()
    assert list(state.totals.values()) == worker_totals(state.contributions)
    assert worker_totals(state.contributions, run="run-2") == [
        t for t in state.totals.values() if t.run == "run-2"
    ]
    w1 = state.totals[("run-1", A["w1"])]
    assert (w1.credits, w1.tokens, w1.flops) == (40, 3 * 100 + 37 * 11, 3 * 10**5 + 37 * 110)


def batch_credits(state: LedgerState, index: int) -> list[Credit]:
    batch = state.batches[index]
    members = state.contributions[batch.first_contribution : batch.first_contribution + batch.count]
    assert all(r.batch == index and r.run == batch.run and r.validator == batch.validator for r in members)
    return [Credit(r.worker, r.step, r.tokens, r.flops, r.rollout_digest) for r in members]


def test_batch_roots_are_the_roots_of_their_credits_and_every_credit_proves() -> None:
    state = credited_state()
    assert [b.count for b in state.batches] == [5, 1, 37]
    assert [r.index for r in state.contributions] == list(range(43))
    for batch in state.batches:
        members = batch_credits(state, batch.index)
        leaves = [credit_leaf(c) for c in members]
        assert batch.root == credits_root(leaves)
        for i, credit in enumerate(members):
            proof = CreditProof(
                contribution=batch.first_contribution + i,
                batch=batch.index,
                run=batch.run,
                validator=batch.validator,
                leaf_index=i,
                count=batch.count,
                credit=credit,
                path=credit_path(leaves, i),
                root=batch.root,
            )
            assert proof.verify()
            assert not replace(proof, credit=replace(credit, tokens=credit.tokens + 1)).verify()


def test_a_credit_is_an_abi_encoded_leaf() -> None:
    """The leaf the contract computes: keccak256(abi.encode(address, uint64, uint64, uint64, bytes32))."""
    credit = T.credit(ID["w1"], step=2**64 - 1, tokens=2**64 - 1, flops=12345)
    encoded = eth_abi.encode(
        ["address", "uint64", "uint64", "uint64", "bytes32"],
        [credit.worker, credit.step, credit.tokens, credit.flops, credit.rollout_digest],
    )
    assert credit_leaf(credit) == keccak256(encoded)
    assert run_key("run-1") == keccak256(b"run-1")


def leaves_of(n: int) -> list[bytes]:
    return [keccak256(b"leaf %d" % i) for i in range(n)]


def shape(index: int, count: int) -> tuple[tuple[int, int], ...]:
    """At each level, (sibling present, this node is a right child): what a path of (index, count) encodes."""
    out = []
    while count > 1:
        out.append((int(index % 2 == 1 or index + 1 < count), index % 2))
        index //= 2
        count = (count + 1) // 2
    return tuple(out)


@pytest.mark.parametrize("n", range(1, 41))
def test_every_leaf_of_every_tree_size_proves_and_nothing_else_does(n: int) -> None:
    leaves = leaves_of(n)
    root = credits_root(leaves)
    assert credits_root(leaves[:1]) == leaves[0]
    for i, leaf in enumerate(leaves):
        path = credit_path(leaves, i)
        assert root_from_path(leaf, i, n, path) == root
        assert len(path) == sum(present for present, _ in shape(i, n)) <= MAX_PROOF_DEPTH
        for j in range(n):  # another index: its path has another length, or hashes in another order
            if j != i:
                assert root_from_path(leaf, j, n, path) != root
        for other in (leaf for k, leaf in enumerate(leaves) if k != i):
            assert root_from_path(other, i, n, path) != root
        assert root_from_path(leaf, i, n, (*path, leaf)) is None  # one sibling too many
        if path:
            assert root_from_path(leaf, i, n, path[:-1]) is None  # one too few
        for count in range(1, 45):  # another count proves only where the tree has the same shape at i
            if count != n:
                proved = root_from_path(leaf, i, count, path) == root
                assert proved == (i < count and shape(i, count) == shape(i, n)), (i, count)
        assert root_from_path(leaf, n, n, path) is None and root_from_path(leaf, -1, n, path) is None


def test_batch_helpers_refuse_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        credits_root([])
    with pytest.raises(IndexError):
        credit_path(leaves_of(3), 3)
    leaf = leaves_of(1)[0]
    assert root_from_path(leaf, 0, 1, ()) == leaf
    assert root_from_path(leaf, 0, 2**20, (leaf,) * (MAX_PROOF_DEPTH + 1)) is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
        | st.tuples(st.integers(0, 9), st.integers(0, 300)),
        min_size=2,
        max_size=20,
        unique=True,
    )
)
def test_credit_slots_name_each_assignment_once(assignments: list[tuple[int, int]]) -> None:
    """Distinct (version, counter) steps of one worker get distinct (slot, bit) pairs in the bitmap."""
    slots = [credit_slot("run-1", A["w1"], T.assignment_step(v, c)) for v, c in assignments]
    assert len(set(slots)) == len(slots)
    assert all(0 <= bit < 256 for _, bit in slots)


def test_low_counters_of_eight_versions_share_one_slot() -> None:
    assert (LOW_COUNTERS, VERSIONS_PER_SLOT) == (32, 8)  # 8 x 32 = the 256 bits of one storage word
    versions = range(8, 16)
    slots = {credit_slot("run-1", A["w1"], T.assignment_step(v, c)) for v in versions for c in range(32)}
    assert {key for key, _ in slots} == {credit_slot("run-1", A["w1"], T.assignment_step(8, 0))[0]}
    assert len(slots) == 256
    others = (
        credit_slot("run-1", A["w1"], T.assignment_step(7, 0)),  # the previous group of versions
        credit_slot("run-1", A["w1"], T.assignment_step(16, 0)),  # the next one
        credit_slot("run-1", A["w1"], T.assignment_step(8, 32)),  # a high counter
        credit_slot("run-1", A["w2"], T.assignment_step(8, 0)),  # another worker
        credit_slot("run-2", A["w1"], T.assignment_step(8, 0)),  # another run
    )
    assert all(key not in {k for k, _ in slots} for key, _ in others)
    high = {credit_slot("run-1", A["w1"], T.assignment_step(3, c)) for c in range(32, 256 + 32)}
    assert len(high) == 256 and len({key for key, _ in high}) == 2  # 32..255 in one slot, 256.. the next


# --- slashes: pending, void, finalize --------------------------------------------------------------


@pytest.mark.parametrize(("size", "quorum"), [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (16, 8)])
def test_the_void_quorum_is_a_majority_of_the_other_validators(size: int, quorum: int) -> None:
    validators = tuple(sorted(T.identity(f"q{i}").address for i in range(size)))
    run = RunInfo("run-1", A["tr"], validators, 1, 1, 0, 0)
    assert void_quorum(run, validators[0]) == quorum
    assert void_quorum(run, A["nobody"]) == size // 2 + 1  # a slasher since removed from the set


def test_a_quorum_voids_and_the_slasher_pays() -> None:
    state = staked_state()
    record = apply(state, "v1", T.slash(ID["w1"], 120, nonce=1), 1)
    assert (record.status, record.taken_gwei, record.final_epoch) == (SLASH_PENDING, 0, 3)
    assert state.nodes[A["w1"]].pending_slashes == state.nodes[A["v1"]].pending_slashes == 1
    assert apply(state, "v3", VoidSlash(0), 2).status == SLASH_PENDING
    voided = apply(state, "v2", VoidSlash(0), 2)
    assert (voided.status, voided.votes, voided.penalty_gwei, voided.ejected) == (SLASH_VOIDED, 2, 120, False)
    assert (state.nodes[A["w1"]].bonded_gwei, state.nodes[A["v1"]].bonded_gwei) == (400, 280)
    assert state.nodes[A["v1"]].info.slash_count == 1 and state.nodes[A["w1"]].info.slash_count == 0
    assert state.voters == {} and all(n.pending_slashes == 0 for n in state.nodes.values())


def test_an_owners_voids_cost_no_one() -> None:
    """An owner risks no stake on a slash, so its void takes none: three voids (the ejection threshold is 2)
    leave the slasher's stake, slash count and membership whole, and the worker's stake too (issue #31: an
    owner burned and ejected an honest validator this way to protect a colluding cheater)."""
    state = staked_state()
    for nonce in (1, 2, 3):
        apply(state, "v1", T.slash(ID["w1"], 100, nonce=nonce))
    for index in (0, 1, 2):
        record = apply(state, "tr", VoidSlash(index), 1)
        assert (record.status, record.penalty_gwei, record.ejected) == (SLASH_VOIDED, 0, False)
        assert record.votes == 0
    for who in ("v1", "w1"):
        node = state.nodes[A[who]]
        assert (node.bonded_gwei, node.info.slash_count, node.info.ejected, node.pending_slashes) == (
            400, 0, False, 0
        )
    apply(state, "v1", T.batch("run-1", *credits(0)), 1)  # still a validator of the run


def test_a_second_slash_voided_by_a_quorum_ejects_the_validator() -> None:
    state = staked_state()
    for nonce in (1, 2):
        apply(state, "v1", T.slash(ID["w1"], 100, nonce=nonce))
    apply(state, "v2", VoidSlash(0))
    apply(state, "v3", VoidSlash(0))  # a majority of the others (v2, v3): 2 votes
    apply(state, "v2", VoidSlash(1), 1)
    record = apply(state, "v3", VoidSlash(1), 1)
    v1 = state.nodes[A["v1"]]
    assert record.ejected and v1.info.ejected
    assert (v1.bonded_gwei, v1.unbonding_gwei, v1.release_epoch) == (
        0,
        200,
        1 + PARAMS.unbonding_delay_epochs,
    )
    with pytest.raises(E.NodeEjected):
        apply(state, "v1", T.batch("run-1", *credits(0)), 1)


def test_finalizing_moves_an_ejected_workers_remaining_stake_to_unbonding() -> None:
    state = staked_state(window=0)
    apply(state, "v1", T.slash(ID["w1"], 150, nonce=0), 1)
    apply(state, "w2", FinalizeSlash(0), 1)
    apply(state, "v1", T.slash(ID["w1"], 150, nonce=1), 5)
    record = apply(state, "w2", FinalizeSlash(1), 5)
    node = state.nodes[A["w1"]]
    assert (record.status, record.taken_gwei, record.ejected) == (SLASH_FINAL, 150, True)
    assert node.info.ejected and (node.bonded_gwei, node.unbonding_gwei, node.release_epoch) == (
        0,
        100,
        5 + PARAMS.unbonding_delay_epochs,
    )


def test_a_resealed_assignment_is_refused_naming_it() -> None:
    state = staked_state()
    step = T.assignment_step(4, 2)
    apply(state, "v1", T.batch("run-1", T.credit(ID["w1"], step=step)), 1)
    again = T.batch("run-1", T.credit(ID["w1"], step=step, digest=keccak256(b"resealed")))
    named = f"run 'run-1', worker 0x{A['w1'].hex()}, step {step} (version 4, counter 2)"
    with pytest.raises(E.DuplicateContribution, match=re.escape(named)):
        apply(state, "v2", again, 1)


def test_a_malformed_rollout_is_slashable() -> None:
    """609 is recomputable from the signed submission and the run descriptor: it may be slashed."""
    assert Reason.MALFORMED_ROLLOUT in SLASHABLE_REASONS
    op = T.slash(ID["w1"], 100, nonce=3, failing_chunks=(), reason=Reason.MALFORMED_ROLLOUT)
    check_slash_form(op)
    state = staked_state(window=0)
    record = apply(state, "v1", op, 1)
    assert record.reason_code == 609 and record.status == SLASH_PENDING
    assert apply(state, "w1", FinalizeSlash(0), 1).taken_gwei == 100


def test_an_ejected_owner_loses_its_powers_and_an_unstaked_trainer_gets_none() -> None:
    state = staked_state(window=0)
    for nonce in (1, 2):
        apply(state, "v1", T.slash(ID["tr"], 100, nonce=nonce))
        apply(state, "w1", FinalizeSlash(nonce - 1))
    assert state.nodes[A["tr"]].info.ejected
    apply(state, "v1", T.slash(ID["w1"], 100, nonce=3))  # slash 2, pending (window 0: already closable)
    refusals = [
        ("tr", SetRunValidators("run-1", (A["v1"],)), E.NodeEjected),
        ("tr", T.register_run("run-2", (ID["v1"],)), E.NodeEjected),
        ("v1", SetRunValidators("run-1", (A["v1"],)), E.NotRunOwner),
    ]
    fresh = LedgerState(PARAMS)
    apply(fresh, "tr", register_op("tr"))
    for author, op, error in refusals:
        before = state.copy()
        with pytest.raises(error):
            apply(state, author, op)
        assert state == before
    before = fresh.copy()
    with pytest.raises(E.InsufficientStake, match="to hold 1 run"):
        apply(fresh, "tr", T.register_run("run-1", (ID["v1"],)))
    assert fresh == before


def test_a_run_is_registered_as_declared() -> None:
    state = staked_state()
    op = RegisterRun("run-2", tuple(sorted((A["v2"], A["out"]))), 9, 77, 5)
    apply(state, "tr", op, 3)
    assert state.runs["run-2"] == RunInfo("run-2", A["tr"], op.validators, 9, 77, 5, 3)
    apply(state, "tr", SetRunValidators("run-2", (A["v1"],)), 4)
    assert state.runs["run-2"] == RunInfo("run-2", A["tr"], (A["v1"],), 9, 77, 5, 3)

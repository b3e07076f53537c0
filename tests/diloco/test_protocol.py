"""The pure DiLoCo rules (protocol/diloco.py): typed refusals, the contributor-set rule, routes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.protocol import diloco as rules
from swarmnode.protocol.envelope import seal
from swarmnode.protocol.errors import Ignore, Reason, Reject
from swarmnode.protocol.messages import DilocoEntry
from tests.conformance.keys import NOW_MS, RUN
from tests.diloco.cases_diloco import (
    DIGEST,
    OUTSIDER,
    OWNER,
    PLAN,
    ROUND,
    THETA,
    A,
    B,
    _contribution,
    _sealed,
    _vote,
)


def verify(envelope: bytes, round: int = ROUND, base: bytes | None = THETA[ROUND]) -> rules.Contribution:
    return rules.verify_contribution(
        envelope, plan=PLAN, digest=DIGEST, round=round, base=base, now_ms=NOW_MS
    )


def test_a_valid_contribution_names_its_author_and_digest() -> None:
    envelope = _sealed(_contribution(), A)
    found = verify(envelope)
    assert found.sender == A.address and found.entry().trainer == A.address
    assert found.manifest.run == rules.contribution_namespace(RUN, PLAN.trainers.index(A.address))
    assert found.manifest.version == ROUND


def test_a_bad_signature_is_rejected() -> None:
    envelope = bytearray(_sealed(_contribution(), A))
    envelope[-5] ^= 0x01
    with pytest.raises(Reject) as refused:
        verify(bytes(envelope))
    assert refused.value.reason is Reason.BAD_SIGNATURE


def test_a_contribution_from_a_non_trainer_is_rejected() -> None:
    with pytest.raises(Reject) as refused:
        verify(_sealed(_contribution(OUTSIDER), OUTSIDER))
    assert refused.value.reason is Reason.WRONG_SENDER


def test_a_wrong_round_is_ignored_as_stale_or_not_for_us() -> None:
    envelope = _sealed(_contribution(), A)
    with pytest.raises(Ignore) as past:
        verify(envelope, round=ROUND + 1)
    with pytest.raises(Ignore) as future:
        verify(envelope, round=ROUND - 1)
    assert (past.value.reason, future.value.reason) == (Reason.STALE, Reason.NOT_FOR_US)


def test_a_wrong_hash_is_rejected() -> None:
    with pytest.raises(Reject) as refused:
        verify(_sealed(_contribution(merkle_root=bytes(32)), A))
    assert refused.value.reason is Reason.BAD_HASH


def test_another_lineage_is_ignored_not_blamed() -> None:
    envelope = _sealed(_contribution(base=THETA[5]), A)
    with pytest.raises(Ignore) as refused:
        verify(envelope)
    assert refused.value.reason is Reason.NOT_FOR_US
    assert verify(envelope, base=None).message.base == THETA[5]


def test_a_vote_must_name_its_voter_and_only_trainers() -> None:
    ok = rules.verify_vote(_sealed(_vote(), B), plan=PLAN, digest=DIGEST, round=ROUND, now_ms=NOW_MS)
    assert ok.sender == B.address
    with pytest.raises(Reject) as refused:
        rules.verify_vote(_sealed(_vote(), OUTSIDER), plan=PLAN, digest=DIGEST, round=ROUND, now_ms=NOW_MS)
    assert refused.value.reason is Reason.WRONG_SENDER


def test_the_run_must_be_signed_by_the_pinned_owner() -> None:
    envelope = seal(OWNER, PLAN, run=RUN, seq=1, ts=NOW_MS)
    assert rules.verify_plan(envelope, run=RUN, owner=OWNER.address, now_ms=NOW_MS) == PLAN
    with pytest.raises(Reject) as refused:
        rules.verify_plan(envelope, run=RUN, owner=A.address, now_ms=NOW_MS)
    assert refused.value.reason is Reason.WRONG_SENDER


# --- the contributor-set rule --------------------------------------------------------------------

TRAINERS = [bytes([i]) * 20 for i in range(1, 6)]


def entries(authors: frozenset[bytes]) -> tuple[DilocoEntry, ...]:
    return tuple(DilocoEntry(a, a[:1] * 32) for a in sorted(authors))


@st.composite
def holdings(draw: st.DrawFn) -> dict[bytes, frozenset[bytes]]:
    """Voters and what each holds: always its own contribution, maybe some of the others."""
    voters = draw(st.sets(st.sampled_from(TRAINERS), min_size=2, max_size=5))
    return {v: frozenset({v} | draw(st.sets(st.sampled_from(TRAINERS)))) for v in voters}


@given(holdings())
@settings(max_examples=300, deadline=None)
def test_trainers_that_saw_the_same_votes_decide_the_same(held: dict[bytes, frozenset[bytes]]) -> None:
    decisions = set()
    for me in held:
        votes = {v: entries(h) for v, h in held.items() if v != me}
        decisions.add(rules.decide(me, entries(held[me]), votes))
    assert len(decisions) == 1
    decided = {e.trainer for e in decisions.pop()}
    for author in decided:  # a decided contribution is held by a voter other than its author
        assert any(author in h for v, h in held.items() if v != author)


@given(st.lists(st.floats(0, 3), min_size=2, max_size=5), st.floats(0.1, 2))
@settings(max_examples=200, deadline=None)
def test_timing_skew_alone_never_splits_the_trainers(times: list[float], timeout: float) -> None:
    """Contributions published at `times`, each trainer collecting until its own time + timeout, every
    vote reaching everyone: all trainers average one set, and nobody's own contribution is lost while
    another trainer held it."""
    authors = TRAINERS[: len(times)]
    at = dict(zip(authors, times, strict=True))
    held = {a: frozenset(b for b in authors if at[b] <= at[a] + timeout) for a in authors}
    decisions = {
        rules.decide(a, entries(held[a]), {v: entries(h) for v, h in held.items() if v != a}) for a in authors
    }
    assert len(decisions) == 1


def test_an_author_with_two_contributions_is_dropped() -> None:
    a, b = TRAINERS[:2]
    mine = (DilocoEntry(a, bytes(32)), DilocoEntry(b, b"\x01" * 32))
    theirs = (DilocoEntry(a, bytes(32)), DilocoEntry(b, b"\x02" * 32))
    assert rules.decide(a, mine, {b: theirs}) == (DilocoEntry(a, bytes(32)),)


def test_lineage_and_join_choices() -> None:
    low, high = sorted((THETA[1], THETA[2]))
    assert rules.winning_base(high, {high: {TRAINERS[0]}, low: {TRAINERS[1]}}) == low
    assert rules.winning_base(low, {low: {TRAINERS[0]}, high: set(TRAINERS[1:3])}) == high
    offers = [(TRAINERS[0], 2, high), (TRAINERS[1], 3, high), (TRAINERS[2], 3, low), (TRAINERS[3], 3, high)]
    assert rules.choose_outer_state(offers) == (3, high)
    assert rules.choose_outer_state([]) is None


def test_routes_round_trip() -> None:
    paths = {
        rules.plan_path(RUN): rules.Route("plan", RUN),
        rules.outer_path(RUN, 4, 9): rules.Route("outer", RUN, after=4, wait_s=9),
        rules.vote_path(RUN, 7, 3): rules.Route("vote", RUN, 7, wait_s=3),
        rules.contribution_path(RUN, 7, A.address): rules.Route("contribution", RUN, 7, A.address),
    }
    for path, route in paths.items():
        assert rules.parse_route(path, 30) == route
    assert rules.parse_route(rules.vote_path(RUN, 7, 99), 30) == rules.Route("vote", RUN, 7, wait_s=30)


def test_namespaces_fit_a_run_id_for_every_trainer_index() -> None:
    run = "r" * rules.MAX_RUN_LEN
    for index in (0, rules.MAX_TRAINERS - 1):
        for name in (rules.contribution_namespace(run, index), rules.outer_namespace(run, index)):
            assert len(name) <= 64

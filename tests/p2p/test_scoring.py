"""Peer scores: penalties by error class, decay, bans and their expiry (time is an argument)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.node.p2p.scoring import Action, Fault, PeerScores, ScoreParams
from swarmnode.protocol.errors import Reason


def test_penalties_follow_the_error_class() -> None:
    params = ScoreParams()
    assert params.penalty(Reason.UNDECODABLE) == params.malformed_penalty
    assert params.penalty(Reason.BAD_SIGNATURE) == params.forged_penalty
    assert params.penalty(Reason.BAD_PROOF) == params.rule_penalty
    assert params.penalty(Reason.REPLAYED_SEQ) == 0.0  # Ignore-class reasons never cost a peer
    assert params.penalty(Fault.BAD_FRAME) == params.bad_frame_penalty


def test_ignores_do_not_touch_the_score() -> None:
    scores = PeerScores()
    for _ in range(100):
        assert scores.penalize("p", Reason.DUPLICATE, 0.0) is Action.NONE
    assert scores.score("p", 0.0) == 0.0 and scores.statistics(0.0)["tracked_peers"] == 0


def test_forgeries_ban_after_four() -> None:
    scores = PeerScores()
    actions = [scores.penalize("p", Reason.BAD_SIGNATURE, 0.0) for _ in range(4)]
    assert actions == [Action.NONE, Action.NONE, Action.NONE, Action.BAN]
    assert scores.is_banned("p", 10.0)
    assert scores.penalize("p", Reason.BAD_SIGNATURE, 11.0) is Action.NONE  # already banned: no second ban
    assert scores.statistics(11.0)["bans_total"] == 1


def test_scores_decay_with_the_half_life() -> None:
    scores = PeerScores(ScoreParams(half_life_s=10.0))
    scores.penalize("p", Reason.UNDECODABLE, 0.0)
    assert scores.score("p", 10.0) == pytest.approx(-5.0)
    assert scores.score("p", 20.0) == pytest.approx(-2.5)


def test_slow_offenders_below_the_decay_rate_are_not_banned() -> None:
    scores = PeerScores(ScoreParams(half_life_s=60.0))
    for minute in range(60):
        assert scores.penalize("p", Reason.UNDECODABLE, minute * 60.0) is Action.NONE
    assert scores.score("p", 3600.0) > -25


def test_bans_expire_and_the_peer_restarts_on_probation() -> None:
    params = ScoreParams(ban_seconds=100.0)
    scores = PeerScores(params)
    for _ in range(4):
        scores.penalize("p", Reason.BAD_SIGNATURE, 0.0)
    assert scores.expire_bans(50.0) == []
    assert scores.expire_bans(100.0) == ["p"]
    assert not scores.is_banned("p", 100.0)
    assert scores.score("p", 100.0) == params.ban_threshold / 2
    assert scores.penalize("p", Reason.BAD_SIGNATURE, 100.0) is Action.NONE
    assert scores.penalize("p", Reason.BAD_SIGNATURE, 100.0) is Action.BAN  # a repeat offender goes faster


def test_memory_is_bounded_and_banned_peers_are_kept() -> None:
    scores = PeerScores(max_peers=3)
    for _ in range(4):
        scores.penalize("bad", Reason.BAD_SIGNATURE, 0.0)
    for i in range(10):
        scores.penalize(f"p{i}", Reason.UNDECODABLE, 0.0)
    assert scores.statistics(0.0)["tracked_peers"] == 3
    assert scores.is_banned("bad", 1.0)


def test_unauthorised_and_ledger_refusals_have_their_own_penalties() -> None:
    params = ScoreParams()
    assert params.penalty(Reason.UNAUTHORISED) == params.unauthorised_penalty
    assert params.penalty(Reason.WRONG_SENDER) == params.forged_penalty
    assert params.penalty(Reason.MALFORMED_OPERATION) == params.rule_penalty  # 7xx once raised KeyError
    assert params.penalty(Fault.UNDECODABLE_RPC) == params.undecodable_rpc_penalty
    assert all(params.penalty(reason) >= 0 for reason in Reason)
    assert all(params.penalty(fault) > 0 for fault in Fault)


def test_repeat_bans_double_up_to_the_cap() -> None:
    params = ScoreParams(ban_seconds=100.0, max_ban_seconds=350.0)
    assert [params.ban_duration(n) for n in (1, 2, 3, 4, 1000)] == [100.0, 200.0, 350.0, 350.0, 350.0]
    scores = PeerScores(params)
    now = 0.0
    lengths = []
    for _ in range(3):
        while scores.penalize("p", Reason.BAD_SIGNATURE, now) is not Action.BAN:
            pass
        lengths.append(scores.banned_until("p") - now)
        now = scores.banned_until("p")
        assert scores.expire_bans(now) == ["p"]
    assert lengths == [100.0, 200.0, 350.0]


@given(
    st.lists(
        st.tuples(st.integers(0, 40), st.sampled_from([Reason.BAD_SIGNATURE, Reason.UNDECODABLE])),
        max_size=300,
    )
)
def test_the_table_stays_bounded_even_when_every_peer_is_banned(offences: list[tuple[int, Reason]]) -> None:
    scores = PeerScores(max_peers=8)
    lifted: set[str] = set()
    for t, (peer, reason) in enumerate(offences):
        scores.penalize(f"p{peer}", reason, float(t))
        assert scores.statistics(float(t))["tracked_peers"] <= 8
        lifted.update(scores.expire_bans(float(t)))
    banned = {f"p{p}" for p, _ in offences if scores.is_banned(f"p{p}", float(len(offences)))}
    assert len(banned) <= 8


def test_an_evicted_ban_is_reported_as_lifted() -> None:
    scores = PeerScores(max_peers=2)
    for peer in ("a", "b", "c"):
        while scores.penalize(peer, Reason.BAD_SIGNATURE, 0.0) is not Action.BAN:
            pass
    assert scores.statistics(0.0)["tracked_peers"] == 2
    evicted = scores.expire_bans(1.0)
    assert len(evicted) == 1 and not scores.is_banned(evicted[0], 1.0)

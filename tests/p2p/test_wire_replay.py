"""The replay window is bounded in senders and time, and never accepts a replay the clock check lets
through."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.protocol.envelope import MAX_CLOCK_SKEW_MS, ReplayWindow
from swarmnode.protocol.errors import Ignore, Reason

SKEW = 100
WINDOW = 8


def _accept(replay: ReplayWindow, sender: bytes, seq: int, ts: int, now: int) -> bool:
    """What open_envelope does around the window: clock check, replay check, record."""
    if abs(now - ts) > SKEW:
        return False
    try:
        replay.check(sender, seq, ts=ts, now_ms=now)
    except Ignore as exc:
        assert exc.reason == Reason.REPLAYED_SEQ
        return False
    replay.record(sender, seq, ts=ts, now_ms=now)
    return True


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("new"),
            st.integers(0, 7),  # sender
            st.integers(0, 40),  # seq
            st.integers(-SKEW - 20, SKEW + 20),  # ts relative to now
            st.integers(-30, 60),  # how far the receiver's clock moves first (sometimes backwards)
        ),
        st.tuples(st.just("replay"), st.integers(0, 10**6), st.just(0), st.just(0), st.integers(-30, 60)),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(1, 4), st.integers(1, 4))
def test_no_replay_is_ever_accepted_and_the_window_stays_bounded(ops, max_senders: int, buckets: int) -> None:  # type: ignore[no-untyped-def]
    """A replay is a byte-identical message: same sender, seq and ts (all three are signed)."""
    replay = ReplayWindow(window=WINDOW, max_senders=max_senders, expiry_ms=SKEW, buckets=buckets, salt=b"s")
    accepted: list[tuple[bytes, int, int]] = []
    now = 10_000
    for op, a, seq, dts, step in ops:
        now += step
        if op == "replay":
            if not accepted:
                continue
            sender, seq, ts = accepted[a % len(accepted)]
            assert not _accept(replay, sender, seq, ts, now), f"accepted a replay of {(sender, seq, ts)}"
        else:
            sender, ts = bytes([a]), now + dts
            tracked = replay.senders.get(sender)
            stale = tracked is not None and seq <= tracked.highest - WINDOW
            if _accept(replay, sender, seq, ts, now):
                assert not stale  # a forgotten sender's window restarts; a tracked one's never goes back
                accepted.append((sender, seq, ts))
        assert len(replay.senders) <= max_senders
        assert all(s.bits < 1 << WINDOW for s in replay.senders.values())


def test_an_honest_sender_is_never_refused_and_idle_senders_expire() -> None:
    replay = ReplayWindow(window=WINDOW, expiry_ms=SKEW, salt=b"s")
    for i in range(100):  # one message every 10 ms, seq increasing, ts = now
        assert _accept(replay, b"honest", 1000 + i, 10_000 + 10 * i, 10_000 + 10 * i)
    assert _accept(replay, b"other", 1, 11_050, 11_050)
    assert replay.statistics()["senders"] == 2
    assert _accept(replay, b"other", 2, 11_120, 11_120)  # "honest" idle for > SKEW: forgotten
    assert replay.statistics() == {"senders": 1, "tracked_seqs": 2, "expired": 1, "evicted_fresh": 0}
    assert not _accept(replay, b"honest", 1099, 10_990, 11_120)  # its old messages fail the clock check


def test_a_flood_of_new_identities_evicts_without_reopening_a_replay() -> None:
    replay = ReplayWindow(window=WINDOW, max_senders=4, expiry_ms=SKEW, buckets=1, salt=b"s")
    assert _accept(replay, b"victim", 7, 10_000, 10_000)
    for n in range(4):
        assert _accept(replay, b"sybil%d" % n, 1, 10_001 + n, 10_001 + n)
    assert b"victim" not in replay.senders and replay.statistics()["evicted_fresh"] == 1
    assert not _accept(replay, b"victim", 7, 10_000, 10_010)  # still fresh by the clock: refused by the floor
    assert _accept(replay, b"victim", 8, 10_011, 10_011)  # a newer message from it is accepted


def test_a_clock_stepping_back_does_not_revive_forgotten_messages() -> None:
    replay = ReplayWindow(window=WINDOW, expiry_ms=SKEW, salt=b"s")
    assert _accept(replay, b"a", 1, 10_000, 10_000)
    assert _accept(replay, b"b", 1, 10_500, 10_500)  # "a" expires
    assert b"a" not in replay.senders
    assert not _accept(replay, b"a", 1, 10_000, 10_050)  # the receiver's clock went back 450 ms


def test_defaults_and_invalid_parameters() -> None:
    assert ReplayWindow().expiry_ms == MAX_CLOCK_SKEW_MS
    with pytest.raises(ValueError):
        ReplayWindow(max_senders=0)

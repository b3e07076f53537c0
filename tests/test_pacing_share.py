"""Supply control (protocol/pacing.py): N workers supply about the swarm's target per version between them
whatever N is, a share grows while a version stands so nothing stalls, the worker count is bounded, and a
trainer holds a ready step at most a bounded time for the rows on their way."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.protocol.pacing import (
    DRAW_SPACE,
    HOLD_MARGIN,
    LAG_HISTORY,
    MAX_COUNTED_WORKERS,
    MAX_HOLD_MS,
    WORKER_WINDOW_VERSIONS,
    active_workers,
    hold_until_ms,
    note_lag,
    note_worker,
    share_budget,
    share_draw,
    share_wait_ms,
)

wanted_ = st.integers(min_value=1, max_value=64)
workers_ = st.integers(min_value=1, max_value=100_000)
draws = st.integers(min_value=0, max_value=DRAW_SPACE - 1)
intervals = st.integers(min_value=1, max_value=86_400_000)
waits = st.integers(min_value=-(10**9), max_value=10**10)
addresses = st.binary(min_size=20, max_size=20)


def address(n: int) -> bytes:
    return hashlib.sha256(n.to_bytes(8, "big")).digest()[:20]


# --- the draw and the budget ---------------------------------------------------------------------------


@given(worker=addresses, version=st.integers(min_value=0, max_value=2**64 - 1))
def test_the_draw_is_fixed_per_worker_and_version_and_in_range(worker: bytes, version: int) -> None:
    draw = share_draw(worker, version)
    assert 0 <= draw < DRAW_SPACE and draw == share_draw(worker, version)


@pytest.mark.parametrize("version", [-1, 2**64])
def test_a_version_beyond_u64_is_refused(version: int) -> None:
    with pytest.raises(ValueError, match="u64"):
        share_draw(address(0), version)


@given(wanted=wanted_, workers=workers_, draw=draws, waited=waits, interval=intervals)
def test_the_budget_rounds_the_grown_share_by_the_draw(
    wanted: int, workers: int, draw: int, waited: int, interval: int
) -> None:
    budget = share_budget(wanted=wanted, workers=workers, draw=draw, waited_ms=waited, interval_ms=interval)
    grown = wanted * max(interval, waited) / (workers * interval)  # the share after `waited`
    assert budget in (int(grown), int(grown) + 1) or abs(budget - grown) < 1e-6
    lower = share_budget(wanted=wanted, workers=workers, draw=0, waited_ms=waited, interval_ms=interval)
    assert lower <= budget  # a larger draw never gives less
    later = share_budget(wanted=wanted, workers=workers, draw=draw, waited_ms=max(waited, 0) + interval,
                         interval_ms=interval)  # fmt: skip
    assert later >= budget  # standing longer never gives less


@given(wanted=wanted_, workers=workers_, draw=draws, interval=intervals, used=st.integers(0, 1000))
def test_the_wait_is_exactly_when_the_share_first_allows_one_more(
    wanted: int, workers: int, draw: int, interval: int, used: int
) -> None:
    share = {"wanted": wanted, "workers": workers, "draw": draw, "interval_ms": interval}
    wait = share_wait_ms(used=used, **share)
    assert share_budget(waited_ms=wait, **share) > used  # no worker is held back forever
    if wait > 0:
        assert share_budget(waited_ms=wait - 1, **share) <= used


@pytest.mark.parametrize("workers", [1, 3, 10, 100, 1000])
def test_n_workers_supply_about_the_target_per_version_whatever_n(workers: int) -> None:
    """The floor of one per worker is gone: 1000 workers give ~3 per version between them, not 1000."""
    swarm = [address(n) for n in range(workers)]
    totals = [
        sum(
            share_budget(wanted=3, workers=workers, draw=share_draw(w, v), waited_ms=0, interval_ms=1_000)
            for w in swarm
        )
        for v in range(40)
    ]
    mean = sum(totals) / len(totals)
    assert 2.5 <= mean <= 3.5, totals
    if workers <= 3:
        assert min(totals) >= 3  # a share of at least one per worker is a floor, not a draw


@pytest.mark.parametrize(
    "bad",
    [
        {"wanted": 0, "workers": 1, "draw": 0, "interval_ms": 1},
        {"wanted": 1, "workers": 0, "draw": 0, "interval_ms": 1},
        {"wanted": 1, "workers": 1, "draw": DRAW_SPACE, "interval_ms": 1},
        {"wanted": 1, "workers": 1, "draw": -1, "interval_ms": 1},
        {"wanted": 1, "workers": 1, "draw": 0, "interval_ms": 0},
    ],
)
def test_a_share_of_nothing_is_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="no share"):
        share_budget(waited_ms=0, **bad)
    with pytest.raises(ValueError, match="no share"):
        share_wait_ms(used=0, **bad)


# --- counting the workers -----------------------------------------------------------------------------


@given(
    events=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 200)), max_size=200),
    limit=st.integers(min_value=1, max_value=64),
)
def test_the_count_is_bounded_and_keeps_each_workers_newest_version(
    events: list[tuple[int, int]], limit: int
) -> None:
    seen: dict[bytes, int] = {}
    newest: dict[bytes, int] = {}
    for n, version in events:
        seen = note_worker(seen, address(n), version, limit=limit)
        newest[address(n)] = max(version, newest.get(address(n), version))
    assert len(seen) <= limit
    assert all(newest[w] == v for w, v in seen.items())
    if len(newest) <= limit:
        assert seen == newest


def test_the_count_keeps_the_most_recent_workers_by_default() -> None:
    seen: dict[bytes, int] = {}
    for n in range(MAX_COUNTED_WORKERS + 10):
        seen = note_worker(seen, address(n), n)
    assert len(seen) == MAX_COUNTED_WORKERS and address(0) not in seen and address(n) in seen
    with pytest.raises(ValueError, match="counts nobody"):
        note_worker(seen, address(1), 1, limit=0)


def test_active_workers_are_those_of_the_window_and_me() -> None:
    me = address(0)
    edge = 100 - WORKER_WINDOW_VERSIONS
    seen = {address(1): 100, address(2): edge + 1, address(3): edge}
    assert active_workers(seen, me, 100) == 3  # 1, 2 and me; 3 left the window
    assert active_workers({}, me, 0) == 1
    assert active_workers({me: 100}, me, 100) == 1  # counted once
    assert active_workers(seen, me, 100, window=1) == 2


# --- the trainer's hold --------------------------------------------------------------------------------


@given(
    published=st.one_of(st.none(), st.integers(min_value=0, max_value=2**53)),
    lags=st.lists(st.integers(min_value=-(10**12), max_value=10**12), max_size=40),
)
def test_a_ready_step_is_held_at_most_the_bound_after_its_oldest_version(
    published: int | None, lags: list[int]
) -> None:
    kept: tuple[int, ...] = ()
    for lag in lags:
        kept = note_lag(kept, lag)
    assert len(kept) <= LAG_HISTORY and all(lag >= 0 for lag in kept)
    until = hold_until_ms(published, kept)
    if published is None or not kept:
        assert until == 0  # nothing to wait for, or nothing measured: at once
    else:
        assert published <= until <= published + MAX_HOLD_MS


def test_the_hold_is_the_margin_times_the_median_first_arrival_lag() -> None:
    lags = note_lag(note_lag(note_lag((), 1_000), 3_000), 90_000)  # one outlier does not move it
    assert hold_until_ms(10_000, lags) == 10_000 + round(HOLD_MARGIN * 3_000)
    assert hold_until_ms(10_000, lags, margin=1.0) == 13_000
    assert hold_until_ms(10_000, (10**9,)) == 10_000 + MAX_HOLD_MS

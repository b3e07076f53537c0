"""Pacing a worker to the trainer's step rate (protocol/pacing.py): the interval estimate stays bounded and
ignores a clock that goes back, a deadline follows the newest version, and no input stalls a worker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.protocol.pacing import (
    MAX_STEP_INTERVAL_MS,
    MIN_STEP_INTERVAL_MS,
    OVERDUE_MIN_MS,
    PACE_HISTORY,
    SAMPLE_HISTORY,
    median_of,
    note_checkpoint,
    note_sample,
    overdue_after_ms,
    plan_budget,
    stalled_cap,
    stalled_cap_grows_in_ms,
    step_interval_ms,
    typical_ms,
    useful_submissions,
    version_budget,
    version_deadline_ms,
)

# a hostile trainer clock: any stamp a uint64 field can carry, any order
stamps_ms = st.integers(min_value=0, max_value=2**64 - 1)
versions = st.integers(min_value=0, max_value=2**32)


def history(pairs: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    stamps: tuple[tuple[int, int], ...] = ()
    for version, created in pairs:
        stamps = note_checkpoint(stamps, version, created)
    return stamps


# --- the history -----------------------------------------------------------------------------------------


@given(st.lists(st.tuples(versions, stamps_ms), max_size=60))
def test_history_is_bounded_sorted_and_distinct(pairs):
    stamps = history(pairs)
    assert len(stamps) <= PACE_HISTORY
    kept = [v for v, _ in stamps]
    assert kept == sorted(set(kept))
    if pairs:  # the newest versions are the ones kept
        assert kept[-1] == max(v for v, _ in pairs)


def test_the_first_stamp_of_a_version_stands():
    stamps = history([(3, 1_000), (4, 2_000)])
    assert note_checkpoint(stamps, 4, 9_999_999) == stamps


def test_a_history_too_short_for_an_interval_is_refused():
    with pytest.raises(ValueError, match="no interval"):
        note_checkpoint((), 1, 1, limit=1)


# --- the interval ----------------------------------------------------------------------------------------


@given(st.lists(st.tuples(versions, stamps_ms), max_size=60))
def test_the_interval_is_bounded_whatever_the_stamps(pairs):
    interval = step_interval_ms(history(pairs))
    assert interval is None or MIN_STEP_INTERVAL_MS <= interval <= MAX_STEP_INTERVAL_MS


@given(
    st.integers(min_value=0, max_value=2**40),  # the trainer's clock offset: skew cancels out
    st.integers(min_value=MIN_STEP_INTERVAL_MS, max_value=10**7),
    st.integers(min_value=2, max_value=PACE_HISTORY),
)
def test_a_steady_trainer_is_measured_exactly_at_any_skew(offset, interval, count):
    assert step_interval_ms(history([(v, offset + v * interval) for v in range(count)])) == interval


@given(st.integers(min_value=0, max_value=2**40), st.integers(min_value=2, max_value=PACE_HISTORY))
def test_equal_stamps_give_no_interval(stamp, count):
    assert step_interval_ms(history([(v, stamp) for v in range(count)])) is None


@given(st.integers(min_value=1, max_value=2**40), st.integers(min_value=2, max_value=PACE_HISTORY))
def test_a_clock_going_back_every_version_gives_no_interval(start, count):
    stamps = history([(v, max(start - v * 1000, 0)) for v in range(count)])
    assert step_interval_ms(stamps) is None


def test_one_backward_jump_is_skipped():
    # 1 s steps, then the trainer's clock is set back an hour between v2 and v3
    stamps = history([(0, 3_600_000), (1, 3_601_000), (2, 3_602_000), (3, 3_000), (4, 4_000)])
    assert step_interval_ms(stamps) == 1_000


def test_a_huge_gap_does_not_move_the_median():
    steady = [(v, v * 2_000) for v in range(10)]
    stamps = history([*steady, (10, 18_000 + 7 * 86_400_000), (11, 18_000 + 7 * 86_400_000 + 2_000)])
    assert step_interval_ms(stamps) == 2_000


def test_skipped_versions_count_per_version():
    assert step_interval_ms(history([(1, 0), (5, 8_000)])) == 2_000


def test_extremes_are_clamped():
    assert step_interval_ms(history([(0, 0), (1_000, 1)])) == MIN_STEP_INTERVAL_MS
    assert step_interval_ms(history([(0, 0), (1, 2**64 - 1)])) == MAX_STEP_INTERVAL_MS


# --- measured durations ----------------------------------------------------------------------------------


@given(st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=50))
def test_samples_are_bounded_and_never_negative(values):
    samples: tuple[int, ...] = ()
    for value in values:
        samples = note_sample(samples, value)
    assert len(samples) <= SAMPLE_HISTORY and all(s >= 0 for s in samples)
    typical = typical_ms(samples)
    assert (typical is None) == (not values)
    if values:
        assert min(samples) <= typical <= max(samples)


def test_median():
    assert median_of([]) is None
    assert median_of([5, 1, 3]) == 3
    assert median_of([4, 1, 3, 2]) == 2.5
    assert typical_ms([1, 1, 1, 10_000]) == 1


# --- deadlines and budgets -------------------------------------------------------------------------------


def test_the_deadline_is_async_level_steps_after_the_version_less_the_latency():
    # v7 heard at t=50 s, 2 s steps, async level 2: step 9 takes its batch at 54 s; hand over by 53.5 s
    assert version_deadline_ms(7, 7, 50_000, 2_000, 2, 500) == 53_500
    # v9 heard at 53 s (a little early): v7's time is up at 53 s, less the latency
    assert version_deadline_ms(7, 9, 53_000, 2_000, 2, 500) == 52_500
    # three behind: already past
    assert version_deadline_ms(7, 10, 56_000, 2_000, 2, 0) == 54_000


def test_a_version_newer_than_the_newest_is_refused():
    with pytest.raises(ValueError, match="newer than the newest"):
        version_deadline_ms(8, 7, 0, 1_000, 2, 0)


@given(
    st.integers(min_value=0, max_value=2**50),
    st.integers(min_value=0, max_value=2**50),
    st.integers(min_value=-(2**20), max_value=2**40),
)
def test_useful_submissions_fit_before_the_deadline(now, deadline, generate):
    n = useful_submissions(now, deadline, generate)
    assert n >= 0
    assert now + n * max(generate, 1) <= max(deadline, now)


@given(
    st.integers(min_value=0, max_value=2**20),
    st.integers(min_value=1, max_value=65536),
    st.one_of(st.none(), st.integers(min_value=-(2**20), max_value=2**40)),
)
def test_the_budget_is_at_least_one_and_at_most_the_cap(used, cap, useful):
    budget = version_budget(used, cap, useful)
    assert 1 <= budget <= cap
    if useful is None:
        assert budget == cap


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="allows nothing"):
        version_budget(0, 0, 3)


@given(
    st.lists(st.tuples(versions, stamps_ms), max_size=20),
    st.integers(min_value=0, max_value=2**32),  # version
    st.integers(min_value=0, max_value=8),  # how far the newest is ahead
    st.integers(min_value=0, max_value=2**50),  # heard
    st.integers(min_value=0, max_value=2**50),  # now
    st.integers(min_value=0, max_value=16),  # async level
    st.one_of(st.none(), st.integers(min_value=0, max_value=2**40)),
    st.one_of(st.none(), st.integers(min_value=0, max_value=2**40)),
    st.integers(min_value=0, max_value=100),
    st.integers(min_value=1, max_value=65536),
)
def test_no_input_stalls_the_worker_or_passes_the_cap(
    pairs, version, ahead, heard, now, level, generate, latency, used, cap
):
    budget = plan_budget(
        version=version,
        newest=version + ahead,
        newest_heard_ms=heard,
        now_ms=now,
        stamps=history(pairs),
        async_level=level,
        generate_ms=generate,
        latency_ms=latency,
        used=used,
        cap=cap,
    )
    assert 1 <= budget <= cap


def steady(count: int, interval: int) -> tuple[tuple[int, int], ...]:
    return history([(v, 10**12 + v * interval) for v in range(count)])


def budget_at(now: int, *, version: int = 5, newest: int = 5, used: int = 0, cap: int = 64) -> int:
    """2 s steps, v`newest` heard at t=100 s, async level 2, 300 ms per build, 200 ms to a verdict."""
    return plan_budget(
        version=version,
        newest=newest,
        newest_heard_ms=100_000,
        now_ms=now,
        stamps=steady(6, 2_000),
        async_level=2,
        generate_ms=300,
        latency_ms=200,
        used=used,
        cap=cap,
    )


def test_the_budget_follows_the_time_left():
    # deadline 100 + 4 - 0.2 = 103.8 s: from 100 s, 12 builds of 0.3 s fit
    assert budget_at(100_000) == 12
    assert budget_at(100_000, cap=4) == 4  # the configured budget caps it
    assert budget_at(103_000, used=5) == 7  # 0.8 s left: two more
    assert budget_at(103_700, used=5) == 5  # spent: wait for the next version
    assert budget_at(129_000) == 1  # past the deadline, nothing used: still one
    # no v6 for max(async_level + 1 = 3 intervals, 30 s): the trainer lacks rows, time no longer limits v5
    assert budget_at(130_001, used=5) == 64
    # the trainer moved on to v7 (heard at 100 s): v5's deadline is now 100 - 0.2 s
    assert budget_at(100_000, newest=7, used=1) == 1


def test_nothing_measured_means_the_cap():
    common = dict(version=3, newest=3, newest_heard_ms=0, now_ms=10_000, async_level=2, used=2, cap=4)
    assert plan_budget(stamps=steady(1, 1_000), generate_ms=10, latency_ms=0, **common) == 4
    assert plan_budget(stamps=steady(4, 1_000), generate_ms=None, latency_ms=0, **common) == 4
    # both measured, far past the deadline: the used counters stand, no more
    assert plan_budget(stamps=steady(4, 1_000), generate_ms=10, latency_ms=None, **common) == 2


# --- a stalled trainer ----------------------------------------------------------------------------------


def test_a_trainer_is_overdue_after_async_level_plus_one_intervals_never_sooner_than_the_floor():
    assert overdue_after_ms(None, 2) == OVERDUE_MIN_MS
    assert overdue_after_ms(1_000, 2) == OVERDUE_MIN_MS
    assert overdue_after_ms(20_000, 2) == 60_000


@given(st.integers(1, 64), st.integers(1, 256), st.integers(-10**6, 10**9), st.integers(1, 10**6))
def test_the_stalled_cap_grows_from_the_cap_to_the_runs_bound_and_never_past_it(cap, run_max, stood, overdue):
    grown = stalled_cap(cap=cap, run_max=run_max, stood_ms=stood, overdue_ms=overdue)
    assert grown <= run_max and grown >= min(cap, run_max)
    if stood < overdue:
        assert grown == min(cap, run_max)
    later = stalled_cap(cap=cap, run_max=run_max, stood_ms=max(stood, 0) + overdue, overdue_ms=overdue)
    assert later >= grown and (later > grown or grown == run_max)
    wait = stalled_cap_grows_in_ms(cap=cap, run_max=run_max, stood_ms=stood, overdue_ms=overdue)
    if wait is None:
        assert grown == run_max
    else:
        assert 0 < wait <= overdue
        at = max(stood, 0) + wait
        assert stalled_cap(cap=cap, run_max=run_max, stood_ms=at, overdue_ms=overdue) > grown
        assert stalled_cap(cap=cap, run_max=run_max, stood_ms=at - 1, overdue_ms=overdue) == grown

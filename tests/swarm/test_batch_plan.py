"""The batch of one trainer step (`plan_batch`, `batch_limit`): it waits for the signal it needs, then takes
every usable submission up to the limit, oldest first; stale rows are dropped, newer ones wait."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.node.trainer import BATCH_LIMIT_FACTOR, batch_limit, plan_batch
from swarmnode.node.trainer.inbox import InboxRow

WORKER = b"\x01" * 20


def row(id: int, version: int, signal: int = 2, groups: int = 4) -> InboxRow:
    return InboxRow(id, id.to_bytes(32, "big"), WORKER, version, groups, signal)


# pending rows in arrival order: any versions around the step, any signal a submission can carry
rows = st.lists(
    st.tuples(st.integers(min_value=0, max_value=12), st.integers(min_value=0, max_value=32)), max_size=40
).map(lambda spec: [row(i + 1, version, signal, max(signal, 1)) for i, (version, signal) in enumerate(spec)])


@given(
    pending=rows,
    step=st.integers(min_value=0, max_value=12),
    async_level=st.integers(min_value=0, max_value=4),
    need=st.integers(min_value=1, max_value=64),
    extra=st.integers(min_value=0, max_value=200),
)
def test_a_step_takes_a_prefix_of_the_usable_rows_bounded_by_the_limit(
    pending: list[InboxRow], step: int, async_level: int, need: int, extra: int
) -> None:
    limit = need + extra
    plan = plan_batch(pending, step, async_level, need, limit)
    usable = [r for r in pending if step - async_level <= r.checkpoint_version <= step]
    available = sum(r.signal_groups for r in usable)
    assert plan.stale == tuple(r for r in pending if r.checkpoint_version < step - async_level)
    assert plan.ready == (available >= need)
    if not plan.ready:
        assert plan.take == () and plan.signal_groups == available
        return
    taken = sum(r.signal_groups for r in plan.take)
    assert list(plan.take) == usable[: len(plan.take)]  # oldest arrivals first, whole submissions
    assert taken == plan.signal_groups >= need
    assert taken - plan.take[-1].signal_groups < limit  # only the last row may pass the limit
    assert plan.take == tuple(usable) or taken >= limit  # the rest waits only when the limit is reached


@given(
    pending=rows,
    step=st.integers(min_value=0, max_value=12),
    async_level=st.integers(min_value=0, max_value=4),
    need=st.integers(min_value=1, max_value=64),
)
def test_without_a_limit_the_batch_stops_at_the_need(
    pending: list[InboxRow], step: int, async_level: int, need: int
) -> None:
    plan = plan_batch(pending, step, async_level, need)
    assert plan == plan_batch(pending, step, async_level, need, need)
    if plan.ready:
        assert plan.signal_groups - plan.take[-1].signal_groups < need


def test_a_ready_step_takes_the_surplus_up_to_the_limit() -> None:
    pending = [row(1, 3), row(2, 4, signal=0), row(3, 5), row(4, 2), row(5, 5, signal=3), row(6, 5)]
    pending.append(row(7, 6))
    plan = plan_batch(pending, step=5, async_level=2, need=4, limit=8)
    assert [r.id for r in plan.take] == [1, 2, 3, 5, 6] and plan.signal_groups == 9
    assert [r.id for r in plan.stale] == [4]  # version 2 < 5 - 2; version 6 waits
    everything = plan_batch(pending, step=5, async_level=2, need=4, limit=100)
    assert [r.id for r in everything.take] == [1, 2, 3, 5, 6]
    short = plan_batch(pending[:2], step=5, async_level=2, need=4, limit=100)
    assert not short.ready and short.take == () and short.signal_groups == 2


def test_a_limit_below_the_need_is_raised_to_it() -> None:
    pending = [row(1, 5), row(2, 5), row(3, 5)]
    assert plan_batch(pending, 5, 2, need=4, limit=1) == plan_batch(pending, 5, 2, need=4)


@given(need=st.integers(min_value=1, max_value=10**6), configured=st.integers(min_value=0, max_value=10**7))
def test_the_limit_is_the_configured_one_or_a_multiple_of_the_need_never_below_it(
    need: int, configured: int
) -> None:
    limit = batch_limit(need, configured)
    assert limit >= need
    assert limit == (max(need, configured) if configured else BATCH_LIMIT_FACTOR * need)


@pytest.mark.parametrize(("need", "configured"), [(0, 0), (-1, 0), (4, -1)])
def test_a_limit_of_nothing_is_refused(need: int, configured: int) -> None:
    with pytest.raises(ValueError, match="signal groups"):
        batch_limit(need, configured)

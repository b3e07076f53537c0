from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.node.p2p.ratelimit import KeyedBuckets, Slots, TokenBucket


def test_bucket_allows_burst_then_rate() -> None:
    bucket = TokenBucket(rate=10.0, burst=3)
    assert [bucket.try_take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.wait_time(0.0) == pytest.approx(0.1)
    assert bucket.try_take(0.1)
    assert not bucket.try_take(0.1)
    assert bucket.try_take(10.0) and bucket.tokens <= 3


def test_bucket_ignores_time_going_backwards() -> None:
    bucket = TokenBucket(rate=1.0, burst=1)
    assert bucket.try_take(5.0)
    assert not bucket.try_take(4.0)


def test_invalid_buckets() -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=0.0, burst=1)
    with pytest.raises(ValueError):
        TokenBucket(rate=1.0, burst=0)


def test_keyed_buckets_are_independent_and_bounded() -> None:
    buckets = KeyedBuckets(rate=1.0, burst=1, max_keys=2)
    assert buckets.try_take("a", 0.0) and not buckets.try_take("a", 0.0)
    assert buckets.try_take("b", 0.0)
    assert buckets.try_take("c", 0.0)  # evicts "a", the least recently used
    assert len(buckets) == 2
    assert buckets.try_take("a", 0.0)  # a fresh bucket again


def test_stream_slots_count_per_peer_and_in_total() -> None:
    slots = Slots(total=3, per_key=2)
    assert slots.try_acquire("hostile") and slots.try_acquire("hostile")
    assert not slots.try_acquire("hostile")  # over its share, while the total still has room
    assert slots.try_acquire("honest")
    assert not slots.try_acquire("other")  # total full
    assert slots.statistics() == {"in_use": 3, "keys": 2, "refused_key": 1, "refused_total": 1}
    slots.release("hostile")
    assert slots.try_acquire("other")
    for peer in ("hostile", "honest", "other"):
        slots.release(peer)
    assert slots.statistics()["in_use"] == 0 and slots.statistics()["keys"] == 0  # idle peers are forgotten
    with pytest.raises(RuntimeError):
        slots.release("hostile")
    with pytest.raises(ValueError):
        Slots(total=0, per_key=1)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=200))
def test_stream_slots_never_exceed_their_bounds(ops: list[tuple[bool, int]]) -> None:
    """Whatever the order of acquires and releases, no peer holds more than its share, nor all more than
    the total, and the bookkeeping matches a plain model."""
    slots = Slots(total=4, per_key=2)
    model: dict[int, int] = {}
    for acquire, peer in ops:
        if acquire:
            expect = model.get(peer, 0) < 2 and sum(model.values()) < 4
            assert slots.try_acquire(peer) == expect
            if expect:
                model[peer] = model.get(peer, 0) + 1
        elif model.get(peer):
            slots.release(peer)
            model[peer] -= 1
        assert all(slots.count(p) == n <= 2 for p, n in model.items())
        assert slots.statistics()["in_use"] == sum(model.values()) <= 4

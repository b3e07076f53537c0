from __future__ import annotations

import pytest

from node.p2p.ratelimit import KeyedBuckets, TokenBucket


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

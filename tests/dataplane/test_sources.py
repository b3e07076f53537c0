"""SourceBook: availability from ShardHave claims, throughput-weighted choice, penalties and bans."""

from __future__ import annotations

import random
from collections import Counter

import trio
import trio.testing

from swarmnode.node.dataplane.errors import FailureKind
from swarmnode.node.dataplane.sources import ScoringConfig, SourceBook
from swarmnode.protocol.messages import ShardHave
from swarmnode.protocol.shards import encode_bitfield
from tests.dataplane.helpers import blobs, manifest_for

MANIFEST = manifest_for(blobs(4, 10))
A, B, C = "http://127.0.0.1:1001", "http://127.0.0.1:1002", "http://127.0.0.1:1003"


def _have(endpoint, held, manifest=MANIFEST, root=None):
    return ShardHave(
        run=manifest.run,
        version=manifest.version,
        merkle_root=root or manifest.merkle_root,
        bitfield=encode_bitfield(held, len(manifest.shards)),
        endpoint=endpoint,
    )


def _book(*endpoints, **config):
    book = SourceBook(ScoringConfig(**config))
    for endpoint in endpoints:
        book.observe(_have(endpoint, range(4)))
    return book


def test_holders_follow_the_latest_claim():
    book = SourceBook()
    book.observe(_have(A, {0, 1}))
    book.observe(_have(B, {1}))
    assert [s.endpoint for s in book.holders(MANIFEST, 1)] == [A, B]
    assert [s.endpoint for s in book.holders(MANIFEST, 0)] == [A]
    book.observe(_have(A, {2}))
    assert book.holders(MANIFEST, 0) == []


def test_a_claim_about_another_root_or_a_malformed_bitfield_counts_for_nothing():
    book = SourceBook()
    book.observe(_have(A, {0}, root=bytes(32)))
    bad = ShardHave(MANIFEST.run, MANIFEST.version, MANIFEST.merkle_root, b"\xff\xff", B)
    book.observe(bad)
    assert book.holders(MANIFEST, 0) == []


def test_own_endpoint_is_never_a_source():
    book = SourceBook(own_endpoint=A)
    book.observe(_have(A, range(4)))
    assert book.holders(MANIFEST, 0) == []


def test_choice_is_weighted_by_measured_throughput():
    book = _book(A, B)
    book.began(A)
    book.succeeded(A, 100 << 20, 1.0)  # 100 MiB/s
    book.began(B)
    book.succeeded(B, 10 << 20, 1.0)  # 10 MiB/s
    rng = random.Random(1)
    picks = Counter(book.pick(MANIFEST, 0, 0.0, rng) for _ in range(1000))
    assert picks[A] > 8 * picks[B] > 0


def test_an_unmeasured_source_is_explored():
    book = _book(A, B)
    book.began(A)
    book.succeeded(A, 10 << 20, 1.0)
    picks = Counter(book.pick(MANIFEST, 0, 0.0, random.Random(2)) for _ in range(200))
    assert picks[B] > picks[A]  # the optimistic prior beats a slow measured source


def test_busy_sources_are_shared_out():
    book = _book(A, B, max_per_source=1)
    book.began(A)
    assert all(book.pick(MANIFEST, 0, 0.0, random.Random(i)) == B for i in range(20))
    book.began(B)
    assert book.pick(MANIFEST, 0, 0.0, random.Random(0)) is None


def test_failures_back_off_exponentially_and_success_resets():
    book = _book(A, backoff_base=1.0, backoff_max=10.0)
    for expected in (1.0, 2.0, 4.0, 8.0, 10.0):
        book.began(A)
        book.failed(A, FailureKind.STALL, 0, 1.0, now=0.0)
        assert book.get(A).retry_at == expected
    assert book.pick(MANIFEST, 0, 5.0, random.Random(0)) is None
    assert book.next_eligible(MANIFEST, 0, 5.0) == 10.0
    assert book.pick(MANIFEST, 0, 10.0, random.Random(0)) == A
    book.began(A)
    book.succeeded(A, 1 << 20, 0.1)
    assert book.get(A).consecutive_failures == 0


def test_busy_is_a_short_pause_not_a_strike():
    book = _book(A, backoff_base=0.5)
    book.began(A)
    book.failed(A, FailureKind.BUSY, 0, 0.0, now=0.0)
    assert book.get(A).consecutive_failures == 0 and book.get(A).retry_at == 0.5


def test_a_sole_corrupt_source_is_banned_a_mixed_one_is_not():
    book = _book(A, B, bad_hash_ban=100.0)
    book.corrupt(A, now=0.0, sole=True)
    book.corrupt(B, now=0.0, sole=False)
    assert book.get(A).banned_until == 100.0 and book.get(B).banned_until == 0.0
    picks = {book.pick(MANIFEST, 0, 50.0, random.Random(i)) for i in range(20)}
    assert picks == {B}


def test_a_404_retracts_the_claim_until_the_next_one():
    book = _book(A)
    book.retract(A, MANIFEST.version, 2)
    assert book.holders(MANIFEST, 2) == []
    assert book.holders(MANIFEST, 1) != []
    book.observe(_have(A, {1, 2}))
    assert book.holders(MANIFEST, 2) != []


def test_slow_failures_still_lower_the_throughput_estimate():
    book = _book(A)
    book.began(A)
    book.succeeded(A, 100 << 20, 1.0)
    book.began(A)
    book.failed(A, FailureKind.STALL, 1 << 20, 10.0, now=0.0)
    assert book.get(A).throughput < 100 << 20


def test_changes_wake_waiters():
    async def main():
        book = SourceBook()
        woke = []

        async def waiter():
            await book.wait_changed()
            woke.append(True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            book.observe(_have(C, {0}))
        assert woke == [True]

    trio.run(main)

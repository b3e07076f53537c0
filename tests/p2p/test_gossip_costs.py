"""The per-message costs removed for gossip at load keep py-libp2p's behaviour (issue #19).

- `OrderedValidationCache` answers like py-libp2p's `ValidationCache` for any sequence of calls.
- `CountingGossipSub._prune_pending_messages` leaves what py-libp2p's leaves.
- `CachedAddrs` reuses a host's addresses for `ttl` seconds, never an empty answer, and on a real host
  answers what the host computes.
- `GcWatch` times the collector's passes; `settle_gc` freezes the start-up heap.
"""

from __future__ import annotations

import gc
import secrets
import time

import multiaddr  # type: ignore[import-untyped]
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.custom_types import TProtocol
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import PROTOCOL_ID, GossipSub
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import ValidationCache, ValidationResult

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.gossip.outbound import CountingGossipSub
from swarmnode.node.p2p.gossip.pubsub import OrderedValidationCache
from swarmnode.node.p2p.host import CachedAddrs, build_host, listen_addrs
from swarmnode.node.runtime import GcWatch, settle_gc

TTL = 300
IDS = st.binary(min_size=1, max_size=2)  # few distinct ids: hits, refreshes and evictions all happen
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("get"), IDS),
        st.tuples(st.just("put"), IDS, st.booleans(), st.booleans()),  # id, valid, already expired
        st.tuples(
            st.just("clear"),
        ),
    ),
    max_size=200,
)


@given(ops=OPS, max_size=st.integers(min_value=1, max_value=6))
@settings(max_examples=300, deadline=None)
def test_ordered_validation_cache_answers_like_py_libp2p(ops: list[tuple], max_size: int) -> None:
    reference, ours = ValidationCache(TTL, max_size), OrderedValidationCache(TTL, max_size)
    for op in ops:
        if op[0] == "get":
            assert ours.get(op[1]) == reference.get(op[1])
        elif op[0] == "put":
            stamped = time.time() - (10 * TTL if op[3] else 0)  # expired entries are a real case
            result = ValidationResult(is_valid=op[2], timestamp=stamped)
            reference.put(op[1], result)
            ours.put(op[1], result)
        else:
            reference.clear_expired()
            ours.clear_expired()
        assert list(ours.cache) == reference.access_order  # same entries, same eviction order
        assert dict(ours.cache) == reference.cache


def test_ordered_validation_cache_stays_bounded() -> None:
    cache = OrderedValidationCache(TTL, 1000)
    for index in range(10_000):
        cache.put(index.to_bytes(4, "big"), ValidationResult(is_valid=True, timestamp=time.time()))
    assert len(cache.cache) == 1000
    assert cache.get((0).to_bytes(4, "big")) is None
    assert cache.get((9_999).to_bytes(4, "big")) is not None


def _router(cls: type[GossipSub], max_pending: int) -> GossipSub:
    return cls(
        protocols=[TProtocol(PROTOCOL_ID)],
        degree=6,
        degree_low=4,
        degree_high=12,
        max_pending_messages_per_peer=max_pending,
        pending_messages_ttl=30.0,
    )


@given(
    ages=st.lists(st.sampled_from([0.0, 1.0, 10.0, 25.0, 35.0, 60.0, 600.0]), max_size=150),
    max_pending=st.integers(min_value=1, max_value=120),
)
@settings(max_examples=200, deadline=None)
def test_pending_prune_leaves_what_py_libp2p_leaves(ages: list[float], max_pending: int) -> None:
    """Ages at least 5 s from the 30 s TTL: the two calls a moment apart must agree."""
    peer = ID(b"\x00\x01peer")
    now = time.time()
    queue = [(now - age, rpc_pb2.RPC()) for age in sorted(ages, reverse=True)]  # appended in time order
    reference, ours = _router(GossipSub, max_pending), _router(CountingGossipSub, max_pending)
    if queue:
        reference._pending_messages[peer] = list(queue)
        ours._pending_messages[peer] = list(queue)
    reference._prune_pending_messages(peer)
    ours._prune_pending_messages(peer)
    assert (peer in ours._pending_messages) == (peer in reference._pending_messages)
    assert ours._pending_messages.get(peer) == reference._pending_messages.get(peer)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cached_addrs_reuses_for_ttl_and_never_caches_empty() -> None:
    answers = [[], [multiaddr.Multiaddr("/ip4/10.0.0.1/tcp/1")], [multiaddr.Multiaddr("/ip4/10.0.0.2/tcp/2")]]
    calls = iter(answers)
    clock = FakeClock()
    addrs = CachedAddrs(lambda: next(calls), ttl=1.0, clock=clock)
    assert addrs() == []  # not listening yet
    assert addrs() == answers[1]  # an empty answer was not reused
    clock.now += 0.999
    assert addrs() == answers[1] and addrs.computed == 2
    addrs().clear()  # a caller mutating its list does not touch the cache
    assert addrs() == answers[1]
    clock.now += 0.001
    assert addrs() == answers[2] and addrs.computed == 3


def test_host_addrs_are_cached_and_current() -> None:
    host = build_host(NodeIdentity(secrets.token_bytes(32)), ["/ip4/127.0.0.1/tcp/0"])
    cached = host.get_addrs
    assert isinstance(cached, CachedAddrs)

    async def main() -> None:
        async with host.run(listen_addrs(["/ip4/127.0.0.1/tcp/0"])):
            for _ in range(50):
                if host.get_addrs():
                    break
                await trio.sleep(0.02)
            first = host.get_addrs()
            assert first and all(str(a).endswith(f"/p2p/{host.get_id()}") for a in first)
            computed = cached.computed
            for _ in range(100):
                assert host.get_addrs() == first
            assert cached.computed == computed  # one computation served them all
            assert cached.compute() == first  # and it is what the host computes now

    trio.run(main)


def test_gc_watch_times_every_pass_until_removed() -> None:
    watch = GcWatch()
    watch.install()
    try:
        gc.collect()
        gc.collect(0)
    finally:
        watch.remove()
    assert watch.collections[2] >= 1 and watch.collections[0] >= 1
    assert watch.pause_s[2] > 0 and watch.max_pause_s[2] <= watch.pause_s[2]
    before = list(watch.collections)
    gc.collect()
    assert watch.collections == before
    stats = watch.statistics()
    assert stats["collections"] == before and len(stats["max_pause_ms"]) == 3


def test_settle_gc_freezes_what_survives_start_up() -> None:
    if gc.get_freeze_count():
        pytest.skip("this process was frozen already")
    try:
        frozen = settle_gc()
        assert frozen == gc.get_freeze_count() > 0
        started = time.perf_counter()
        gc.collect()
        frozen_pass = time.perf_counter() - started
        assert frozen_pass < 1.0  # traverses only what was made since, not the test process's heap
    finally:
        gc.unfreeze()

"""The pure admission pieces behind the HTTP bounds: `Slots`, `address_key`, `is_long_poll`, the config."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from swarmnode.node.dataplane.http_server import Request, ServerConfig, is_long_poll
from swarmnode.node.dataplane.ratelimit import address_key, in_networks
from swarmnode.node.p2p.ratelimit import Slots

KEYS = st.sampled_from(["a", "b", "c", "d"])
OPS = st.lists(st.tuples(st.sampled_from(["acquire", "release"]), KEYS, st.booleans()), max_size=80)


@given(total=st.integers(1, 6), per_key=st.integers(1, 4), ops=OPS)
def test_slots_never_exceed_their_caps_and_a_refusal_changes_nothing(total, per_key, ops):
    slots = Slots(total, per_key)
    model: dict[str, int] = {}
    exempt_held: dict[str, int] = {}
    for op, key, exempt in ops:
        before = (dict(slots.held), slots.in_use)
        if op == "acquire":
            took = slots.try_acquire(key, exempt)
            fits = sum(model.values()) < total and (exempt or model.get(key, 0) < per_key)
            assert took == fits
            if took:
                model[key] = model.get(key, 0) + 1
                if exempt:
                    exempt_held[key] = exempt_held.get(key, 0) + 1
            else:
                assert (dict(slots.held), slots.in_use) == before
        elif model.get(key, 0):
            slots.release(key)
            model[key] -= 1
            if not model[key]:
                del model[key]
        else:
            with pytest.raises(RuntimeError):
                slots.release(key)
            assert (dict(slots.held), slots.in_use) == before
        assert slots.held == model and slots.in_use == sum(model.values()) <= total
        for k, n in model.items():
            assert n <= per_key + exempt_held.get(k, 0)


def test_slots_refuse_nonsense_caps():
    with pytest.raises(ValueError):
        Slots(0, 1)
    with pytest.raises(ValueError):
        Slots(1, 0)


@given(st.integers(0, 2**128 - 1), st.integers(0, 2**64 - 1))
def test_every_address_of_an_ipv6_slash_64_shares_one_key(address, low):
    ip = ipaddress.IPv6Address(address)
    if ip.ipv4_mapped is not None:
        return
    sibling = ipaddress.IPv6Address((address >> 64 << 64) | low)
    assert address_key(str(ip)) == address_key(str(sibling)) == str(ipaddress.IPv6Network((ip, 64), False))


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_ipv4_addresses_are_their_own_keys_and_mapped_ones_are_ipv4(a, b):
    ip_a, ip_b = ipaddress.IPv4Address(a), ipaddress.IPv4Address(b)
    assert address_key(str(ip_a)) == str(ip_a)
    assert address_key(f"::ffff:{ip_a}") == str(ip_a)
    assert (address_key(str(ip_a)) == address_key(str(ip_b))) == (a == b)


def test_loopback_is_exempt_by_default_and_nothing_else_is():
    networks = ServerConfig().exempt_networks
    assert in_networks("127.0.0.1", networks) and in_networks("127.3.2.1", networks)
    assert in_networks("::1", networks) and in_networks("::ffff:127.0.0.1", networks)
    assert not in_networks("10.0.0.1", networks) and not in_networks("2001:db8::1", networks)
    assert not in_networks("not-an-ip", networks)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/shards/1.0.0/run/latest/manifest?after=3&wait=20", True),
        ("/shards/1.0.0/run/4/have?wait=1", True),
        ("/diloco/1.0.0/run/2/vote?wait=5", True),
        ("/shards/1.0.0/run/latest/manifest?wait=0", False),
        ("/shards/1.0.0/run/latest/manifest", False),
        ("/shards/1.0.0/run/4/shard/x?wait=", False),
        ("/shards/1.0.0/run/4/shard/x?wait=-1", False),
        ("/x?waiting=9", False),
    ],
)
def test_a_long_poll_is_a_request_with_a_positive_wait(target, expected):
    assert is_long_poll(Request("GET", target, {})) is expected


def test_long_polls_never_get_more_than_half_the_connections():
    assert ServerConfig().long_poll_cap == 64 and ServerConfig().long_poll_cap_per_address == 4
    small = ServerConfig(max_connections=6, max_connections_per_address=2, max_long_polls=100)
    assert small.long_poll_cap == 3 and small.long_poll_cap_per_address == 1
    assert ServerConfig(max_connections=1).long_poll_cap == 1


@pytest.mark.parametrize(
    "bad",
    [
        {"max_connections": 0},
        {"max_connections_per_address": 0},
        {"max_long_polls_per_address": 0},
        {"head_timeout": 0},
        {"min_send_rate": 0},
        {"send_grace": -1},
    ],
)
def test_the_config_refuses_nonsense_bounds(bad):
    with pytest.raises(ValueError):
        ServerConfig(**bad)

"""Profiles, shaping arguments and address planning: pure, no namespaces."""

from __future__ import annotations

import ipaddress
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.node.wan import PROFILES, Link, UnknownProfile, draw_links, pair_loss, pair_rtt_ms, profile
from swarmnode.node.wan.harness import free_subnet, node_address
from swarmnode.node.wan.profiles import Span
from swarmnode.node.wan.shaping import tbf_args


def test_profiles_give_the_issue_figures():
    pairs = {name: draw_links({"x": name, "y": name}, seed=1) for name in PROFILES}
    lan, cont, home = pairs["lan"], pairs["continental"], pairs["home"]
    assert pair_rtt_ms(lan["x"], lan["y"]) <= 1.0
    assert pair_rtt_ms(cont["x"], cont["y"]) == 50.0 and cont["x"].up_mbit == 1000.0
    assert (home["x"].up_mbit, home["x"].down_mbit, home["x"].nat) == (10.0, 50.0, True)
    assert not any(link.nat for name, p in pairs.items() if name != "home" for link in p.values())


@given(st.integers(0, 2**63))
@settings(max_examples=100)
def test_global_pairs_fall_in_the_issue_ranges(seed):
    links = draw_links({"x": "global", "y": "global"}, seed)
    x, y = links["x"], links["y"]
    assert 150.0 <= pair_rtt_ms(x, y) <= 300.0
    assert all(20.0 <= rate <= 200.0 for rate in (x.up_mbit, x.down_mbit, y.up_mbit, y.down_mbit))
    assert pair_loss(x, y) == pytest.approx(0.005, rel=0.01)
    assert draw_links({"x": "global", "y": "global"}, seed) == links  # seeded: reproducible


def test_unknown_profile_is_a_typed_error():
    with pytest.raises(UnknownProfile, match="known: continental, global, home, lan"):
        profile("moon")
    with pytest.raises(UnknownProfile):
        draw_links({"x": "lan", "y": "dialup"}, 0)


@pytest.mark.parametrize(
    "fields",
    [
        {"up_mbit": 0},
        {"down_mbit": -1},
        {"up_mbit": math.inf},
        {"delay_ms": -0.1},
        {"delay_ms": 1.0, "jitter_ms": 2.0},
        {"loss": 1.0},
        {"loss": -0.01},
        {"loss": math.nan},
        {"queue_ms": 0},
    ],
)
def test_bad_links_are_refused(fields):
    with pytest.raises(ValueError, match="link"):
        Link(**{"up_mbit": 10.0, "down_mbit": 10.0, **fields})


@given(st.floats(0, 1e3), st.floats(0, 1e3))
def test_spans_refuse_inverted_or_negative_ranges(lo, hi):
    if lo <= hi:
        rng = random.Random(0)
        assert lo <= Span(lo, hi).draw(rng) <= hi
        assert lo <= Span(lo, hi).draw(rng, log=True) <= hi
    else:
        with pytest.raises(ValueError, match="bad span"):
            Span(lo, hi)


@given(rate=st.floats(0.1, 10_000), queue=st.floats(1, 1000), mtu=st.integers(576, 65_000))
def test_tbf_bucket_holds_a_frame_and_queue_holds_the_bucket(rate, queue, mtu):
    args = tbf_args("eth0", rate, queue, mtu)
    burst, limit = int(args[args.index("burst") + 1]), int(args[args.index("limit") + 1])
    assert burst >= 4 * (mtu + 14)
    assert limit >= burst + int(rate * 1e6 / 8 * queue / 1000) - 1
    assert args[args.index("rate") + 1] == f"{int(rate * 1e6)}bit"


@pytest.mark.parametrize("rate, queue, mtu", [(0, 100, 1500), (10, 0, 1500), (10, 100, 100), (-5, 10, 1500)])
def test_tbf_refuses_bad_shaping(rate, queue, mtu):
    with pytest.raises(ValueError, match="bad shaping"):
        tbf_args("eth0", rate, queue, mtu)


def test_free_subnet_skips_every_overlapping_route():
    routes = "\n".join(
        [
            "default via 192.0.2.1 dev eth0",
            "10.64.0.0/16 via 10.64.255.2 dev sw1h1",
            "local 10.65.3.4 dev x table local proto kernel scope host src 10.65.3.4",
            "10.66.7.0/24 dev y proto kernel",
            "10.0.0.0/9 dev z",  # 10.0-10.127
            "garbage line",
            "",
        ]
    )
    assert free_subnet(routes) == 128
    assert free_subnet("") == 64


@given(st.integers(0, 253 * 255 - 1))
def test_node_addresses_are_distinct_and_off_the_gateway_and_host_blocks(index):
    address = ipaddress.ip_address(node_address(70, index))
    assert address in ipaddress.ip_network("10.70.0.0/16")
    assert address != ipaddress.ip_address("10.70.0.1")
    assert not str(address).startswith("10.70.255.")
    assert str(address).split(".")[3] not in ("0", "1", "255")
    if index:
        assert node_address(70, index - 1) != str(address)

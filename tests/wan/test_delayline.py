"""The link emulator's decisions (`DelayLine`), without a TUN: delay, jitter, order, loss, NAT, bounds."""

from __future__ import annotations

import random
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmnode.node.wan import linkemu
from swarmnode.node.wan.linkemu import DelayLine, EmuLink, links_from_config

A, B, H, OTHER = "10.9.0.2", "10.9.0.3", "10.9.0.4", "10.9.0.99"


def ipv4(
    src: str, dst: str, proto: int = 6, sport: int = 1000, dport: int = 2000, *, size: int = 60
) -> bytes:
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, size, 0, 0, 64, proto, 0, socket.inet_aton(src), socket.inet_aton(dst)
    )
    if proto == 1:
        body = bytes((sport & 0xFF, 0)) + b"\0" * 6  # ICMP: type = sport
    else:
        body = struct.pack("!HH", sport, dport) + b"\0" * 4
    return (header + body).ljust(size, b"\0")


def line(links: dict[str, EmuLink], seed: int = 0) -> DelayLine:
    return DelayLine({socket.inet_aton(k): v for k, v in links.items()}, random.Random(seed))


@given(
    delay_a=st.floats(0, 0.2),
    delay_b=st.floats(0, 0.2),
    jitter=st.floats(0, 0.01),
    gaps=st.lists(st.floats(0, 0.02), min_size=1, max_size=60),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=60, deadline=None)
def test_delay_is_both_links_within_jitter_and_never_reorders(delay_a, delay_b, jitter, gaps, seed):
    emu = line({A: EmuLink(delay_a, min(jitter, delay_a)), B: EmuLink(delay_b, min(jitter, delay_b))}, seed)
    now, released = 0.0, []
    for i, gap in enumerate(gaps):
        now += gap
        release = emu.admit(ipv4(A, B, sport=i), now)
        assert release is not None
        low = now + delay_a + delay_b - 2 * jitter
        assert release >= low - 1e-9
        released.append(release)
        if i == 0:
            assert release <= now + delay_a + delay_b + 2 * jitter + 1e-9
    assert released == sorted(released)  # one direction of a pair keeps its order
    out = emu.due(max(released))
    assert [struct.unpack_from("!H", p, 20)[0] for p in out] == list(range(len(gaps)))
    assert emu.next_due() is None


def test_packets_are_held_until_due_and_released_in_time_order():
    emu = line({A: EmuLink(0.050), B: EmuLink(0.010), H: EmuLink(0.001)})
    emu.admit(ipv4(A, B), 0.0)  # due 0.060
    emu.admit(ipv4(H, B), 0.0)  # due 0.011
    assert emu.due(0.010) == []
    assert emu.due(0.011) == [ipv4(H, B)]
    assert emu.next_due() == pytest.approx(0.060)
    assert emu.due(0.059) == []
    assert emu.due(1.0) == [ipv4(A, B)]


def test_unknown_addresses_pass_without_delay():
    emu = line({A: EmuLink(0.050)})
    assert emu.admit(ipv4(OTHER, "10.9.0.98"), 3.0) == 3.0


@pytest.mark.parametrize("loss", [0.01, 0.1, 0.5])
def test_loss_rate_matches_both_links(loss):
    emu = line({A: EmuLink(0.0, loss=loss), B: EmuLink(0.0, loss=loss)}, seed=7)
    sent = 20_000
    lost = sum(emu.admit(ipv4(A, B), 0.0) is None for _ in range(sent))
    expected = 1 - (1 - loss) ** 2
    assert lost / sent == pytest.approx(expected, abs=4 * (expected * (1 - expected) / sent) ** 0.5)
    assert emu.counters["dropped_loss"] == lost


@pytest.mark.parametrize(
    "packet",
    [b"", b"\x45" * 19, b"\x60" + b"\0" * 39, ipv4(A, B)[:19]],
    ids=["empty", "short", "ipv6", "truncated"],
)
def test_what_is_not_ipv4_is_dropped_and_counted(packet):
    emu = line({A: EmuLink(0.0), B: EmuLink(0.0)})
    assert emu.admit(packet, 0.0) is None
    assert emu.counters["dropped_not_ipv4"] == 1
    assert emu.next_due() is None


def test_a_nat_node_cannot_be_dialed_but_its_own_flows_come_back():
    emu = line({A: EmuLink(0.0), H: EmuLink(0.0, nat=True)})
    assert emu.admit(ipv4(A, H, sport=5000, dport=7000), 0.0) is None  # unsolicited SYN: dropped
    assert emu.counters["dropped_nat"] == 1
    assert emu.admit(ipv4(H, A, sport=40000, dport=7000), 1.0) is not None  # the node dials out
    assert emu.admit(ipv4(A, H, sport=7000, dport=40000), 1.0) is not None  # and hears back
    assert emu.admit(ipv4(A, H, sport=7000, dport=40001), 1.0) is None  # not on another port
    assert emu.admit(ipv4(OTHER, H, sport=7000, dport=40000), 1.0) is None  # nor from another host
    assert emu.admit(ipv4(A, H, 17, sport=7000, dport=40000), 1.0) is None  # nor another protocol


def test_nat_lets_icmp_answers_in_and_refuses_icmp_requests():
    emu = line({A: EmuLink(0.0), H: EmuLink(0.0, nat=True)})
    assert emu.admit(ipv4(A, H, 1, sport=8), 0.0) is None  # echo request
    for answer in (0, 3, 11):
        assert emu.admit(ipv4(A, H, 1, sport=answer), 0.0) is not None


def test_nat_forgets_idle_flows():
    emu = line({A: EmuLink(0.0), H: EmuLink(0.0, nat=True)})
    emu.admit(ipv4(H, A, sport=40000, dport=7000), 0.0)
    later = linkemu.NAT_IDLE_S + 1.0
    assert emu.admit(ipv4(A, H, sport=7000, dport=40000), later) is None
    emu.admit(ipv4(H, A, sport=40001, dport=7000), 0.0)
    emu.expire_flows(later)
    assert emu.statistics()["nat_flows"] == 0


def test_nat_table_is_bounded(monkeypatch):
    monkeypatch.setattr(linkemu, "NAT_MAX_FLOWS", 4)
    emu = line({A: EmuLink(0.0), H: EmuLink(0.0, nat=True)})
    assert all(emu.admit(ipv4(H, A, sport=40000 + i), 0.0) is not None for i in range(4))
    assert emu.admit(ipv4(H, A, sport=50000), 1.0) is None
    assert emu.counters["dropped_nat_full"] == 1
    assert emu.admit(ipv4(H, A, sport=50000), linkemu.NAT_IDLE_S + 1.0) is not None  # idle ones expire


def test_queue_is_bounded(monkeypatch):
    monkeypatch.setattr(linkemu, "MAX_QUEUED_BYTES", 1000)
    emu = line({A: EmuLink(1.0), B: EmuLink(0.0)})
    accepted = [emu.admit(ipv4(A, B, size=300), 0.0) is not None for _ in range(5)]
    assert accepted == [True, True, True, False, False]
    assert emu.counters["dropped_overflow"] == 2
    emu.due(2.0)
    assert emu.admit(ipv4(A, B, size=300), 2.0) is not None


@given(
    st.lists(
        st.tuples(
            st.sampled_from([A, B, H, OTHER]),
            st.sampled_from([A, B, H, OTHER]),
            st.sampled_from([1, 6, 17, 47]),
            st.integers(0, 65535),
            st.floats(0, 0.05),
        ),
        max_size=80,
    )
)
@settings(max_examples=50, deadline=None)
def test_every_packet_is_accounted_for(packets):
    emu = line({A: EmuLink(0.02, 0.005, loss=0.2), B: EmuLink(0.01, loss=0.1), H: EmuLink(0.0, nat=True)})
    now = 0.0
    for src, dst, proto, port, gap in packets:
        now += gap
        emu.admit(ipv4(src, dst, proto, sport=port, dport=port), now)
    emu.due(now + 0.1)
    c = emu.statistics()
    drops = sum(v for k, v in c.items() if k.startswith("dropped_"))
    assert c["packets_in"] == len(packets) == c["packets_out"] + drops + c["queued_packets"]
    assert c["queued_packets"] == 0


def test_config_round_trip_and_bad_config():
    table = links_from_config({"links": {A: {"delay_ms": 12.5, "jitter_ms": 1, "loss": 0.01, "nat": True}}})
    assert table == {socket.inet_aton(A): EmuLink(0.0125, 0.001, 0.01, True)}
    with pytest.raises(OSError):
        links_from_config({"links": {"not-an-address": {"delay_ms": 1}}})
    for bad in (
        {"delay_ms": -1},
        {"delay_ms": 1, "jitter_ms": 2},
        {"delay_ms": 1, "loss": 1.0},
        {"delay_ms": float("nan")},
    ):
        with pytest.raises(ValueError, match="bad emulated link"):
            links_from_config({"links": {A: bad}})

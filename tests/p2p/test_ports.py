"""Ports handed to local nodes never repeat and never come from the range outgoing connections use."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from swarmnode.node.p2p.ports import (
    DEFAULT_EPHEMERAL_RANGE,
    LOWEST_PORT,
    ephemeral_range,
    free_port,
    free_ports,
    listening_band,
)


def test_one_process_never_hands_out_a_port_twice() -> None:
    # A devnet once gave a validator the same port for libp2p and HTTP: the OS's port 0 repeats.
    ports = [free_port() for _ in range(3000)]
    assert len(set(ports)) == len(ports)


def test_ports_come_from_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    for port in free_ports("127.0.0.1", 200):
        assert not low <= port <= high


def test_a_port_a_listener_holds_is_skipped() -> None:
    held = []
    try:
        for port in free_ports("127.0.0.1", 50):
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        taken = {sock.getsockname()[1] for sock in held}
        fresh = free_ports("127.0.0.1", 500)
        assert not taken & set(fresh)
        for port in fresh:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port))
    finally:
        for sock in held:
            sock.close()


@pytest.mark.parametrize(
    ("ephemeral", "band"),
    [
        ((32768, 60999), range(LOWEST_PORT, 32768)),
        ((1024, 60000), range(60001, 65536)),
        ((1024, 65535), None),
    ],
)
def test_the_band_is_below_the_ephemeral_range_else_above_it(
    ephemeral: tuple[int, int], band: range | None
) -> None:
    assert listening_band(ephemeral) == band


def test_an_unreadable_range_file_means_the_linux_default(tmp_path: Path) -> None:
    assert ephemeral_range(tmp_path / "missing") == DEFAULT_EPHEMERAL_RANGE
    garbled = tmp_path / "garbled"
    garbled.write_text("many ports\n")
    assert ephemeral_range(garbled) == DEFAULT_EPHEMERAL_RANGE
    good = tmp_path / "range"
    good.write_text("20000\t40000\n")
    assert ephemeral_range(good) == (20000, 40000)

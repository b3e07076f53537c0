"""TCP ports for local nodes: one place for the devnet, `swarmnode init` and the tests that start nodes.

Asking the OS for port 0 and closing the socket is not enough. The kernel may hand the same port to the
next such call (a devnet once gave one validator the same port for libp2p and HTTP), and every outgoing
connection on the machine draws from that same ephemeral range until the node binds. So ports come from
the band below the ephemeral range, are checked free by binding, and are never handed out twice by one
process.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)  # Linux's default, for machines without the file
LOWEST_PORT = 10000  # below: well-known and registered services are common
MIN_BAND = 4096  # a narrower band than this is not worth walking; ask the OS instead

_handed_out: set[int] = set()
_lock = threading.Lock()


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (inclusive)."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    return low, high


def listening_band(ephemeral: tuple[int, int]) -> range | None:
    """Ports no outgoing connection takes: below the ephemeral range, else above it; None if too narrow."""
    low, high = ephemeral
    for band in (range(LOWEST_PORT, low), range(high + 1, 65536)):
        if len(band) >= MIN_BAND:
            return band
    return None


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _from_os(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, outside the ephemeral range, and new to this process.

    Another process may still take it before it is used; processes start at random points of the band,
    so two of them rarely walk the same ports.
    """
    band = listening_band(ephemeral_range())
    with _lock:
        if band is None:
            for _ in range(1000):
                port = _from_os(host)
                if port not in _handed_out:
                    break
            else:
                raise OSError(f"the OS offers only ports this process already handed out on {host}")
        else:
            start = random.randrange(len(band))
            for step in range(len(band)):
                port = band[(start + step) % len(band)]
                if port not in _handed_out and _bindable(host, port):
                    break
            else:
                raise OSError(f"no free TCP port on {host} in {band.start}-{band.stop - 1}")
        _handed_out.add(port)
        return port


def free_ports(host: str, count: int) -> list[int]:
    """`count` distinct TCP ports free on `host` now."""
    return [free_port(host) for _ in range(count)]

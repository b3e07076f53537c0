"""TCP ports the OS picks: one place for the devnet, `swarmnode init` and the tests that start nodes."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (another process may take it before it is used)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(host: str, count: int) -> list[int]:
    """`count` distinct TCP ports free on `host` now (the OS picks them)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()

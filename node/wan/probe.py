"""Measure a WAN path with real traffic: TCP round trips, bulk TCP throughput, UDP loss.

`swarmnode wan probe serve PORT` (node/cli/wan.py) runs inside one node's namespace (it prints `ready` once
listening); the client commands run inside another and print one line of JSON:
- `rtt HOST PORT COUNT`: COUNT one-byte TCP round trips on one connection (TCP_NODELAY), in ms;
- `send HOST PORT BYTES`: bulk TCP; the server times first byte to last, so slow start and the closing
  round trip are not in the rate;
- `udp HOST PORT COUNT PPS`: COUNT numbered datagrams at PPS, then asks (over TCP) how many arrived.
Plain blocking sockets and a thread per connection: it measures the network, not an event loop.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

DATAGRAM = 200
CHUNK = 256 * 1024
SETTLE_S = 1.0  # after the last datagram, before asking how many arrived (longer than any WAN RTT)


class _Counter:
    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.lock = threading.Lock()


def serve(port: int) -> None:
    counter = _Counter()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
    udp.bind(("0.0.0.0", port))
    listener = socket.create_server(("0.0.0.0", port), reuse_port=False)
    threading.Thread(target=_udp_loop, args=(udp, counter), daemon=True).start()
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_handle, args=(conn, counter), daemon=True).start()


def _udp_loop(udp: socket.socket, counter: _Counter) -> None:
    while True:
        data = udp.recv(65_536)
        if len(data) >= 8:
            with counter.lock:
                counter.seen.add(struct.unpack_from("!Q", data)[0])


def _handle(conn: socket.socket, counter: _Counter) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        mode = conn.recv(1)
        if mode == b"E":
            while byte := conn.recv(1):
                conn.sendall(byte)
        elif mode == b"S":
            total, first, last = 0, 0.0, 0.0
            while chunk := conn.recv(CHUNK):
                now = time.monotonic()
                if not total:
                    first = now
                total += len(chunk)
                last = now
            conn.sendall(struct.pack("!Qd", total, last - first))
        elif mode == b"U":
            with counter.lock:
                seen = len(counter.seen)
                counter.seen.clear()
            conn.sendall(struct.pack("!Q", seen))


def rtt(host: str, port: int, count: int) -> dict[str, object]:
    with socket.create_connection((host, port), timeout=30) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(b"E")
        samples = []
        for _ in range(count):
            start = time.monotonic()
            conn.sendall(b"x")
            if conn.recv(1) != b"x":
                raise ConnectionError("echo server closed the connection")
            samples.append((time.monotonic() - start) * 1000.0)
    return {"rtt_ms": samples}


def send(host: str, port: int, size: int) -> dict[str, object]:
    block = b"\0" * CHUNK
    with socket.create_connection((host, port), timeout=120) as conn:
        conn.sendall(b"S")
        left = size
        while left > 0:
            sent = conn.send(block[: min(left, CHUNK)])
            left -= sent
        conn.shutdown(socket.SHUT_WR)
        total, seconds = struct.unpack("!Qd", _recv_exact(conn, 16))
    return {"bytes": total, "seconds": seconds, "mbit": total * 8 / seconds / 1e6 if seconds else 0.0}


def udp(host: str, port: int, count: int, pps: float) -> dict[str, object]:
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    padding = b"\0" * (DATAGRAM - 8)
    start = time.monotonic()
    for seq in range(count):
        delay = start + seq / pps - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        sender.sendto(struct.pack("!Q", seq) + padding, (host, port))
    time.sleep(SETTLE_S)
    with socket.create_connection((host, port), timeout=30) as conn:
        conn.sendall(b"U")
        (received,) = struct.unpack("!Q", _recv_exact(conn, 8))
    return {"sent": count, "received": received}


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"server closed after {len(data)} of {size} bytes")
        data += chunk
    return data

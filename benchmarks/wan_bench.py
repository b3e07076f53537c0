"""What the benchmarks need of a WAN (`swarmnode.node.wan`): build one or exit 2 with why; measure it.

`open_wan` turns `WanUnavailable` (no root, no `ip`) into exit status 2 with the reason on stderr, so a
`--wan` run on a machine without namespaces says why instead of failing half way. `probe_rtt` runs
`swarmnode wan probe` in two nodes' namespaces: the TCP round trip the links give;
`wan_tcp_fanout` moves bytes from senders to receivers with plain TCP the way a broadcast moves them.
Both use plain blocking sockets: they measure the WAN (links and emulator), which the benchmarks'
figures are held against.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from swarmnode.node.wan import Link, Wan, WanUnavailable, check_available, destroy_stale  # noqa: E402

PROBE = [sys.executable, "-m", "swarmnode.node.cli", "wan", "probe"]  # `swarmnode wan probe`
PROBE_PORT = 7999  # inside a node's namespace every port is free; the node roles use others
PROBE_TIMEOUT_S = 300.0
UNAVAILABLE_EXIT = 2


def _unavailable(exc: WanUnavailable) -> SystemExit:
    print(f"--wan needs network namespaces: {exc}", file=sys.stderr, flush=True)
    return SystemExit(UNAVAILABLE_EXIT)


def require_wan() -> None:
    """Exit with status 2 and the reason now, before any other phase, if no WAN can be made here."""
    try:
        check_available()
    except WanUnavailable as exc:
        raise _unavailable(exc) from None


def open_wan(links: Mapping[str, Link], seed: int = 0) -> Wan:
    """A WAN of these nodes; where namespaces cannot be made, print the reason and exit with status 2."""
    try:
        destroy_stale()
        return Wan.create(links, seed=seed)
    except WanUnavailable as exc:
        raise _unavailable(exc) from None


def _probe(wan: Wan, server: str, client: str, *command: str) -> dict[str, Any]:
    """Run one probe client command in `client`'s namespace against a probe server in `server`'s."""
    serving = wan.spawn(
        server,
        [*PROBE, "serve", str(PROBE_PORT)],
        stdout=subprocess.PIPE,
        cwd=str(ROOT),
    )
    try:
        assert serving.stdout is not None
        if serving.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the probe server in {server} did not start")
        argv = [*PROBE, command[0], wan.address(server), str(PROBE_PORT)]
        client_process = wan.spawn(client, [*argv, *command[1:]], stdout=subprocess.PIPE, cwd=str(ROOT))
        out, _ = client_process.communicate(timeout=PROBE_TIMEOUT_S)
        if client_process.returncode != 0:
            raise RuntimeError(
                f"probe {command[0]} from {client} to {server} failed ({client_process.returncode})"
            )
        return dict(json.loads(out))
    finally:
        serving.kill()
        serving.wait(timeout=10)


def probe_rtt(wan: Wan, server: str, client: str, count: int = 200) -> list[float]:
    """TCP round trips in seconds between two nodes' namespaces (one byte, TCP_NODELAY, one connection)."""
    return [ms / 1e3 for ms in _probe(wan, server, client, "rtt", str(count))["rtt_ms"]]


_FANOUT_SENDER = """
import socket, sys, threading
size, count = int(sys.argv[3]), int(sys.argv[4])
listener = socket.create_server((sys.argv[1], int(sys.argv[2])), backlog=count)
print("ready", flush=True)
block = bytes(1 << 18)
def send(conn):
    with conn:
        left = size
        while left > 0:
            left -= conn.send(block[: min(left, len(block))])
threads = [threading.Thread(target=send, args=(listener.accept()[0],)) for _ in range(count)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
"""

_FANOUT_RECEIVER = """
import socket, sys, time
started = time.time()
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=600)
buf = bytearray(1 << 20); view = memoryview(buf); total = 0
while n := s.recv_into(view):
    total += n
print(total, started, time.time(), flush=True)
"""


def wan_tcp_fanout(wan: Wan, senders: list[str], receivers: list[str], size: int) -> float:
    """Seconds for every receiver to get `size` bytes of plain TCP from a sender (receivers dealt to
    senders in turn; each receiver dials, as a NATed node must): the links' and emulator's floor for
    moving the same bytes the same way, with no protocol above TCP."""
    dealt = {s: [r for i, r in enumerate(receivers) if i % len(senders) == k] for k, s in enumerate(senders)}
    servers = []
    try:
        for sender, mine in dealt.items():
            argv = [sys.executable, "-c", _FANOUT_SENDER, wan.address(sender), str(PROBE_PORT), str(size)]
            server = wan.spawn(sender, [*argv, str(len(mine))], stdout=subprocess.PIPE)
            servers.append(server)
            assert server.stdout is not None
            if server.stdout.readline().strip() != b"ready":
                raise RuntimeError(f"the fan-out sender in {sender} did not start")
        clients = [
            wan.spawn(
                receiver,
                [sys.executable, "-c", _FANOUT_RECEIVER, wan.address(sender), str(PROBE_PORT)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for sender, mine in dealt.items()
            for receiver in mine
        ]
        starts, ends = [], []
        for client in clients:
            out, _ = client.communicate(timeout=PROBE_TIMEOUT_S * 4)
            total, started, finished = out.split()
            if int(total) != size:
                raise RuntimeError(f"tcp fan-out moved {total} of {size} bytes")
            starts.append(float(started))
            ends.append(float(finished))
        return max(ends) - min(starts)
    finally:
        for server in servers:
            if server.poll() is None:
                server.kill()
            server.wait(timeout=10)

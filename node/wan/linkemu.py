"""The userspace link emulator: per-link delay, jitter, loss and NAT where the kernel has no netem.

Choice (issue #19 allows a TUN delay line, a userspace router, or NFQUEUE): a userspace **router**.
All node-to-node traffic of a WAN is routed through one TUN device in the WAN's core namespace (policy
routing: packets that enter from the bridge go to the TUN, packets this process writes back go out the
bridge), and this process holds each packet for its delay and drops it by chance. Why this one:
- one TUN and one process for the whole WAN, not a TUN pair and a thread per node: the cost is per packet,
  not per node, and the nodes keep an ordinary veth + bridge with the kernel's `tbf` on both ends (rate
  shaping stays in the kernel, before and after the delay, as on a real access line);
- no NFQUEUE: that needs nftables and a netlink binding, and a verdict per packet costs more than a read;
- the router sees both directions of every flow, so it can also play NAT: a node marked `nat` may open
  flows out, and only packets of flows it opened come back in ("cannot be dialed", faithfully: an
  unsolicited SYN is silently dropped, so the dialer waits and times out as behind a real home router).
  What it does not do is rewrite addresses: peers see the node's own address, which nobody can dial.

A packet from A to B waits `delay(A) + delay(B)`, each with a uniform jitter of +-jitter, and is dropped
with A's loss and again with B's. Jitter never reorders a direction of a node pair: a packet is never
released before the one sent before it from the same source to the same destination (real paths reorder
rarely, and netem-style reordering makes TCP retransmit spuriously and measure nothing useful).

The loop is one thread on epoll: read every waiting packet, decide, write every packet whose time has come,
sleep until the next one is due. `DelayLine` is the decision part, pure (time and randomness are arguments),
so it is tested without a TUN. The harness runs it as
`swarmnode wan linkemu --tun NAME --config FILE [--stats FILE]` (node/cli/wan.py) inside the core
namespace; it prints `ready` once the TUN is attached and writes its counters as JSON to the stats file
every second and on SIGTERM.
"""

from __future__ import annotations

import fcntl
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_QUEUED_BYTES = 64 * 1024 * 1024  # held in the delay line at once; above this a packet is dropped
NAT_IDLE_S = 300.0  # a NAT flow nobody used this long is forgotten (home routers: minutes for TCP)
NAT_MAX_FLOWS = 65_536  # flows remembered across all NATed nodes; a new one beyond this is refused
READ_BATCH = 256  # packets read before the due ones are written again
STATS_EVERY_S = 1.0
# epoll sleeps in whole milliseconds rounded up, so a packet is released when it is due within this much:
# the error is +-0.5 ms instead of 0 to +1 ms per pass
EARLY_S = 0.0005

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000

_TCP, _UDP, _ICMP = 6, 17, 1
_ICMP_BACK_IN = frozenset({0, 3, 11})  # echo reply, unreachable, time exceeded: answers, never dials


@dataclass(frozen=True)
class EmuLink:
    """What the emulator needs of one node's link (rates are the kernel's business)."""

    delay_s: float
    jitter_s: float = 0.0
    loss: float = 0.0
    nat: bool = False

    def __post_init__(self) -> None:
        if not (0.0 <= self.jitter_s <= self.delay_s < 60.0) or not (0.0 <= self.loss < 1.0):
            raise ValueError(f"bad emulated link {self}: need 0 <= jitter <= delay < 60 s, 0 <= loss < 1")


_DIRECT = EmuLink(0.0)  # an address that is not a node (the core itself): no delay, no loss


class DelayLine:
    """Decides each packet's fate and holds it until its release time."""

    def __init__(self, links: Mapping[bytes, EmuLink], rng: random.Random) -> None:
        self._links = dict(links)
        self._rng = rng
        self._heap: list[tuple[float, int, bytes]] = []
        self._seq = 0
        self._last: dict[bytes, float] = {}  # src+dst -> release time of the last packet that way
        self._flows: dict[bytes, float] = {}  # NAT flows: inside ip+port, outside ip+port, proto -> seen
        self._queued_bytes = 0
        self.counters: dict[str, int] = {
            "packets_in": 0,
            "packets_out": 0,
            "bytes_in": 0,
            "bytes_out": 0,
            "dropped_loss": 0,
            "dropped_nat": 0,
            "dropped_nat_full": 0,
            "dropped_overflow": 0,
            "dropped_not_ipv4": 0,
            "max_queued_bytes": 0,
        }

    def admit(self, packet: bytes, now: float) -> float | None:
        """Take one packet read at `now`: its release time, or None if it is dropped (and why is counted)."""
        counters = self.counters
        counters["packets_in"] += 1
        counters["bytes_in"] += len(packet)
        if len(packet) < 20 or packet[0] >> 4 != 4:
            counters["dropped_not_ipv4"] += 1
            return None
        src, dst = packet[12:16], packet[16:20]
        a = self._links.get(src, _DIRECT)
        b = self._links.get(dst, _DIRECT)
        rng = self._rng
        if (a.loss and rng.random() < a.loss) or (b.loss and rng.random() < b.loss):
            counters["dropped_loss"] += 1
            return None
        if b.nat and not self._inbound_allowed(packet, now):
            counters["dropped_nat"] += 1
            return None
        if a.nat and not self._note_outbound(packet, now):
            counters["dropped_nat_full"] += 1
            return None
        if self._queued_bytes + len(packet) > MAX_QUEUED_BYTES:
            counters["dropped_overflow"] += 1
            return None
        delay = a.delay_s + b.delay_s
        if a.jitter_s:
            delay += rng.uniform(-a.jitter_s, a.jitter_s)
        if b.jitter_s:
            delay += rng.uniform(-b.jitter_s, b.jitter_s)
        way = src + dst
        release = max(now + delay, self._last.get(way, 0.0))
        self._last[way] = release
        self._seq += 1
        heapq.heappush(self._heap, (release, self._seq, packet))
        self._queued_bytes += len(packet)
        counters["max_queued_bytes"] = max(counters["max_queued_bytes"], self._queued_bytes)
        return release

    def due(self, now: float) -> list[bytes]:
        """The packets whose release time has come, in release order."""
        heap = self._heap
        out: list[bytes] = []
        while heap and heap[0][0] <= now:
            packet = heapq.heappop(heap)[2]
            out.append(packet)
        if out:
            sent = sum(len(p) for p in out)
            self._queued_bytes -= sent
            self.counters["packets_out"] += len(out)
            self.counters["bytes_out"] += sent
        return out

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def expire_flows(self, now: float) -> None:
        """Forget NAT flows idle longer than `NAT_IDLE_S`."""
        stale = [key for key, seen in self._flows.items() if now - seen > NAT_IDLE_S]
        for key in stale:
            del self._flows[key]

    def statistics(self) -> dict[str, Any]:
        return {**self.counters, "queued_packets": len(self._heap), "nat_flows": len(self._flows)}

    def _note_outbound(self, packet: bytes, now: float) -> bool:
        key = _flow_key(packet, inside_is_src=True)
        if key is None:
            return True  # ICMP and other protocols go out freely; only their answers are filtered
        if key not in self._flows and len(self._flows) >= NAT_MAX_FLOWS:
            self.expire_flows(now)
            if len(self._flows) >= NAT_MAX_FLOWS:
                return False
        self._flows[key] = now
        return True

    def _inbound_allowed(self, packet: bytes, now: float) -> bool:
        proto = packet[9]
        if proto == _ICMP:
            ihl = (packet[0] & 0x0F) * 4
            return len(packet) > ihl and packet[ihl] in _ICMP_BACK_IN
        key = _flow_key(packet, inside_is_src=False)
        if key is None or key not in self._flows:
            return False
        if now - self._flows[key] > NAT_IDLE_S:
            del self._flows[key]
            return False
        self._flows[key] = now
        return True


def _flow_key(packet: bytes, *, inside_is_src: bool) -> bytes | None:
    """inside ip+port, outside ip+port, protocol, for TCP and UDP; None for other protocols.

    A non-first fragment carries no ports: it is keyed with zero ports, so inbound it matches no flow.
    """
    proto = packet[9]
    if proto not in (_TCP, _UDP):
        return None
    ihl = (packet[0] & 0x0F) * 4
    first_fragment = (int.from_bytes(packet[6:8], "big") & 0x1FFF) == 0
    ports = packet[ihl : ihl + 4] if first_fragment and len(packet) >= ihl + 4 else b"\0\0\0\0"
    src, dst = packet[12:16], packet[16:20]
    if inside_is_src:
        return src + ports[0:2] + dst + ports[2:4] + bytes((proto,))
    return dst + ports[2:4] + src + ports[0:2] + bytes((proto,))


def links_from_config(document: Mapping[str, Any]) -> dict[bytes, EmuLink]:
    """The emulator's table from its JSON config: {"links": {address: {delay_ms, jitter_ms, loss, nat}}}."""
    table: dict[bytes, EmuLink] = {}
    for address, spec in document["links"].items():
        table[socket.inet_aton(address)] = EmuLink(
            delay_s=float(spec["delay_ms"]) / 1000.0,
            jitter_s=float(spec.get("jitter_ms", 0.0)) / 1000.0,
            loss=float(spec.get("loss", 0.0)),
            nat=bool(spec.get("nat", False)),
        )
    return table


def open_tun(name: str) -> int:
    """Attach to an existing (persistent) TUN device by name; non-blocking, no packet-info header."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


class _Stop(Exception):
    pass


def stop_on_signals() -> None:
    """Make SIGTERM and SIGINT end `serve`: it writes the stats once more and returns."""

    def stop(signum: int, frame: object) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def _write_stats(path: Path | None, line: DelayLine, started: float) -> None:
    if path is None:
        return
    usage = os.times()
    stats = {**line.statistics(), "cpu_s": usage.user + usage.system, "wall_s": time.monotonic() - started}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stats))
    os.replace(tmp, path)


def serve(fd: int, line: DelayLine, stats_path: Path | None = None) -> None:
    """Forward packets through `line` until SIGTERM/SIGINT (`stop_on_signals`; raised here as `_Stop`)."""
    poller = select.epoll()
    poller.register(fd, select.EPOLLIN)
    started = time.monotonic()
    next_stats = started
    clock = time.monotonic
    try:
        while True:
            now = clock()
            for packet in line.due(now + EARLY_S):
                try:
                    os.write(fd, packet)
                except OSError:
                    line.counters["dropped_overflow"] += 1
            if now >= next_stats:
                _write_stats(stats_path, line, started)
                line.expire_flows(now)
                next_stats = now + STATS_EVERY_S
            upcoming = line.next_due()
            deadline = min(next_stats, upcoming) if upcoming is not None else next_stats
            poller.poll(max(0.0, deadline - EARLY_S - clock()))
            for _ in range(READ_BATCH):
                try:
                    packet = os.read(fd, 65_536)
                except BlockingIOError:
                    break
                line.admit(packet, clock())
    except _Stop:
        pass
    finally:
        _write_stats(stats_path, line, started)
        poller.close()

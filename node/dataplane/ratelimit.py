"""Rationing for the HTTP data plane: upload bandwidth, and slots counted per client address.

Addresses are what a remote peer cannot mint for free in bulk, so caps count per address: an IPv4 address,
or an IPv6 /64 (the block one subscriber is handed; its 2^64 addresses cost nothing more). A `Slots` table
(`node.p2p.ratelimit.Slots`) bounds both the total and each address's share, and admits or refuses at
once: nothing ever queues for a slot, so refusing costs no memory beyond the open connection itself.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

import trio

# Loopback peers are this host's own processes (a devnet, a local relay): uncapped per address by default.
LOOPBACK_NETWORKS = ("127.0.0.0/8", "::1/128")
IPV6_PREFIX = 64  # one IPv6 subscriber holds a /64: count it as one address


class TokenBucket:
    """`rate` bytes per second with bursts up to `burst` bytes; takers are served first come, first served."""

    def __init__(self, rate: float, burst: int) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._stamp: float | None = None
        self._lock = trio.Lock()  # fair: FIFO

    def _refill(self) -> None:
        now = trio.current_time()
        if self._stamp is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def take(self, want: int) -> int:
        """Wait until some tokens are available and take up to `want` of them (at most `burst`)."""
        async with self._lock:
            self._refill()
            need = min(want, self.burst)
            if self._tokens < need:
                await trio.sleep((need - self._tokens) / self.rate)
                self._refill()
            self._tokens -= need
            return need


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP literal `host` names (zone id dropped, IPv4-mapped IPv6 as IPv4), or None for anything else."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def address_key(host: str) -> str:
    """The unit a per-address cap counts: the IPv4 address, or the IPv6 /64 (IPv4-mapped IPv6 is IPv4).

    A host that is not an IP literal (a Unix socket path, a test double) is its own key.
    """
    ip = _ip(host)
    if ip is None:
        return host
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))
    return str(ip)


def in_networks(host: str, networks: Iterable[str]) -> bool:
    """Whether `host` (an IP literal; IPv4-mapped IPv6 counts as IPv4) lies in any of `networks`."""
    ip = _ip(host)
    return ip is not None and any(ip in ipaddress.ip_network(net, strict=False) for net in networks)

"""The libp2p host: the node's secp256k1 identity, TCP, Noise only, yamux only.

py-libp2p's `new_host` offers Noise, TLS, SECIO *and plaintext* unless `sec_opt` is passed
(libp2p/__init__.py:653-665), and mplex beside yamux unless `muxer_opt` is: a peer could negotiate its
way down to an unauthenticated, unencrypted session. We always pass both, so the only stack on offer is
`/noise` + `/yamux/1.0.0`.
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import multiaddr  # type: ignore[import-untyped]
import trio
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.secp256k1 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.exceptions import BaseLibp2pError
from libp2p.network.config import ConnectionConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.inbound import free_inbound_slots_on_close

TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    BaseLibp2pError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    OSError,
)
"""What a dial, stream open, read or write can raise when the other side or the network fails."""


YAMUX_TUNING = {"PY_YAMUX_RELEASE_ON_READ": "0"}
"""py-libp2p's yamux reads its tuning from the environment on every call (yamux.py:70 `_py_yamux_env`).
By default (`RELEASE_ON_READ=1`, yamux.py:92) it sends a WINDOW_UPDATE frame after nearly every read,
unlike go-yamux, which batches updates until half the window is consumed. Gossip of small messages then
costs about a third more frames; measured: 17% less CPU per gossip message with the go-yamux behaviour."""


def apply_yamux_tuning() -> None:
    """Process set-up for a node entry point (CLI): go-yamux window-update batching, unless overridden."""
    for name, value in YAMUX_TUNING.items():
        os.environ.setdefault(name, value)


ADDRS_CACHE_S = 1.0
"""How long the host's advertised addresses are reused before they are computed again (`CachedAddrs`)."""


class CachedAddrs:
    """A host's `get_addrs`, computed at most once per `ttl` seconds while it returns any address.

    py-libp2p attaches our signed peer record to every pubsub RPC it builds, and to check that the cached
    record is current it computes `get_addrs()` each time (peerstore.py:92 `env_to_send_in_RPC`): listener
    addresses, observed addresses, our `addrs_factory`, a multiaddr parse per address. Per forwarded
    gossip message that was 9% of a node's CPU at 100 msg/s (py-spy). The addresses change when a
    listener starts or identify confirms an observed address; either shows within `ttl`. An empty answer
    (not listening yet) is never reused.
    """

    def __init__(
        self,
        compute: Callable[[], list[multiaddr.Multiaddr]],
        ttl: float = ADDRS_CACHE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.compute = compute
        self.ttl = ttl
        self.clock = clock
        self._addrs: list[multiaddr.Multiaddr] = []
        self._at = 0.0
        self.computed = 0

    def __call__(self) -> list[multiaddr.Multiaddr]:
        now = self.clock()
        if not self._addrs or now - self._at >= self.ttl:
            self._addrs, self._at = list(self.compute()), now
            self.computed += 1
        return list(self._addrs)


@dataclass(frozen=True)
class HostSettings:
    """Connection limits and handshake timeouts (seconds)."""

    dial_timeout: float = 5.0
    upgrade_timeout: float = 5.0
    negotiate_timeout: float = 5.0
    max_connections: int = 300  # py-libp2p requires >= its high watermark (300); inbound: this - 50
    # A peer whose every address just failed is not dialled again for this long. py-libp2p's own 60 s
    # would leave a worker unable to reach a validator for a minute after one handshake timed out under
    # load; the callers (discovery, delivery) already pace their retries.
    failed_dial_backoff: float = 5.0


def libp2p_key_pair(identity: NodeIdentity) -> KeyPair:
    """The libp2p keypair of the node identity; its peer id equals `identity.peer_id`."""
    return create_new_key_pair(identity.private_key)


def parse_announce(texts: Sequence[str]) -> list[multiaddr.Multiaddr]:
    """Configured announce addresses: TCP multiaddrs of a concrete, non-loopback host (ValueError if not)."""
    parsed = []
    for text in texts:
        try:
            addr = multiaddr.Multiaddr(text)
            addr.value_for_protocol("tcp")
        except Exception as exc:  # multiaddr raises several unrelated types for bad text
            raise ValueError(f"not a TCP multiaddr: {text!r}: {exc}") from None
        if _is_unusable(addr):
            raise ValueError(f"{text!r} cannot be dialed by a peer (unspecified or loopback host)")
        parsed.append(addr)
    return parsed


def _host_part(addr: multiaddr.Multiaddr) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    for protocol in ("ip4", "ip6"):
        try:
            return ipaddress.ip_address(addr.value_for_protocol(protocol))
        except Exception:  # the protocol is absent (ProtocolLookupError) or the value is not an IP
            continue
    return None  # dns names and the like: dialable as far as we can tell


def _is_unusable(addr: multiaddr.Multiaddr) -> bool:
    host = _host_part(addr)
    return host is not None and (host.is_unspecified or host.is_loopback)


def announced_addrs(
    candidates: Sequence[multiaddr.Multiaddr], *, announce: Sequence[multiaddr.Multiaddr] = (), dialable: bool
) -> list[multiaddr.Multiaddr]:
    """What we tell peers (identify, DHT provider records, peer records) they can dial us at.

    Nothing when we cannot be dialed (behind NAT); the configured addresses when there are any; else our
    listen (and identify-observed) addresses less the unspecified ones, and less loopback unless loopback
    is all we have (a swarm on 127.0.0.1): a peer on another host that dials our 127.0.0.1 dials itself.
    """
    if not dialable:
        return []
    if announce:
        return list(announce)
    usable = [a for a in candidates if not _is_unusable(a)]
    if usable:
        return usable
    return [a for a in candidates if (host := _host_part(a)) is not None and host.is_loopback]


def build_host(
    identity: NodeIdentity,
    listen: Sequence[str],
    settings: HostSettings | None = None,
    *,
    announce: Sequence[str] = (),
    dialable: bool = True,
) -> IHost:
    """A host speaking only Noise over TCP with yamux, with our timeouts; `host.run(...)` listens.

    `announce`, `dialable`: what the host advertises (`announced_addrs`), recomputed at most every
    `ADDRS_CACHE_S` (`CachedAddrs`).
    """
    settings = settings or HostSettings()
    configured = parse_announce(announce)
    key_pair = libp2p_key_pair(identity)
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    connection_config = ConnectionConfig(
        max_connections=settings.max_connections,
        dial_timeout=settings.dial_timeout,
        inbound_upgrade_timeout=settings.upgrade_timeout,
        outbound_upgrade_timeout=settings.upgrade_timeout,
        inbound_stream_protocol_negotiation_timeout=settings.negotiate_timeout,
        outbound_stream_protocol_negotiation_timeout=settings.negotiate_timeout,
    )
    host = new_host(
        key_pair=key_pair,
        sec_opt={TProtocol(NOISE_PROTOCOL_ID): noise},
        muxer_opt={TProtocol(YAMUX_PROTOCOL_ID): Yamux},
        listen_addrs=[multiaddr.Multiaddr(a) for a in listen],
        connection_config=connection_config,
        negotiate_timeout=int(settings.negotiate_timeout),
        addrs_factory=lambda candidates: announced_addrs(candidates, announce=configured, dialable=dialable),
    )
    host.get_addrs = CachedAddrs(host.get_addrs)  # type: ignore[method-assign]  # every caller, libp2p's too
    set_failed_dial_backoff(host, settings.failed_dial_backoff)
    free_inbound_slots_on_close(host)
    if str(host.get_id()) != identity.peer_id:  # the two derivations must agree, or nothing is attributable
        raise RuntimeError(f"libp2p derived peer id {host.get_id()} for identity {identity.peer_id}")
    return host


def set_failed_dial_backoff(host: IHost, seconds: float) -> None:
    """How long the swarm refuses to dial a peer whose every address failed (its "negative cache").

    py-libp2p 0.8 fixes it at 60 s with no setting; this sets the cache's TTL, and fails loudly if a
    py-libp2p upgrade moved it (tests/p2p/test_dial_backoff.py dials through it).
    """
    cache = getattr(host.get_network(), "_negative_peer_cache", None)
    if cache is None or not isinstance(getattr(cache, "_ttl", None), float):
        raise RuntimeError("py-libp2p moved Swarm._negative_peer_cache._ttl (see set_failed_dial_backoff)")
    cache._ttl = float(seconds)


def listen_addrs(listen: Sequence[str]) -> list[multiaddr.Multiaddr]:
    return [multiaddr.Multiaddr(a) for a in listen]


def parse_peer_addr(text: str) -> PeerInfo:
    """A bootstrap address: a multiaddr ending in `/p2p/<peer id>`."""
    try:
        return info_from_p2p_addr(multiaddr.Multiaddr(text))
    except (ValueError, BaseLibp2pError) as exc:
        raise ValueError(f"not a peer multiaddr (…/p2p/<peer id>): {text!r}: {exc}") from None


def dialable_addrs(host: IHost) -> list[str]:
    """Our advertised addresses with the /p2p suffix, as text (for configs, status files and logs)."""
    return [str(a) for a in host.get_addrs()]


def peer_text(peer: ID) -> str:
    return peer.to_base58()

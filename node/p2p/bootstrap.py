"""Why a bootstrap peer could not be reached, in words an operator can act on.

A node alone on the network is the first thing a new operator meets, and libp2p names it in its own
terms ("no addresses established a successful connection", "handshake failed when upgrading to secure
connection"). The two mistakes behind nearly every case are a wrong port (nothing listens there) and a
wrong peer id (something answers, but the Noise handshake proves it holds another key). `explain`
turns a dial's failure into one of those, naming the address; `BootstrapReport` remembers the newest
explanation per address for the status file and says it in the log without repeating it every round.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

REPEAT_S = 60.0
"""A bootstrap address that keeps failing for the same reason is logged again after this many seconds."""


def _chain_text(exc: BaseException) -> str:
    """Every message in the exception's cause chain and group members, lower-cased, for matching."""
    parts: list[str] = []
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        parts.append(f"{type(current).__name__}: {current}")
        stack.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        stack.extend(getattr(current, "exceptions", ()) or ())
        stack.extend(e for e in getattr(current, "errors", ()) or () if isinstance(e, BaseException))
    return " | ".join(parts).lower()


def explain(address: str, exc: BaseException | None, timeout_s: float) -> str | None:
    """One sentence on why `address` (a bootstrap multiaddr) was not reached; `exc` None: it timed out.

    None when the dial was not tried: libp2p caches a peer's recent failure, and the last reason stands.
    """
    host_part, _, peer = address.partition("/p2p/")
    if exc is None:
        return (
            f"no answer from {host_part} within {timeout_s:g}s: the host is down, a firewall drops the "
            "connection, or the address is wrong"
        )
    text = _chain_text(exc)
    if "handshake" in text or "upgrade security" in text or "upgrading to secure" in text:
        return (
            f"something at {host_part} answered but is not peer {peer}: the peer id in the bootstrap "
            "address is wrong (`swarmnode keys show` on that node prints its peer id), or the port "
            "belongs to another service"
        )
    if "negative cache" in text:
        return None
    if "open connection" in text or "connect" in text or "refused" in text:
        return (
            f"nothing accepts connections at {host_part}: the port or host is wrong, or the bootstrap "
            "node is not running"
        )
    return f"dial to {address} failed: {str(exc)[:200]}"


@dataclass
class BootstrapReport:
    """The newest failure per bootstrap address, logged once per reason and then every `REPEAT_S`."""

    unreachable: dict[str, str] = field(default_factory=dict)  # address -> explanation
    _logged: dict[str, tuple[str, float]] = field(default_factory=dict)  # address -> (reason, when)

    def failed(self, address: str, reason: str, now: float) -> None:
        self.unreachable[address] = reason
        previous = self._logged.get(address)
        if previous is None or previous[0] != reason or now - previous[1] >= REPEAT_S:
            self._logged[address] = (reason, now)
            log.warning("bootstrap unreachable: %s", reason, extra={"bootstrap": address})

    def reached(self, address: str) -> None:
        if self.unreachable.pop(address, None) is not None:
            log.info("bootstrap reached", extra={"bootstrap": address})
        self._logged.pop(address, None)

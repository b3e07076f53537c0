"""Time and sequence numbers for the networking layer, passed in rather than read globally.

A node's envelope sequence number must never repeat, even across restarts, because receivers reject
(sender, seq) pairs they have already accepted. We keep no state on disk for it: at start-up the counter
is initialised from the wall clock in microseconds and incremented by one per sealed message. A restarted
node therefore starts above every seq it could have used before, unless it sealed more than one million
messages per second on average during its previous life, or the wall clock went backwards by more than
the previous uptime. Both are operator errors the replay window would surface as ignored messages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]
"""Seconds, monotonic or wall depending on use; components take one so tests can pass a fake."""


def wall_ms() -> int:
    """Milliseconds since the Unix epoch: the unit of envelope timestamps."""
    return time.time_ns() // 1_000_000


def wall_us() -> int:
    return time.time_ns() // 1_000


@dataclass
class SeqCounter:
    """Monotonic envelope sequence numbers that survive restarts without reuse (see module doc)."""

    next_value: int = field(default_factory=wall_us)

    def next(self) -> int:
        value = self.next_value
        self.next_value += 1
        return value

    def statistics(self) -> dict[str, int]:
        return {"next_seq": self.next_value}

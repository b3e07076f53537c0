"""A token bucket for upload bandwidth: emulates a node's uplink on loopback and caps a relay's share."""

from __future__ import annotations

import trio


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

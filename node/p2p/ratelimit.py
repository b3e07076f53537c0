"""Token buckets: sizing gossip rates explicitly instead of py-libp2p's fixed 10 msg/s per topic.

Pure state; the caller passes the current time, so tests need no clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TokenBucket:
    """`rate` tokens per second, at most `burst` banked."""

    rate: float
    burst: float
    tokens: float = -1.0
    updated: float = 0.0

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        if self.tokens < 0:
            self.tokens = self.burst

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = max(self.updated, now)

    def try_take(self, now: float, n: float = 1.0) -> bool:
        """Take `n` tokens if available; never blocks."""
        self._refill(now)
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False

    def wait_time(self, now: float, n: float = 1.0) -> float:
        """Seconds until `n` tokens are available (0 if they are now)."""
        self._refill(now)
        return 0.0 if self.tokens >= n else (n - self.tokens) / self.rate


class KeyedBuckets:
    """One bucket per key (sender, peer), bounded in number: the least recently used key is forgotten."""

    def __init__(self, rate: float, burst: float, max_keys: int = 4096) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: dict[object, TokenBucket] = {}

    def try_take(self, key: object, now: float) -> bool:
        bucket = self._buckets.pop(key, None)
        if bucket is None:
            bucket = TokenBucket(self.rate, self.burst, updated=now)
            if len(self._buckets) >= self.max_keys:
                self._buckets.pop(next(iter(self._buckets)))
        self._buckets[key] = bucket  # re-insert: most recently used last
        return bucket.try_take(now)

    def __len__(self) -> int:
        return len(self._buckets)


class StreamSlots:
    """Concurrent admissions for one protocol: at most `per_peer` for any one key and `total` overall.

    Counting per peer as well as in total is what keeps one peer from taking every slot: a peer over
    its share is refused while others are still admitted. Pure bookkeeping, no I/O; a key with no
    slot in use is forgotten, so memory is bounded by `total`.
    """

    def __init__(self, total: int, per_peer: int) -> None:
        if total < 1 or per_peer < 1:
            raise ValueError("stream slots need total >= 1 and per_peer >= 1")
        self.total = total
        self.per_peer = per_peer
        self._held: dict[object, int] = {}
        self._in_use = 0
        self.refused_peer = 0
        self.refused_total = 0

    def try_acquire(self, key: object) -> bool:
        """Take a slot for `key` if its share and the total allow; never blocks."""
        held = self._held.get(key, 0)
        if held >= self.per_peer:
            self.refused_peer += 1
            return False
        if self._in_use >= self.total:
            self.refused_total += 1
            return False
        self._held[key] = held + 1
        self._in_use += 1
        return True

    def release(self, key: object) -> None:
        held = self._held.get(key, 0)
        if held <= 0:
            raise RuntimeError(f"release of a slot {key!r} does not hold")
        if held == 1:
            del self._held[key]
        else:
            self._held[key] = held - 1
        self._in_use -= 1

    def held(self, key: object) -> int:
        return self._held.get(key, 0)

    def statistics(self) -> dict[str, int]:
        return {
            "in_use": self._in_use,
            "peers": len(self._held),
            "refused_peer": self.refused_peer,
            "refused_total": self.refused_total,
        }

"""Rationing as pure state: token buckets (gossip rates sized explicitly instead of py-libp2p's fixed
10 msg/s per topic) and slot tables counted per key and in total (request/response streams, HTTP
connections). The caller passes the current time, so tests need no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


@dataclass
class Slots:
    """At most `total` slots held, and at most `per_key` by one key (a peer, a client address) unless the
    caller says it is exempt.

    Counting per key as well as in total is what keeps one peer from taking every slot: a key over its
    share is refused while others are still admitted. `try_acquire` never waits and a refusal changes
    nothing (it is only counted); every acquire is paired with one `release` of the same key. A key with
    no slot held is forgotten, so the table is bounded by `total`. Used by request/response streams and
    by the HTTP data plane's connections and long polls.
    """

    total: int
    per_key: int
    held: dict[object, int] = field(default_factory=dict)
    in_use: int = 0
    refused_key: int = 0
    refused_total: int = 0

    def __post_init__(self) -> None:
        if self.total < 1 or self.per_key < 1:
            raise ValueError("slot caps must be at least 1")

    def count(self, key: object) -> int:
        return self.held.get(key, 0)

    def key_full(self, key: object, exempt: bool = False) -> bool:
        return not exempt and self.count(key) >= self.per_key

    def full(self) -> bool:
        return self.in_use >= self.total

    def try_acquire(self, key: object, exempt: bool = False) -> bool:
        """Take a slot for `key` if its share and the total allow; never blocks."""
        if self.key_full(key, exempt):
            self.refused_key += 1
            return False
        if self.full():
            self.refused_total += 1
            return False
        self.acquire(key)
        return True

    def acquire(self, key: object) -> None:
        """Take a slot without checking the caps (the caller made room, e.g. by evicting)."""
        self.held[key] = self.count(key) + 1
        self.in_use += 1

    def release(self, key: object) -> None:
        left = self.count(key) - 1
        if left < 0:
            raise RuntimeError(f"release of a slot {key!r} does not hold")
        if left:
            self.held[key] = left
        else:
            del self.held[key]
        self.in_use -= 1

    def statistics(self) -> dict[str, int]:
        return {
            "in_use": self.in_use,
            "keys": len(self.held),
            "refused_key": self.refused_key,
            "refused_total": self.refused_total,
        }

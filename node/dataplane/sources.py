"""Where shards can be fetched from, and how much to trust each source: the book the control plane feeds.

Availability arrives as `ShardHave` claims (gossip, DHT provider records, or the HTTP `have` long poll);
`observe` stores the latest claim per (endpoint, version) and decodes it lazily against the trainer-signed
manifest, so a claim may arrive before its manifest. Choice is random, weighted by measured throughput
(EWMA of finished transfers) divided by the transfers already running there, and halved per consecutive
failure; a failing source also waits out an exponential backoff, and one that served bytes that did not
hash to the manifest is banned for a while. Time (`now`, trio's clock) and the RNG are arguments.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import trio

from swarmnode.node.dataplane.errors import FailureKind
from swarmnode.protocol.errors import Reject
from swarmnode.protocol.messages import CheckpointManifest, ShardHave
from swarmnode.protocol.shards import decode_bitfield, parse_endpoint


@dataclass(frozen=True)
class ScoringConfig:
    prior_throughput: float = 200e6  # bytes/s assumed for an unmeasured source: optimistic, so it is tried
    ewma_alpha: float = 0.3
    failure_decay: float = 0.5  # score factor per consecutive failure
    backoff_base: float = 0.25  # seconds after the first failure, doubling per consecutive failure
    backoff_max: float = 15.0
    bad_hash_ban: float = 600.0  # seconds a source is excluded after it alone served a corrupt shard
    max_per_source: int = 2  # transfers at once from one source: fewer, sooner-finished shards pipeline

    min_sample_bytes: int = 256 * 1024  # smaller transfers say little about throughput


@dataclass
class SourceState:
    endpoint: str
    weight: float = 1.0  # operator preference, e.g. below 1 for the origin so relays carry the load
    throughput: float | None = None
    in_flight: int = 0
    consecutive_failures: int = 0
    retry_at: float = 0.0
    banned_until: float = 0.0
    bytes_received: int = 0
    transfers_ok: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    claims: dict[int, ShardHave] = field(default_factory=dict)  # version → latest claim
    retracted: dict[int, set[int]] = field(default_factory=dict)  # version → shards it 404'd
    _decoded: dict[int, frozenset[int]] = field(default_factory=dict)

    def score(self, prior: float, decay: float) -> float:
        rate = self.throughput if self.throughput is not None else prior
        return self.weight * rate * decay**self.consecutive_failures / (1 + self.in_flight)

    def held(self, manifest: CheckpointManifest) -> frozenset[int]:
        """Shards this source claims for the manifest's version (nothing if the claim names another root)."""
        claim = self.claims.get(manifest.version)
        if claim is None or claim.merkle_root != manifest.merkle_root:
            return frozenset()
        held = self._decoded.get(manifest.version)
        if held is None:
            try:
                held = decode_bitfield(claim.bitfield, len(manifest.shards))
            except Reject:
                held = frozenset()
            self._decoded[manifest.version] = held
        return held - self.retracted.get(manifest.version, set())


class SourceBook:
    """Sources of one run. Synchronous and clock-free except `wait_changed`."""

    def __init__(self, config: ScoringConfig = ScoringConfig(), *, own_endpoint: str | None = None) -> None:
        self.config = config
        self.own_endpoint = own_endpoint
        self._sources: dict[str, SourceState] = {}
        self._changed = trio.Event()

    # --- feeding -----------------------------------------------------------------------------------

    def _touch(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def add(self, endpoint: str, weight: float = 1.0) -> SourceState:
        """Know a source (no claims yet); Reject an endpoint that is not `http://host:port`."""
        parse_endpoint(endpoint)
        state = self._sources.get(endpoint)
        if state is None:
            state = self._sources[endpoint] = SourceState(endpoint, weight)
            self._touch()
        elif state.weight != weight:
            state.weight = weight
            self._touch()
        return state

    def observe(self, have: ShardHave, weight: float | None = None) -> None:
        """Record a source's latest claim for a version (the envelope was verified by the caller)."""
        if have.endpoint == self.own_endpoint:
            return
        state = self._sources.get(have.endpoint) or self.add(have.endpoint, 1.0 if weight is None else weight)
        old = state.claims.get(have.version)
        if old is not None and old.merkle_root == have.merkle_root and old.bitfield == have.bitfield:
            return
        state.claims[have.version] = have
        state._decoded.pop(have.version, None)
        state.retracted.pop(have.version, None)
        self._touch()

    def remove(self, endpoint: str) -> None:
        if self._sources.pop(endpoint, None) is not None:
            self._touch()

    def forget_version(self, version: int) -> None:
        """Drop claims about a pruned version."""
        for state in self._sources.values():
            state.claims.pop(version, None)
            state._decoded.pop(version, None)
            state.retracted.pop(version, None)

    # --- choosing ----------------------------------------------------------------------------------

    def holders(self, manifest: CheckpointManifest, index: int) -> list[SourceState]:
        return [s for s in self._sources.values() if index in s.held(manifest)]

    def pick(self, manifest: CheckpointManifest, index: int, now: float, rng: random.Random) -> str | None:
        """A source for shard `index`, drawn with probability proportional to its score; None if none free."""
        cfg = self.config
        eligible = [
            s
            for s in self.holders(manifest, index)
            if s.retry_at <= now and s.banned_until <= now and s.in_flight < cfg.max_per_source
        ]
        if not eligible:
            return None
        weights = [s.score(cfg.prior_throughput, cfg.failure_decay) for s in eligible]
        if sum(weights) <= 0:
            return None
        return rng.choices(eligible, weights)[0].endpoint

    def next_eligible(self, manifest: CheckpointManifest, index: int, now: float) -> float | None:
        """When a holder of shard `index` comes out of backoff or ban (None: no later time helps)."""
        times = [max(s.retry_at, s.banned_until) for s in self.holders(manifest, index)]
        later = [t for t in times if t > now]
        return min(later) if later else None

    def manifest_sources(self, version: int, merkle_root: bytes, now: float) -> list[str]:
        """Where to ask for a version's manifest: sources not banned, those claiming the version first,
        then by score (spec/shards.md, Checkpoint heads)."""
        cfg = self.config

        def rank(s: SourceState) -> tuple[bool, float]:
            claim = s.claims.get(version)
            claims = claim is not None and claim.merkle_root == merkle_root
            return (not claims, -s.score(cfg.prior_throughput, cfg.failure_decay))

        free = [s for s in self._sources.values() if s.banned_until <= now]
        return [s.endpoint for s in sorted(free, key=rank)]

    def get(self, endpoint: str) -> SourceState | None:
        return self._sources.get(endpoint)

    # --- feedback ----------------------------------------------------------------------------------

    def began(self, endpoint: str) -> None:
        state = self._sources.get(endpoint)
        if state is not None:
            state.in_flight += 1

    def ended(self, endpoint: str) -> None:
        """A transfer stopped for a reason that is not the source's (cancelled, our disk)."""
        state = self._sources.get(endpoint)
        if state is not None:
            state.in_flight -= 1
            self._touch()

    def _sample(self, state: SourceState, nbytes: int, seconds: float) -> None:
        state.bytes_received += nbytes
        if nbytes >= self.config.min_sample_bytes:
            rate = nbytes / max(seconds, 1e-4)
            a = self.config.ewma_alpha
            state.throughput = rate if state.throughput is None else (1 - a) * state.throughput + a * rate

    def succeeded(self, endpoint: str, nbytes: int, seconds: float) -> None:
        state = self._sources.get(endpoint)
        if state is None:
            return
        state.in_flight -= 1
        state.transfers_ok += 1
        state.consecutive_failures = 0
        self._sample(state, nbytes, seconds)
        self._touch()

    def failed(self, endpoint: str, kind: FailureKind, nbytes: int, seconds: float, now: float) -> None:
        """A transfer from this source failed; bytes received before the failure still count as a sample."""
        state = self._sources.get(endpoint)
        if state is None:
            return
        state.in_flight -= 1
        state.failures[kind.value] += 1
        self._sample(state, nbytes, seconds)
        if kind is FailureKind.BUSY:
            state.retry_at = max(state.retry_at, now + self.config.backoff_base)
        else:
            state.consecutive_failures += 1
            delay = self.config.backoff_base * 2 ** (state.consecutive_failures - 1)
            state.retry_at = now + min(delay, self.config.backoff_max)
        self._touch()

    def retract(self, endpoint: str, version: int, index: int) -> None:
        """The source answered 404 for a shard it claimed: stop asking it until it claims again."""
        state = self._sources.get(endpoint)
        if state is not None:
            state.retracted.setdefault(version, set()).add(index)
            self._touch()

    def corrupt(self, endpoint: str, now: float, sole: bool) -> None:
        """Bytes from this source failed the digest: ban it if it alone supplied the shard."""
        state = self._sources.get(endpoint)
        if state is None:
            return
        state.failures[FailureKind.BAD_HASH.value] += 1
        state.consecutive_failures += 1
        if sole:
            state.banned_until = now + self.config.bad_hash_ban
        self._touch()

    def statistics(self) -> dict[str, dict[str, object]]:
        return {
            s.endpoint: {
                "throughput": round(s.throughput or 0.0),
                "bytes_received": s.bytes_received,
                "transfers_ok": s.transfers_ok,
                "failures": dict(s.failures),
                "banned": s.banned_until > 0,
            }
            for s in self._sources.values()
        }

"""WAN link profiles: what one node's access link to the internet looks like (pure, no I/O).

A node's link is modelled as its last mile to an ideal core: an uplink rate, a downlink rate, a one-way
delay with jitter, and a loss probability, each applied in both directions of that link. A packet from A to
B therefore crosses A's link and then B's: its one-way delay is `A.delay_ms + B.delay_ms`, its loss
`1 - (1 - A.loss)(1 - B.loss)`, its rate the smaller of A's uplink and B's downlink. So the round trip
between two nodes of one profile is four times the profile's per-link delay, and the profile figures below
are chosen so that the pair figures match issue #19:

| profile     | pair RTT        | rate (up / down)           | pair loss | dialable |
|-------------|-----------------|----------------------------|-----------|----------|
| lan         | 1 ms            | 1 Gbit/s                   | 0         | yes      |
| continental | 50 ms           | 1 Gbit/s                   | 0         | yes      |
| global      | 150-300 ms      | 20-200 Mbit/s (per node)   | ~0.5 %    | yes      |
| home        | 40 ms (home-home) | 10 / 50 Mbit/s           | 0         | no (NAT) |

`global` gives ranges: each node draws its own delay (uniform) and rate (log-uniform) from an explicit
`random.Random`, so a seeded WAN is reproducible. A `Link` is the drawn, concrete figure for one node.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass


class UnknownProfile(ValueError):
    """A profile name that is not one of `PROFILES`."""


@dataclass(frozen=True)
class Span:
    """A closed range [lo, hi] a node's figure is drawn from; lo == hi for a fixed figure."""

    lo: float
    hi: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)) or self.lo < 0 or self.hi < self.lo:
            raise ValueError(f"bad span [{self.lo}, {self.hi}]: need 0 <= lo <= hi, finite")

    def draw(self, rng: random.Random, *, log: bool = False) -> float:
        if self.lo == self.hi:
            return self.lo
        if log and self.lo > 0:
            value = math.exp(rng.uniform(math.log(self.lo), math.log(self.hi)))
        else:
            value = rng.uniform(self.lo, self.hi)
        return min(max(value, self.lo), self.hi)  # exp(log(x)) may round just outside


def fixed(value: float) -> Span:
    return Span(value, value)


@dataclass(frozen=True)
class Link:
    """One node's concrete access link: rates in Mbit/s, one-way delay and jitter in ms, loss in [0, 1)."""

    up_mbit: float
    down_mbit: float
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    nat: bool = False  # behind NAT: it can dial out, nobody can dial it
    queue_ms: float = 100.0  # how much the shaper may queue before it drops (the modem's buffer)

    def __post_init__(self) -> None:
        for name in ("up_mbit", "down_mbit", "queue_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"link {name} must be a positive number, got {value!r}")
        for name in ("delay_ms", "jitter_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"link {name} must be a non-negative number, got {value!r}")
        if self.jitter_ms > self.delay_ms:
            raise ValueError(f"link jitter {self.jitter_ms} ms exceeds its delay {self.delay_ms} ms")
        if not (0.0 <= self.loss < 1.0):
            raise ValueError(f"link loss must be in [0, 1), got {self.loss!r}")


@dataclass(frozen=True)
class Profile:
    """A kind of access link; `link(rng)` draws one node's concrete `Link` from it."""

    name: str
    up_mbit: Span
    down_mbit: Span
    delay_ms: Span
    jitter_ms: float = 0.0
    loss: float = 0.0
    nat: bool = False
    queue_ms: float = 100.0

    def link(self, rng: random.Random) -> Link:
        up = self.up_mbit.draw(rng, log=True)
        # one draw for both directions where the spans are equal: a node's line is one kind of line
        down = up if self.down_mbit == self.up_mbit else self.down_mbit.draw(rng, log=True)
        return Link(
            up_mbit=up,
            down_mbit=down,
            delay_ms=self.delay_ms.draw(rng),
            jitter_ms=self.jitter_ms,
            loss=self.loss,
            nat=self.nat,
            queue_ms=self.queue_ms,
        )


PROFILES: Mapping[str, Profile] = {
    "lan": Profile("lan", fixed(1000.0), fixed(1000.0), fixed(0.25)),
    "continental": Profile("continental", fixed(1000.0), fixed(1000.0), fixed(12.5), jitter_ms=1.0),
    "global": Profile(
        "global", Span(20.0, 200.0), Span(20.0, 200.0), Span(37.5, 75.0), jitter_ms=2.0, loss=0.0025
    ),
    "home": Profile("home", fixed(10.0), fixed(50.0), fixed(10.0), jitter_ms=2.0, nat=True, queue_ms=200.0),
}


def profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfile(f"unknown WAN profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None


def draw_links(profiles: Mapping[str, Profile | str], seed: int) -> dict[str, Link]:
    """Each node's concrete link, in the mapping's order, from one seeded generator (reproducible)."""
    rng = random.Random(seed)
    return {
        node: (profile(spec) if isinstance(spec, str) else spec).link(rng) for node, spec in profiles.items()
    }


def pair_rtt_ms(a: Link, b: Link) -> float:
    """The round trip the emulator gives between two nodes, before queueing and serialisation."""
    return 2.0 * (a.delay_ms + b.delay_ms)


def pair_loss(a: Link, b: Link) -> float:
    """The chance a packet from a to b is lost on the links (before any queue drops)."""
    return 1.0 - (1.0 - a.loss) * (1.0 - b.loss)

"""A WAN on one machine for the devnet and the tests (issue #19): see `harness.Wan`.

Each node gets its own network namespace and address, its access link shaped by the kernel's `tbf`
(`shaping`), and delay, jitter, loss and NAT from a userspace router (`linkemu`); `profiles` holds the
kinds of link. Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN); elsewhere `WanUnavailable` says so.
"""

from swarmnode.node.wan.harness import Wan, destroy_stale
from swarmnode.node.wan.netns import WanError, WanUnavailable, check_available, destroy, spawn_in
from swarmnode.node.wan.profiles import (
    PROFILES,
    Link,
    Profile,
    UnknownProfile,
    draw_links,
    pair_loss,
    pair_rtt_ms,
    profile,
)

__all__ = [
    "PROFILES",
    "Link",
    "Profile",
    "UnknownProfile",
    "Wan",
    "WanError",
    "WanUnavailable",
    "check_available",
    "destroy",
    "destroy_stale",
    "draw_links",
    "pair_loss",
    "pair_rtt_ms",
    "profile",
    "spawn_in",
]

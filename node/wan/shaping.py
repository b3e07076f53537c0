"""Rate shaping with the kernel's `tbf`, on both ends of a node's veth (the kernel has no netem).

The egress of the namespace end is the node's uplink; the egress of the bridge end is its downlink. The
queue is sized in time (`Link.queue_ms` at the link's rate, the modem's buffer); the bucket holds about a
millisecond at rate and never less than a few full frames, so one packet never waits on a token it cannot
get.
"""

from __future__ import annotations

from swarmnode.node.wan.netns import run_in

BURST_S = 0.001  # bucket depth in seconds at the link's rate
MIN_BURST_FRAMES = 4  # and never less than this many full frames
ETHERNET_HEADER = 14


def tbf_args(device: str, rate_mbit: float, queue_ms: float, mtu: int) -> list[str]:
    """`tc qdisc replace` arguments putting a tbf of this rate and queue on a device's egress."""
    if not (rate_mbit > 0 and queue_ms > 0 and mtu >= 576):
        raise ValueError(f"bad shaping: rate {rate_mbit} Mbit/s, queue {queue_ms} ms, mtu {mtu}")
    rate_bytes = rate_mbit * 1e6 / 8
    frame = mtu + ETHERNET_HEADER
    burst = max(int(rate_bytes * BURST_S), MIN_BURST_FRAMES * frame)
    limit = int(rate_bytes * queue_ms / 1000.0) + burst
    rate_bit = int(rate_mbit * 1e6)
    return [
        "qdisc",
        "replace",
        "dev",
        device,
        "root",
        "tbf",
        "rate",
        f"{rate_bit}bit",
        "burst",
        f"{burst}",
        "limit",
        f"{limit}",
    ]


def shape(namespace: str, device: str, rate_mbit: float, queue_ms: float, mtu: int) -> None:
    run_in(namespace, ["tc", *tbf_args(device, rate_mbit, queue_ms, mtu)])

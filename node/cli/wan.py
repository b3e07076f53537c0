"""`swarmnode wan linkemu | probe ...`: the processes the WAN harness (`node.wan`) runs inside namespaces.

Neither is for an operator's daily use: `linkemu` is the link emulator the harness starts in a WAN's core
namespace, `probe` the path measurement tool tests/wan, scripts/wan_check.py and the WAN benchmarks run in
two nodes' namespaces. Both start fast: this module imports only click, and each command imports its
`node.wan` module (socket, epoll; never torch or libp2p) inside its function.
"""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.group("wan")
def wan_group() -> None:
    """The WAN harness's tools: the link emulator and a path measurement probe (run inside namespaces)."""


@wan_group.command("linkemu")
@click.option("--tun", required=True, metavar="NAME", help="The persistent TUN device to attach to.")
@click.option("--config", "config_path", required=True, metavar="FILE",
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help='JSON: {"seed": N, "links": {address: {delay_ms, jitter_ms, loss, nat}}}.')
@click.option("--stats", "stats_path", default=None, metavar="FILE", type=click.Path(path_type=Path),
              help="Write the counters here as JSON every second and on exit.")
def linkemu_command(tun: str, config_path: Path, stats_path: Path | None) -> None:
    """The WAN harness's link emulator: delay, jitter, loss and NAT.

    Holds and drops every packet routed through TUN as the links of --config say. The harness starts it in
    the WAN's core namespace (node/wan/linkemu.py says how the traffic is routed). Prints `ready` once the
    TUN is attached; runs until SIGTERM or SIGINT, then writes the stats once more.
    """
    import os
    import random

    from swarmnode.node.wan.linkemu import DelayLine, links_from_config, open_tun, serve, stop_on_signals

    document = json.loads(config_path.read_text())
    line = DelayLine(links_from_config(document), random.Random(int(document.get("seed", 0))))
    stop_on_signals()
    fd = open_tun(tun)
    click.echo("ready")  # click.echo flushes
    try:
        serve(fd, line, stats_path)
    finally:
        os.close(fd)


@wan_group.group("probe")
def probe_group() -> None:
    """A path measurement tool: TCP round trips, bulk TCP rate, UDP loss.

    Run `serve PORT` in one namespace and a client command (rtt, send, udp) in another against it; each
    client command prints one line of JSON.
    """


def _print(result: dict[str, object]) -> None:
    click.echo(json.dumps(result))


@probe_group.command("serve")
@click.argument("port", type=click.IntRange(1, 65535))
def probe_serve(port: int) -> None:
    """Answer the client commands on TCP and UDP PORT.

    Prints `ready` once listening; runs until killed.
    """
    from swarmnode.node.wan.probe import serve

    serve(port)


@probe_group.command("rtt")
@click.argument("host")
@click.argument("port", type=click.IntRange(1, 65535))
@click.argument("count", type=click.IntRange(1))
def probe_rtt(host: str, port: int, count: int) -> None:
    """COUNT one-byte TCP round trips to HOST.

    One connection with TCP_NODELAY; prints {"rtt_ms": [one per round trip]}.
    """
    from swarmnode.node.wan.probe import rtt

    _print(rtt(host, port, count))


@probe_group.command("send")
@click.argument("host")
@click.argument("port", type=click.IntRange(1, 65535))
@click.argument("size", metavar="BYTES", type=click.IntRange(1))
def probe_send(host: str, port: int, size: int) -> None:
    """Bulk TCP rate: send BYTES to HOST.

    The server times first byte to last, so slow start and the closing round trip are not in the rate;
    prints {"bytes", "seconds", "mbit"}.
    """
    from swarmnode.node.wan.probe import send

    _print(send(host, port, size))


@probe_group.command("udp")
@click.argument("host")
@click.argument("port", type=click.IntRange(1, 65535))
@click.argument("count", type=click.IntRange(1))
@click.argument("pps", type=click.FloatRange(min=0, min_open=True))
def probe_udp(host: str, port: int, count: int, pps: float) -> None:
    """UDP loss: send COUNT datagrams at PPS per second to HOST.

    Then asks the server over TCP how many arrived; prints {"sent", "received"}.
    """
    from swarmnode.node.wan.probe import udp

    _print(udp(host, port, count, pps))

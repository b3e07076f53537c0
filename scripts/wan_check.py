"""Check the WAN harness on this machine: build two nodes of a profile, measure them against the figures.

    sudo .venv/bin/python scripts/wan_check.py --profile continental [--bytes 50000000] [--seed 0]

Prints what was configured and what real traffic measured (TCP round trip, bulk TCP rate, UDP loss) and
the link emulator's CPU time per second of transfer, then one line of JSON. Exits 2 with the reason where
namespaces cannot be made.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from swarmnode.node.wan import Wan, WanUnavailable, check_available, draw_links, pair_loss, pair_rtt_ms

PROBE = [sys.executable, "-m", "swarmnode.node.cli", "wan", "probe"]
PORT = "7000"


def _probe(wan: Wan, node: str, *args: str) -> dict[str, object]:
    process = wan.spawn(node, [*PROBE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=600)
    if process.returncode != 0:
        raise SystemExit(f"probe {args[0]} failed: {err.strip()[-500:]}")
    return dict(json.loads(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="continental")
    parser.add_argument("--bytes", type=int, default=50_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mtu", type=int, default=1500)
    args = parser.parse_args()
    try:
        check_available()
    except WanUnavailable as err:
        print(f"wan_check: {err}", file=sys.stderr)
        return 2
    profile = (
        "lan" if args.profile == "home" else args.profile
    )  # a home node cannot be dialed: serve from lan
    links = draw_links({"client": args.profile, "server": profile}, args.seed)
    client, server = links["client"], links["server"]
    with Wan.create(links, seed=args.seed, mtu=args.mtu) as wan:
        serving = wan.spawn("server", [*PROBE, "serve", PORT], stdout=subprocess.PIPE)
        if serving.stdout is None or serving.stdout.readline().strip() != b"ready":
            raise SystemExit("the probe server did not start")
        rtts = _probe(wan, "client", "rtt", wan.address("server"), PORT, "50")["rtt_ms"]
        time.sleep(1.1)  # the emulator writes its counters once a second
        cpu_before = float(wan.statistics().get("cpu_s", 0.0))
        sent = _probe(wan, "client", "send", wan.address("server"), PORT, str(args.bytes))
        time.sleep(1.1)
        cpu_used = float(wan.statistics().get("cpu_s", 0.0)) - cpu_before
        udp = _probe(wan, "client", "udp", wan.address("server"), PORT, "5000", "1000")
        stats = wan.statistics()
    assert isinstance(rtts, list)
    seconds = float(sent["seconds"])  # type: ignore[arg-type]
    rate_configured = min(client.up_mbit, server.down_mbit)
    result = {
        "profile": args.profile,
        "rtt_configured_ms": pair_rtt_ms(client, server),
        "rtt_median_ms": statistics.median(rtts),
        "rtt_p99_ms": sorted(rtts)[int(0.99 * (len(rtts) - 1))],
        "rate_configured_mbit": rate_configured,
        "rate_measured_mbit": sent["mbit"],
        "rate_ratio": float(sent["mbit"]) / rate_configured,  # type: ignore[arg-type]
        "loss_configured": pair_loss(client, server),
        "loss_measured": 1 - int(udp["received"]) / int(udp["sent"]),  # type: ignore[call-overload]
        "emulator_cpu_per_s": cpu_used / seconds if seconds else 0.0,
        "emulator_packets": stats.get("packets_in", 0),
    }
    for key, value in result.items():
        print(f"{key:24} {value:.4g}" if isinstance(value, float) else f"{key:24} {value}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

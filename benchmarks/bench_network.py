#!/usr/bin/env python3
"""Network benchmark: gossip delivery latency and loss across 10 processes, DHT lookup time, TCP baseline.

    python benchmarks/bench_network.py [--duration 10] [--out DIR]

A devnet of 9 node processes (bootstrap, trainer, 2 relays, 3 workers, 2 validators) on 127.0.0.1; a
10th process, a probe node given only the bootstrap address, publishes numbered `ShardHave` probes on
the shards topic at 1, 10 and 50 messages/s. The 8 shards subscribers log every delivery with the wall
clock; latency is receive time minus the publish time carried in the probe (one machine, one clock),
loss is the share of (probe, subscriber) pairs never delivered. A last probe run times provider lookups
of every role key. The baseline is the round trip of a 64-byte message over a plain trio TCP connection
on loopback in this process. Ends with one JSON line (snake_case keys; ratios end in `_ratio`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from node.devnet import Devnet, DevnetPlan  # noqa: E402
from node.roles.probe import parse_probe_tag  # noqa: E402

RATES = (1, 10, 50)
SECTIONS = {"discovery": {"early_refresh": [0.5, 1.0, 2.0, 4.0, 8.0]}}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def tcp_round_trips(n: int = 2000, size: int = 64) -> list[float]:
    """Round-trip seconds of `n` echoes of `size` bytes over one loopback TCP connection."""
    times: list[float] = []

    async def echo(stream: trio.SocketStream) -> None:
        async with stream:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                await stream.send_all(data)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, echo, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        payload = b"x" * size
        async with stream:
            for _ in range(n):
                start = time.perf_counter()
                await stream.send_all(payload)
                received = 0
                while received < size:
                    received += len(await stream.receive_some(65536))
                times.append(time.perf_counter() - start)
        nursery.cancel_scope.cancel()
    return times


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.25)


def run_probe(devnet: Devnet, name: str, *args: str) -> dict[str, Any]:
    node = devnet.add_node(name, "probe", config_sections=SECTIONS)
    report = node.directory / "report.json"
    devnet.start(name, "--report", str(report), *args, command="probe")
    assert node.process is not None
    code = node.process.wait(timeout=600)
    if code != 0:
        raise SystemExit(f"probe {name} failed ({code}); see {node.directory}/stdout.log")
    return dict(json.loads(report.read_text()))


def cpu_seconds(devnet: Devnet) -> float:
    """User + system CPU seconds used so far by the running node processes (Linux /proc)."""
    total = 0
    tick = os.sysconf("SC_CLK_TCK")
    for node in devnet.nodes.values():
        if node.process is None or node.process.poll() is not None or node.name.startswith("probe"):
            continue
        try:
            fields = Path(f"/proc/{node.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


def gossip_phase(devnet: Devnet, rate: int, duration: float, subscribers: list[str]) -> dict[str, float]:
    name = f"probe-rate-{rate}"
    count = max(5, int(rate * duration))
    cpu_before, wall_before = cpu_seconds(devnet), time.monotonic()
    report = run_probe(
        devnet, name, "--rate", str(rate), "--count", str(count), "--wait-subscribers", "4", "--linger", "5"
    )
    address = json.loads((devnet.nodes[name].data_dir / "status.json").read_text())["address"].lower()
    sent = {index: wall for index, wall in report["published"]}
    latencies: list[float] = []
    delivered = 0
    for subscriber in subscribers:
        path = devnet.nodes[subscriber].data_dir / "deliveries.jsonl"
        seen: set[int] = set()
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            parsed = parse_probe_tag(entry["tag"])
            if parsed is None or entry["sender"] != address or parsed[0] in seen:
                continue
            seen.add(parsed[0])
            latencies.append((entry["recv_ns"] - sent[parsed[0]]) / 1e6)
        delivered += len(seen)
    cpu_used, wall = cpu_seconds(devnet) - cpu_before, time.monotonic() - wall_before
    expected = len(sent) * len(subscribers)
    span_s = (max(sent.values()) - min(sent.values())) / 1e9 if len(sent) > 1 else 0.0
    drops = {"outbound": 0, "upstream": 0, "queue": 0}
    for node in devnet.nodes.values():
        shards = ((node.status() or {}).get("gossip") or {}).get("shards") or {}
        drops["outbound"] += shards.get("outbound_drops", 0)
        drops["upstream"] += shards.get("upstream_drops", 0)
        drops["queue"] += shards.get("queue_drops", 0)
    result = {
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "loss": 1 - delivered / expected if expected else float("nan"),
        "messages": len(sent),
        "achieved_rate": (len(sent) - 1) / span_s if span_s else float("nan"),
        "outbound_drops_total": drops["outbound"],
        "node_cpu_ms_per_message": cpu_used * 1e3 / len(sent) / len(subscribers),
        "node_cpu_cores_busy": cpu_used / wall,
    }
    print(
        f"gossip {rate:>3} msg/s (achieved {result['achieved_rate']:.1f}): {len(sent)} messages x "
        f"{len(subscribers)} subscribers: p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, "
        f"loss {result['loss']:.4f}; counted drops so far {drops}; node CPU "
        f"{result['node_cpu_ms_per_message']:.1f} ms per message per node, "
        f"{result['node_cpu_cores_busy']:.2f} cores busy",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of publishing per rate")
    parser.add_argument("--lookups", type=int, default=10, help="timed lookups per role key")
    parser.add_argument("--out", type=Path, help="devnet folder (default: a temporary directory)")
    args = parser.parse_args()

    rtts = trio.run(tcp_round_trips)
    tcp_p50, tcp_p99 = percentile(rtts, 50) * 1e3, percentile(rtts, 99) * 1e3
    print(f"trio TCP round trip (64 B, loopback): p50 {tcp_p50:.3f} ms, p99 {tcp_p99:.3f} ms", flush=True)

    folder = args.out or Path(tempfile.mkdtemp(prefix="bench-network-")) / "devnet"
    plan = DevnetPlan(
        trainers=1, relays=2, workers=3, validators=2, run="bench", record_deliveries=True, sections=SECTIONS
    )
    devnet = Devnet(plan, folder)
    devnet.prepare()
    subscribers = [
        n.name for n in devnet.nodes.values() if n.role in ("bootstrap", "relay", "worker", "validator")
    ]
    results: dict[str, Any] = {}
    try:
        devnet.start("bootstrap")
        devnet.wait_ready(["bootstrap"], timeout=120)
        devnet.start_others()
        devnet.wait_ready(list(devnet.nodes), timeout=180)
        started = time.monotonic()
        wait_for(devnet.discovered, 180, "discovery")
        print(
            f"{len(devnet.nodes)} node processes + 1 probe process; discovery complete "
            f"{time.monotonic() - started:.1f}s after all were ready; folder {devnet.folder}",
            flush=True,
        )
        for rate in RATES:
            phase = gossip_phase(devnet, rate, args.duration, subscribers)
            for key, value in phase.items():
                results[f"gossip_{rate}_per_s_{key}"] = value
        lookup_report = run_probe(
            devnet,
            "probe-lookups",
            "--lookups",
            str(args.lookups),
            "--wait-subscribers",
            "0",
            "--linger",
            "0",
        )
        lookups = [t * 1e3 for times in lookup_report["lookups"].values() for t in times]
        results["dht_lookup_p50_ms"] = percentile(lookups, 50)
        results["dht_lookup_p99_ms"] = percentile(lookups, 99)
        results["dht_lookups"] = len(lookups)
        print(
            f"DHT provider lookup ({len(lookups)}): p50 {results['dht_lookup_p50_ms']:.1f} ms, "
            f"p99 {results['dht_lookup_p99_ms']:.1f} ms",
            flush=True,
        )
    finally:
        codes = devnet.stop_all()
    unclean = {n: c for n, c in codes.items() if c not in (0, None)}
    results.update(
        {
            "processes": len([n for n in devnet.nodes.values() if not n.name.startswith("probe")]) + 1,
            "subscribers": len(subscribers),
            "tcp_rtt_p50_ms": tcp_p50,
            "tcp_rtt_p99_ms": tcp_p99,
            "gossip_1_per_s_p50_to_tcp_rtt_ratio": results["gossip_1_per_s_p50_ms"] / tcp_p50,
            "gossip_50_per_s_p50_to_tcp_rtt_ratio": results["gossip_50_per_s_p50_ms"] / tcp_p50,
            "dht_lookup_p50_to_tcp_rtt_ratio": results["dht_lookup_p50_ms"] / tcp_p50,
            "cpu_count": os.cpu_count(),
            "clean_shutdown": not unclean,
        }
    )
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in results.items()}))


if __name__ == "__main__":
    main()

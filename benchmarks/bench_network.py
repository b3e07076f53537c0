#!/usr/bin/env python3
"""Network benchmark: gossip latency, loss and CPU at 10, 50 and 100 msg/s across 10 processes; DHT lookups;
the TCP round trip of the same network as the baseline.

    python benchmarks/bench_network.py [--quick] [--duration 10] [--rates 10,50,100] [--out DIR]
                                       [--wan PROFILE [--skip-loopback]]

A devnet of 9 node processes (bootstrap, trainer, 2 relays, 3 workers, 2 validators) on 127.0.0.1; a 10th
process, a probe node given only the bootstrap address, publishes numbered `ShardHave` probes on the shards
topic at each rate. The 8 shards subscribers log every delivery with the wall clock; latency is receive time
minus the publish time carried in the probe (one machine, one clock), loss is the share of (probe, subscriber)
pairs never delivered. CPU per message per node is the node processes' CPU during a phase, less their idle CPU
over as long a quiet window measured just before it, divided by messages x subscribers; the machine's busy
share while the probe published (every core, all processes: /proc/stat) says whether the machine itself was
saturated. Drop counters are per phase, summed over all nodes, by kind (spec/gossip.md, Delivery and
back-pressure). A last probe times provider lookups of every role key. The baseline is the round trip of a
64-byte message over a plain trio TCP connection on the same network.

Phases run on a `Network`: loopback, then with `--wan PROFILE` the same phases on a WAN of that profile
(`node.wan`, needs root; elsewhere the run exits 2 with the reason). There every node and every probe has its
own namespace and link, so a probe's messages cross the emulated links like any node's, and the baseline is
the TCP round trip between two nodes' namespaces (`swarmnode wan probe rtt`, one byte, p50). Its keys get the
profile's name as prefix. Goals (issue #19): no loss and p99 < 250 ms at 100 msg/s on loopback; on the WAN no
loss and p99 < 3 x the round trip (`<profile>_gossip_<rate>_p99_vs_3_rtt_ratio` < 1). Ends with one JSON line
(snake_case keys; ratios end in `_ratio`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.wan_bench import open_wan, probe_rtt, require_wan  # noqa: E402
from swarmnode.node.devnet.network import WAN_P2P_PORT, Devnet  # noqa: E402
from swarmnode.node.devnet.plan import DevnetNode, DevnetPlan  # noqa: E402
from swarmnode.node.roles.probe import parse_probe_tag  # noqa: E402
from swarmnode.node.wan import PROFILES, draw_links  # noqa: E402

RATES = (10, 50, 100)
GOAL_P99_MS = 250.0  # issue #19, at 100 msg/s on loopback
GOAL_WAN_RTTS = 3.0  # issue #19: gossip p99 on a WAN under this many TCP round trips
WAN_RTT_SAMPLES = 200
SECTIONS = {"discovery": {"early_refresh": [0.5, 1.0, 2.0, 4.0, 8.0]}}
SETTLE_S = 20.0  # DHT early refreshes (SECTIONS) end 15.5 s after start; idle CPU is measured after
DROP_KINDS = ("outbound_drops", "upstream_drops", "queue_drops", "pending_full", "throttled")
FLOW_COUNTERS = ("backpressure_waits", "backpressure_timeouts")
PUBSUB_COUNTERS = ("rpc_copies", "rpc_duplicate_copies", "records_verified", "outbound_merged")
GC_COUNTERS = ("gc_pause_ms", "gc_full_collections")  # summed over nodes, per phase
GC_MAXIMA = ("gc_max_pause_ms",)  # the longest pass of any node since it was ready (not per phase)


@dataclass(frozen=True)
class Network:
    """Where a run's processes live: how to build its devnet and time its TCP round trip."""

    name: str  # "loopback", or a WAN profile
    make_devnet: Callable[[DevnetPlan, Path], Devnet]
    round_trips: Callable[[Devnet], list[float]]  # of the prepared devnet's network, in seconds

    def key(self, name: str) -> str:
        return name if self.name == "loopback" else f"{self.name}_{name}"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def tcp_round_trips(host: str = "127.0.0.1", n: int = 2000, size: int = 64) -> list[float]:
    """Round-trip seconds of `n` echoes of `size` bytes over one TCP connection to `host`."""
    times: list[float] = []

    async def echo(stream: trio.SocketStream) -> None:
        async with stream:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                await stream.send_all(data)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, echo, 0, host=host))
        port = listeners[0].socket.getsockname()[1]
        stream = await trio.open_tcp_stream(host, port)
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


LOOPBACK = Network("loopback", Devnet, lambda devnet: trio.run(tcp_round_trips))


class WanDevnet(Devnet):
    """A devnet on a WAN with a seat for each probe: a probe gets its own namespace and a link of the
    plan's profile (the root namespace reaches nodes around the emulator, which would hide a hop)."""

    def __init__(self, plan: DevnetPlan, folder: Path, probes: Sequence[str]) -> None:
        super().__init__(plan, folder)
        self.probes = tuple(probes)

    def open_wan(self) -> None:
        profiles = {**self.plan.wan_profiles(), **dict.fromkeys(self.probes, self.plan.wan)}
        self.wan = open_wan(draw_links(profiles, self.plan.wan_seed), self.plan.wan_seed)

    def add_node(self, name: str, role: str, *, config_sections: Any = None) -> DevnetNode:
        node = super().add_node(name, role, config_sections=config_sections)
        if self.wan is not None and name in self.wan.links:
            node.host, node.port = self.wan.address(name), WAN_P2P_PORT
            self.write_config(node, bootstrap=(self.nodes["bootstrap"].addr,), sections=config_sections)
        return node


def wan_network(profile: str, probes: Sequence[str]) -> Network:
    def round_trips(devnet: Devnet) -> list[float]:
        assert devnet.wan is not None
        return probe_rtt(devnet.wan, "bootstrap", "trainer-1", WAN_RTT_SAMPLES)

    return Network(profile, lambda plan, folder: WanDevnet(plan, folder, probes), round_trips)


def probe_names(rates: Sequence[int]) -> list[str]:
    return [f"probe-rate-{rate}" for rate in rates] + ["probe-lookups"]


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
    """User + system CPU seconds used so far by the running node processes, probes excepted (Linux /proc)."""
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


def counters(devnet: Devnet) -> dict[str, float]:
    """Shards-topic drop and flow counters, pubsub counters and garbage-collector passes, from every node's
    status.json: summed over nodes, except `GC_MAXIMA` (the largest)."""
    total = dict.fromkeys(DROP_KINDS + FLOW_COUNTERS + PUBSUB_COUNTERS + GC_COUNTERS + GC_MAXIMA, 0.0)
    for node in devnet.nodes.values():
        status = node.status() or {}
        gossip = status.get("gossip") or {}
        shards = gossip.get("shards") or {}
        for key in DROP_KINDS + FLOW_COUNTERS:
            total[key] += int(shards.get(key, 0))
        for key in PUBSUB_COUNTERS:
            total[key] += int(gossip.get(key, 0))
        gc = status.get("gc") or {}
        if gc:
            total["gc_pause_ms"] += sum(gc["pause_ms"])
            total["gc_full_collections"] += gc["collections"][2]
            total["gc_max_pause_ms"] = max(total["gc_max_pause_ms"], *gc["max_pause_ms"])
    return total


class MachineCpu:
    """Samples the whole machine's CPU (/proc/stat) a few times a second in a thread, so a phase can say how
    busy the machine was while the probe published: the share of every core, emulator and probe included.
    Node CPU alone, averaged over a phase's start-up and linger, hides a machine that is saturated only
    while messages flow."""

    INTERVAL_S = 0.25

    def __init__(self) -> None:
        self.samples: list[tuple[float, int, int]] = []  # (wall s, busy ticks, total ticks)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MachineCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            idle = ticks[3] + ticks[4]  # idle + iowait
            self.samples.append((time.time(), sum(ticks) - idle, sum(ticks)))
            self._stop.wait(self.INTERVAL_S)

    def busy_share(self, start: float, end: float) -> float:
        """Share of all cores busy between the samples nearest inside [start, end] (wall seconds)."""
        inside = [sample for sample in self.samples if start <= sample[0] <= end]
        if len(inside) < 2:
            return float("nan")
        (_, busy_a, total_a), (_, busy_b, total_b) = inside[0], inside[-1]
        return (busy_b - busy_a) / max(1, total_b - total_a)


def idle_cpu_rate(devnet: Devnet, seconds: float) -> float:
    """CPU cores the node processes use with no probe traffic (heartbeats, liveness, DHT, status)."""
    before, started = cpu_seconds(devnet), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(devnet) - before) / (time.monotonic() - started)


def gossip_phase(devnet: Devnet, rate: int, duration: float, subscribers: list[str]) -> dict[str, float]:
    name = probe_names([rate])[0]
    count = max(5, int(rate * duration))
    idle = idle_cpu_rate(devnet, min(5.0, max(2.0, duration / 2)))
    counted_before = counters(devnet)
    cpu_before, wall_before = cpu_seconds(devnet), time.monotonic()
    with MachineCpu() as machine:
        report = run_probe(
            devnet, name, "--rate", str(rate), "--count", str(count),
            "--wait-subscribers", "4", "--linger", "5",
        )
    cpu_used, wall = cpu_seconds(devnet) - cpu_before, time.monotonic() - wall_before
    time.sleep(1.5)  # every node writes status.json each second: the counters catch up
    counted = {k: v if k in GC_MAXIMA else v - counted_before[k] for k, v in counters(devnet).items()}
    address = json.loads((devnet.nodes[name].data_dir / "status.json").read_text())["address"].lower()
    sent = {index: wall_ns for index, wall_ns in report["published"]}
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
    expected = len(sent) * len(subscribers)
    span_s = (max(sent.values()) - min(sent.values())) / 1e9 if len(sent) > 1 else 0.0
    traffic_cpu = max(0.0, cpu_used - idle * wall)
    result: dict[str, float] = {
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "loss": 1 - delivered / expected if expected else float("nan"),
        "messages": len(sent),
        "achieved_rate": (len(sent) - 1) / span_s if span_s else float("nan"),
        "node_cpu_ms_per_message": traffic_cpu * 1e3 / len(sent) / len(subscribers),
        "node_cpu_cores_busy": cpu_used / wall,
        "node_cpu_cores_idle": idle,
        # every core of the machine while the probe published (nodes, probe, the WAN emulator, the rest)
        "machine_cpu_busy_ratio": machine.busy_share(min(sent.values()) / 1e9, max(sent.values()) / 1e9),
        **{k: float(v) for k, v in counted.items()},
    }
    result["p99_vs_goal_ratio"] = result["p99_ms"] / GOAL_P99_MS
    drops = {k.removesuffix("_drops"): counted[k] for k in DROP_KINDS}
    print(
        f"gossip {rate:>3} msg/s (achieved {result['achieved_rate']:.1f}): {len(sent)} messages x "
        f"{len(subscribers)} subscribers: p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms "
        f"({result['p99_vs_goal_ratio']:.2f}x the {GOAL_P99_MS:.0f} ms goal), loss {result['loss']:.4f}; "
        f"drops {drops}; node CPU {result['node_cpu_ms_per_message']:.2f} ms per message per node "
        f"({result['node_cpu_cores_busy']:.2f} cores busy, {idle:.2f} idle; the machine "
        f"{result['machine_cpu_busy_ratio']:.0%} busy while publishing); copies received "
        f"{counted['rpc_copies']:.0f} ({counted['rpc_duplicate_copies']:.0f} duplicate), "
        f"{counted['outbound_merged']:.0f} merged into queued RPCs, "
        f"{counted['records_verified']:.0f} peer records verified; GC {counted['gc_pause_ms']:.0f} ms in "
        f"{counted['gc_full_collections']:.0f} full passes over all nodes (longest pass so far "
        f"{counted['gc_max_pause_ms']:.0f} ms)",
        flush=True,
    )
    return result


def run_network(network: Network, args: argparse.Namespace) -> dict[str, Any]:
    """Every phase on one network: TCP round trip, gossip at each rate, DHT lookups."""
    results: dict[str, Any] = {}
    folder = (args.out or Path(tempfile.mkdtemp(prefix="bench-network-"))) / network.name
    plan = DevnetPlan(
        trainers=1,
        relays=2,
        workers=3,
        validators=2,
        run="bench",
        record_deliveries=True,
        sections=SECTIONS,
        wan="" if network.name == "loopback" else network.name,
    )
    devnet = network.make_devnet(plan, folder)
    devnet.prepare()
    subscribers = [
        n.name for n in devnet.nodes.values() if n.role in ("bootstrap", "relay", "worker", "validator")
    ]
    try:
        rtts = network.round_trips(devnet)
        tcp_p50, tcp_p99 = percentile(rtts, 50) * 1e3, percentile(rtts, 99) * 1e3
        print(f"[{network.name}] TCP round trip: p50 {tcp_p50:.3f} ms, p99 {tcp_p99:.3f} ms", flush=True)
        results[network.key("tcp_rtt_p50_ms")] = tcp_p50
        results[network.key("tcp_rtt_p99_ms")] = tcp_p99
        devnet.start("bootstrap")
        devnet.wait_ready(["bootstrap"], timeout=120)
        devnet.start_others()
        devnet.wait_ready(list(devnet.nodes), timeout=180)
        started = time.monotonic()
        wait_for(devnet.discovered, 180, "discovery")
        print(
            f"[{network.name}] {len(devnet.nodes)} node processes + 1 probe process; discovery complete "
            f"{time.monotonic() - started:.1f}s after all were ready; folder {devnet.folder}",
            flush=True,
        )
        time.sleep(SETTLE_S)  # start-up work (imports done, first DHT refreshes) out of the idle window
        for rate in args.rates:
            phase = gossip_phase(devnet, rate, args.duration, subscribers)
            for key, value in phase.items():
                results[network.key(f"gossip_{rate}_{key}")] = value
            results[network.key(f"gossip_{rate}_p50_to_tcp_rtt_ratio")] = phase["p50_ms"] / tcp_p50
            if network.name != "loopback":
                ratio = phase["p99_ms"] / (GOAL_WAN_RTTS * tcp_p50)
                results[network.key(f"gossip_{rate}_p99_vs_3_rtt_ratio")] = ratio
                print(
                    f"[{network.name}] {rate} msg/s: p99 {ratio:.2f}x the goal of 3 round trips", flush=True
                )
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
        results[network.key("dht_lookup_p50_ms")] = percentile(lookups, 50)
        results[network.key("dht_lookup_p99_ms")] = percentile(lookups, 99)
        results[network.key("dht_lookups")] = len(lookups)
        results[network.key("dht_lookup_p50_to_tcp_rtt_ratio")] = percentile(lookups, 50) / tcp_p50
        print(
            f"[{network.name}] DHT provider lookup ({len(lookups)}): p50 {percentile(lookups, 50):.1f} ms, "
            f"p99 {percentile(lookups, 99):.1f} ms",
            flush=True,
        )
    finally:
        codes = devnet.stop_all()
        devnet.close()  # takes a WAN down (its emulator's counters go to wan-stats.json)
    results[network.key("processes")] = len([n for n in devnet.nodes if not n.startswith("probe")]) + 1
    results[network.key("subscribers")] = len(subscribers)
    results[network.key("clean_shutdown")] = all(c in (0, None) for c in codes.values())
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of publishing per rate")
    parser.add_argument("--rates", type=lambda t: tuple(int(r) for r in t.split(",")), default=RATES)
    parser.add_argument("--lookups", type=int, default=10, help="timed lookups per role key")
    parser.add_argument("--quick", action="store_true", help="4 s per rate and 2 lookups per role")
    parser.add_argument("--out", type=Path, help="devnet folder (default: a temporary directory)")
    parser.add_argument("--wan", choices=sorted(PROFILES), help="also run every phase on a WAN (root)")
    parser.add_argument("--skip-loopback", action="store_true", help="with --wan: the WAN phases only")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.lookups = min(args.duration, 4.0), min(args.lookups, 2)
    if args.skip_loopback and not args.wan:
        parser.error("--skip-loopback needs --wan")
    if args.wan:
        require_wan()  # exits 2 with the reason before the loopback phases, not after them

    results: dict[str, Any] = {}
    if not args.skip_loopback:
        results |= run_network(LOOPBACK, args)
        results["goal_p99_ms"] = GOAL_P99_MS
        results["goal_met"] = (
            results.get("gossip_100_loss") == 0
            and results.get("gossip_100_p99_ms", float("inf")) < GOAL_P99_MS
        )
    if args.wan:
        wan = wan_network(args.wan, probe_names(args.rates))
        results |= run_network(wan, args)
        top = max(args.rates)
        results[wan.key("goal_met")] = (
            results.get(wan.key(f"gossip_{top}_loss")) == 0
            and results.get(wan.key(f"gossip_{top}_p99_vs_3_rtt_ratio"), float("inf")) < 1.0
        )
    results["cpu_count"] = os.cpu_count()
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in results.items()}))


if __name__ == "__main__":
    main()

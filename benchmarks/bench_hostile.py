"""Hostile-peer benchmark: what one cheap attacker costs a working devnet.

Usage: `python benchmarks/bench_hostile.py [--quick] [--window 120] [--attacks bomb,slow,...]`.

One devnet (bootstrap, trainer, 1 relay, 2 honest workers, 1 validator, a signed-log ledger; the
attacker's two staked keys enrolled beside them) runs these phases in order:
- warm-up: until the trainer has taken its first step (checkpoints flow, workers generate).
- honest: `--window` seconds without the attacker. Honest throughput: submissions of the honest
  workers the validator accepted, per minute (its status), and trainer steps per minute.
- frame: one container-bomb SUBMIT frame of `--frame-bytes` from an unstaked key; the validator's
  resident set is polled every 50 ms (and its VmHWM read): `peak_rss_per_frame_byte` is the peak growth
  over the frame's size.
- hostile: `--window` seconds with `tests.hostile.attacker` running `--attacks` against the validator
  and the HTTP endpoints (replay is left out: its cache targets version 0, stale by then; the slow test
  runs it). `hostile_throughput_ratio` = honest accepted submissions per minute with the
  attacker / without (0 when the validator died).
- `stored_bytes_per_hour`: the largest growth of any node's data dir over the honest and hostile windows,
  per hour, under the load stated beside it: `honest_submissions_per_s` (judged by the validator),
  `hostile_gossip_msgs_per_s` and `hostile_submissions_per_s` (what the attacker sent); per node in
  `stored_bytes_per_hour_by_node`.

Progress goes to stderr; the last line on stdout is one JSON object (snake_case keys, ratios end in
`_ratio`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from swarmnode.node.devnet.network import Devnet  # noqa: E402
from swarmnode.node.devnet.plan import DevnetPlan  # noqa: E402
from tests.hostile.attacker import enroll_attackers  # noqa: E402
from tests.hostile.measure import Sampler, du_bytes  # noqa: E402

STEPS = 10_000  # never reached: the benchmark stops the devnet after its phases
HOUR_S = 3600.0


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _work(devnet: Devnet, name: str) -> dict[str, Any]:
    return (devnet.nodes[name].status() or {}).get("work") or {}


def _honest_accepted(devnet: Devnet) -> int:
    """Submissions of the honest workers the validator accepted so far."""
    per_worker = _work(devnet, "validator-1").get("per_worker") or {}
    honest = {n.address.lower() for n in devnet.nodes.values() if n.name.startswith("worker-")}
    return sum(int(t.get("accepted", 0)) for w, t in per_worker.items() if w.lower() in honest)


def _check_alive(devnet: Devnet) -> list[str]:
    return [n for n, node in devnet.nodes.items() if node.exit_code not in (None, 0)]


def _wait(devnet: Devnet, predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if _check_alive(devnet):
            raise RuntimeError(f"{_check_alive(devnet)} exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout} s ({devnet.folder})")
        time.sleep(0.5)


def _disk(devnet: Devnet) -> dict[str, int]:
    return {name: du_bytes(node.data_dir) for name, node in devnet.nodes.items()}


def _window(devnet: Devnet, seconds: float) -> dict[str, float]:
    """Honest throughput over `seconds` (stops early if the validator dies; its rate is then what it did)."""
    accepted, step = _honest_accepted(devnet), int(_work(devnet, "trainer-1").get("step", 0))
    judged = int(_work(devnet, "validator-1").get("judged", 0))
    accepted_now, step_now, judged_now = accepted, step, judged
    started = time.monotonic()
    while time.monotonic() - started < seconds and devnet.nodes["validator-1"].exit_code is None:
        time.sleep(1.0)  # the status files outlive a crash: the last figures a node wrote count
        accepted_now = max(accepted_now, _honest_accepted(devnet))
        step_now = max(step_now, int(_work(devnet, "trainer-1").get("step", 0)))
        judged_now = max(judged_now, int(_work(devnet, "validator-1").get("judged", 0)))
    elapsed = seconds  # a dead validator accepts nothing for the rest of the window
    return {
        "accepted_per_min": (accepted_now - accepted) * 60.0 / elapsed,
        "steps_per_min": (step_now - step) * 60.0 / elapsed,
        "judged_per_s": (judged_now - judged) / elapsed,
    }


def _attacker(
    devnet: Devnet, out: Path, attacks: str, duration: float, extra: list[str]
) -> subprocess.Popen[bytes]:
    log = (out.parent / (out.stem + ".log")).open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "tests.hostile.attacker", "--devnet", str(devnet.folder),
         "--target", "validator-1", "--attacks", attacks, "--duration", str(duration), "--report", str(out),
         *extra],
        cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}, stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip


def run(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    plan = DevnetPlan(trainers=1, relays=1, workers=2, validators=1, steps=STEPS, ledger="signed")
    devnet = Devnet(plan, folder / "run")
    devnet.prepare()
    assert devnet.ledger is not None
    enroll_attackers(devnet.ledger, devnet.folder)
    result: dict[str, Any] = {}
    try:
        devnet.start("bootstrap")
        devnet.wait_ready(["bootstrap"], timeout=60)
        devnet.start_others()
        _log("devnet starting; waiting for the first trainer step ...")
        _wait(devnet, lambda: int(_work(devnet, "trainer-1").get("step", 0)) >= 1, 300, "first trainer step")
        disk_start, clock_start = _disk(devnet), time.monotonic()

        _log(f"honest window: {args.window:.0f} s")
        honest = _window(devnet, args.window)
        _log(f"  {honest}")

        _log(f"one container-bomb frame of {args.frame_bytes} bytes")
        validator = devnet.nodes["validator-1"]
        assert validator.process is not None
        sampler = Sampler.of({"validator-1": (validator.process.pid, validator.data_dir)}, disk_interval=60.0)
        sampler.start()
        bomb_args = ["--bomb-frames", "1", "--bomb-bytes", str(args.frame_bytes), "--bomb-interval-s", "2"]
        frame = _attacker(devnet, folder / "frame.json", "bomb", 1.0, bomb_args)
        frame.wait(timeout=180)
        frame_meter = sampler.stop()["validator-1"]
        _log(f"  validator RSS growth {frame_meter['rss_growth'] / 2**20:.0f} MiB")

        _log(f"hostile window: {args.window:.0f} s, attacks {args.attacks}")
        report_path = folder / "hostile.json"
        attacker = _attacker(devnet, report_path, args.attacks, args.window, [])
        hostile = _window(devnet, args.window)
        _log(f"  {hostile}")
        try:
            attacker.wait(timeout=args.window + 150)  # its own deadline is the window + 120 s
        except subprocess.TimeoutExpired:
            attacker.terminate()  # it writes its report on SIGTERM
            attacker.wait(timeout=30)
        disk_end, clock_end = _disk(devnet), time.monotonic()
        crashed = _check_alive(devnet)
    finally:
        devnet.stop_all()
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    counts = report.get("counts", {})
    gossip_msgs = sum(v for k, v in counts.get("gossip", {}).items() if k.endswith("_published"))
    submissions = sum(
        v for attack in ("bomb", "bloat", "poison", "replay") for k, v in counts.get(attack, {}).items()
        if "_ack_" in k or k.startswith("ack_") or k in ("frames_sent", "no_ack")
    )
    hours = (clock_end - clock_start) / HOUR_S
    per_node = {n: max(0, disk_end.get(n, 0) - disk_start.get(n, 0)) / hours for n in disk_start}
    probes = counts.get("probe", {})
    probe_total = sum(probes.values())
    result = {
        "window_s": args.window,
        "honest_accepted_per_min": round(honest["accepted_per_min"], 2),
        "hostile_accepted_per_min": round(hostile["accepted_per_min"], 2),
        "hostile_throughput_ratio": round(hostile["accepted_per_min"] / honest["accepted_per_min"], 3)
        if honest["accepted_per_min"]
        else 0.0,
        "honest_steps_per_min": round(honest["steps_per_min"], 2),
        "hostile_steps_per_min": round(hostile["steps_per_min"], 2),
        "hostile_steps_ratio": round(hostile["steps_per_min"] / honest["steps_per_min"], 3)
        if honest["steps_per_min"]
        else 0.0,
        "frame_bytes": args.frame_bytes,
        "frame_rss_growth_bytes": frame_meter["rss_growth"],
        "peak_rss_per_frame_byte": round(frame_meter["rss_growth"] / args.frame_bytes, 2),
        "stored_bytes_per_hour": int(max(per_node.values())),
        "stored_bytes_per_hour_by_node": {n: int(v) for n, v in sorted(per_node.items())},
        "honest_submissions_per_s": round((honest["judged_per_s"] + hostile["judged_per_s"]) / 2, 3),
        "hostile_gossip_msgs_per_s": round(gossip_msgs / args.window, 2),
        "hostile_submissions_per_s": round(submissions / args.window, 3),
        "http_probe_ok_ratio": round(
            sum(v for k, v in probes.items() if k.endswith("_200")) / probe_total, 3
        ) if probe_total else 1.0,
        "forged_gossip_forwarded": sum(
            v for k, v in counts.get("gossip", {}).items() if k.endswith("_reached_observer")
        ),
        "crashed_nodes": crashed,
    }  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short windows (30 s) for a smoke run")
    parser.add_argument("--window", type=float, default=120.0, help="seconds of each throughput window")
    parser.add_argument("--frame-bytes", type=int, default=16 * 2**20, help="size of the measured bomb frame")
    parser.add_argument(
        "--attacks",
        default="bomb,bloat,slow,flood,gossip,meshsub,poison",
        help="the hostile window's attacks (replay needs version 0 fresh: the slow test covers it)",
    )
    parser.add_argument("--out", type=Path, help="keep the devnet folder here (default: a temp dir)")
    args = parser.parse_args()
    if args.quick:
        args.window = min(args.window, 30.0)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        result = run(args, args.out)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
            result = run(args, Path(tmp))
    print(json.dumps(result, sort_keys=False))


if __name__ == "__main__":
    main()

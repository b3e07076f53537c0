"""Multi-process tests: a swarm of real node processes on 127.0.0.1 (slow; `pytest -m slow`).

Every node is given only the bootstrap address. One devnet session is shared by the steps below, in
order: discovery through the DHT, gossip reaching every subscriber, a misbehaving peer process banned
while honest traffic keeps flowing, and a node killed with SIGKILL rejoining under the same identity.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from swarmnode.node.devnet.network import Devnet
from swarmnode.node.devnet.plan import DevnetPlan
from swarmnode.node.roles.probe import parse_probe_tag

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FAST = {
    "discovery": {
        "early_refresh": [0.5, 1.0, 2.0, 4.0, 8.0],
        "lookup_interval": 3.0,
        "refresh_interval": 10.0,
    },
    "liveness": {"interval": 2.0, "idle_after": 4.0, "max_strikes": 3},
}
SHARDS_SUBSCRIBERS = ("bootstrap", "relay-1", "relay-2", "worker-1", "worker-2", "validator-1")


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)


def deliveries(devnet: Devnet, name: str) -> list[dict[str, Any]]:
    path = devnet.nodes[name].data_dir / "deliveries.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_probe(devnet: Devnet, name: str, *args: str, timeout: float = 120) -> dict[str, Any]:
    node = devnet.nodes.get(name) or devnet.add_node(name, "probe", config_sections=FAST)
    report = node.directory / f"report-{time.monotonic_ns()}.json"
    devnet.start(name, "--report", str(report), *args, command="probe")
    assert node.process is not None
    assert node.process.wait(timeout=timeout) == 0, (node.directory / "stdout.log").read_text()[-3000:]
    return dict(json.loads(report.read_text()))


def probe_tags_seen(devnet: Devnet, name: str, probe_peer: str) -> list[int]:
    address = json.loads((devnet.nodes[probe_peer].data_dir / "status.json").read_text())["address"].lower()
    tags = []
    for line in deliveries(devnet, name):
        parsed = parse_probe_tag(line["tag"])
        if parsed is not None and line["sender"] == address:
            tags.append(parsed[0])
    return tags


@pytest.fixture(scope="module")
def devnet(tmp_path_factory: pytest.TempPathFactory) -> Any:
    plan = DevnetPlan(
        trainers=1, relays=2, workers=2, validators=1, run="mp-test", record_deliveries=True, sections=FAST
    )
    net = Devnet(plan, tmp_path_factory.mktemp("swarm") / "devnet")
    net.prepare()
    net.start("bootstrap")
    net.wait_ready(["bootstrap"], timeout=90)
    net.start_others()
    yield net
    codes = net.stop_all()
    unclean = {n: c for n, c in codes.items() if c not in (0, None) and not n.startswith("probe")}
    assert not unclean, f"nodes did not shut down cleanly on SIGTERM: {unclean}"


def test_every_node_finds_every_role_it_needs_through_the_dht(devnet: Devnet) -> None:
    bootstrap_addr = devnet.nodes["bootstrap"].addr
    for node in devnet.nodes.values():
        config = tomllib.loads(node.config_path.read_text())["node"]
        assert config["bootstrap"] == ([] if node.name == "bootstrap" else [bootstrap_addr])
    assert len(devnet.nodes) >= 6
    devnet.wait_ready(list(devnet.nodes), timeout=120)
    wait_for(devnet.discovered, 120, "every node to find a provider of each role it needs")
    peer_ids = {n.name: n.peer_id for n in devnet.nodes.values()}
    for name, status in devnet.statuses().items():
        assert status is not None
        for role in status["needs"]:
            expected = {peer_ids[n] for n in peer_ids if n.startswith(role + "-")}
            assert set(status["providers_found"][role]) <= expected and status["providers_found"][role], (
                name,
                role,
            )
    wait_for(
        lambda: all(
            (s or {}).get("run_record")
            for n, s in devnet.statuses().items()
            if n.split("-")[0] in ("relay", "worker", "validator")
        ),
        60,
        "run descriptor",
    )


def test_a_message_reaches_every_subscriber_and_a_forgery_none(devnet: Devnet) -> None:
    report = run_probe(
        devnet, "probe-1", "--count", "5", "--rate", "5", "--wait-subscribers", "3", "--linger", "3"
    )
    assert [i for i, _ in report["published"]] == [0, 1, 2, 3, 4]
    for name in SHARDS_SUBSCRIBERS:
        wait_for(
            lambda name=name: sorted(probe_tags_seen(devnet, name, "probe-1")) == [0, 1, 2, 3, 4],
            30,
            f"{name} to receive every probe exactly once",
        )
    for name in ("trainer-1",):  # not a shards subscriber
        assert probe_tags_seen(devnet, name, "probe-1") == []


def test_misbehaving_peer_is_banned_and_the_swarm_keeps_working(devnet: Devnet, tmp_path: Path) -> None:
    report_path = tmp_path / "adversary.json"
    bootstrap = devnet.nodes["bootstrap"]
    subprocess.run(
        [sys.executable, "-m", "tests.p2p.adversary", bootstrap.addr, devnet.plan.run, str(report_path)],
        check=True,
        timeout=180,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    report = json.loads(report_path.read_text())
    assert report["disconnected"], report
    assert report["reconnect_refused"], report
    assert report["sent"]["forged_sender"] >= 1 and report["sent"]["gossip_oversized"] >= 1

    def banned() -> bool:  # status.json is rewritten every second
        status = bootstrap.status() or {}
        return bool(status.get("guard", {}).get("bans_total"))

    wait_for(banned, 10, "the bootstrap's status to show the ban")
    status = bootstrap.status()
    assert status is not None and status["ready"]
    assert report["peer_id"] in status["scores"] and status["scores"][report["peer_id"]] <= -100
    shards = status["gossip"]["shards"]
    assert shards["rejected"].get("BAD_SIGNATURE", 0) >= 1 and shards["rejected"].get("OVERSIZED", 0) >= 1
    for name in devnet.nodes:  # nothing forged was delivered anywhere
        assert not [d for d in deliveries(devnet, name) if d["tag"].startswith("forged/")], name

    # honest traffic still flows through the node that was attacked
    run_probe(devnet, "probe-2", "--count", "3", "--rate", "10", "--wait-subscribers", "3", "--linger", "3")
    for name in SHARDS_SUBSCRIBERS:
        wait_for(
            lambda name=name: sorted(probe_tags_seen(devnet, name, "probe-2")) == [0, 1, 2],
            30,
            f"{name} to receive the post-attack probes",
        )


def test_sigkilled_node_rejoins_with_its_identity_and_is_found_again(devnet: Devnet) -> None:
    victim = devnet.nodes["relay-2"]
    before = victim.status()
    assert before is not None
    devnet.kill("relay-2")
    assert victim.exit_code == -9
    killed_at = time.time()
    devnet.start("relay-2")
    devnet.wait_ready(["relay-2"], timeout=90)
    after = victim.status()
    assert after is not None and after["peer_id"] == before["peer_id"] and after["pid"] != before["pid"]

    report = run_probe(devnet, "probe-3", "--lookups", "2", "--wait-subscribers", "0", "--linger", "0")
    assert all(victim.peer_id in found for found in report["lookup_found"]["relay"]), report["lookup_found"]

    def workers_verified_it_again() -> bool:
        for name in ("worker-1", "worker-2"):
            status = devnet.nodes[name].status() or {}
            if victim.peer_id not in status.get("providers_found", {}).get("relay", []):
                return False
        hello_log = [
            json.loads(line)
            for line in (devnet.nodes["worker-1"].data_dir / "node.log").read_text().splitlines()
            if 'verified provider"' in line or '"found provider"' in line
        ]
        return any(e.get("peer") == victim.peer_id and e["ts"] > killed_at for e in hello_log)

    wait_for(workers_verified_it_again, 60, "workers to find and verify the restarted relay again")

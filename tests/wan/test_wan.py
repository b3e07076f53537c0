"""A real WAN in namespaces, measured with real traffic (root only; skipped with the reason elsewhere)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator

import pytest

from swarmnode.node.wan import Link, Wan, WanUnavailable, check_available, destroy, destroy_stale
from swarmnode.node.wan.netns import host_link_name, namespaces, run_ip

PROBE = [sys.executable, "-m", "swarmnode.node.cli", "wan", "probe"]
PORT = "7000"


def _require_netns() -> None:
    try:
        check_available()
    except WanUnavailable as err:
        pytest.skip(str(err))


def test_not_root_gets_a_typed_error_and_nothing_is_left():
    """Run as `nobody` (setpriv) when we are root; as ourselves otherwise."""
    script = (
        "from node.wan import Wan, Link, WanUnavailable\n"
        "try:\n    Wan.create({'a': Link(1, 1)}, prefix='swan1-999')\n"
        "except WanUnavailable as err:\n    print('unavailable', err)\n"
    )
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is not installed: cannot drop root for this test")
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script]
    else:
        argv = [sys.executable, "-c", script]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("unavailable cannot create network namespace"), done.stdout
    leftovers = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
    assert not [name for name in leftovers if name.startswith("swan1-999")]


LINKS = {
    "a": Link(50.0, 50.0, delay_ms=10.0, jitter_ms=1.0),
    "b": Link(50.0, 50.0, delay_ms=5.0),
    "lossy": Link(100.0, 100.0, delay_ms=1.0, loss=0.05),
    "home": Link(10.0, 50.0, delay_ms=10.0, jitter_ms=1.0, nat=True),
}


@pytest.fixture(scope="module")
def wan() -> Iterator[Wan]:
    _require_netns()
    with Wan.create(LINKS, seed=3) as built:
        for name in ("b", "lossy", "home"):
            server = built.spawn(name, [*PROBE, "serve", PORT], stdout=subprocess.PIPE)
            assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        yield built


def probe(wan: Wan, node: str, *args: str) -> dict[str, object]:
    process = wan.spawn(node, [*PROBE, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    return dict(json.loads(out))


def dial(wan: Wan, node: str, address: str, timeout: float) -> str:
    script = (
        "import socket, sys\n"
        f"try:\n    socket.create_connection(({address!r}, {PORT}), timeout={timeout}).close()\n"
        "except OSError as err:\n    print(type(err).__name__); sys.exit(0)\nprint('connected')\n"
    )
    process = wan.spawn(node, [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    return process.communicate(timeout=timeout + 30)[0].strip()


@pytest.mark.slow
def test_round_trip_is_twice_the_one_way_delay(wan):
    samples = probe(wan, "a", "rtt", wan.address("b"), PORT, "40")["rtt_ms"]
    assert isinstance(samples, list)
    expected = 2 * (LINKS["a"].delay_ms + LINKS["b"].delay_ms)  # 30 ms
    # the emulator is a userspace process: on a loaded 2-core machine its scheduling adds a few ms, never less
    assert expected - 2.0 <= statistics.median(samples) <= expected + 8.0, samples
    assert min(samples) >= expected - 2 * 2 * LINKS["a"].jitter_ms - 0.5


@pytest.mark.slow
def test_bulk_tcp_runs_at_the_shaped_rate(wan):
    result = probe(wan, "a", "send", wan.address("b"), PORT, str(20_000_000))
    mbit = float(result["mbit"])  # type: ignore[arg-type]
    assert 0.85 * 50.0 <= mbit <= 1.02 * 50.0, result


@pytest.mark.slow
def test_a_home_uplink_is_shaped_on_its_own(wan):
    result = probe(wan, "home", "send", wan.address("b"), PORT, str(5_000_000))
    mbit = float(result["mbit"])  # type: ignore[arg-type]
    assert 0.85 * 10.0 <= mbit <= 1.02 * 10.0, result  # 10 Mbit/s up, though b's downlink has 50


@pytest.mark.slow
def test_loss_matches_the_configured_rate(wan):
    result = probe(wan, "a", "udp", wan.address("lossy"), PORT, "4000", "1000")
    sent, received = int(result["sent"]), int(result["received"])  # type: ignore[arg-type]
    loss = 1 - received / sent
    assert loss == pytest.approx(0.05, abs=0.02), result
    assert wan.statistics()["dropped_loss"] >= sent - received - 5


@pytest.mark.slow
def test_a_home_node_dials_out_but_cannot_be_dialed(wan):
    assert dial(wan, "a", wan.address("home"), timeout=3.0) == "TimeoutError"  # dropped, like a real NAT
    assert dial(wan, "home", wan.address("b"), timeout=10.0) == "connected"
    samples = probe(wan, "home", "rtt", wan.address("b"), PORT, "20")["rtt_ms"]
    assert isinstance(samples, list)
    assert statistics.median(samples) == pytest.approx(2 * (10.0 + 5.0), abs=3.0)
    assert wan.statistics()["dropped_nat"] >= 1


@pytest.mark.slow
def test_the_host_reaches_every_node_directly(wan):
    for name in ("b", "lossy"):
        done = subprocess.run(
            [*PROBE, "rtt", wan.address(name), PORT, "5"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert max(json.loads(done.stdout)["rtt_ms"]) < 20.0  # the host link is not emulated
    assert all(not wan.address(name).startswith("127.") for name in LINKS)


@pytest.mark.slow
def test_close_leaves_nothing_behind():
    _require_netns()
    wan = Wan.create({"x": Link(10.0, 10.0, delay_ms=1.0), "y": Link(10.0, 10.0)})
    sleeper = wan.spawn("x", [sys.executable, "-c", "import time; time.sleep(600)"])
    prefix, subnet = wan.prefix, wan.subnet
    assert {f"{prefix}-core", f"{prefix}-x", f"{prefix}-y"} <= set(namespaces())
    wan.close()
    wan.close()  # idempotent
    assert sleeper.poll() is not None
    assert not [name for name in namespaces() if name.startswith(prefix)]
    assert host_link_name(prefix) not in run_ip(["-br", "link"])
    assert subnet not in run_ip(["-4", "route"])
    assert destroy(prefix) == []


@pytest.mark.slow
def test_stale_runs_of_dead_processes_are_swept():
    _require_netns()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    prefix = f"swan{gone.pid}-1"
    for name in (f"{prefix}-core", f"{prefix}-n"):
        run_ip(["netns", "add", name])
    mine = Wan.create({"z": Link(10.0, 10.0)})  # a live run: must survive the sweep
    try:
        removed = destroy_stale()
        assert sorted(removed) == [f"{prefix}-core", f"{prefix}-n"]
        assert f"{mine.prefix}-z" in namespaces()
    finally:
        mine.close()
        destroy(prefix)

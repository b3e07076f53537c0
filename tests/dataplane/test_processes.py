"""Real processes (`swarmnode dataplane ...`): the broadcast and every fault the issue names.

Each worker loads what it verified and prints the digest of the loaded tensors, which must equal the
digest the origin printed for the state it published: a bad checkpoint cannot pass unnoticed.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import msgpack
import pytest

from swarmnode.protocol.shards import PART_SUFFIX, STATS_PATH
from swarmnode.testing.processes import RoleProcess, role_key, spawn, stop_all

pytestmark = pytest.mark.slow

RUN = "proc-run"
TRAINER = role_key(0)
FOLLOW = ["--trainer", TRAINER.checksum_address, "--run", RUN]


def _stats(proc: RoleProcess) -> dict:
    with urllib.request.urlopen(proc.endpoint + STATS_PATH, timeout=5) as response:
        return msgpack.unpackb(response.read())


def _wait_served(proc: RoleProcess, nbytes: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while _stats(proc)["server"]["bytes_served"] < nbytes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.name} served fewer than {nbytes} bytes")
        time.sleep(0.05)


def _args(root: Path, key: int, *extra: str) -> list[str]:
    return ["--root", str(root), "--key", role_key(key).private_key.hex(), "--run", RUN, *extra]


@pytest.fixture
def procs():
    started: list[RoleProcess] = []
    yield started
    stop_all(started)


def _origin(procs, tmp_path, *extra: str) -> RoleProcess:
    origin = spawn("origin", "origin", [*_args(tmp_path / "origin", 0), "--digest", *extra])
    procs.append(origin)
    return origin


def _publish(origin: RoleProcess) -> dict:
    origin.send("publish")
    return origin.wait_event("published", 120)


def test_two_relays_four_workers_and_a_relay_killed_mid_transfer(procs, tmp_path):
    origin = _origin(procs, tmp_path, "--size-mb", "24", "--shard-mb", "2")
    relays = []
    for i in range(2):
        relay = spawn(
            f"relay{i}",
            "relay",
            [
                *_args(tmp_path / f"relay{i}", 1 + i, "--upload-rate", "12e6"),
                *FOLLOW,
                "--peer",
                origin.endpoint,
            ],
        )
        relays.append(relay)
        procs.append(relay)
    workers = []
    for i in range(4):
        peers = [arg for relay in relays for arg in ("--peer", relay.endpoint)]
        worker = spawn(
            f"worker{i}",
            "worker",
            [
                *_args(tmp_path / f"worker{i}", 10 + i, "--seed", str(i), "--stall", "2"),
                *FOLLOW,
                *peers,
                "--load",
            ],
        )
        workers.append(worker)
        procs.append(worker)

    published = _publish(origin)
    total = published["total_size"]
    _wait_served(relays[0], total)  # a third of what the workers need from it, roughly
    relays[0].kill()

    for worker in workers:
        event = worker.wait_event("checkpoint", 120)
        assert event["version"] == 1 and event["merkle_root"] == published["merkle_root"]
        assert event["digest"] == published["digest"]
    survivor = _stats(relays[1])
    assert survivor["server"]["bytes_served"] > 0
    origin_stats = origin.stop()
    assert origin_stats["server"]["bytes_served"] <= 2 * total + 1_000_000  # one copy per relay
    failures = [w.stop()["downloader"]["failures"] for w in workers]
    assert any(f for f in failures), "the killed relay was in use by somebody"


@pytest.mark.parametrize(
    "fault,kind",
    [("corrupt", "bad_hash"), ("truncate", "truncated"), ("stall", "stall"), ("short", "bad_response")],
)
def test_a_bad_relay_never_gets_a_bad_checkpoint_loaded(procs, tmp_path, fault, kind):
    origin = _origin(procs, tmp_path, "--size-mb", "12", "--shard-mb", "1")
    bad = spawn(
        "bad",
        "bad-relay",
        [*_args(tmp_path / "bad", 1), *FOLLOW, "--peer", origin.endpoint, "--fault", fault],
    )
    procs.append(bad)
    published = _publish(origin)
    bad.wait_event("complete", 60)  # it fetched honestly; now it serves with its fault
    worker = spawn(
        "worker",
        "worker",
        [
            *_args(tmp_path / "worker", 10, "--stall", "1"),
            *FOLLOW,
            "--peer",
            f"{bad.endpoint}=4",  # preferred at first, so the fault is met
            "--peer",
            origin.endpoint,
            "--load",
        ],
    )
    procs.append(worker)
    event = worker.wait_event("checkpoint", 90)
    assert event["digest"] == published["digest"]
    assert _stats(bad)["faulty_responses"] > 0
    stats = worker.stop()
    assert stats["sources"][bad.endpoint]["failures"].get(kind, 0) >= 1
    if fault == "corrupt":
        assert stats["sources"][bad.endpoint]["banned"]


def test_a_manifest_not_signed_by_the_trainer_is_rejected(procs, tmp_path):
    origin = _origin(procs, tmp_path, "--size-mb", "4", "--shard-mb", "1")
    forger = spawn(
        "forger",
        "bad-relay",
        [*_args(tmp_path / "forger", 1), *FOLLOW, "--peer", origin.endpoint, "--fault", "forge"],
    )
    procs.append(forger)
    published = _publish(origin)
    forger.wait_event("complete", 60)
    worker = spawn(
        "worker",
        "worker",
        [
            *_args(tmp_path / "worker", 10),
            *FOLLOW,
            "--peer",
            forger.endpoint,
            "--peer",
            origin.endpoint,
            "--load",
        ],
    )
    procs.append(worker)
    event = worker.wait_event("checkpoint", 60)
    assert event["version"] == 1 and event["digest"] == published["digest"]
    time.sleep(1.0)  # the forger keeps offering its manifest
    stats = worker.stop()
    assert stats["follower"]["manifest_verdicts"].get("reject:WRONG_SENDER", 0) >= 1
    assert all(e.get("version") != 1001 for e in worker.seen)
    assert not (tmp_path / "worker" / RUN / "1001").exists()


def test_a_worker_killed_mid_download_leaves_nothing_loadable_and_resumes(procs, tmp_path):
    origin = _origin(procs, tmp_path, "--size-mb", "16", "--shard-mb", "2", "--upload-rate", "6e6")
    worker_args = [*_args(tmp_path / "worker", 10), *FOLLOW, "--peer", origin.endpoint, "--load"]
    worker = spawn("worker", "worker", worker_args)
    procs.append(worker)
    published = _publish(origin)
    _wait_served(origin, published["total_size"] // 3)
    worker.kill()

    run_dir = tmp_path / "worker" / RUN
    assert not (run_dir / "1").exists(), "a half-downloaded version must not look complete"
    parts = list((run_dir / "1.partial").glob("*" + PART_SUFFIX))
    assert parts

    again = spawn("worker-again", "worker", worker_args)
    procs.append(again)
    event = again.wait_event("checkpoint", 90)
    assert event["digest"] == published["digest"]
    assert (run_dir / "1").is_dir() and not (run_dir / "1.partial").exists()
    stats = again.stop()
    assert stats["downloader"]["bytes_received"] < published["total_size"]  # resumed, not restarted

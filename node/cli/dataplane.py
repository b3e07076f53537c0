"""Run one data-plane role as a process: `swarmnode dataplane origin|relay|worker|...`.

Used by the multi-process tests and the broadcast benchmark; also a manual way to watch a broadcast.
Each process prints JSON lines on stdout (`listening`, `published`, `checkpoint`, `stats`) and stops on
SIGTERM or SIGINT after printing its final `stats`. The origin takes commands on stdin: `publish` (the
next version of a synthetic, seeded state dict) and `stats`.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import torch
import trio

from swarmnode.crypto.identity import parse_address
from swarmnode.node.cli.process_events import emit, hex_key, until_signalled
from swarmnode.node.dataplane.checkpoint import load_checkpoint, state_digest
from swarmnode.node.dataplane.downloader import DownloadConfig
from swarmnode.node.dataplane.follower import VerifiedCheckpoint
from swarmnode.node.dataplane.http_client import RECV_LOW_WATER
from swarmnode.node.dataplane.http_server import ServerConfig
from swarmnode.node.dataplane.progress import RichProgress
from swarmnode.node.dataplane.roles import FollowerNode, FollowerNodeConfig, OriginNode
from swarmnode.node.dataplane.sources import ScoringConfig
from swarmnode.protocol.types import MIB
from swarmnode.testing.relay_faults import Fault, FaultyService


def synthetic_state(total_bytes: int, seed: int) -> dict[str, torch.Tensor]:
    """A bf16 'model' of about `total_bytes`: one embedding a quarter of the size (split across shards
    when larger than a shard) and square 8 MiB layers for the rest. Random bits, seeded."""
    g = torch.Generator().manual_seed(seed)

    def tensor(*shape: int) -> torch.Tensor:
        n = 1
        for d in shape:
            n *= d
        return (
            torch.randint(0, 1 << 15, (n,), dtype=torch.int16, generator=g).view(torch.bfloat16).view(*shape)
        )

    state: dict[str, torch.Tensor] = {}
    embed_rows = max(1, total_bytes // 4 // (2 * 2048))
    state["embed.weight"] = tensor(embed_rows, 2048)
    remaining = total_bytes - state["embed.weight"].nbytes
    layer = 0
    while remaining > 0:
        rows = max(1, min(2048, remaining // (2 * 2048)))
        state[f"layers.{layer}.weight"] = tensor(rows, 2048)
        remaining -= rows * 2048 * 2
        layer += 1
        if rows < 2048:
            break
    return state



def _peers(values: list[str]) -> dict[str, float]:
    peers: dict[str, float] = {}
    for value in values:
        url, _, weight = value.partition("=")
        peers[url] = float(weight) if weight else 1.0
    return peers




def _server_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(host=args.host, port=args.port, upload_rate=args.upload_rate or None)


# --- origin --------------------------------------------------------------------------------------


async def run_origin(args: argparse.Namespace) -> None:
    identity = hex_key(args.key)
    node = OriginNode(
        Path(args.root),
        identity,
        args.run,
        server=_server_config(args),
        shard_size=int(args.shard_mb * MIB),
        async_level=args.async_level,
    )
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(node.run)
        await nursery.start(until_signalled, nursery, node.statistics)
        emit("listening", role="origin", endpoint=endpoint, address=identity.checksum_address)
        version = 0
        stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
        buffer = b""
        while True:
            data = await stdin.receive_some(4096)
            if not data:
                await trio.sleep_forever()  # stdin closed: keep serving until signalled
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                command = line.decode().strip()
                if command == "publish":
                    version += 1
                    await _publish(node, args, version)
                elif command == "stats":
                    emit("stats", **node.statistics())


async def _publish(node: OriginNode, args: argparse.Namespace, version: int) -> None:
    state = await trio.to_thread.run_sync(synthetic_state, int(args.size_mb * MIB), args.seed + version)
    digest = (await trio.to_thread.run_sync(state_digest, state)).hex() if args.digest else ""
    started = time.time()
    manifest, _ = await node.origin.publish(
        state,
        version=version,
        parent_version=version - 1,
        model_config_hash=hashlib.sha256(b"synthetic-model-config").digest(),
    )
    emit(
        "published",
        version=version,
        merkle_root=manifest.merkle_root.hex(),
        shards=len(manifest.shards),
        total_size=manifest.total_size,
        digest=digest,
        publish_s=time.time() - started,
    )


# --- relay and worker ----------------------------------------------------------------------------


def _follower_config(args: argparse.Namespace, *, newest_only: bool, serve: bool) -> FollowerNodeConfig:
    return FollowerNodeConfig(
        root=Path(args.root),
        run=args.run,
        trainer=parse_address(args.trainer),
        identity=hex_key(args.key),
        peers=_peers(args.peer),
        newest_only=newest_only,
        serve=serve,
        async_level=args.async_level,
        server=_server_config(args),
        download=DownloadConfig(
            parallel_shards=args.parallel, stall_timeout=args.stall, recv_low_water=args.recv_low_water
        ),
        scoring=ScoringConfig(max_per_source=args.per_source),
        seed=args.seed,
    )


async def _trace_shards(node: FollowerNode) -> None:
    """With `--trace`: a `shard` event as each shard verifies here (where a broadcast's time goes)."""
    seen: set[tuple[int, int]] = set()
    while True:
        for version in node.catalog.versions():
            entry = node.catalog.get(version)
            if (version, -1) not in seen:
                seen.add((version, -1))
                emit("shard", version=version, index=-1)  # the manifest arrived
            for index in sorted(entry.held if entry is not None else ()):
                if (version, index) not in seen:
                    seen.add((version, index))
                    emit("shard", version=version, index=index)
        await node.catalog.wait_changed()


async def run_relay(args: argparse.Namespace) -> None:
    node = FollowerNode(_follower_config(args, newest_only=False, serve=True))
    send, receive = trio.open_memory_channel[VerifiedCheckpoint](8)
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(node.run, send)
        await nursery.start(until_signalled, nursery, node.statistics)
        if args.trace:
            nursery.start_soon(_trace_shards, node)
        emit("listening", role="relay", endpoint=endpoint)
        async for checkpoint in receive:
            emit(
                "complete",
                version=checkpoint.manifest.version,
                merkle_root=checkpoint.manifest.merkle_root.hex(),
            )


async def run_worker(args: argparse.Namespace) -> None:
    progress = RichProgress() if args.progress else None
    node = FollowerNode(_follower_config(args, newest_only=True, serve=args.serve), progress=progress)
    send, receive = trio.open_memory_channel[VerifiedCheckpoint](1)
    if progress is not None:
        progress.start()
    try:
        async with trio.open_nursery() as nursery:
            endpoint = await nursery.start(node.run, send)
            await nursery.start(until_signalled, nursery, node.statistics)
            if args.trace:
                nursery.start_soon(_trace_shards, node)
            emit("listening", role="worker", endpoint=endpoint)
            async for checkpoint in receive:
                digest = ""
                if args.load:  # what an engine does before its hot swap: parse only verified bytes
                    state = await trio.to_thread.run_sync(
                        load_checkpoint, checkpoint.directory, checkpoint.manifest
                    )
                    digest = (await trio.to_thread.run_sync(state_digest, state)).hex()
                    del state
                emit(
                    "checkpoint",
                    version=checkpoint.manifest.version,
                    merkle_root=checkpoint.manifest.merkle_root.hex(),
                    digest=digest,
                    directory=str(checkpoint.directory),
                )
                if args.exit_after is not None and checkpoint.manifest.version >= args.exit_after:
                    emit("stats", cpu_s=time.process_time(), **node.statistics())
                    nursery.cancel_scope.cancel()
    finally:
        if progress is not None:
            progress.stop()


# --- bad relay -----------------------------------------------------------------------------------


async def run_bad_relay(args: argparse.Namespace) -> None:
    """A relay that fetches and verifies honestly, then serves its shards with `--fault`."""
    node = FollowerNode(_follower_config(args, newest_only=False, serve=True))
    assert node.server is not None
    faulty = FaultyService(node.service, Fault(args.fault), forger=node.seal)
    node.server.handler = faulty

    def statistics() -> dict[str, object]:
        return {"faulty_responses": faulty.faulty_responses, **node.statistics()}

    node.service.extra_stats = lambda: {"faulty_responses": faulty.faulty_responses}
    send, receive = trio.open_memory_channel[VerifiedCheckpoint](8)
    async with trio.open_nursery() as nursery:
        endpoint = await nursery.start(node.run, send)
        await nursery.start(until_signalled, nursery, statistics)
        emit("listening", role="bad-relay", endpoint=endpoint, fault=args.fault)
        async for checkpoint in receive:
            manifest = checkpoint.manifest
            emit("complete", version=manifest.version, merkle_root=manifest.merkle_root.hex())


# --- arguments -----------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swarmnode dataplane", description=__doc__)
    sub = parser.add_subparsers(dest="role", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--root", required=True, help="shard store directory")
        p.add_argument("--run", default="bench")
        p.add_argument("--key", required=True, help="this node's secp256k1 private key, hex")
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, default=0)
        p.add_argument("--upload-rate", type=float, default=0, help="bytes/s cap on serving (0: none)")
        p.add_argument("--async-level", type=int, default=2)
        p.add_argument("--seed", type=int, default=0)

    def following(p: argparse.ArgumentParser) -> None:
        p.add_argument("--trainer", required=True, help="the run's trainer address")
        p.add_argument("--peer", action="append", default=[], help="endpoint to follow, URL[=weight]")
        p.add_argument("--parallel", type=int, default=8, help="shard transfers at once")
        p.add_argument(
            "--per-source", type=int, default=ScoringConfig.max_per_source, help="transfers per source"
        )
        p.add_argument(
            "--stall", type=float, default=10.0, help="seconds without a byte before giving up a source"
        )
        p.add_argument(
            "--recv-low-water",
            type=int,
            default=RECV_LOW_WATER,
            help="bytes a body read waits for before waking (SO_RCVLOWAT; 1: every segment)",
        )
        p.add_argument("--trace", action="store_true", help="print a `shard` event as each shard verifies")

    origin = sub.add_parser("origin", help="serve a trainer's checkpoints; 'publish' on stdin")
    common(origin)
    origin.add_argument("--size-mb", type=float, default=256)
    origin.add_argument("--shard-mb", type=float, default=50)
    origin.add_argument("--digest", action="store_true", help="print the state digest of each version")

    relay = sub.add_parser("relay", help="fetch, verify and re-serve shards")
    common(relay)
    following(relay)

    worker = sub.add_parser("worker", help="fetch the newest checkpoint, verify, optionally load")
    common(worker)
    following(worker)
    worker.add_argument("--serve", action="store_true", help="serve verified shards to others too")
    worker.add_argument("--load", action="store_true", help="load each checkpoint and print its digest")
    worker.add_argument("--progress", action="store_true", help="rich progress bar on stderr")
    worker.add_argument("--exit-after", type=int, default=None, help="exit once this version is verified")

    bad = sub.add_parser("bad-relay", help="a relay that misbehaves (tests)")
    common(bad)
    following(bad)
    bad.add_argument("--fault", required=True, choices=[f.value for f in Fault])
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    runner = {"origin": run_origin, "relay": run_relay, "worker": run_worker, "bad-relay": run_bad_relay}[
        args.role
    ]
    trio.run(runner, args)

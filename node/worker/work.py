"""The worker's work: follow the newest checkpoint, generate the assigned groups with proofs, submit them.

One loop, in the order of the run lifecycle (DESIGN.md, steps 3-4):
1. wait for the run descriptor and check it names the dataset, model and base this node holds;
2. follow checkpoints (`SwarmFollower`, newest only, not serving); load each verified one in a thread;
3. between submissions only, hot-swap the newest loaded weights into the one engine;
4. for the loaded version v, counters 0 .. budget - 1, the budget being `submissions_per_version` capped by
   the run's `max_submissions_per_version`, and cut to what can still reach the trainer in time
   (`Pacer`, `protocol.pacing`): build the submission in a thread
   (`build_submission`, or a devnet cheat from `node.worker.cheats`), send it to a validator found through
   the DHT, and count the ack;
5. then wait for a newer checkpoint. A version more than `async_level` behind the newest known one is
   never generated on: a validator would drop it as stale.

Decisions:
- The next counter of each version is persisted in `data_dir/worker_state.json` (atomic replace) *before*
  the submission is built: a crash then skips an assignment rather than redoing it, and a redone
  assignment is exactly what validators treat as a duplicate.
- Validators are tried round-robin, starting one further each submission, so load spreads; a validator
  that cannot take the submission now (unreachable, busy or not validating, checkpoint not held yet,
  authentication trouble) passes it to the next. A rejection is final: the checks are deterministic, and
  another validator would reach the same verdict.
- The submit and planning logic are plain functions over a `SubmitTransport`, so they run without a network.
- Pacing: the worker learns the trainer's step interval from the created_ms of the trainer-signed heads and
  manifests it sees, times its own builds, and times each hand-over until the verdict on it is gossiped. A
  version's budget ends when one more build would be handed over after the trainer's step
  v + async_level has taken its batch (it would only be dropped as stale); the worker then waits for the
  newest version. The budget is also cut to this worker's share of the version: the swarm aims at
  `SWARM_SUBMISSIONS_PER_VERSION` per version between its N workers (counted from accepted verdicts),
  a share below one drawn per (worker, version); the share grows while a version stands (the loop
  wakes when it next allows a counter), so a bad estimate of N or of the pace never stalls the run.
- Verdicts naming this worker are counted once per submission digest, whoever gossips them: they feed
  this node's status display and the pacer's latency median, never a verdict of its own; a validator
  gossiping them late or early can only move that median (they come in `VerdictBatch`es, at most one
  flush interval after the judgement). Accepted verdicts naming any worker set the
  count N behind the share; verdicts naming workers that do not exist only lower this worker's share for
  a while, since the share grows while a version stands.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch
import trio
from libp2p.peer.id import ID

from swarmnode.crypto.identity import NodeIdentity, format_address
from swarmnode.ledger import Ledger
from swarmnode.ledger.evidence import SLASHABLE_REASONS
from swarmnode.node.config import NodeConfig
from swarmnode.node.dataplane.checkpoint import load_checkpoint
from swarmnode.node.dataplane.follower import VerifiedCheckpoint
from swarmnode.node.p2p.gossip import Delivery
from swarmnode.node.p2p.peers import PeerRecord
from swarmnode.node.p2p.reqresp import RequestFailed
from swarmnode.node.rl.engine import InferenceEngine
from swarmnode.node.rl.engines import choose_engine, open_engine
from swarmnode.node.rl.rollouts import build_submission
from swarmnode.node.rl.run import RunSetup, load_run_setup
from swarmnode.node.rl.tasks import GraderFault, Task
from swarmnode.node.roles.base import RoleNet
from swarmnode.node.roles.common import run_model_dir, run_tasks, set_threads, wait_run_owner
from swarmnode.node.roles.follow import SwarmFollower
from swarmnode.node.validator.service import SUBMIT
from swarmnode.node.worker.cheats import (
    FORGED_REWARD,
    TAMPERED_PROMPT,
    build_dishonest_submission,
    tamper_weights,
)
from swarmnode.protocol.errors import Reason
from swarmnode.protocol.messages import (
    CheckpointHead,
    RolloutSubmission,
    RunDescriptor,
    SubmitAck,
    Verdict,
    VerdictBatch,
)
from swarmnode.protocol.pacing import (
    SAMPLE_HISTORY,
    SWARM_SUBMISSIONS_PER_VERSION,
    Stamps,
    active_workers,
    note_checkpoint,
    note_sample,
    note_worker,
    plan_budget,
    share_budget,
    share_draw,
    share_wait_ms,
    step_interval_ms,
    typical_ms,
)
from swarmnode.protocol.runs import run_trainers

log = logging.getLogger(__name__)

STATE_FILE = "worker_state.json"
QUEUED = 100
SUBMIT_ROUNDS = 6  # passes over every known validator before a submission is given up
FIRST_RETRY_DELAY = 1.0
MAX_RETRY_DELAY = 8.0
WORKER_MEMORY_GB = 1  # what the refusal message suggests registering: the devnet model needs far less


# --- eligibility -----------------------------------------------------------------------------------


class NotEligible(RuntimeError):
    """The ledger does not let this worker work: not registered as a worker, under-staked, or ejected."""


def ledger_cli_args(ledger_url: str) -> str:
    """The `--ledger ... [--contract ...]` options of `swarmnode stake/register` for a `[node] ledger_url`."""
    if ledger_url.startswith("evm:") and "#" in ledger_url:
        url, contract = ledger_url.split("#", 1)
        return f"--ledger {url} --contract {contract}"
    return f"--ledger {ledger_url}"


def refusal_message(ledger: Ledger, address: bytes, ledger_url: str, key: Path) -> str:
    """Why `address` may not work, and the exact commands that fix it (when anything can)."""
    who = format_address(address)
    options = f"{ledger_cli_args(ledger_url)} --key {key}"
    node = ledger.node(address)
    minimum = ledger.params.min_stake_per_unit_gwei
    if node is None:
        return (
            f"worker {who} is not registered in the ledger {ledger_url}; "
            "register it and bond stake, then restart:\n"
            "  swarmnode register --role worker --accelerator cpu --count 1 "
            f"--memory-gb {WORKER_MEMORY_GB} {options}\n"
            f"  swarmnode stake deposit {minimum}gwei {options}\n"
            f"(a stake of {minimum} gwei per compute unit declared with --count)"
        )
    if node.ejected:
        return (
            f"worker {who} was ejected from the ledger {ledger_url} after {node.slash_count} slashes; "
            "an ejected node cannot stake again: run the worker with a new key"
        )
    if node.role != "worker":
        return (
            f"{who} is registered as a {node.role} in the ledger {ledger_url}, not as a worker; "
            "a node has one role: run the worker with a key registered by `swarmnode register --role worker`"
        )
    stake = ledger.stake(address)
    bonded, required = (stake.bonded_gwei, stake.required_gwei) if stake is not None else (0, minimum)
    shortfall = max(required - bonded, 1)
    return (
        f"worker {who} has {bonded} gwei bonded in the ledger {ledger_url}, {required} gwei required; "
        f"bond the rest, then restart:\n"
        f"  swarmnode stake deposit {shortfall}gwei {options}"
    )


def require_eligible(ledger: Ledger, address: bytes, config: NodeConfig) -> None:
    """Raise `NotEligible` (saying how to fix it) unless the ledger lets `address` work."""
    if not ledger.is_eligible(address):
        raise NotEligible(refusal_message(ledger, address, config.ledger_url, config.identity))


# --- the per-version counters ----------------------------------------------------------------------


class WorkerStateError(RuntimeError):
    """The worker's state file cannot be read; the message names it."""


@dataclass
class Counters:
    """The next submission counter of each checkpoint version, persisted so a restart never redoes one."""

    path: Path
    run: str
    worker: bytes
    next_counter: dict[int, int] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, run: str, worker: bytes) -> Counters:
        """The counters in `path` for this run and worker; empty when the file is absent or someone else's."""
        try:
            document = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path, run, worker)
        except (OSError, ValueError) as exc:
            raise WorkerStateError(
                f"cannot read worker state {path}: {exc}; remove it to start over"
            ) from None
        if not isinstance(document, dict):
            raise WorkerStateError(f"worker state {path} is not a JSON object; remove it to start over")
        if document.get("run") != run or document.get("worker") != "0x" + worker.hex():
            return cls(path, run, worker)
        try:
            counters = {int(v): int(n) for v, n in document["next_counter"].items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            raise WorkerStateError(f"worker state {path} has no valid next_counter table") from None
        return cls(path, run, worker, counters)

    def used(self, version: int) -> int:
        return self.next_counter.get(version, 0)

    def reserve(self, version: int) -> int:
        """Take the next counter of `version` and persist the one after it before anything is generated."""
        counter = self.used(version)
        self.next_counter[version] = counter + 1
        self.save()
        return counter

    def forget_below(self, version: int) -> None:
        """Drop versions older than `version`: nobody generates on them again."""
        self.next_counter = {v: n for v, n in self.next_counter.items() if v >= version}

    def save(self) -> None:
        document = {
            "run": self.run,
            "worker": "0x" + self.worker.hex(),
            "next_counter": {str(v): n for v, n in sorted(self.next_counter.items())},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(document))
        os.replace(tmp, self.path)


# --- what to generate next -------------------------------------------------------------------------


def within_async_level(version: int, newest: int, async_level: int) -> bool:
    """Whether a submission on `version` is still fresh when the newest known checkpoint is `newest`."""
    return newest - version <= async_level


def plan_counter(
    loaded: int | None, newest: int | None, async_level: int, used: int, budget: int
) -> int | None:
    """The counter to generate next on the loaded version, or None: nothing loaded, stale, or budget spent."""
    if loaded is None:
        return None
    if newest is not None and not within_async_level(loaded, newest, async_level):
        return None
    return used if used < budget else None


def submission_budget(configured: int, descriptor: RunDescriptor) -> int:
    """Counters to use per version: the configured number, never more than the run allows (a counter
    at or past `max_submissions_per_version` is rejected 602 and slashed)."""
    return min(configured, descriptor.max_submissions_per_version)


def now_ms() -> int:
    """This worker's clock in milliseconds (trio's: monotonic, and a MockClock in tests)."""
    return int(trio.current_time() * 1000)


@dataclass
class Pacer:
    """What the worker has measured of the trainer's pace and of its own, in milliseconds of its clock.

    `stamps` are the trainer's created_ms per version (only their differences are used); `newest_heard_ms`
    is when this worker first heard of the newest version; `generate` and `latency` are the last build
    times and hand-over-to-verdict times; `seen` the newest version each worker was accepted on, whose
    count sets this worker's (`me`) share of each version's `wanted` submissions. All bounded
    (`protocol.pacing`).
    """

    me: bytes = b""
    wanted: int = SWARM_SUBMISSIONS_PER_VERSION
    seen: dict[bytes, int] = field(default_factory=dict)
    stamps: Stamps = ()
    newest: int | None = None
    newest_heard_ms: int = 0
    generate: tuple[int, ...] = ()
    latency: tuple[int, ...] = ()
    cut: int = 0  # versions whose budget time cut below the configured cap
    _handed: dict[int, int] = field(default_factory=dict, repr=False)  # step -> when handed over
    _last_cut: int | None = field(default=None, repr=False)

    def heard(self, version: int, created_ms: int, at_ms: int) -> None:
        """A trainer-signed head or manifest of `version`, stamped `created_ms` by the trainer."""
        self.stamps = note_checkpoint(self.stamps, version, created_ms)
        if self.newest is None or version > self.newest:
            self.newest, self.newest_heard_ms = version, at_ms

    def built(self, wall_s: float) -> None:
        self.generate = note_sample(self.generate, round(wall_s * 1000))

    def handed(self, step: int, at_ms: int) -> None:
        """A submission of assignment `step` goes to the validators now."""
        self._handed[step] = at_ms
        while len(self._handed) > 4 * SAMPLE_HISTORY:  # verdicts that never came: forget the oldest
            del self._handed[next(iter(self._handed))]

    def judged(self, step: int, at_ms: int) -> None:
        """The verdict on our submission of `step` was gossiped: one latency sample."""
        handed = self._handed.pop(step, None)
        if handed is not None:
            self.latency = note_sample(self.latency, at_ms - handed)

    def accepted(self, worker: bytes, version: int) -> None:
        """A validator-signed verdict accepted `worker`'s submission on `version`: it supplies the run."""
        self.seen = note_worker(self.seen, worker, version)

    def _share(self, version: int, used: int, at_ms: int) -> tuple[int, int] | None:
        """(counters this worker's share of `version` allows now, ms until it allows one more), or None
        until the trainer's interval is measured. The version has stood since the newest was heard, plus
        an interval per version it is behind the newest."""
        interval = step_interval_ms(self.stamps)
        if interval is None or self.newest is None or version > self.newest:
            return None
        workers = active_workers(self.seen, self.me, self.newest)
        draw = share_draw(self.me, version)
        stood = at_ms - self.newest_heard_ms + (self.newest - version) * interval
        share = dict(wanted=self.wanted, workers=workers, draw=draw, interval_ms=interval)
        allowed = share_budget(waited_ms=stood, **share)
        return allowed, max(0, share_wait_ms(used=used, **share) - stood)

    def recheck_in_ms(self, version: int, used: int, at_ms: int) -> int | None:
        """When the share of `version` next allows a counter, if only the share holds the worker back."""
        share = self._share(version, used, at_ms)
        return None if share is None or share[0] > used else share[1]

    def budget(self, version: int, async_level: int, used: int, cap: int, at_ms: int) -> int:
        """Counters to use on `version` now: `protocol.pacing.plan_budget` (time left, at most `cap`),
        cut to this worker's share of the version (`share_budget`, which may be none yet)."""
        if self.newest is None:
            return cap
        budget = plan_budget(
            version=version,
            newest=self.newest,
            newest_heard_ms=self.newest_heard_ms,
            now_ms=at_ms,
            stamps=self.stamps,
            async_level=async_level,
            generate_ms=typical_ms(self.generate),
            latency_ms=typical_ms(self.latency),
            used=used,
            cap=cap,
        )
        share = self._share(version, used, at_ms)
        if share is not None:
            budget = min(budget, share[0])
        if budget <= used < cap and version != self._last_cut:
            self._last_cut = version
            self.cut += 1
        return budget

    def statistics(self) -> dict[str, Any]:
        return {
            "step_interval_ms": step_interval_ms(self.stamps),
            "generate_ms": typical_ms(self.generate),
            "latency_ms": typical_ms(self.latency),
            "versions_cut": self.cut,
            "workers": active_workers(self.seen, self.me, self.newest) if self.newest is not None else None,
        }


@dataclass(frozen=True)
class CheckpointRef:
    version: int
    root: bytes


@dataclass(frozen=True)
class LoadedWeights:
    """A verified checkpoint read into memory (with the cheat's change, if any), waiting to be swapped in."""

    ref: CheckpointRef
    state: Mapping[str, torch.Tensor]


def prepare_weights(checkpoint: VerifiedCheckpoint, cheat: str) -> LoadedWeights:
    """Read a verified checkpoint's state dict (blocking: run in a thread)."""
    manifest = checkpoint.manifest
    state = load_checkpoint(checkpoint.directory, manifest)
    ref = CheckpointRef(manifest.version, manifest.merkle_root)
    return LoadedWeights(ref, tamper_weights(cheat, state, manifest.version))


def make_submission(
    engine: InferenceEngine,
    descriptor: RunDescriptor,
    dataset: Mapping[bytes, Task],
    dataset_ids: Sequence[bytes],
    worker: bytes,
    ref: CheckpointRef,
    counter: int,
    cheat: str,
) -> RolloutSubmission:
    """The `counter`-th submission on checkpoint `ref`, honest or as the configured cheat (blocking)."""
    if cheat in (TAMPERED_PROMPT, FORGED_REWARD):
        return build_dishonest_submission(
            cheat, engine, descriptor, dataset, dataset_ids, worker, ref.version, ref.root, counter
        )
    return build_submission(engine, descriptor, dataset, dataset_ids, worker, ref.version, ref.root, counter)


@dataclass(frozen=True)
class Built:
    submission: RolloutSubmission
    wall_s: float
    cpu_s: float
    tokens: int


def timed_build(make: Callable[[], RolloutSubmission]) -> Built:
    """Run `make` in this thread, measuring wall time and this thread's CPU time."""
    wall, cpu = time.perf_counter(), time.thread_time()
    submission = make()
    tokens = sum(len(c.token_ids) for g in submission.groups for c in g.completions)
    return Built(submission, time.perf_counter() - wall, time.thread_time() - cpu, tokens)


# --- statistics ------------------------------------------------------------------------------------


@dataclass
class WorkerStats:
    submitted: int = 0  # built and handed to delivery
    delivered: int = 0  # queued by a validator (ack 100)
    undelivered: int = 0  # no validator took it before it went stale or the rounds ran out
    acks: Counter[int] = field(default_factory=Counter)
    submit_failures: int = 0  # requests that got no valid answer
    accepted: int = 0
    rejected: int = 0
    slashable: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    generate_s: float = 0.0
    cpu_s: float = 0.0
    tokens: int = 0
    grader_faults: int = 0  # counters skipped: the grader hit a safety net, so no reward could be claimed
    _judged: set[bytes] = field(default_factory=set, repr=False)

    def record_build(self, built: Built) -> None:
        self.submitted += 1
        self.generate_s += built.wall_s
        self.cpu_s += built.cpu_s
        self.tokens += built.tokens

    def observe_verdict(self, verdict: Verdict, worker: bytes, run: str) -> bool:
        """Count a verdict on one of this worker's submissions, once per submission; False if not ours."""
        if verdict.worker != worker or verdict.run != run or verdict.submission_digest in self._judged:
            return False
        self._judged.add(verdict.submission_digest)
        if verdict.accepted:
            self.accepted += 1
            return True
        self.rejected += 1
        try:
            reason = Reason(verdict.reason_code)
        except ValueError:
            self.by_reason[str(verdict.reason_code)] += 1
            return True
        self.by_reason[reason.name] += 1
        self.slashable += reason in SLASHABLE_REASONS
        return True

    def as_dict(self) -> dict[str, Any]:
        return {
            "submitted": self.submitted,
            "delivered": self.delivered,
            "undelivered": self.undelivered,
            "acks": {str(status): n for status, n in sorted(self.acks.items())},
            "submit_failures": self.submit_failures,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "slashable": self.slashable,
            "by_reason": dict(sorted(self.by_reason.items())),
            "generate_s": round(self.generate_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "tokens": self.tokens,
            "grader_faults": self.grader_faults,
        }


# --- submitting ------------------------------------------------------------------------------------

# Answers that say "not here, not now", not "no": another validator (or this one later) may take it.
TRY_ANOTHER = frozenset(
    {Reason.NOT_FOR_US, Reason.CLOCK_SKEW, Reason.REPLAYED_SEQ, Reason.UNKNOWN_CHECKPOINT, Reason.BUSY}
)


def try_another(status: int) -> bool:
    """Whether an ack of `status` passes the submission on to the next validator."""
    return status // 100 == 5 or status in TRY_ANOTHER


class SubmitTransport(Protocol):
    """How a submission reaches validators: `NetTransport` over the swarm, anything else in tests."""

    def validators(self) -> list[PeerRecord]: ...

    async def wait_for_validators(self) -> list[PeerRecord]: ...

    async def send(self, peer_id: str, submission: RolloutSubmission) -> SubmitAck:
        """One SUBMIT exchange; raises `RequestFailed` when no valid ack comes back."""
        ...


RESEAL_AFTER_S = 120.0  # well inside the envelope's 5-minute clock-skew window


@dataclass
class NetTransport:
    """SUBMIT over the swarm. A submission is sealed once and every retry sends the same envelope: a
    validator that queued it before our request timed out and the one we retry with then name it by one
    digest, so the ledger credits it and the trainer trains on it once."""

    net: RoleNet
    _sealed: tuple[RolloutSubmission, bytes, float] | None = None

    def validators(self) -> list[PeerRecord]:
        return self.net.peers("validator")

    async def wait_for_validators(self) -> list[PeerRecord]:
        return await self.net.wait_for_role("validator")

    async def send(self, peer_id: str, submission: RolloutSubmission) -> SubmitAck:
        now = trio.current_time()
        if (
            self._sealed is None
            or self._sealed[0] is not submission
            or now - self._sealed[2] > RESEAL_AFTER_S
        ):
            self._sealed = (submission, self.net.seal(submission), now)  # stale envelopes meet the skew check
        opened = await self.net.request(ID.from_base58(peer_id), SUBMIT, submission, sealed=self._sealed[1])
        ack: SubmitAck = opened.message
        return ack


@dataclass
class Rotation:
    """Round-robin over the validators known at each submission, one further each time."""

    turn: int = 0

    def order(self, peers: Sequence[PeerRecord]) -> list[PeerRecord]:
        if not peers:
            return []
        start = self.turn % len(peers)
        self.turn += 1
        return list(peers[start:]) + list(peers[:start])


async def deliver(
    transport: SubmitTransport,
    rotation: Rotation,
    submission: RolloutSubmission,
    stats: WorkerStats,
    *,
    fresh: Callable[[], bool] = lambda: True,
    rounds: int = SUBMIT_ROUNDS,
    first_delay: float = FIRST_RETRY_DELAY,
    max_delay: float = MAX_RETRY_DELAY,
) -> SubmitAck | None:
    """Hand `submission` to the first validator that gives a final answer; None if none did in time.

    Each round tries every known validator once (starting at the rotation's turn); between rounds it
    backs off, and it stops early once the submission is no longer `fresh` (it would only be dropped).
    """
    delay = first_delay
    for _ in range(rounds):
        if not fresh():
            break
        peers = transport.validators()
        if not peers:
            with trio.move_on_after(delay):
                peers = await transport.wait_for_validators()
        for peer in rotation.order(peers):
            try:
                ack = await transport.send(peer.peer_id, submission)
            except RequestFailed as exc:
                stats.submit_failures += 1
                log.info("submission not delivered", extra={"peer": peer.peer_id, "error": str(exc)})
                continue
            stats.acks[ack.status] += 1
            if try_another(ack.status):
                continue
            if ack.status == QUEUED:
                stats.delivered += 1
            return ack
        await trio.sleep(delay)
        delay = min(delay * 2, max_delay)
    stats.undelivered += 1
    return None


# --- the work --------------------------------------------------------------------------------------


class SwarmWorkerWork:
    """The worker role's `RoleWork`: generation and submission on the newest checkpoint it holds."""

    def __init__(
        self,
        config: NodeConfig,
        identity: NodeIdentity,
        ledger: Ledger | None,
        *,
        model_dir: Path | None = None,
        tasks: Sequence[Task] | None = None,
    ) -> None:
        self.config = config
        self.identity = identity
        self.address = identity.address
        self.ledger = ledger
        self.model_dir = model_dir or run_model_dir(config.work)
        self.tasks = list(tasks) if tasks is not None else run_tasks(config.work)
        self.cheat = config.work.cheat
        self.stats = WorkerStats()
        self.rotation = Rotation()
        self.follower: SwarmFollower | None = None
        self.setup: RunSetup | None = None
        self.engine: InferenceEngine | None = None
        self.counters: Counters | None = None
        self.loaded: CheckpointRef | None = None
        self._pending: LoadedWeights | None = None
        self._newest: int | None = None
        self._changed = trio.Event()
        self.pacer = Pacer(me=self.address)

    # -- state the loop decides on

    def newest_known(self) -> int | None:
        """The newest checkpoint version signed by the trainer that this node has heard of."""
        versions = [v for v in (self._newest, self.loaded.version if self.loaded else None) if v is not None]
        node = self.follower.node if self.follower is not None else None
        if node is not None and node.catalog.latest_version is not None:
            versions.append(node.catalog.latest_version)
        return max(versions) if versions else None

    def _note_version(self, version: int, created_ms: int | None = None) -> None:
        if created_ms is not None:
            self.pacer.heard(version, created_ms, now_ms())
        if self._newest is None or version > self._newest:
            self._newest = version
            self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _async_level(self) -> int:
        assert self.setup is not None
        return self.setup.descriptor.async_level

    def next_counter(self) -> int | None:
        """Reserve (and persist) the next counter on the loaded version; None when there is nothing to do."""
        assert self.counters is not None and self.setup is not None
        loaded = self.loaded.version if self.loaded is not None else None
        used = self.counters.used(loaded) if loaded is not None else 0
        budget = submission_budget(self.config.work.submissions_per_version, self.setup.descriptor)
        if loaded is not None:
            budget = self.pacer.budget(loaded, self._async_level(), used, budget, now_ms())
        if plan_counter(loaded, self.newest_known(), self._async_level(), used, budget) is None:
            return None
        assert loaded is not None
        return self.counters.reserve(loaded)

    def _recheck_s(self) -> float:
        """Seconds until the loaded version's share allows another counter; inf if it is not what waits."""
        if self.loaded is None or self.counters is None:
            return math.inf
        version = self.loaded.version
        wait = self.pacer.recheck_in_ms(version, self.counters.used(version), now_ms())
        return math.inf if wait is None else (wait + 1) / 1000

    # -- RoleWork

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        if self.ledger is not None:
            require_eligible(self.ledger, self.address, self.config)  # sqlite handles stay on this thread
        set_threads(self.config.work.threads)
        self.follower = follower = SwarmFollower(net, self.config, newest_only=True, serve=False)
        completed_send, completed_receive = trio.open_memory_channel[VerifiedCheckpoint](8)
        task_status.started()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follower.run, completed_send)
            nursery.start_soon(self._load_checkpoints, completed_receive)
            record = await net.wait_run_record()
            self.setup = setup = await trio.to_thread.run_sync(
                load_run_setup, record.descriptor, self.model_dir, self.tasks
            )
            if self.ledger is not None:  # work only for a run its descriptor's signer owns on the ledger
                await wait_run_owner(self.ledger, record.descriptor)
            # each of the run's trainers (DiLoCo) takes its own batches from every version
            self.pacer.wanted = SWARM_SUBMISSIONS_PER_VERSION * len(run_trainers(setup.descriptor))
            self.counters = Counters.load(self.config.data_dir / STATE_FILE, net.run, self.address)
            kind = choose_engine(self.config.work.engine)  # EngineUnavailable: says what is missing
            self.engine = await trio.to_thread.run_sync(
                partial(open_engine, kind, self.model_dir, role="worker")
            )
            log.info(
                "worker ready",
                extra={"run": net.run, "cheat": self.cheat, "async_level": setup.descriptor.async_level},
            )
            nursery.start_soon(self._work, NetTransport(net))

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        message = delivery.opened.message
        if isinstance(message, VerdictBatch):  # checked whole by the topic (protocol.verdicts)
            for verdict in message.verdicts:
                if verdict.accepted and verdict.run == self.config.run:
                    self.pacer.accepted(verdict.worker, verdict.checkpoint_version)
                if self.stats.observe_verdict(verdict, self.address, self.config.run):
                    self.pacer.judged(verdict.step, now_ms())
            return
        if (
            isinstance(message, CheckpointHead)
            and self.setup is not None
            and delivery.opened.sender == self.setup.descriptor.trainer
            and message.run == self.config.run
        ):
            self._note_version(message.version, message.created_ms)
        if self.follower is not None:
            await self.follower.on_gossip(delivery)

    def status(self) -> dict[str, Any]:
        return {
            "version": self.loaded.version if self.loaded is not None else None,
            "newest_known": self.newest_known(),
            "cheat": self.cheat,
            **self.stats.as_dict(),
            "pace": self.pacer.statistics(),
            "follower": self.follower.statistics() if self.follower is not None else {},
        }

    # -- the loops

    async def _load_checkpoints(self, completed: trio.MemoryReceiveChannel[VerifiedCheckpoint]) -> None:
        """Read each verified checkpoint (the newest of what is waiting) into memory for the next swap."""
        async for checkpoint in completed:
            while True:
                try:
                    later = completed.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                if later.manifest.version > checkpoint.manifest.version:
                    checkpoint = later
            version = checkpoint.manifest.version
            self._note_version(version, checkpoint.manifest.created_ms)
            if not self._is_news(version):
                continue
            weights = await trio.to_thread.run_sync(prepare_weights, checkpoint, self.cheat)
            if self._is_news(version):
                self._pending = weights
                log.info("checkpoint loaded", extra={"version": version, "cheat": self.cheat})
                self._wake()

    def _is_news(self, version: int) -> bool:
        held = [
            w.version for w in (self.loaded, self._pending.ref if self._pending else None) if w is not None
        ]
        return not held or version > max(held)

    async def _swap_in(self) -> None:
        """Put the pending weights into the engine (only ever called between submissions)."""
        pending, self._pending = self._pending, None
        if pending is None or (self.loaded is not None and pending.ref.version <= self.loaded.version):
            return
        assert self.engine is not None and self.counters is not None
        await trio.to_thread.run_sync(self.engine.load_weights, pending.state)
        self.loaded = pending.ref
        self.counters.forget_below(pending.ref.version - self._async_level())
        log.info("checkpoint swapped in", extra={"version": pending.ref.version})

    async def _work(self, transport: SubmitTransport) -> None:
        assert self.setup is not None and self.engine is not None
        setup, engine = self.setup, self.engine
        dataset, dataset_ids = setup.dataset, setup.dataset_ids
        async_level = setup.descriptor.async_level
        while True:
            changed = self._changed
            await self._swap_in()
            counter = self.next_counter()
            if counter is None:
                with trio.move_on_after(self._recheck_s()):  # a share grows while a version stands
                    await changed.wait()
                continue
            assert self.loaded is not None
            ref = self.loaded
            make = partial(
                make_submission,
                engine,
                setup.descriptor,
                dataset,
                dataset_ids,
                self.address,
                ref,
                counter,
                self.cheat,
            )
            try:
                built = await trio.to_thread.run_sync(timed_build, make)
            except GraderFault as exc:
                # A machine-dependent limit decided the reward: a validator would not recompute it. The
                # counter is spent (never reused for other tokens), nothing is submitted.
                self.stats.grader_faults += 1
                log.warning("grader fault, counter skipped", extra={"counter": counter, "error": str(exc)})
                continue
            self.stats.record_build(built)
            self.pacer.built(built.wall_s)
            self.pacer.handed(built.submission.step, now_ms())

            def fresh(version: int = ref.version) -> bool:
                newest = self.newest_known()
                return newest is None or within_async_level(version, newest, async_level)

            ack = await deliver(transport, self.rotation, built.submission, self.stats, fresh=fresh)
            log.info(
                "submission sent",
                extra={
                    "version": ref.version,
                    "counter": counter,
                    "status": ack.status if ack is not None else None,
                    "generate_s": round(built.wall_s, 3),
                    "tokens": built.tokens,
                },
            )

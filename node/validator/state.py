"""The few things the validator's parts share, each a small object handed to the parts that need it.

- `RunContext`: the run as this validator knows it (setup, trainers, engines, follower). Written by
  `work.SwarmValidatorWork` (prepare, hold), read by the parts.
- `PendingQueue`: the submissions waiting for judgement. `intake` adds, `judging_loop` takes, a
  checkpoint held wakes it.
- `CreditBacklog`: how many credits wait for the ledger. `judging_loop` adds, `settlement` commits,
  `intake` refuses new work while it is full.
- `OutcomeCounts`: the outcome counts (read back from the store at start), written by `judging_loop`.

Decisions:
- Bounded state: every map keyed by something a peer chooses is capped (`TtlCache` for stake reads in
  `intake`, `bounded_get` for per-worker tallies here); the store's retention is `accepted_log`'s.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import trio

from swarmnode.node.rl.run import RunSetup
from swarmnode.node.rl.validation import Accepted
from swarmnode.node.roles.common import bounded_get
from swarmnode.node.roles.follow import SwarmFollower
from swarmnode.node.validator.engines import CheckpointEngines
from swarmnode.node.validator.judgement import Judgement, reason_name
from swarmnode.node.validator.limits import MAX_WORKER_TALLIES
from swarmnode.node.validator.store_rows import JudgedCounts, PendingItem
from swarmnode.node.validator.store_schema import ACCEPTED as ACCEPTED_STATUS
from swarmnode.protocol.errors import Ignore, ProtocolError


@dataclass
class WorkerTally:
    accepted: int = 0
    rejected: int = 0
    slashed: int = 0


class RunContext:
    """The run as this validator knows it: nothing until its record arrives, then its setup, its trainers,
    the engines of the checkpoints held and the follower that brings them."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.setup: RunSetup | None = None
        # the run's trainers (lead and co-trainers), once its record is known: ACCEPTED serves them only
        self.trainers: frozenset[bytes] = frozenset()
        self.engines: CheckpointEngines | None = None
        self.follower: SwarmFollower | None = None
        self._engines_lock: trio.Lock | None = None

    def engines_lock(self) -> trio.Lock:
        """Held while a checkpoint loads or a judgement runs: the versions held cannot change under it."""
        if self._engines_lock is None:
            self._engines_lock = trio.Lock()
        return self._engines_lock


class PendingQueue:
    """The submissions waiting for judgement, oldest first, and a wake-up for whoever waits on them."""

    def __init__(self, items: list[PendingItem]) -> None:
        self.items = items
        self._changed = trio.Event()  # a submission queued or a checkpoint held: the scheduler looks again

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[PendingItem]:
        return iter(self.items)

    def add(self, item: PendingItem) -> None:
        self.items.append(item)
        self.wake()

    def remove(self, item: PendingItem) -> None:
        self.items.remove(item)

    def wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self, deadline: float) -> None:
        """Until the next `wake`, or `deadline` (trio time)."""
        changed = self._changed
        with trio.move_on_at(deadline):
            await changed.wait()


class CreditBacklog:
    """The credits queued in the store for the committer: a full batch starts a commit at once, and too
    many waiting refuse new submissions (the ledger is behind)."""

    def __init__(self, queued: int, *, max_per_batch: int, max_queued: int) -> None:
        self.queued = queued  # waiting for the committer (durable)
        self.max_per_batch = max_per_batch
        self.max_queued = max_queued
        self._batch_full = trio.Event()  # a full batch of credits is queued: the committer goes now

    @property
    def full(self) -> bool:
        return self.queued >= self.max_queued

    def added(self) -> None:
        self.queued += 1
        if self.queued >= self.max_per_batch:
            self._batch_full.set()

    def settled(self, marked: int) -> None:
        self.queued = max(0, self.queued - marked)

    async def wait_batch_full(self, timeout_s: float) -> None:
        """Until a full batch is queued, or `timeout_s`; the next wait starts afresh."""
        full = self._batch_full
        with trio.move_on_after(timeout_s):
            await full.wait()
        self._batch_full = trio.Event()


class OutcomeCounts:
    """What the judgements came to. Outcome counts survive a restart (read back from the store); the
    checks' counts and CPU time count from this start."""

    def __init__(self, stored: JudgedCounts) -> None:
        self.by_reason: dict[str, int] = {}
        self.accepted = self.rejected = self.ignored = 0
        for status, n in stored.by_status.items():
            if status == ACCEPTED_STATUS:
                self.accepted += n
                continue
            self.by_reason[reason_name(status)] = self.by_reason.get(reason_name(status), 0) + n
            self.rejected += n
        for status, n in stored.ignored.items():
            self.by_reason[reason_name(status)] = self.by_reason.get(reason_name(status), 0) + n
            self.ignored += n
        self.per_worker: OrderedDict[bytes, WorkerTally] = OrderedDict()
        for worker, statuses in stored.per_worker.items():
            tally = bounded_get(self.per_worker, worker, WorkerTally, MAX_WORKER_TALLIES)
            for status, n in statuses.items():
                if status == ACCEPTED_STATUS:
                    tally.accepted += n
                else:
                    tally.rejected += n
        self.tokens = stored.tokens
        self.full_checks = self.cheap_checks = 0
        self.slashes = 0  # slashes filed (pending on the ledger until their window passes)
        self.cpu_s = self.cpu_full_s = 0.0

    @property
    def judged(self) -> int:
        return self.accepted + self.rejected + self.ignored

    def count(
        self, worker: bytes, outcome: Accepted | ProtocolError, judgement: Judgement, slashed: bool
    ) -> None:
        tally = bounded_get(self.per_worker, worker, WorkerTally, MAX_WORKER_TALLIES)
        self.cpu_s += judgement.cpu_s
        if judgement.full:
            self.full_checks += 1
            self.cpu_full_s += judgement.cpu_s
        else:
            self.cheap_checks += 1
        if isinstance(outcome, Accepted):
            self.accepted += 1
            self.tokens += outcome.tokens
            tally.accepted += 1
            return
        name = outcome.reason.name
        self.by_reason[name] = self.by_reason.get(name, 0) + 1
        if isinstance(outcome, Ignore):
            self.ignored += 1
            return
        self.rejected += 1
        tally.rejected += 1
        if slashed:
            self.slashes += 1
            tally.slashed += 1

"""What the validator's work holds, what it has counted, and the `status` it reports.

`ValidatorState` builds the state every part of the work shares (`intake`, `judge`, `settlement`,
`accepted_log`; `work.SwarmValidatorWork` is all of them), and keeps the two wake-ups they share.

Decisions:
- Bounded state: every map keyed by something a peer chooses is capped (`TtlCache` for stake reads,
  `bounded_get` for per-worker tallies); the store's retention is `accepted_log`'s.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from swarmnode.crypto.identity import NodeIdentity
from swarmnode.ledger import Ledger
from swarmnode.node.config import NodeConfig
from swarmnode.node.rl.run import RunSetup
from swarmnode.node.rl.tasks import Task, require_sandbox_for
from swarmnode.node.rl.validation import Accepted
from swarmnode.node.roles.common import TtlCache, bounded_get, run_model_dir, run_tasks
from swarmnode.node.roles.follow import SwarmFollower
from swarmnode.node.validator.engines import CheckpointEngines
from swarmnode.node.validator.fairness import RoundRobin
from swarmnode.node.validator.judgement import Decision, Judgement, reason_name
from swarmnode.node.validator.ledger_access import LedgerAccess
from swarmnode.node.validator.limits import (
    ACCEPTED_RETENTION_VERSIONS,
    CREDIT_INTERVAL_S,
    ELIGIBILITY_TTL_S,
    LEDGER_RETRY_MAX_S,
    LEDGER_RETRY_S,
    MAX_ACCEPTED_BYTES,
    MAX_ELIGIBILITY_CACHE,
    MAX_QUEUED_CREDITS,
    MAX_WORKER_TALLIES,
    PRUNE_EVERY_S,
    SLASH_CHECK_S,
    STORE_FILE,
    VERDICT_FLUSH_S,
    WAIT_FOR_CHECKPOINT_S,
)
from swarmnode.node.validator.store import AcceptedStore
from swarmnode.node.validator.store_rows import PendingItem, StoreStatistics
from swarmnode.node.validator.store_schema import ACCEPTED as ACCEPTED_STATUS
from swarmnode.protocol.errors import Ignore, ProtocolError
from swarmnode.protocol.ledger_messages import MAX_CREDITS_PER_BATCH
from swarmnode.protocol.messages import VERDICT_BATCH_MAX_ITEMS


@dataclass
class WorkerTally:
    accepted: int = 0
    rejected: int = 0
    slashed: int = 0


class ValidatorState:
    """The validator's state and counts; its behaviour is in the parts that subclass it."""

    def __init__(
        self,
        config: NodeConfig,
        identity: NodeIdentity,
        ledger: Ledger | None,
        *,
        model_dir: Path | None = None,
        tasks: Sequence[Task] | None = None,
        wait_for_checkpoint_s: float = WAIT_FOR_CHECKPOINT_S,
        ledger_retry_s: float = LEDGER_RETRY_S,
        ledger_retry_max_s: float = LEDGER_RETRY_MAX_S,
        eligibility_ttl_s: float = ELIGIBILITY_TTL_S,
        retention_versions: int = ACCEPTED_RETENTION_VERSIONS,
        max_accepted_bytes: int = MAX_ACCEPTED_BYTES,
        prune_every_s: float = PRUNE_EVERY_S,
        credit_interval_s: float = CREDIT_INTERVAL_S,
        max_credits_per_batch: int = MAX_CREDITS_PER_BATCH,
        max_queued_credits: int = MAX_QUEUED_CREDITS,
        slash_check_s: float = SLASH_CHECK_S,
        verdict_flush_s: float = VERDICT_FLUSH_S,
        verdict_batch_items: int = VERDICT_BATCH_MAX_ITEMS,
    ) -> None:
        if retention_versions < 0 or max_accepted_bytes < 0 or not prune_every_s > 0:
            raise ValueError("retention_versions and max_accepted_bytes >= 0, prune_every_s > 0")
        if not 1 <= max_credits_per_batch <= MAX_CREDITS_PER_BATCH or max_queued_credits < 1:
            raise ValueError(f"max_credits_per_batch 1..{MAX_CREDITS_PER_BATCH}, max_queued_credits >= 1")
        if not credit_interval_s > 0 or not slash_check_s > 0:
            raise ValueError("credit_interval_s and slash_check_s > 0")
        if not verdict_flush_s > 0 or not 1 <= verdict_batch_items <= VERDICT_BATCH_MAX_ITEMS:
            raise ValueError(f"verdict_flush_s > 0, verdict_batch_items 1..{VERDICT_BATCH_MAX_ITEMS}")
        self.verdict_flush_s = verdict_flush_s
        self.verdict_batch_items = verdict_batch_items
        self.credit_interval_s = credit_interval_s
        self.max_credits_per_batch = max_credits_per_batch
        self.max_queued_credits = max_queued_credits
        self.slash_check_s = slash_check_s
        self.config = config
        self.wait_for_checkpoint_s = wait_for_checkpoint_s
        self.ledger_retry_s = ledger_retry_s
        self.ledger_retry_max_s = ledger_retry_max_s
        self.retention_versions = retention_versions
        self.max_accepted_bytes = max_accepted_bytes
        self.prune_every_s = prune_every_s
        # SUBMIT's stake reads, by sender: a flood of SUBMITs costs one ledger read per sender per TTL
        self._stake_reads: TtlCache[bytes, bool] = TtlCache(eligibility_ttl_s, MAX_ELIGIBILITY_CACHE)
        # the newest cursor each trainer sent (ACCEPTED): what it has pulled, for the accepted log's byte cap
        self._pulled: dict[bytes, int] = {}
        self.identity = identity
        self.run_id = config.run
        self.model_dir = model_dir or run_model_dir(config.work)
        self.tasks = list(tasks) if tasks is not None else run_tasks(config.work)
        require_sandbox_for(self.tasks)  # code tasks: the sandbox must work here, or no run
        self.ledger = LedgerAccess(ledger)
        self.store = AcceptedStore(config.data_dir / "validator" / STORE_FILE)
        self._secret = self.store.secret()
        self._queue: list[PendingItem] = self.store.pending()
        self._deadlines: dict[int, float] = {}
        self._turns = RoundRobin()  # fair judging: whose turn it is (node.validator.fairness)
        # decided and stored, the ledger write and `finish` still to do (by item id); read back on a restart
        self._decided: dict[int, Decision] = {i: Decision.restore(d) for i, d in self.store.decided().items()}
        self._attempts: dict[int, int] = {}  # ledger failures of an item so far
        self._retry_at: dict[int, float] = {}  # an item deferred by a ledger failure: not before then
        self._changed = trio.Event()  # a submission queued or a checkpoint held: the scheduler looks again
        self._progress = trio.Event()  # a submission judged
        self._torch: trio.Lock | None = None
        self._batch_full = trio.Event()  # a full batch of credits is queued: the committer goes now
        self._pending_slashes: dict[int, int] = {}  # slash index -> its final epoch: filed here, pending
        self.setup: RunSetup | None = None
        # the run's trainers (lead and co-trainers), once its record is known: ACCEPTED serves them only
        self.trainers: frozenset[bytes] = frozenset()
        self._dataset: dict[bytes, Task] = {}
        self._dataset_ids: list[bytes] = []
        self.engines: CheckpointEngines | None = None
        self.follower: SwarmFollower | None = None
        self._init_counts()

    def _init_counts(self) -> None:
        """Outcome counts survive a restart (read back from the store); the rest count from this start."""
        counts = self.store.judged_counts()
        self.by_reason: dict[str, int] = {}
        self.accepted = self.rejected = self.ignored = 0
        for status, n in counts.by_status.items():
            if status == ACCEPTED_STATUS:
                self.accepted += n
                continue
            self.by_reason[reason_name(status)] = self.by_reason.get(reason_name(status), 0) + n
            self.rejected += n
        for status, n in counts.ignored.items():
            self.by_reason[reason_name(status)] = self.by_reason.get(reason_name(status), 0) + n
            self.ignored += n
        self.per_worker: OrderedDict[bytes, WorkerTally] = OrderedDict()
        for worker, statuses in counts.per_worker.items():
            tally = bounded_get(self.per_worker, worker, WorkerTally, MAX_WORKER_TALLIES)
            for status, n in statuses.items():
                if status == ACCEPTED_STATUS:
                    tally.accepted += n
                else:
                    tally.rejected += n
        self.tokens = counts.tokens
        self.refused = 0  # submissions answered at SUBMIT without being queued
        self.full_checks = self.cheap_checks = 0
        self.slashes = 0  # slashes filed (pending on the ledger until their window passes)
        self.slashes_finalized = self.slashes_voided = self.slashes_settled_elsewhere = 0
        self.credits_queued = self.store.credit_counts().queued  # waiting for the committer (durable)
        self.contributions = self.batches = 0  # credits committed, and their batches
        self.credits_dropped: dict[str, int] = {}  # reason -> credits dropped (`credit_refusal`, "refused")
        self.credit_blocked = ""  # why the last commit round could not commit (the run, our standing)
        self.cpu_s = self.cpu_full_s = 0.0
        self.verdicts_gossiped = self.verdicts_dropped = 0
        self.verdict_batches = 0  # VerdictBatches gossiped (each carries 1..verdict_batch_items verdicts)
        self.ledger_retries = 0  # judgements put back in the queue by a ledger failure
        self.accepted_refused = 0  # ACCEPTED requests refused (not a trainer, a cursor out of range)
        self.quarantined = 0  # items the judge failed on, taken out of the queue as JUDGE_FAULT
        self.pruned_judged = self.pruned_accepted = 0
        self.store_stats: StoreStatistics = self.store.statistics()  # as of the last prune

    # --- status --------------------------------------------------------------------------------------

    @property
    def judged(self) -> int:
        return self.accepted + self.rejected + self.ignored

    def status(self) -> dict[str, object]:
        return {
            "queued": len(self._queue),
            "judged": self.judged,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "ignored": self.ignored,
            "refused": self.refused,
            "by_reason": dict(sorted(self.by_reason.items())),
            "slashes": self.slashes,
            "slashes_pending": len(self._pending_slashes),
            "slashes_finalized": self.slashes_finalized,
            "slashes_voided": self.slashes_voided,
            "slashes_settled_elsewhere": self.slashes_settled_elsewhere,
            "contributions": self.contributions,
            "credits": {
                "queued": self.credits_queued,
                "committed": self.contributions,
                "batches": self.batches,
                "dropped": dict(sorted(self.credits_dropped.items())),
                "blocked": self.credit_blocked,
            },
            "ledger_errors": self.ledger.errors,
            "ledger_refusals": self.ledger.refusals,
            "ledger_retries": self.ledger_retries,
            "ledger_deferred": len(self._retry_at),
            "ledger_last_error": self.ledger.last_error,
            "cpu_s": round(self.cpu_s, 3),
            "cpu_s_per_full_check": round(self.cpu_full_s / self.full_checks, 4) if self.full_checks else 0.0,
            "full_checks": self.full_checks,
            "cheap_checks": self.cheap_checks,
            "tokens": self.tokens,
            "per_worker": {
                "0x" + worker.hex(): {"accepted": t.accepted, "rejected": t.rejected, "slashed": t.slashed}
                for worker, t in sorted(self.per_worker.items())
            },
            "versions_held": self.engines.versions() if self.engines is not None else [],
            "accepted_newest": self.store.newest,
            "accepted_refused": self.accepted_refused,
            "quarantined": self.quarantined,
            "store": {
                "floor_version": self.store_stats.floor,
                "judged_rows": self.store_stats.judged,
                "accepted_rows": self.store_stats.accepted,
                "accepted_bytes": self.store_stats.accepted_bytes,
                "pruned_judged": self.pruned_judged,
                "pruned_accepted": self.pruned_accepted,
            },
            "verdicts_gossiped": self.verdicts_gossiped,
            "verdicts_dropped": self.verdicts_dropped,
            "verdict_batches": self.verdict_batches,
            "data_plane": self.follower.statistics() if self.follower is not None else {},
        }

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _torch_lock(self) -> trio.Lock:
        if self._torch is None:
            self._torch = trio.Lock()
        return self._torch

    def _count(
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

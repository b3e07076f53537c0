"""Validator work: queue signed submissions, judge them on the claimed checkpoint, gossip signed verdicts,
serve the accepted ones to the trainer, and credit (in batches) or slash in the ledger.

The life of a submission (spec/validation.md):
1. SUBMIT (`submit`): only cheap checks (a RolloutSubmission of this run, once the run is loaded; its step
   bound to its version with a counter the run allows; not stale, not newer than the newest trainer-signed
   manifest the follower has seen; a staked sender, read from the ledger and cached for
   `ELIGIBILITY_TTL_S`; not a duplicate (201) nor a second submission for an assignment (610); room in the
   queue and in the worker's share of it); then it is written to the durable pending queue
   (`AcceptedStore`) and acknowledged 100. Nothing is written for a refused one.
2. The judge (`judge_forever`) takes queued submissions oldest first, skipping over those whose checkpoint
   it does not hold yet: they wait up to `WAIT_FOR_CHECKPOINT_S` for the follower to bring it, then are
   ignored (203/607). `node.rl.validation.judge_total` runs in a thread on the engine of the claimed
   version; on a run with `sample_fraction < 1`, only the submissions an HMAC of their digest under a
   validator-local secret draws get the prefill checks (workers cannot tell which), the others the cheap
   ones. The judge is total: an exception while judging is a JUDGE_FAULT ignore (207), an envelope that
   does not read back too, and any other exception on one item's path quarantines that item (a JUDGE_FAULT
   ignore written straight to the store, `quarantined` in the status): no item can stop the loop or a
   restart.
3. The outcome becomes a `Verdict`, sealed once with the node key: those bytes are what the accepted log
   stores and the ledger cites; the decision (outcome, verdict, sealed envelope) is written to the store
   before any ledger call. After the ledger write and `finish`, the verdict is gossiped on `verdicts`
   (ignores are not: nobody is at fault and nothing is recorded).
4. Accepted: an entry in the accepted log that the run's trainers (the lead and its co-trainers, only
   they) pull with ACCEPTED (long poll, cursor), and, in the same store transaction, a credit owed
   (tokens, flops = 2 · parameters · tokens, capped by the run's bound per token; the submission's
   digest). The committer (`commit_credits`) sends the queued credits of the run as one `CommitCredits`
   of up to `max_credits_per_batch`, sorted by (worker, step), every `credit_interval_s` or as soon as a
   batch is full, and marks them committed.
   Rejected for a slashable reason (`ledger.evidence.SLASHABLE_REASONS`): a slash of the run's
   `slash_gwei` (capped by the ledger's own maximum) whose evidence is the worker's signed submission
   and, for a bad proof, the failing chunks. The ledger files it pending; `finalize_slashes` applies it
   once the run's challenge window has passed (unless the run's owner or its other validators voided it).
   Other rejections only get the verdict.

Decisions:
- One engine per retained checkpoint version (`CheckpointEngines`, the newest `async_level + 1`), each a
  TransformersEngine of the run's model folder (on CUDA in bf16 when there is one) with the version's
  weights; a pruned version's engine is reused for the next one. All torch work (loading weights, judging)
  runs in threads under one lock: the engines are not thread-safe, and on a CPU parallel judging would
  only share the same cores.
- Ledger calls block (an fsynced SQLite commit, or a chain transaction): they run in threads, one at a time.
  Every failed ledger call is logged and counted (`ledger_errors`); none ever stops the judging. A typed
  refusal (a `LedgerError` of the state machine: duplicate, invalid evidence, ejected, ...) decides the
  write: the judgement moves on without it. Any other failure (`BackendError`, a corrupt or locked log,
  a replayed nonce, an OS, SQLite or web3 error) is transient: the submission stays queued with its stored
  decision, and the ledger write is retried with exponential backoff (`ledger_retries`). A worker
  whose stake cannot be read is not judged at all until it can (never accepted on an unread stake).
- Crash safety: the decision is durable (`AcceptedStore.decide`) before the ledger is written (a slash),
  and the judgement leaves the queue (`finish`) after it. A submission with a stored decision is never
  judged again: after a restart its slash is replayed from the decision (a duplicate refusal means it was
  filed before the crash) and it finishes with the verdict sealed the first time, whatever checkpoints
  the restarted validator holds. A credit is queued by `finish` itself, so an acceptance is credited
  after any crash; one committed just before a crash, not yet marked, is found credited and dropped.
- A refused batch is settled credit by credit, never retried as it was: the credits the ledger holds
  already, those of a worker no longer eligible (unregistered, not a worker, ejected, under-staked) and
  those above the run's bounds are dropped (each logged and counted by reason), the rest sent again; a
  refusal none of these explain is split in halves down to the one credit it names, which is dropped with
  the ledger's message. A refusal of the whole batch (the run not registered yet, this validator not in
  its set or not staked) drops nothing: the credits wait for the next round. The run's owner must be the
  descriptor's trainer: a validator refuses any other run (`RunMismatch`).
- The slashes this validator filed and still pending are read back from the ledger at start and tried
  every `slash_check_s`: a window still open waits; a slash no longer pending (voided, or finalized by
  anyone else) is forgotten.
- The gossip of verdicts runs in its own task behind a bounded channel, so a slow mesh never holds up the
  judge (a full channel drops the gossip copy and counts it; the ledger and the accepted log keep it).
- Bounded state: the store is pruned every `PRUNE_EVERY_S` past the async window plus
  `ACCEPTED_RETENTION_VERSIONS` below the newest version held, and the accepted log to
  `MAX_ACCEPTED_BYTES` among the items every trainer has pulled (`AcceptedStore.prune`); every map keyed by
  something a peer chooses is capped (`TtlCache` for stake reads, `bounded_get` for per-worker tallies).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
import trio
from libp2p.peer.id import ID

from crypto.identity import NodeIdentity, address_of_peer_id
from ledger import Ledger, LedgerError
from ledger.errors import ChallengeWindowOpen, DuplicateSlash, SlashNotPending
from ledger.evidence import SLASHABLE_REASONS, slash_digest
from ledger.signedlog import SignedLog
from ledger.types import SLASH_PENDING, SLASH_VOIDED, Receipt, RunInfo
from node.config import NodeConfig
from node.dataplane.checkpoint import load_checkpoint
from node.dataplane.follower import VerifiedCheckpoint
from node.p2p.gossip import Delivery
from node.rl.engine import TransformersEngine
from node.rl.engines import open_engine
from node.rl.run import RunSetup, load_run_setup
from node.rl.tasks import Task
from node.rl.validation import (
    Accepted,
    BadProof,
    ProofFailure,
    ValidationContext,
    check_step,
    judge_fault,
    judge_total,
)
from node.roles.base import RoleNet
from node.swarm.accepted import ACCEPTED as ACCEPTED_STATUS
from node.swarm.accepted import MAX_CURSOR, AcceptedStore, Decided, PendingItem, RunCredit, StoreStatistics
from node.swarm.common import (
    ACCEPTED,
    TtlCache,
    bounded_get,
    check_run_owner,
    is_refusal,
    read_run,
    run_model_dir,
    run_tasks,
    set_threads,
)
from node.swarm.follow import SwarmFollower
from protocol.codec import decode, encode
from protocol.envelope import Envelope, Opened
from protocol.errors import Ignore, ProtocolError, Reason, Reject
from protocol.ledger_messages import (
    MAX_CREDITS_PER_BATCH,
    MAX_FAILING_CHUNKS,
    CommitCredits,
    Credit,
    Slash,
)
from protocol.messages import (
    AcceptedBatch,
    AcceptedRequest,
    RolloutSubmission,
    RunDescriptor,
    SubmitAck,
    Verdict,
)
from protocol.runs import run_trainers
from protocol.types import MIB

log = logging.getLogger(__name__)

T = TypeVar("T")

QUEUED = 100  # SubmitAck status: durably queued for judgement
WAIT_FOR_CHECKPOINT_S = 60.0  # how long a submission waits for a checkpoint version not held yet
MAX_PENDING = 256  # submissions queued at once
MAX_PENDING_PER_WORKER = 8  # submissions of one worker queued at once
MAX_PENDING_BYTES = 1024 * MIB
MAX_BATCH_BYTES = 8 * MIB  # an AcceptedBatch carries at least one item, more only up to this size
VERDICT_BACKLOG = 256  # verdicts waiting for gossip before new ones are dropped from it
MAX_DETAIL_BYTES = 512
MAX_VERDICT_CHUNKS = 4096
UNSAMPLED = "cheap checks only: not drawn for the prefill checks"
LEDGER_RETRY_S = 1.0  # first wait before retrying a ledger write that failed; doubles up to the max
LEDGER_RETRY_MAX_S = 60.0
STORE_FILE = "validator.db"
ELIGIBILITY_TTL_S = 10.0  # how long SUBMIT trusts a stake read (the judge reads it again, uncached)
MAX_ELIGIBILITY_CACHE = 4096  # senders whose stake read is cached (identities are free: oldest evicted)
MAX_WORKER_TALLIES = 1024  # workers with a per-worker tally in the status (least recently judged evicted)
# Retention (AcceptedStore.prune): versions kept beyond the async window, for audits and late pulls
ACCEPTED_RETENTION_VERSIONS = 4
MAX_ACCEPTED_BYTES = 2048 * MIB  # accepted log bytes; over it, items every trainer pulled go, oldest first
PRUNE_EVERY_S = 30.0
# Credits: one CommitCredits per interval, or as soon as a batch is full. The devnet's scale; a real swarm
# commits about once an epoch (Params.epoch_seconds: an hour), one transaction per validator.
CREDIT_INTERVAL_S = 5.0
MAX_QUEUED_CREDITS = 16 * MAX_CREDITS_PER_BATCH  # credits waiting for the ledger; SUBMIT is BUSY beyond
SLASH_CHECK_S = 5.0  # how often the pending slashes this validator filed are tried for finalization
RUN_WAIT_S = 2.0  # while the run is not on the ledger yet: how often to look again


class VerdictOut(Protocol):
    """Where verdicts go: sealed with the node key, gossiped on a topic (`RoleNet` is one)."""

    def seal(self, message: Any) -> bytes: ...

    async def publish(self, kind: str, message: Any) -> bytes: ...


# --- engines ---------------------------------------------------------------------------------------


class CheckpointEngines:
    """The engines of the newest `keep` checkpoint versions, with the trainer's Merkle root of each.

    Blocking (it loads weights): call `load` from a thread. Not thread-safe: one caller at a time.
    """

    def __init__(self, model_dir: Path, keep: int) -> None:
        if keep < 1:
            raise ValueError("keep at least one version")
        self.keep = keep
        self._model_dir = model_dir
        self._spare: TransformersEngine | None = self._open()
        self.parameters = sum(p.numel() for p in self._spare.model.parameters())
        self.model_info = self._spare.info  # the run's model: what `check_fields` bounds by
        self.tokenizer = self._spare.tokenizer  # the run's prompts
        self._engines: dict[int, TransformersEngine] = {}
        self._roots: dict[int, bytes] = {}

    def _open(self) -> TransformersEngine:
        """A validator's prefill engine: transformers, on CUDA in bf16 when there is one (engines.py)."""
        engine = open_engine("transformers", self._model_dir, role="validator")
        assert isinstance(engine, TransformersEngine)
        return engine

    @property
    def newest(self) -> int | None:
        return max(self._engines) if self._engines else None

    def versions(self) -> list[int]:
        return sorted(self._engines)

    def roots(self) -> dict[int, bytes]:
        return dict(self._roots)

    def holds(self, version: int) -> bool:
        return version in self._engines

    def engine(self, version: int) -> TransformersEngine:
        return self._engines[version]

    def load(self, version: int, merkle_root: bytes, state: Mapping[str, torch.Tensor]) -> bool:
        """Hold `version`; False when it is held already or older than every version kept."""
        if version in self._engines:
            return False
        if len(self._engines) >= self.keep and version < min(self._engines):
            return False
        if len(self._engines) >= self.keep:
            oldest = min(self._engines)
            engine = self._engines.pop(oldest)
            del self._roots[oldest]
        elif self._spare is not None:
            engine, self._spare = self._spare, None
        else:
            engine = self._open()
        engine.load_weights(state)
        self._engines[version] = engine
        self._roots[version] = merkle_root
        return True


# --- judging ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Judgement:
    outcome: Accepted | ProtocolError
    cpu_s: float  # this thread's CPU time spent judging
    full: bool  # the prefill checks ran


def judge_submission(
    sub: RolloutSubmission, worker: bytes, ctx: ValidationContext, engines: CheckpointEngines, full: bool
) -> Judgement:
    """`judge_total` with its CPU time (blocking: run in a thread). Total: an exception that is not a
    typed refusal (a check tripping over hostile input, an engine error) is a JUDGE_FAULT ignore."""
    start = time.thread_time()
    outcome = judge_total(sub, worker, ctx, engines.engine, prefill=full)
    if isinstance(outcome, Ignore) and outcome.reason == Reason.JUDGE_FAULT:
        log.error(
            "judging failed",
            extra={"worker": "0x" + worker.hex(), "step": sub.step},
            exc_info=outcome.__cause__,
        )
    return Judgement(outcome, time.thread_time() - start, full)


def drawn_for_full_check(secret: bytes, digest: bytes, fraction: float) -> bool:
    """Whether a submission gets the prefill checks: HMAC-SHA256(secret, digest) < fraction · 2^256.

    The secret never leaves the validator, so a worker cannot grind its envelope into the unchecked part.
    """
    if fraction >= 1.0:
        return True
    if not fraction > 0.0:
        return False
    draw = int.from_bytes(hmac.digest(secret, digest, "sha256"), "big")
    return draw < int(fraction * 2**256)


def clip_detail(text: str) -> str:
    return text.encode()[:MAX_DETAIL_BYTES].decode(errors="ignore")


def make_verdict(
    sub: RolloutSubmission, digest: bytes, worker: bytes, outcome: Accepted | ProtocolError, full: bool = True
) -> Verdict:
    """The signed judgement's body: acceptance statistics, or the reason code and failing chunks."""
    if isinstance(outcome, Accepted):
        return Verdict(
            run=sub.run,
            submission_digest=digest,
            worker=worker,
            step=sub.step,
            checkpoint_version=sub.checkpoint_version,
            accepted=True,
            reason_code=0,
            detail="" if full else UNSAMPLED,
            failing_chunks=(),
            tokens=outcome.tokens,
            mean_exp_mismatches=outcome.mean_exp_mismatches,
            mean_mant_err=outcome.mean_mant_err,
        )
    failure = outcome.failure if isinstance(outcome, BadProof) else ProofFailure((), 0.0, 0.0)
    return Verdict(
        run=sub.run,
        submission_digest=digest,
        worker=worker,
        step=sub.step,
        checkpoint_version=sub.checkpoint_version,
        accepted=False,
        reason_code=int(outcome.reason),
        detail=clip_detail(outcome.detail),
        failing_chunks=failure.failing_chunks[:MAX_VERDICT_CHUNKS],
        tokens=0,
        mean_exp_mismatches=failure.mean_exp_mismatches,
        mean_mant_err=failure.mean_mant_err,
    )


def fault_verdict(run: str, item: PendingItem, outcome: Ignore) -> Verdict:
    """The verdict body of an item whose stored envelope could not be read back (never sealed)."""
    return Verdict(
        run=run,
        submission_digest=item.digest,
        worker=item.worker,
        step=item.step,
        checkpoint_version=item.checkpoint_version,
        accepted=False,
        reason_code=int(outcome.reason),
        detail=clip_detail(outcome.detail),
        failing_chunks=(),
        tokens=0,
        mean_exp_mismatches=0.0,
        mean_mant_err=0.0,
    )


def slash_for(verdict: Verdict, evidence: bytes, amount_gwei: int) -> Slash | None:
    """The slash a rejection warrants, or None: not slashable, no amount, or a bad proof without a chunk."""
    if verdict.accepted or verdict.reason_code not in SLASHABLE_REASONS or amount_gwei < 1:
        return None
    chunks = verdict.failing_chunks[:MAX_FAILING_CHUNKS] if verdict.reason_code == Reason.BAD_PROOF else ()
    if verdict.reason_code == Reason.BAD_PROOF and not chunks:
        return None
    return Slash(
        run=verdict.run,
        worker=verdict.worker,
        amount_gwei=amount_gwei,
        failing_chunks=chunks,
        reason_code=verdict.reason_code,
        evidence=evidence,
    )


def credit_for(verdict: Verdict, parameters: int) -> Credit:
    """The credit an acceptance earns: its tokens, about 2 · parameters FLOPs per token, the submission."""
    return Credit(
        worker=verdict.worker,
        step=verdict.step,
        tokens=verdict.tokens,
        flops=2 * parameters * verdict.tokens,
        rollout_digest=verdict.submission_digest,
    )


def fit_credit(credit: Credit, run: RunInfo) -> Credit:
    """The FLOPs the run lets a credit claim: at most its bound per token (the ledger caps that bound, so
    a model beyond it is credited the cap)."""
    return replace(credit, flops=min(credit.flops, credit.tokens * run.max_flops_per_token))


def commit_blocker(ledger: Ledger, run: RunInfo, validator: bytes) -> str | None:
    """Blocking: why no batch of this validator can be committed to the run now (None: one can)."""
    if validator not in run.validators:
        return f"not one of run {run.run!r}'s {len(run.validators)} validators (its owner sets them)"
    info = ledger.node(validator)
    if info is None or info.role != "validator" or info.ejected or not ledger.is_eligible(validator):
        return "this node is not a registered, unejected, fully staked validator on the ledger"
    return None


def credit_refusal(ledger: Ledger, run: RunInfo, credit: Credit) -> str | None:
    """Blocking: why the ledger refuses this one credit whatever batch carries it (None: no such reason)."""
    if ledger.is_credited(run.run, credit.worker, credit.step):
        return "already_credited"
    worker = ledger.node(credit.worker)
    if worker is None or worker.role != "worker" or worker.ejected or not ledger.is_eligible(credit.worker):
        return "ineligible"
    if credit.tokens > run.max_tokens_per_credit:
        return "out_of_bounds"
    return None


# --- the ledger, from trio ----------------------------------------------------------------------------


class LedgerUnavailable(Exception):
    """A ledger call failed for a reason that may pass (backend down, RPC error, file error): retry later."""


class LedgerAccess:
    """Blocking ledger calls in a thread, one at a time. A typed refusal returns None (`attempt`: the
    refusal itself); any other exception (web3's and the OS's included) raises `LedgerUnavailable`. Both
    are counted."""

    def __init__(self, ledger: Ledger | None) -> None:
        self.ledger = ledger
        self.errors = 0  # refusals and failures
        self.refusals = 0
        self.last_error = ""
        self._lock: trio.Lock | None = None

    async def call(self, what: str, fn: Callable[[], T]) -> T | None:
        result = await self.attempt(what, fn)
        return None if isinstance(result, LedgerError) else result

    async def attempt(self, what: str, fn: Callable[[], T]) -> T | LedgerError:
        """`call`, returning a typed refusal (to act on its kind) instead of None."""
        if self._lock is None:
            self._lock = trio.Lock()
        async with self._lock:
            try:
                return await trio.to_thread.run_sync(fn)
            except Exception as exc:  # backends raise anything (web3 has no common base); never let it out
                self.errors += 1
                self.last_error = f"{what}: {exc}"
                if isinstance(exc, LedgerError) and is_refusal(exc):
                    self.refusals += 1
                    log.warning("ledger refused", extra={"call": what, "error": str(exc)})
                    return exc
                log.warning("ledger call failed", extra={"call": what, "error": repr(exc)})
                raise LedgerUnavailable(f"{what}: {exc!r}") from exc

    def eligible(self, address: bytes) -> bool:
        """Blocking: the worker's stake now (a signed log first reads what other writers appended)."""
        assert self.ledger is not None
        if isinstance(self.ledger, SignedLog):
            self.ledger.refresh()
        return self.ledger.is_eligible(address)

    def slash_cap(self, amount_gwei: int) -> int:
        """Blocking: the run's slash amount, capped by the ledger's maximum."""
        assert self.ledger is not None
        return min(amount_gwei, self.ledger.params.slash_gwei)


# --- the work ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """A judgement made and sealed, waiting for its ledger write and `finish` (kept across ledger retries
    and, as the store's `Decided` record, across restarts)."""

    outcome: Accepted | ProtocolError
    judgement: Judgement
    verdict: Verdict
    sealed: bytes  # b"" for an ignore

    def record(self) -> Decided:
        """What the store keeps of it."""
        outcome = self.outcome
        if isinstance(outcome, Accepted):
            kind, status = "accepted", ACCEPTED_STATUS
        else:
            kind, status = ("ignored" if isinstance(outcome, Ignore) else "rejected"), int(outcome.reason)
        return Decided(
            outcome=kind,
            status=status,
            tokens=self.verdict.tokens,
            verdict=encode(self.verdict),
            sealed=self.sealed,
            full=self.judgement.full,
            cpu_s=self.judgement.cpu_s,
        )

    @classmethod
    def restore(cls, decided: Decided) -> Decision:
        """The decision a stored record holds (its sealed verdict unchanged: it is never sealed again)."""
        verdict = decode(Verdict, decided.verdict)
        outcome: Accepted | ProtocolError
        if decided.outcome == "accepted":
            outcome = Accepted(verdict.tokens, verdict.mean_exp_mismatches, verdict.mean_mant_err)
        elif decided.outcome == "ignored":
            outcome = Ignore(Reason(decided.status), verdict.detail)
        elif decided.status == Reason.BAD_PROOF:
            failure = ProofFailure(verdict.failing_chunks, verdict.mean_exp_mismatches, verdict.mean_mant_err)
            outcome = BadProof(verdict.detail, failure)
        else:
            outcome = Reject(Reason(decided.status), verdict.detail)
        return cls(outcome, Judgement(outcome, decided.cpu_s, decided.full), verdict, decided.sealed)


@dataclass
class WorkerTally:
    accepted: int = 0
    rejected: int = 0
    slashed: int = 0


class SwarmValidatorWork:
    """The validator role's work (`node.roles.validator.ValidatorWork`)."""

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
    ) -> None:
        if retention_versions < 0 or max_accepted_bytes < 0 or not prune_every_s > 0:
            raise ValueError("retention_versions and max_accepted_bytes >= 0, prune_every_s > 0")
        if not 1 <= max_credits_per_batch <= MAX_CREDITS_PER_BATCH or max_queued_credits < 1:
            raise ValueError(f"max_credits_per_batch 1..{MAX_CREDITS_PER_BATCH}, max_queued_credits >= 1")
        if not credit_interval_s > 0 or not slash_check_s > 0:
            raise ValueError("credit_interval_s and slash_check_s > 0")
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
        self.ledger = LedgerAccess(ledger)
        self.store = AcceptedStore(config.data_dir / "validator" / STORE_FILE)
        self._secret = self.store.secret()
        self._queue: list[PendingItem] = self.store.pending()
        self._deadlines: dict[int, float] = {}
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
            "data_plane": self.follower.statistics() if self.follower is not None else {},
        }

    # --- SUBMIT --------------------------------------------------------------------------------------

    async def submit(self, peer: ID, opened: Opened, digest: bytes) -> SubmitAck:
        """Cheap checks, then the durable queue; status 100 once it is on disk."""
        sub = opened.message
        try:
            if not isinstance(sub, RolloutSubmission):
                raise Reject(
                    Reason.TYPE_MISMATCH, f"expected a rollout submission, got {opened.envelope.type}"
                )
            if sub.run != self.run_id or opened.envelope.run != self.run_id:
                raise Ignore(Reason.WRONG_RUN, f"submission for run {sub.run!r}, not {self.run_id!r}")
            if self.setup is None:
                raise Ignore(Reason.BUSY, "not judging yet: the run is still loading")
            check_step(sub, self.setup.descriptor)  # the store then holds at most the run's counters
            if self.credits_queued >= self.max_queued_credits:
                raise Ignore(Reason.BUSY, f"{self.credits_queued} credits wait for the ledger; try later")
            self._check_fresh(sub)
            self._check_known(sub)
            await self._check_staked(opened.sender)
            item = await trio.to_thread.run_sync(
                lambda: self.store.enqueue(
                    digest=digest,
                    worker=opened.sender,
                    step=sub.step,
                    checkpoint_version=sub.checkpoint_version,
                    received_ms=int(time.time() * 1000),
                    envelope=encode(opened.envelope),
                    max_items=MAX_PENDING,
                    max_bytes=MAX_PENDING_BYTES,
                    max_per_worker=MAX_PENDING_PER_WORKER,
                )
            )
        except ProtocolError as exc:
            self.refused += 1
            return SubmitAck(submission_digest=digest, status=int(exc.reason), detail=clip_detail(exc.detail))
        self._queue.append(item)
        self._wake()
        return SubmitAck(submission_digest=digest, status=QUEUED, detail=f"queued at {len(self._queue)}")

    async def _check_staked(self, sender: bytes) -> None:
        """Only a staked sender takes queue room: `Reject` NOT_STAKED, `Ignore` BUSY while the ledger
        cannot answer. A read is cached for `eligibility_ttl_s` (an outage is not)."""
        if self.ledger.ledger is None:
            return
        now = trio.current_time()
        eligible = self._stake_reads.get(sender, now)
        if eligible is None:
            try:
                eligible = bool(await self.ledger.call("is_eligible", lambda: self.ledger.eligible(sender)))
            except LedgerUnavailable as exc:
                raise Ignore(Reason.BUSY, f"cannot read the sender's stake now: {exc}") from None
            self._stake_reads.put(sender, eligible, trio.current_time())
        if not eligible:
            raise Reject(Reason.NOT_STAKED, f"sender {sender.hex()} is not registered with enough stake")

    def _check_fresh(self, sub: RolloutSubmission) -> None:
        if self.engines is None or self.setup is None:
            return
        newest = self.engines.newest
        if newest is not None and newest - sub.checkpoint_version > self.setup.descriptor.async_level:
            raise Ignore(Reason.STALE, f"checkpoint v{sub.checkpoint_version} is too old (newest v{newest})")

    def _check_known(self, sub: RolloutSubmission) -> None:
        """A version above the newest trainer-signed manifest the follower has seen cannot exist yet."""
        node = self.follower.node if self.follower is not None else None
        latest = node.catalog.latest_version if node is not None else None
        if latest is not None and sub.checkpoint_version > latest:
            raise Ignore(
                Reason.UNKNOWN_CHECKPOINT,
                f"checkpoint v{sub.checkpoint_version} is newer than any manifest seen (v{latest})",
            )

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # --- checkpoints ---------------------------------------------------------------------------------

    async def prepare(self, setup: RunSetup) -> None:
        """Know the run and build the engines (loads the base architecture in a thread)."""
        self.setup = setup
        self.trainers = frozenset(run_trainers(setup.descriptor))
        self._dataset = setup.dataset
        self._dataset_ids = setup.dataset_ids
        keep = setup.descriptor.async_level + 1
        self.engines = await trio.to_thread.run_sync(CheckpointEngines, self.model_dir, keep)

    def _torch_lock(self) -> trio.Lock:
        if self._torch is None:
            self._torch = trio.Lock()
        return self._torch

    async def hold(self, version: int, merkle_root: bytes, state: Mapping[str, torch.Tensor]) -> bool:
        """Load a checkpoint version's weights into an engine; wakes submissions waiting for it."""
        engines = self.engines
        assert engines is not None, "prepare() first"
        async with self._torch_lock():
            loaded = await trio.to_thread.run_sync(engines.load, version, merkle_root, state)
        if loaded:
            log.info("holding checkpoint", extra={"version": version, "held": engines.versions()})
            self._wake()
        return loaded

    async def hold_verified(self, checkpoint: VerifiedCheckpoint) -> bool:
        """`hold` a checkpoint the follower verified on disk (its manifest must name the run's model)."""
        assert self.setup is not None
        manifest = checkpoint.manifest
        if manifest.model_config_hash != self.setup.descriptor.model_config_hash:
            log.warning("checkpoint names another model config", extra={"version": manifest.version})
            return False
        state = await trio.to_thread.run_sync(load_checkpoint, checkpoint.directory, manifest)
        return await self.hold(manifest.version, manifest.merkle_root, state)

    async def _hold_all(self, receive: trio.MemoryReceiveChannel[VerifiedCheckpoint]) -> None:
        async for checkpoint in receive:
            await self.hold_verified(checkpoint)

    # --- the judge -----------------------------------------------------------------------------------

    async def judge_forever(
        self, out: VerdictOut, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Judge queued submissions as their checkpoints become available; gossip verdicts through `out`;
        prune the store every `prune_every_s`; commit the queued credits and finalize the pending slashes.

        Total: whatever an item holds, it ends judged. An exception on one item's path (but a ledger
        that cannot answer, which defers it) quarantines that item as a JUDGE_FAULT ignore, and the loop
        goes on with the next one.
        """
        assert self.setup is not None and self.engines is not None, "prepare() first"
        send, receive = trio.open_memory_channel[Verdict](VERDICT_BACKLOG)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._gossip_verdicts, out, receive)
            nursery.start_soon(self._prune_forever)
            if self.ledger.ledger is not None:
                nursery.start_soon(self._commit_forever)
                nursery.start_soon(self._finalize_forever)
            task_status.started()
            while True:
                item = await self._next_ready()
                try:
                    await self._judge(item, out, send)
                except Exception as exc:  # one item's fault: quarantine it, never stop the judge
                    log.exception("judging an item failed", extra={"digest": item.digest.hex()[:16]})
                    await self._quarantine(item, exc)

    async def wait_judged(self, count: int) -> None:
        """Wait until `count` submissions have been judged (since the store was created)."""
        while self.judged < count:
            await self._progress.wait()

    def _ready(self, item: PendingItem) -> bool:
        """Judge now: the version is held, or it is so old that no wait can make it fresh."""
        assert self.engines is not None and self.setup is not None
        if self.engines.holds(item.checkpoint_version):
            return True
        newest = self.engines.newest
        return newest is not None and newest - item.checkpoint_version > self.setup.descriptor.async_level

    async def _next_ready(self) -> PendingItem:
        """The oldest queued submission that can be judged now, or whose wait for its checkpoint ran out."""
        while True:
            now = trio.current_time()
            soonest = float("inf")
            for item in self._queue:
                deadline = self._deadlines.setdefault(item.id, now + self.wait_for_checkpoint_s)
                retry = self._retry_at.get(item.id, now)
                if retry > now:  # deferred by a ledger failure
                    soonest = min(soonest, retry)
                    continue
                if item.id in self._decided or deadline <= now or self._ready(item):
                    return item
                soonest = min(soonest, deadline)
            changed = self._changed
            with trio.move_on_at(soonest):
                await changed.wait()

    async def _judge(
        self, item: PendingItem, out: VerdictOut, gossip: trio.MemorySendChannel[Verdict]
    ) -> None:
        """Judge `item` (once: the decision is stored before the ledger write), write the ledger, finish.
        When the ledger cannot answer, the item stays queued (with its decision) and is tried again after a
        backoff; a decision read back after a restart only replays the ledger write and finishes."""
        assert self.setup is not None
        evidence = await trio.to_thread.run_sync(self.store.pending_envelope, item.id)
        try:
            decision = self._decided.get(item.id)
            if decision is None:
                decision = await self._decide(item, evidence, out)
                record = decision.record()
                decided_ms = int(time.time() * 1000)
                await trio.to_thread.run_sync(lambda: self.store.decide(item, record, decided_ms=decided_ms))
                self._decided[item.id] = decision
            slashed = await self._write_ledger(decision, evidence)
        except LedgerUnavailable as exc:
            self._defer(item, exc)
            return
        outcome, verdict = decision.outcome, decision.verdict
        status = ACCEPTED_STATUS if isinstance(outcome, Accepted) else int(outcome.reason)
        credit = None
        if isinstance(outcome, Accepted) and self.ledger.ledger is not None:
            assert self.engines is not None
            credit = RunCredit(self.run_id, credit_for(verdict, self.engines.parameters))
        await self.store.finish_async(
            item,
            status=status,
            tokens=verdict.tokens,
            verdict=decision.sealed,
            submission=evidence if isinstance(outcome, Accepted) else None,
            judged_ms=int(time.time() * 1000),
            ignored=isinstance(outcome, Ignore),
            credit=credit,
        )
        if credit is not None:
            self.credits_queued += 1
            if self.credits_queued >= self.max_credits_per_batch:
                self._batch_full.set()
        if not isinstance(outcome, Ignore):
            try:
                gossip.send_nowait(verdict)
            except trio.WouldBlock:
                self.verdicts_dropped += 1
        self._forget(item)
        self._count(item.worker, outcome, decision.judgement, slashed)
        log.info(
            "judged submission",
            extra={
                "digest": item.digest.hex()[:16],
                "worker": "0x" + item.worker.hex(),
                "version": item.checkpoint_version,
                "verdict": "accept" if isinstance(outcome, Accepted) else str(outcome),
                "full": decision.judgement.full,
                "cpu_s": round(decision.judgement.cpu_s, 4),
            },
        )

    def _forget(self, item: PendingItem) -> None:
        self._queue.remove(item)
        for state in (self._deadlines, self._decided, self._attempts, self._retry_at):
            state.pop(item.id, None)
        self._progress.set()
        self._progress = trio.Event()

    async def _quarantine(self, item: PendingItem, exc: Exception) -> None:
        """Take an item the judge failed on out of the queue as a JUDGE_FAULT ignore (its decision, if
        stored, goes with it). When even that cannot be written (the store's disk fails), the item is
        deferred like a ledger failure: the loop goes on either way."""
        outcome = judge_fault(exc)
        try:
            await trio.to_thread.run_sync(
                lambda: self.store.quarantine(
                    item, status=int(outcome.reason), judged_ms=int(time.time() * 1000)
                )
            )
        except Exception as store_exc:  # the store itself failed: try again later, judge the others
            log.exception("quarantine failed", extra={"digest": item.digest.hex()[:16]})
            self._defer(item, LedgerUnavailable(f"store: {store_exc!r}"))
            return
        self.quarantined += 1
        self._forget(item)
        self._count(item.worker, outcome, Judgement(outcome, 0.0, False), False)
        log.warning(
            "quarantined submission",
            extra={"digest": item.digest.hex()[:16], "worker": "0x" + item.worker.hex(), "error": str(exc)},
        )

    async def _decide(self, item: PendingItem, evidence: bytes, out: VerdictOut) -> Decision:
        """Read the worker's stake, judge, seal the verdict (an ignore is not sealed). A stored envelope
        that does not decode is a JUDGE_FAULT; a second submission for an assignment held by another one
        (two SUBMITs racing) is rejected ASSIGNMENT_REUSED without judging."""
        assert self.setup is not None and self.engines is not None
        descriptor = self.setup.descriptor
        try:
            sub = decode(RolloutSubmission, decode(Envelope, evidence).body)
        except Exception as exc:  # our own store's bytes: a verdict about this item, not a dead judge
            fault = judge_fault(exc)
            judgement = Judgement(fault, 0.0, False)
            return Decision(fault, judgement, fault_verdict(self.run_id, item, fault), b"")
        holder = await trio.to_thread.run_sync(self.store.reused, item)
        if holder is not None:
            reused = Reject(Reason.ASSIGNMENT_REUSED, f"assignment held by submission {holder.hex()[:16]}")
            verdict = make_verdict(sub, item.digest, item.worker, reused, False)
            return Decision(reused, Judgement(reused, 0.0, False), verdict, out.seal(verdict))
        eligible = await self._eligible(item.worker)  # LedgerUnavailable: not judged yet
        full = drawn_for_full_check(self._secret, item.digest, descriptor.policy.sample_fraction)
        async with self._torch_lock():  # the versions held cannot change until the judgement is done
            ctx = ValidationContext(
                descriptor=descriptor,
                dataset=self._dataset,
                dataset_ids=self._dataset_ids,
                newest_version=self.engines.newest if self.engines.newest is not None else -1,
                checkpoint_roots=self.engines.roots(),
                is_eligible=lambda _: eligible,
                model=self.engines.model_info,
                tokenizer=self.engines.tokenizer,
            )
            judgement = await trio.to_thread.run_sync(
                judge_submission, sub, item.worker, ctx, self.engines, full
            )
        outcome = judgement.outcome
        verdict = make_verdict(sub, item.digest, item.worker, outcome, judgement.full)
        sealed = b"" if isinstance(outcome, Ignore) else out.seal(verdict)
        return Decision(outcome, judgement, verdict, sealed)

    async def _write_ledger(self, decision: Decision, evidence: bytes) -> bool:
        """Slash as a rejection warrants; True when a slash was filed. (An acceptance's credit is queued
        by `finish` and committed in a batch.)"""
        assert self.setup is not None
        if isinstance(decision.outcome, Reject):
            return await self._slash(decision.verdict, evidence, self.setup.descriptor.policy.slash_gwei)
        return False

    def _defer(self, item: PendingItem, exc: Exception) -> None:
        """Leave `item` queued (the ledger, or the store, could not answer); try it again after 1, 2, 4, ...
        `ledger_retry_s`, at most the max."""
        attempts = self._attempts.get(item.id, 0) + 1
        self._attempts[item.id] = attempts
        delay = min(self.ledger_retry_max_s, self.ledger_retry_s * 2 ** min(attempts - 1, 32))
        self._retry_at[item.id] = trio.current_time() + delay
        self.ledger_retries += 1
        log.warning(
            "ledger or store unavailable, submission stays queued",
            extra={
                "digest": item.digest.hex()[:16],
                "attempt": attempts,
                "retry_s": delay,
                "error": str(exc),
            },
        )

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

    async def _eligible(self, worker: bytes) -> bool:
        """The worker's stake (without a ledger, everyone). A refusal reads as not eligible; a ledger that
        cannot answer raises `LedgerUnavailable`: the submission waits, it is never judged unread."""
        if self.ledger.ledger is None:
            return True
        eligible = await self.ledger.call("is_eligible", lambda: self.ledger.eligible(worker))
        return bool(eligible)

    async def _slash(self, verdict: Verdict, evidence: bytes, amount_gwei: int) -> bool:
        """File the slash (pending on the ledger) and remember it for `finalize_slashes`. A duplicate
        refusal (filed before a crash) is remembered too, but not counted again."""
        ledger = self.ledger.ledger
        if ledger is None or verdict.reason_code not in SLASHABLE_REASONS or amount_gwei < 1:
            return False
        capped = await self.ledger.call("params", lambda: self.ledger.slash_cap(amount_gwei))
        op = slash_for(verdict, evidence, capped or 0)
        if op is None:
            return False
        result = await self.ledger.attempt("slash", lambda: ledger.slash(self.identity, op))
        if isinstance(result, LedgerError) and not isinstance(result, DuplicateSlash):
            return False
        digest = slash_digest(op)
        records = await self.ledger.call("slashes", lambda: ledger.slashes(op.worker))
        for record in records or ():
            mine = record.validator == self.identity.address and record.submission_digest == digest
            if mine and record.status == SLASH_PENDING:
                self._pending_slashes[record.index] = record.final_epoch
        if isinstance(result, LedgerError):
            return False
        log.info(
            "filed a slash",
            extra={"worker": "0x" + verdict.worker.hex(), "reason": reason_name(verdict.reason_code)},
        )
        return True

    # --- the run on the ledger, credits and slashes ------------------------------------------------------

    async def ledger_run(self) -> RunInfo | None:
        """The run as the ledger holds it (None: not registered yet). RunMismatch when its owner is not
        the descriptor's trainer. LedgerUnavailable when the ledger cannot answer."""
        ledger = self.ledger.ledger
        assert ledger is not None and self.setup is not None
        info = await self.ledger.call("run", lambda: read_run(ledger, self.run_id))
        if info is not None:
            check_run_owner(info, self.setup.descriptor)
        return info

    async def wait_run_on_ledger(self, descriptor: RunDescriptor) -> RunInfo | None:
        """Before judging: wait until the run is on the ledger, and refuse it (RunMismatch) unless its
        owner is the trainer that signed `descriptor`. Without a ledger, nothing to wait for."""
        ledger = self.ledger.ledger
        if ledger is None:
            return None
        waiting = False
        while True:
            try:
                info = await self.ledger.call("run", lambda: read_run(ledger, descriptor.run))
            except LedgerUnavailable:
                info = None
            if info is not None:
                check_run_owner(info, descriptor)
                if self.identity.address not in info.validators:
                    log.warning(
                        "this validator is not in the run's validator set: its credits wait until the "
                        "run's owner adds it",
                        extra={"run": descriptor.run},
                    )
                return info
            if not waiting:
                log.info("waiting for the run's owner to register it", extra={"run": descriptor.run})
                waiting = True
            await trio.sleep(RUN_WAIT_S)

    async def _commit_forever(self) -> None:
        """`commit_credits` every `credit_interval_s`, or at once when a batch is full; after a failure,
        the ledger retry backoff (a full queue must not spin on a ledger that is down)."""
        failures = 0
        while True:
            full = self._batch_full
            with trio.move_on_after(self.credit_interval_s):
                await full.wait()
            self._batch_full = trio.Event()
            try:
                await self.commit_credits()
                failures = 0
            except LedgerUnavailable as exc:
                failures += 1
                self.credit_blocked = str(exc)
                backoff = self.ledger_retry_s * 2 ** min(failures - 1, 32)
                await trio.sleep(min(self.ledger_retry_max_s, backoff))

    async def commit_credits(self) -> None:
        """Commit the queued credits of the run, a batch at a time, until none is left or the batch as a
        whole cannot be committed now (`credit_blocked` says why). LedgerUnavailable: try again later."""
        ledger = self.ledger.ledger
        if ledger is None:
            return
        self.credits_queued = (await trio.to_thread.run_sync(self.store.credit_counts)).queued
        while True:
            credits = await trio.to_thread.run_sync(
                self.store.queued_credits, self.run_id, self.max_credits_per_batch
            )
            if not credits:
                self.credit_blocked = ""
                return
            if not await self._commit(credits):
                return

    async def _blocked(self) -> RunInfo | None:
        """The run, when a batch can be committed to it now; else None (why: `credit_blocked`)."""
        ledger = self.ledger.ledger
        assert ledger is not None
        run = await self.ledger_run()
        if run is None:
            self.credit_blocked = f"run {self.run_id!r} is not registered on the ledger yet"
            return None
        blocker = await self.ledger.call(
            "run standing", lambda: commit_blocker(ledger, run, self.identity.address)
        )
        if blocker is not None:
            self.credit_blocked = blocker
            return None
        return run

    async def _commit(self, credits: list[Credit]) -> bool:
        """One batch (sorted by (worker, step)). True when every credit was settled: committed, or
        dropped for a reason of its own; False when the batch as a whole cannot be committed now."""
        ledger = self.ledger.ledger
        assert ledger is not None
        run = await self._blocked()
        if run is None:
            return False
        op = CommitCredits(self.run_id, tuple(fit_credit(c, run) for c in credits))
        result = await self.ledger.attempt("commit_credits", lambda: ledger.commit_credits(self.identity, op))
        if isinstance(result, Receipt):
            await self._settle(credits, committed=True, detail="")
            self.batches += 1
            log.info("committed credits", extra={"credits": len(credits), "run": self.run_id})
            return True
        return await self._settle_refused(run, credits, result)

    async def _settle_refused(self, run: RunInfo, credits: list[Credit], error: LedgerError) -> bool:
        """A refused batch: drop what `credit_refusal` explains (the rest go in the next round); a refusal
        nothing explains is split in halves down to the credit it names (dropped with the ledger's
        message). Terminates: every round settles a credit at least, or stops on a refusal of the whole
        batch; the splitting recurses at most log2(batch) deep."""
        ledger = self.ledger.ledger
        assert ledger is not None
        checked = await self.ledger.call(
            "credit checks", lambda: [credit_refusal(ledger, run, c) for c in credits]
        )
        reasons = checked if checked is not None else [None] * len(credits)
        dropped = [(c, r) for c, r in zip(credits, reasons, strict=True) if r is not None]
        if dropped:  # the rest stay queued: the next round sends them
            for credit, reason in dropped:
                await self._drop(credit, reason, reason)
            return True
        if await self._blocked() is None:
            return False
        if len(credits) == 1:
            await self._drop(credits[0], "refused", str(error))
            return True
        half = len(credits) // 2
        first = await self._commit(credits[:half])
        return await self._commit(credits[half:]) and first

    async def _drop(self, credit: Credit, reason: str, detail: str) -> None:
        await self._settle([credit], committed=False, detail=detail)
        self.credits_dropped[reason] = self.credits_dropped.get(reason, 0) + 1
        log.warning(
            "credit dropped",
            extra={
                "worker": "0x" + credit.worker.hex(),
                "step": credit.step,
                "reason": reason,
                "error": detail,
            },
        )

    async def _settle(self, credits: list[Credit], *, committed: bool, detail: str) -> None:
        settled = [(c, detail) for c in credits]
        marked = await trio.to_thread.run_sync(
            lambda: self.store.settle_credits(self.run_id, settled, committed=committed)
        )
        self.credits_queued = max(0, self.credits_queued - marked)
        if committed:
            self.contributions += marked

    async def _finalize_forever(self) -> None:
        """Read back the pending slashes this validator filed, then `finalize_slashes` every
        `slash_check_s`; a ledger that cannot answer is asked again next time."""
        ledger = self.ledger.ledger
        assert ledger is not None
        me = self.identity.address
        loaded = False
        while True:
            try:
                if not loaded:
                    records = await self.ledger.call("slashes", lambda: ledger.slashes(me))
                    for record in records or ():
                        if record.validator == me and record.status == SLASH_PENDING:
                            self._pending_slashes.setdefault(record.index, record.final_epoch)
                    loaded = True
                await self.finalize_slashes()
            except LedgerUnavailable:
                pass
            await trio.sleep(self.slash_check_s)

    async def finalize_slashes(self) -> None:
        """Finalize each pending slash filed here whose challenge window has passed (anyone may; the one
        who filed it has the reason to). A window still open waits; a slash no longer pending is dropped."""
        ledger = self.ledger.ledger
        if ledger is None or not self._pending_slashes:
            return
        epoch = await self.ledger.call("current_epoch", ledger.current_epoch)
        for index, final_epoch in sorted(self._pending_slashes.items()):
            if epoch is None or epoch < final_epoch:
                continue
            result = await self.ledger.attempt(
                "finalize_slash", lambda index=index: ledger.finalize_slash(self.identity, index)
            )
            if isinstance(result, ChallengeWindowOpen):
                continue
            del self._pending_slashes[index]
            if isinstance(result, Receipt):
                self.slashes_finalized += 1
                log.info("finalized a slash", extra={"slash": index})
            elif isinstance(result, SlashNotPending):
                await self._count_settled(index)
            else:
                log.warning("finalizing a slash was refused", extra={"slash": index, "error": str(result)})

    async def _count_settled(self, index: int) -> None:
        """A slash someone else settled: voided (the worker keeps its stake), or finalized by another."""
        ledger = self.ledger.ledger
        assert ledger is not None
        me = self.identity.address
        records = await self.ledger.call("slashes", lambda: ledger.slashes(me))
        record = next((r for r in records or () if r.index == index), None)
        if record is not None and record.status == SLASH_VOIDED:
            self.slashes_voided += 1
        else:
            self.slashes_settled_elsewhere += 1

    # --- retention -----------------------------------------------------------------------------------

    def retention_floor(self) -> int | None:
        """The oldest version whose assignments are kept: the async window plus the audit horizon below
        the newest version held (None while none is held). Older ones are stale for every judge."""
        assert self.setup is not None
        newest = self.engines.newest if self.engines is not None else None
        if newest is None:
            return None
        return max(0, newest - self.setup.descriptor.async_level - self.retention_versions)

    def pulled_by_every_trainer(self) -> int:
        """The accepted index every trainer that pulled since this start has pulled (0: none pulled)."""
        return min(self._pulled.values(), default=0)

    async def prune(self) -> None:
        """Apply the retention to the store (`AcceptedStore.prune`) and refresh its statistics."""
        floor = self.retention_floor()
        if floor is not None:
            pruned = await trio.to_thread.run_sync(
                lambda: self.store.prune(
                    floor=floor,
                    max_accepted_bytes=self.max_accepted_bytes,
                    pulled=self.pulled_by_every_trainer(),
                )
            )
            self.pruned_judged += pruned.judged
            self.pruned_accepted += pruned.accepted
            if pruned.judged or pruned.accepted:
                log.info(
                    "pruned the store",
                    extra={"floor": pruned.floor, "judged": pruned.judged, "accepted": pruned.accepted},
                )
        self.store_stats = await trio.to_thread.run_sync(self.store.statistics)

    async def _prune_forever(self) -> None:
        while True:
            await self.prune()
            await trio.sleep(self.prune_every_s)

    async def _gossip_verdicts(self, out: VerdictOut, receive: trio.MemoryReceiveChannel[Verdict]) -> None:
        async for verdict in receive:
            await out.publish("verdicts", verdict)
            self.verdicts_gossiped += 1

    # --- ACCEPTED ------------------------------------------------------------------------------------

    def admits_puller(self, peer: ID) -> bool:
        """ACCEPTED before any slot or read: only the run's trainers (a peer id names its key's address)."""
        return address_of_peer_id(peer.to_bytes()) in self.trainers

    def admits_submitter(self, peer: ID) -> bool:
        """SUBMIT before any slot or read: refuse a peer whose stake was read as too low within the TTL.

        An unknown peer gets one frame read (its SUBMIT reads the stake and caches the answer); after that
        an unstaked sender's streams are reset before they take a slot, however often it comes back.
        """
        address = address_of_peer_id(peer.to_bytes())
        if address is None:
            return False
        return self._stake_reads.get(address, trio.current_time()) is not False

    async def serve_accepted(self, peer: ID, opened: Opened) -> AcceptedBatch:
        """Accepted submissions after the puller's cursor; waits up to `wait_ms` for the first new one.

        Only the run's trainers are served, the lead and its co-trainers (anyone else could hold the
        protocol's few inbound streams with long polls): others, and a request before the run is known, are
        refused with Ignore NOT_FOR_US.
        """
        request = opened.message
        if not isinstance(request, AcceptedRequest) or request.run != self.run_id:
            raise Ignore(Reason.WRONG_RUN, "accepted submissions of another run")
        if opened.sender not in self.trainers:
            self.accepted_refused += 1
            raise Ignore(Reason.NOT_FOR_US, "accepted submissions are served to the run's trainers only")
        if not 0 <= request.after <= MAX_CURSOR:
            self.accepted_refused += 1
            raise Reject(Reason.OUT_OF_RANGE, f"cursor {request.after} is beyond any accepted index")
        # what this trainer has (its cursor), never beyond what exists: frees pulled items for the byte cap
        pulled = min(request.after, self.store.newest)
        self._pulled[opened.sender] = max(self._pulled.get(opened.sender, 0), pulled)
        if self.store.newest <= request.after and request.wait_ms:
            await self.store.wait_after(request.after, request.wait_ms / 1000)
        items, newest = await trio.to_thread.run_sync(
            self.store.after, request.after, request.limit, MAX_BATCH_BYTES
        )
        return AcceptedBatch(items=tuple(items), newest=newest)

    # --- RoleWork ------------------------------------------------------------------------------------

    async def run(
        self, net: RoleNet, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        set_threads(self.config.work.threads)
        net.serve(ACCEPTED, self.serve_accepted, admit=self.admits_puller)
        task_status.started()
        record = await net.wait_run_record()
        await self.wait_run_on_ledger(record.descriptor)  # RunMismatch: another trainer owns the run
        self.trainers = frozenset(run_trainers(record.descriptor))
        setup = await trio.to_thread.run_sync(load_run_setup, record.descriptor, self.model_dir, self.tasks)
        await self.prepare(setup)
        self.follower = SwarmFollower(net, self.config, newest_only=False, serve=True)
        send, receive = trio.open_memory_channel[VerifiedCheckpoint](8)
        async with trio.open_nursery() as nursery:
            await nursery.start(self.follower.run, send)
            nursery.start_soon(self._hold_all, receive)
            await self.judge_forever(net)

    async def on_gossip(self, net: RoleNet, delivery: Delivery) -> None:
        if self.follower is not None and delivery.kind in ("checkpoints", "shards"):
            await self.follower.on_gossip(delivery)


def reason_name(code: int) -> str:
    try:
        return Reason(code).name
    except ValueError:
        return str(code)
